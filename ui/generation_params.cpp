#include "ui/generation_params.h"

#include <exception>

#include "app/common/request_values.h"
#include "ui/json_io.h"
#include "ui/seed_text.h"

namespace dit::ui {

QString defaultPrompt() { return QString::fromUtf8(dit::protocol::kDefaultPrompt); }

QJsonObject paramsToQJson(const GenerationParams& p) {
  return toQJsonObject(dit::protocol::toJson(p));
}

GenerationParams paramsFromQJson(const QJsonObject& j, const GenerationParams& defaults) {
  // A family knob at the top level (a model's default settings, a preset or PNG metadata written
  // before FluxPipeline's true CFG scale was a knob) is read as the option it is.
  nlohmann::json all = toNlohmann(j);
  dit::liftKnobKeys(all);
  if (!j.value("seed").isString()) return dit::protocol::paramsFromJson(all, defaults);
  // A seed above 2^63-1 travels as decimal text in Qt JSON (toQJsonObject).
  QString err;
  const auto seed = parseSeedText(j.value("seed").toString(), &err);
  if (!seed) throw dit::protocol::ProtocolError("request field 'seed': " + err.toStdString());
  all.erase("seed");
  GenerationParams p = dit::protocol::paramsFromJson(all, defaults);
  p.seed = *seed;
  p.random_seed = false;
  return p;
}

GenerationParams withModelDefaults(const QJsonObject& settings, const GenerationParams& current,
                                   QString* problem) {
  if (problem) problem->clear();
  if (settings.isEmpty()) return current;
  try {
    return paramsFromQJson(settings, current);
  } catch (const std::exception& e) {  // ProtocolError, or anything else: the values stay
    if (problem) *problem = QString::fromUtf8(e.what());
    return current;
  }
}

GenerationParams startingParams() {
  GenerationParams p;
  p.width = 64;
  p.height = 64;
  p.steps = 8;
  return p;
}

}  // namespace dit::ui
