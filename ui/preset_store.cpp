#include "ui/preset_store.h"

#include <QDir>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>

#include "ui/json_io.h"
#include "ui/strategy_json.h"

namespace dit::ui {

QJsonObject Preset::toJson() const {
  QJsonObject j;
  j["name"] = name;
  if (!description.isEmpty()) j["description"] = description;
  j["strategy"] = strategyToJson(strategy);
  if (!hostfile.isEmpty()) j["hostfile"] = hostfile;
  QJsonObject h;
  if (!hosts.networkInterface.isEmpty()) h["network_interface"] = hosts.networkInterface;
  if (!hosts.portRange.isEmpty()) h["port_range"] = hosts.portRange;
  if (!hosts.sshOptions.isEmpty()) h["ssh_options"] = hosts.sshOptions;
  if (!hosts.mpirunArgs.isEmpty()) h["mpirun_args"] = hosts.mpirunArgs;
  if (!h.isEmpty()) j["hosts"] = h;
  QJsonObject r;
  if (run.vae_tiling >= 0) r["vae_tiling"] = run.vae_tiling;
  if (run.text_encoder_placement != "sharded")
    r["text_encoder_placement"] = QString::fromStdString(run.text_encoder_placement);
  if (run.prompt_cache > 0) r["prompt_cache"] = run.prompt_cache;
  if (!r.isEmpty()) j["run"] = r;
  if (hasGeneration) j["generation"] = paramsToQJson(generation);
  model.writeTo(j);
  if (!plan.isEmpty()) j["plan"] = plan;
  return j;
}

std::optional<Preset> Preset::fromJson(const QJsonObject& j, QString* error) {
  Preset p;
  p.name = j.value("name").toString().trimmed();
  if (p.name.isEmpty()) {
    if (error) *error = QStringLiteral("a preset has no name");
    return std::nullopt;
  }
  if (!j.value("strategy").isObject()) {
    if (error) *error = QStringLiteral("preset \"%1\" has no strategy object").arg(p.name);
    return std::nullopt;
  }
  p.description = j.value("description").toString();
  p.hostfile = j.value("hostfile").toString();
  const QJsonObject h = j.value("hosts").toObject();
  p.hosts.networkInterface = h.value("network_interface").toString();
  p.hosts.portRange = h.value("port_range").toString();
  p.hosts.sshOptions = h.value("ssh_options").toString();
  p.hosts.mpirunArgs = h.value("mpirun_args").toString();
  const QJsonObject r = j.value("run").toObject();
  p.run.vae_tiling = r.value("vae_tiling").toInt(-1);
  p.run.text_encoder_placement =
      r.value("text_encoder_placement").toString(QStringLiteral("sharded")).toStdString();
  p.run.prompt_cache = r.value("prompt_cache").toInt(0);
  // A run option no worker takes (a placement from a newer build, a value out of range) falls
  // back to its default: the preset itself is kept (dropping it would lose it at the next save).
  const dit::protocol::RunOptions defaults;
  auto keepIfValid = [](const dit::protocol::RunOptions& one) {
    return dit::protocol::runOptionsIssue(one).empty();
  };
  {
    dit::protocol::RunOptions one = defaults;
    one.vae_tiling = p.run.vae_tiling;
    if (!keepIfValid(one)) p.run.vae_tiling = defaults.vae_tiling;
    one = defaults;
    one.text_encoder_placement = p.run.text_encoder_placement;
    if (!keepIfValid(one)) p.run.text_encoder_placement = defaults.text_encoder_placement;
    one = defaults;
    one.prompt_cache = p.run.prompt_cache;
    if (!keepIfValid(one)) p.run.prompt_cache = defaults.prompt_cache;
  }
  p.model = ModelSourcePaths::readFrom(j);
  p.plan = j.value("plan").toObject();
  try {
    p.strategy = strategyFromJson(j.value("strategy").toObject());
    if (j.value("generation").isObject()) {
      p.hasGeneration = true;
      p.generation = paramsFromQJson(j.value("generation").toObject());
    }
  } catch (const dit::protocol::ProtocolError& e) {
    if (error)
      *error = QStringLiteral("preset \"%1\": %2").arg(p.name, QString::fromStdString(e.what()));
    return std::nullopt;
  }
  return p;
}

PresetStore::PresetStore(QString dataDir, QString builtinFile)
    : dataDir_(dataDir.isEmpty() ? appDataDir() : dataDir),
      builtinFile_(builtinFile.isEmpty()
                       ? QStringLiteral(":/ditstudio/presets/builtin-presets.json")
                       : builtinFile) {}

QString PresetStore::userFile() const {
  return QDir(dataDir_).filePath(QStringLiteral("presets.json"));
}

QJsonObject PresetStore::toDocument(const QList<Preset>& presets) {
  QJsonArray arr;
  for (const Preset& p : presets) arr.append(p.toJson());
  return QJsonObject{{"format", "ditstudio-presets"}, {"version", 1}, {"presets", arr}};
}

QList<Preset> PresetStore::fromDocument(const QJsonValue& doc, QString* error) {
  QList<Preset> out;
  QJsonArray arr;
  if (doc.isArray()) {
    arr = doc.toArray();
  } else if (doc.isObject() && doc.toObject().value("presets").isArray()) {
    arr = doc.toObject().value("presets").toArray();
  } else if (doc.isObject() && doc.toObject().contains("name")) {
    arr.append(doc);
  } else {
    if (error) *error = QStringLiteral("not a DiT Studio presets file (no \"presets\" array)");
    return out;
  }
  for (const QJsonValue& v : arr) {
    QString err;
    if (auto p = Preset::fromJson(v.toObject(), &err))
      out.append(*p);
    else if (error && error->isEmpty())
      *error = err;
  }
  return out;
}

bool PresetStore::load(QString* error) {
  builtin_.clear();
  user_.clear();
  bool ok = true;
  QString err;
  QJsonDocument doc;
  if (readJsonFile(builtinFile_, &doc, &err)) {
    const QJsonValue v = doc.isArray() ? QJsonValue(doc.array()) : QJsonValue(doc.object());
    builtin_ = fromDocument(v, &err);
    for (Preset& p : builtin_) p.builtin = true;
  } else {
    ok = false;
    if (error) *error = err;
  }
  if (QFileInfo::exists(userFile())) {
    QString uerr;
    if (readJsonFile(userFile(), &doc, &uerr)) {
      const QJsonValue v = doc.isArray() ? QJsonValue(doc.array()) : QJsonValue(doc.object());
      for (Preset& p : fromDocument(v, &uerr)) {
        if (isBuiltin(p.name) || userIndex(p.name) >= 0) continue;
        p.builtin = false;
        user_.append(p);
      }
    } else {
      ok = false;
      if (error) *error = error->isEmpty() ? uerr : *error + "; " + uerr;
    }
  }
  return ok;
}

QList<Preset> PresetStore::presets() const { return builtin_ + user_; }

QStringList PresetStore::names() const {
  QStringList n;
  for (const Preset& p : presets()) n << p.name;
  return n;
}

std::optional<Preset> PresetStore::find(const QString& name) const {
  for (const Preset& p : presets())
    if (p.name == name) return p;
  return std::nullopt;
}

bool PresetStore::isBuiltin(const QString& name) const {
  for (const Preset& p : builtin_)
    if (p.name == name) return true;
  return false;
}

int PresetStore::userIndex(const QString& name) const {
  for (int i = 0; i < user_.size(); ++i)
    if (user_[i].name == name) return i;
  return -1;
}

QString PresetStore::uniqueName(const QString& base) const {
  if (!find(base)) return base;
  for (int n = 2;; ++n) {
    const QString cand = QStringLiteral("%1 (%2)").arg(base).arg(n);
    if (!find(cand)) return cand;
  }
}

bool PresetStore::persist(QString* error) {
  return writeJsonAtomic(userFile(), QJsonDocument(toDocument(user_)), error);
}

bool PresetStore::save(const Preset& presetIn, QString* error) {
  Preset p = presetIn;
  p.name = p.name.trimmed();
  p.builtin = false;
  if (p.name.isEmpty()) {
    if (error) *error = QStringLiteral("a preset needs a name");
    return false;
  }
  if (isBuiltin(p.name)) {
    if (error)
      *error = QStringLiteral("\"%1\" is a built-in preset; save under another name").arg(p.name);
    return false;
  }
  const QList<Preset> before = user_;
  const int i = userIndex(p.name);
  if (i >= 0)
    user_[i] = p;
  else
    user_.append(p);
  if (!persist(error)) {
    user_ = before;
    return false;
  }
  return true;
}

bool PresetStore::rename(const QString& from, const QString& toIn, QString* error) {
  const QString to = toIn.trimmed();
  if (isBuiltin(from)) {
    if (error) *error = QStringLiteral("built-in presets cannot be renamed");
    return false;
  }
  const int i = userIndex(from);
  if (i < 0) {
    if (error) *error = QStringLiteral("no preset named \"%1\"").arg(from);
    return false;
  }
  if (to.isEmpty()) {
    if (error) *error = QStringLiteral("a preset needs a name");
    return false;
  }
  if (to != from && find(to)) {
    if (error) *error = QStringLiteral("a preset named \"%1\" already exists").arg(to);
    return false;
  }
  const QList<Preset> before = user_;
  user_[i].name = to;
  if (!persist(error)) {
    user_ = before;
    return false;
  }
  return true;
}

bool PresetStore::remove(const QString& name, QString* error) {
  if (isBuiltin(name)) {
    if (error) *error = QStringLiteral("built-in presets cannot be deleted");
    return false;
  }
  const int i = userIndex(name);
  if (i < 0) {
    if (error) *error = QStringLiteral("no preset named \"%1\"").arg(name);
    return false;
  }
  const QList<Preset> before = user_;
  user_.removeAt(i);
  if (!persist(error)) {
    user_ = before;
    return false;
  }
  return true;
}

bool PresetStore::exportTo(const QString& path, const QStringList& names, QString* error) const {
  QList<Preset> chosen;
  if (names.isEmpty()) {
    chosen = user_;
  } else {
    for (const QString& n : names) {
      auto p = find(n);
      if (!p) {
        if (error) *error = QStringLiteral("no preset named \"%1\"").arg(n);
        return false;
      }
      chosen.append(*p);
    }
  }
  return writeJsonAtomic(path, QJsonDocument(toDocument(chosen)), error);
}

QStringList PresetStore::importFrom(const QString& path, QString* error) {
  QJsonDocument doc;
  if (!readJsonFile(path, &doc, error)) return {};
  const QJsonValue v = doc.isArray() ? QJsonValue(doc.array()) : QJsonValue(doc.object());
  QString err;
  const QList<Preset> incoming = fromDocument(v, &err);
  if (incoming.isEmpty()) {
    if (error) *error = err.isEmpty() ? QStringLiteral("%1 holds no presets").arg(path) : err;
    return {};
  }
  const QList<Preset> before = user_;
  QStringList added;
  for (Preset p : incoming) {
    p.builtin = false;
    p.name = uniqueName(p.name);
    user_.append(p);
    added << p.name;
  }
  if (!persist(error)) {
    user_ = before;
    return {};
  }
  return added;
}

}  // namespace dit::ui
