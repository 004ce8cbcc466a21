// Qt adapters over the protocol module (app/protocol/): the worker's stdout event stream and
// mpirun's failure reports (app/PROTOCOL.md). Parsing itself is dit::protocol's; this header
// converts to Qt types. Pure functions, no I/O: unit-tested with noise lines and partial chunks.
#pragma once

#include <QByteArray>
#include <QJsonObject>
#include <QList>
#include <QString>
#include <optional>
#include <string_view>

#include "app/launcher/launch.h"
#include "app/protocol/protocol.h"

namespace dit::ui {

/// The prefix that marks an event line on the worker's stdout (dit::protocol::kEventPrefix).
inline constexpr std::string_view kEventPrefix = dit::protocol::kEventPrefix;

/// One event: `type` is the event name ("hello", "ready", "ranks", "image", ...) from the JSON
/// "event" field (or "type"), `data` the whole JSON object.
struct WorkerEvent {
  QString type;
  QJsonObject data;
};

/// dit::protocol::parseEventLine with the object as a QJsonObject (integers up to 2^63-1 exact):
/// nullopt for library noise and truncated JSON; tolerates "\r\n", leading whitespace and an
/// OpenMPI --tag-output prefix such as "[1,0]<stdout>:".
std::optional<WorkerEvent> parseEventLine(const QByteArray& line);

/// dit::protocol::findEventInLine (an event after log text or inside a cut event on the same
/// line) with the event converted: `offset` is the byte offset of its "@@DIT " marker in `line`.
struct WorkerEventInLine {
  qsizetype offset = 0;
  WorkerEvent event;
};
std::optional<WorkerEventInLine> findEventInLine(const QByteArray& line);

/// Splits a byte stream into complete lines; keeps a trailing partial line for the next chunk.
class LineSplitter {
 public:
  /// Appends `chunk` and returns the complete lines in it (without "\n"; "\r" stripped).
  QList<QByteArray> feed(const QByteArray& chunk);
  /// Returns and clears what is left (a last line without "\n"), empty if none.
  QByteArray flush();

 private:
  QByteArray buffer_;
};

/// Per-rank figures of a `ranks` event. Bytes and milliseconds; -1 when the worker omitted one.
struct RankStats {
  int rank = -1;
  QString stage;
  int step = 0;
  int steps = 0;
  qint64 rss = -1;
  qint64 rss_peak = -1;
  qint64 dev = -1;
  qint64 dev_peak = -1;
  qint64 bytes_sent = -1;
  double step_ms = -1;
};

/// dit::protocol::parseRanks of a `ranks` event (entries without "rank" are skipped).
QList<RankStats> parseRanks(const QJsonObject& event);

/// A failed rank as reported by mpirun on stderr.
struct RankFailure {
  int rank = -1;       ///< MPI_COMM_WORLD rank, -1 when mpirun did not name one
  qint64 pid = -1;     ///< pid of the rank, -1 when not reported
  int signal = -1;     ///< terminating signal, -1 when it exited
  int exit_code = -1;  ///< exit status, -1 when not reported
  QString node;        ///< host name when reported
  QString
      reason;  ///< one-sentence summary, e.g. "rank 1 (pid 4242) was killed by signal 9 (Killed)"
};

/// dit::launcher::parseMpirunFailure (OpenMPI 4 and 5 wordings; the CLI uses the same parser) with
/// Qt types. Returns nullopt when no report is present.
std::optional<RankFailure> parseMpirunFailure(const QString& stderrText);

/// Rank named by a log line, from the worker's spdlog pattern "[rank r/N]" or an OpenMPI tag
/// "[job,r]<stderr>:"; -1 if none.
int rankOfLogLine(const QString& line);

}  // namespace dit::ui
