// Prompt history: the prompts the user generated with, newest first, without repeats, kept in
// <data dir>/prompt-history.json (written atomically). The generation panel offers them in the
// menu of its "History" button.
#pragma once

#include <QString>
#include <QStringList>

namespace dit::ui {

class PromptHistory {
 public:
  explicit PromptHistory(QString dataDir = QString(), int maxEntries = 50);
  /// Reads the file; a missing file is an empty history.
  bool load(QString* error = nullptr);
  /// Moves `prompt` to the front (adding it when new; blank prompts are ignored) and saves.
  bool add(const QString& prompt, QString* error = nullptr);
  bool clear(QString* error = nullptr);
  const QStringList& prompts() const { return prompts_; }
  QString file() const;

 private:
  bool persist(QString* error);
  QString dataDir_;
  int max_;
  QStringList prompts_;
};

}  // namespace dit::ui
