#include "ui/history_store.h"

#include <QDir>
#include <QFileInfo>
#include <QImageReader>
#include <QJsonArray>
#include <QJsonDocument>
#include <QProcess>

#include "ui/json_io.h"
#include "ui/seed_text.h"
#include "ui/strategy_json.h"

namespace dit::ui {

QJsonObject HistoryEntry::toJson() const {
  QJsonObject j{{"path", path},
                {"id", requestId},
                {"params", params},
                {"seconds", seconds},
                {"created", created.toString(Qt::ISODateWithMs)}};
  if (hasSeed) j.insert("seed", seedToQJson(seed));  // text: exact over the whole uint64 range
  return j;
}

HistoryEntry HistoryEntry::fromJson(const QJsonObject& j) {
  HistoryEntry e;
  e.path = j.value("path").toString();
  e.requestId = j.value("id").toString();
  // Decimal text; older files stored a number (exact up to 2^53, or 2^63-1 as an integer).
  if (const auto seed = seedFromQJson(j.value("seed"))) {
    e.seed = *seed;
    e.hasSeed = true;
  }
  e.params = j.value("params").toObject();
  e.seconds = j.value("seconds").toDouble(0);
  e.created = QDateTime::fromString(j.value("created").toString(), Qt::ISODateWithMs);
  return e;
}

GenerationParams HistoryEntry::generation(const GenerationParams& defaults) const {
  GenerationParams p = defaults;
  try {
    p = paramsFromQJson(params, defaults);
    // An image made without LoRAs recalls to none (not to the panel's current list).
    if (!params.contains(QStringLiteral("loras"))) p.loras.clear();
    // Nor to the panel's reference images when it was made without.
    if (!params.contains(QStringLiteral("reference_images"))) p.reference_images.clear();
  } catch (const dit::protocol::ProtocolError&) {
    // A PNG chunk written by another program: keep the defaults rather than half of it.
  }
  if (hasSeed) {
    p.seed = seed;
    p.random_seed = false;
  }
  return p;
}

HistoryStore::HistoryStore(QString dataDir, int maxEntries)
    : dataDir_(dataDir.isEmpty() ? appDataDir() : dataDir), max_(maxEntries) {}

QString HistoryStore::file() const {
  return QDir(dataDir_).filePath(QStringLiteral("history.json"));
}

bool HistoryStore::load(QString* error) {
  entries_.clear();
  if (!QFileInfo::exists(file())) return true;
  QJsonDocument doc;
  if (!readJsonFile(file(), &doc, error)) return false;
  for (const QJsonValue& v : doc.object().value("images").toArray())
    entries_.append(HistoryEntry::fromJson(v.toObject()));
  return true;
}

bool HistoryStore::persist(QString* error) {
  QJsonArray arr;
  for (const HistoryEntry& e : entries_) arr.append(e.toJson());
  return writeJsonAtomic(
      file(),
      QJsonDocument(QJsonObject{{"format", "ditstudio-history"}, {"version", 1}, {"images", arr}}),
      error);
}

bool HistoryStore::add(const HistoryEntry& e, QString* error) {
  HistoryEntry copy = e;
  if (!copy.created.isValid()) copy.created = QDateTime::currentDateTime();
  entries_.prepend(copy);
  while (entries_.size() > max_) entries_.removeLast();
  return persist(error);
}

bool HistoryStore::remove(const QString& path, QString* error) {
  for (int i = 0; i < entries_.size(); ++i) {
    if (entries_[i].path == path) {
      entries_.removeAt(i);
      return persist(error);
    }
  }
  if (error) *error = QStringLiteral("%1 is not in the history").arg(path);
  return false;
}

bool HistoryStore::clear(QString* error) {
  entries_.clear();
  return persist(error);
}

QString historyField(const HistoryEntry& e, const QString& field) {
  if (field == QLatin1String("prompt"))
    return e.params.value("prompt").toString() + "\n" +
           e.params.value("negative_prompt").toString();
  if (field == QLatin1String("model")) return e.params.value("model").toString();
  if (field == QLatin1String("strategy")) {
    const QJsonValue v = e.params.value("strategy");
    if (const auto s = strategyFromParams(v)) return strategyText(*s) + "\n" + v.toString();
    return v.toString();
  }
  if (field == QLatin1String("seed")) return e.hasSeed ? seedText(e.seed) : QString();
  if (field == QLatin1String("date"))
    return e.created.isValid() ? e.created.toString(QStringLiteral("yyyy-MM-dd HH:mm")) : QString();
  if (field == QLatin1String("id")) return e.requestId;
  if (field == QLatin1String("file")) return QFileInfo(e.path).fileName();
  return {};
}

bool historyMatches(const HistoryEntry& e, const QString& query) {
  static const QStringList fields{"prompt", "model", "strategy", "seed", "date", "id", "file"};
  for (const QString& term : QProcess::splitCommand(query)) {
    if (term.isEmpty()) continue;
    const qsizetype colon = term.indexOf(QLatin1Char(':'));
    const QString key = colon > 0 ? term.left(colon).toLower() : QString();
    if (fields.contains(key)) {
      const QString value = term.mid(colon + 1);
      if (!historyField(e, key).contains(value, Qt::CaseInsensitive)) return false;
      continue;
    }
    bool any = false;
    for (const QString& f : fields) {
      if (historyField(e, f).contains(term, Qt::CaseInsensitive)) {
        any = true;
        break;
      }
    }
    if (!any) return false;
  }
  return true;
}

QJsonObject readPngParameters(const QString& path, QString* error) {
  QImageReader reader(path);
  if (!reader.canRead()) {
    if (error)
      *error = QStringLiteral("%1 is not a readable image: %2").arg(path, reader.errorString());
    return {};
  }
  const QString text = reader.text(QStringLiteral("parameters"));
  if (text.isEmpty()) {
    if (error) *error = QStringLiteral("%1 has no \"parameters\" text chunk").arg(path);
    return {};
  }
  // nlohmann, not QJsonDocument: a seed above 2^63-1 must not become a double.
  const QByteArray utf8 = text.toUtf8();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(utf8.constData(), utf8.constData() + utf8.size());
  } catch (const nlohmann::json::exception& e) {
    if (error)
      *error = QStringLiteral("the parameters of %1 are not a JSON object: %2")
                   .arg(path, QString::fromStdString(e.what()));
    return {};
  }
  if (!j.is_object()) {
    if (error) *error = QStringLiteral("the parameters of %1 are not a JSON object").arg(path);
    return {};
  }
  return toQJsonObject(j);
}

}  // namespace dit::ui
