#include "ui/prompt_history.h"

#include <QDir>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>

#include "ui/json_io.h"

namespace dit::ui {

PromptHistory::PromptHistory(QString dataDir, int maxEntries)
    : dataDir_(dataDir.isEmpty() ? appDataDir() : dataDir), max_(maxEntries) {}

QString PromptHistory::file() const {
  return QDir(dataDir_).filePath(QStringLiteral("prompt-history.json"));
}

bool PromptHistory::load(QString* error) {
  prompts_.clear();
  if (!QFileInfo::exists(file())) return true;
  QJsonDocument doc;
  if (!readJsonFile(file(), &doc, error)) return false;
  for (const QJsonValue& v : doc.object().value("prompts").toArray())
    if (v.isString() && !v.toString().trimmed().isEmpty() && !prompts_.contains(v.toString()))
      prompts_ << v.toString();
  while (prompts_.size() > max_) prompts_.removeLast();
  return true;
}

bool PromptHistory::add(const QString& prompt, QString* error) {
  if (prompt.trimmed().isEmpty()) return true;
  if (!prompts_.isEmpty() && prompts_.first() == prompt) return true;
  prompts_.removeAll(prompt);
  prompts_.prepend(prompt);
  while (prompts_.size() > max_) prompts_.removeLast();
  return persist(error);
}

bool PromptHistory::clear(QString* error) {
  prompts_.clear();
  return persist(error);
}

bool PromptHistory::persist(QString* error) {
  return writeJsonAtomic(
      file(),
      QJsonDocument(QJsonObject{{"format", "ditstudio-prompt-history"},
                                {"version", 1},
                                {"prompts", QJsonArray::fromStringList(prompts_)}}),
      error);
}

}  // namespace dit::ui
