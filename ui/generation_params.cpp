#include "ui/generation_params.h"

#include "ui/json_io.h"

namespace dit::ui {

QString defaultPrompt() { return QString::fromUtf8(dit::protocol::kDefaultPrompt); }

QJsonObject paramsToQJson(const GenerationParams& p) {
  return toQJsonObject(dit::protocol::toJson(p));
}

GenerationParams paramsFromQJson(const QJsonObject& j, const GenerationParams& defaults) {
  return dit::protocol::paramsFromJson(toNlohmann(j), defaults);
}

GenerationParams startingParams() {
  GenerationParams p;
  p.width = 64;
  p.height = 64;
  p.steps = 8;
  return p;
}

}  // namespace dit::ui
