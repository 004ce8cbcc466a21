// Small JSON file helpers. Writes are atomic (QSaveFile: temporary file + rename), so a crash or a
// full disk never leaves a half-written presets or history file behind.
#pragma once

#include <QJsonDocument>
#include <QJsonObject>
#include <QString>
#include <nlohmann/json.hpp>

namespace dit::ui {

/// Writes `doc` (indented) to `path` atomically, creating the parent folder. Returns false and
/// sets `error` (if given) on failure; the previous file is then untouched.
bool writeJsonAtomic(const QString& path, const QJsonDocument& doc, QString* error = nullptr);
/// Reads a JSON document. Returns false and sets `error` for a missing file or invalid JSON.
bool readJsonFile(const QString& path, QJsonDocument* doc, QString* error = nullptr);
/// The application data folder (QStandardPaths::AppDataLocation), or $DITSTUDIO_DATA_DIR if set.
QString appDataDir();

/// Qt object -> nlohmann JSON (the protocol module's type), through compact JSON text: integers
/// stay integers (Qt 6 keeps qint64 exactly), doubles keep their shortest round-trip text.
nlohmann::json toNlohmann(const QJsonObject& o);
/// nlohmann JSON object -> Qt object. Integers up to 2^63-1 stay exact integers; unsigned
/// integers above 2^63-1 (seeds), which a QJsonValue could only hold as a rounded double, become
/// their decimal text (read them with seedFromQJson). A value that is not an object gives an
/// empty object.
QJsonObject toQJsonObject(const nlohmann::json& j);

}  // namespace dit::ui
