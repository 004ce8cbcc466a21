#include "ui/model_sources.h"

#include <QFileInfo>
#include <QRegularExpression>

namespace dit::ui {

const std::vector<ModelComponents::Field>& ModelComponents::fields() {
  static const std::vector<Field> f{
      {"config", "--config", "Config folder", true, &ModelComponents::config},
      {"vae", "--vae", "VAE", false, &ModelComponents::vae},
      {"text_encoder", "--text-encoder", "Text encoder", false, &ModelComponents::textEncoder},
      {"text_encoder_2", "--text-encoder-2", "Text encoder 2", false,
       &ModelComponents::textEncoder2},
      {"tokenizer", "--tokenizer", "Tokenizer", true, &ModelComponents::tokenizer},
      {"tokenizer_2", "--tokenizer-2", "Tokenizer 2", true, &ModelComponents::tokenizer2}};
  return f;
}

const ModelComponents::Field* ModelComponents::fieldForFlag(const QString& flag) {
  for (const Field& f : fields())
    if (flag == QLatin1String(f.flag)) return &f;
  return nullptr;
}

QStringList ModelComponents::workerArgs() const {
  QStringList a;
  for (const Field& f : fields()) {
    const QString& v = this->*f.member;
    if (!v.isEmpty()) a << QString::fromLatin1(f.flag) << v;
  }
  return a;
}

QJsonObject ModelComponents::toJson() const {
  QJsonObject j;
  for (const Field& f : fields()) {
    const QString& v = this->*f.member;
    if (!v.isEmpty()) j.insert(QLatin1String(f.key), v);
  }
  return j;
}

ModelComponents ModelComponents::fromJson(const QJsonObject& j) {
  ModelComponents c;
  for (const Field& f : fields()) c.*f.member = j.value(QLatin1String(f.key)).toString();
  return c;
}

dit::ModelSources ModelSourcePaths::toSources() const {
  dit::ModelSources s;
  s.model = model.toStdString();
  s.config = components.config.toStdString();
  s.vae = components.vae.toStdString();
  s.text_encoder = components.textEncoder.toStdString();
  s.text_encoder_2 = components.textEncoder2.toStdString();
  s.tokenizer = components.tokenizer.toStdString();
  s.tokenizer_2 = components.tokenizer2.toStdString();
  return s;
}

void ModelSourcePaths::writeTo(QJsonObject& j) const {
  if (!model.isEmpty()) j.insert(QStringLiteral("model"), model);
  if (components.isEmpty())
    j.remove(QStringLiteral("components"));
  else
    j.insert(QStringLiteral("components"), components.toJson());
}

ModelSourcePaths ModelSourcePaths::readFrom(const QJsonObject& j) {
  ModelSourcePaths s;
  s.model = j.value(QStringLiteral("model")).toString();
  s.components = ModelComponents::fromJson(j.value(QStringLiteral("components")).toObject());
  return s;
}

QStringList ModelSourcePaths::missingHere() const {
  QStringList out;
  if (!model.isEmpty() && !QFileInfo::exists(model))
    out << QStringLiteral("model (--model): %1").arg(model);
  for (const ModelComponents::Field& f : ModelComponents::fields()) {
    const QString& v = components.*f.member;
    if (!v.isEmpty() && !QFileInfo::exists(v))
      out << QStringLiteral("%1 (%2): %3").arg(QLatin1String(f.label), QLatin1String(f.flag), v);
  }
  return out;
}

QString flagAskedFor(const QString& error) {
  // "has no vae (give one with --vae)", "give a diffusers config folder with --config" first,
  // then a component flag named anywhere ("<path>: no such file or folder (--vae)").
  static const QRegularExpression asked(
      QStringLiteral("give (?:one|a [^()]*?) with (--[a-z0-9-]+)"));
  if (const QRegularExpressionMatch m = asked.match(error); m.hasMatch()) return m.captured(1);
  static const QRegularExpression named(QStringLiteral("(--[a-z0-9-]*[a-z0-9])(?![a-z0-9-])"));
  for (auto it = named.globalMatch(error); it.hasNext();) {
    const QString flag = it.next().captured(1);
    if (ModelComponents::fieldForFlag(flag)) return flag;
  }
  return {};
}

}  // namespace dit::ui
