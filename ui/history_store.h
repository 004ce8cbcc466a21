// History of generated images (persisted as <data dir>/history.json, written atomically), and
// reading generation parameters back from a PNG's "parameters" text chunk.
#pragma once

#include <QDateTime>
#include <QJsonObject>
#include <QList>
#include <QString>
#include <cstdint>

#include "ui/generation_params.h"

namespace dit::ui {

/// One generated image.
struct HistoryEntry {
  QString path;  ///< PNG file
  QString requestId;
  std::uint64_t seed = 0;  ///< seed actually used (exact; stored as decimal text)
  bool hasSeed = false;    ///< false when unknown
  QJsonObject params;      ///< the parameters object (prompt, width, ..., model, strategy)
  double seconds = 0;      ///< generation time
  QDateTime created;

  QJsonObject toJson() const;
  static HistoryEntry fromJson(const QJsonObject& j);
  /// Generation parameters with the used seed fixed (for "open parameters").
  GenerationParams generation(const GenerationParams& defaults = {}) const;
};

/// Newest-first list of images, capped at `maxEntries`.
class HistoryStore {
 public:
  explicit HistoryStore(QString dataDir = QString(), int maxEntries = 1000);
  /// Reads history.json; a missing file is an empty history.
  bool load(QString* error = nullptr);
  /// Prepends an entry and saves.
  bool add(const HistoryEntry& e, QString* error = nullptr);
  /// Removes the entry with `path` (the PNG stays on disk) and saves.
  bool remove(const QString& path, QString* error = nullptr);
  bool clear(QString* error = nullptr);
  const QList<HistoryEntry>& entries() const { return entries_; }
  QString file() const;

 private:
  bool persist(QString* error);
  QString dataDir_;
  int max_;
  QList<HistoryEntry> entries_;
};

/// The text of one searchable field of `e`: "prompt" (and the negative prompt), "model" (the
/// model folder), "strategy" (e.g. "2 ranks (cpu): ring 2"), "seed", "date" (created, as
/// "yyyy-MM-dd HH:mm"), "id" (request id) or "file" (the PNG's name).
QString historyField(const HistoryEntry& e, const QString& field);
/// The gallery's search: whitespace-separated terms (double quotes keep spaces), each of which
/// must match, case-insensitively, as a substring. "field:value" looks in one field of
/// historyField() (prompt:, model:, strategy:, seed:, date:, id:, file:), a bare term in any of
/// them. An empty query matches everything.
bool historyMatches(const HistoryEntry& e, const QString& query);

/// The "parameters" text chunk of a PNG, parsed as a JSON object (a seed above 2^63-1 as its
/// decimal text, exact; see toQJsonObject). Returns an empty object and sets `error` when the
/// file is unreadable or has no such chunk.
QJsonObject readPngParameters(const QString& path, QString* error = nullptr);

}  // namespace dit::ui
