#include "ui/json_io.h"

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QSaveFile>
#include <QStandardPaths>
#include <cstdint>
#include <limits>
#include <string>

namespace dit::ui {

bool writeJsonAtomic(const QString& path, const QJsonDocument& doc, QString* error) {
  const QFileInfo fi(path);
  if (!QDir().mkpath(fi.absolutePath())) {
    if (error) *error = QStringLiteral("cannot create folder %1").arg(fi.absolutePath());
    return false;
  }
  QSaveFile f(path);
  if (!f.open(QIODevice::WriteOnly)) {
    if (error) *error = QStringLiteral("cannot write %1: %2").arg(path, f.errorString());
    return false;
  }
  const QByteArray bytes = doc.toJson(QJsonDocument::Indented);
  if (f.write(bytes) != bytes.size()) {
    if (error) *error = QStringLiteral("cannot write %1: %2").arg(path, f.errorString());
    f.cancelWriting();
    return false;
  }
  if (!f.commit()) {
    if (error) *error = QStringLiteral("cannot save %1: %2").arg(path, f.errorString());
    return false;
  }
  return true;
}

bool readJsonFile(const QString& path, QJsonDocument* doc, QString* error) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) {
    if (error) *error = QStringLiteral("cannot read %1: %2").arg(path, f.errorString());
    return false;
  }
  QJsonParseError pe;
  *doc = QJsonDocument::fromJson(f.readAll(), &pe);
  if (pe.error != QJsonParseError::NoError) {
    if (error)
      *error = QStringLiteral("%1 is not valid JSON: %2 at offset %3")
                   .arg(path, pe.errorString())
                   .arg(pe.offset);
    return false;
  }
  return true;
}

QString appDataDir() {
  const QString env = qEnvironmentVariable("DITSTUDIO_DATA_DIR");
  if (!env.isEmpty()) return env;
  QString dir = QStandardPaths::writableLocation(QStandardPaths::AppDataLocation);
  if (dir.isEmpty()) dir = QDir::home().filePath(QStringLiteral(".local/share/ditstudio"));
  return dir;
}

nlohmann::json toNlohmann(const QJsonObject& o) {
  const QByteArray text = QJsonDocument(o).toJson(QJsonDocument::Compact);
  return nlohmann::json::parse(text.constData(), text.constData() + text.size());
}

namespace {
// Unsigned integers Qt cannot hold exactly -> decimal text, recursively.
void bigIntegersToText(nlohmann::json& j) {
  if (j.is_number_unsigned()) {
    const auto v = j.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(std::numeric_limits<qint64>::max())) j = std::to_string(v);
  } else if (j.is_structured()) {
    for (auto& e : j) bigIntegersToText(e);
  }
}
}  // namespace

QJsonObject toQJsonObject(const nlohmann::json& in) {
  if (!in.is_object()) return {};
  nlohmann::json j = in;
  bigIntegersToText(j);
  const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return QJsonDocument::fromJson(QByteArray::fromStdString(text)).object();
}

}  // namespace dit::ui
