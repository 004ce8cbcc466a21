// WorkerController: owns the mpirun process group (QProcess), writes JSON-line requests to its
// stdin, parses `@@DIT ` events from its stdout (other stdout lines are noise), keeps stderr for
// the log and for naming a crashed rank, and keeps the request queue. Never blocks the event loop
// (the destructor is the one place that waits, bounded).
#pragma once

#include <QElapsedTimer>
#include <QImage>
#include <QJsonObject>
#include <QList>
#include <QMap>
#include <QObject>
#include <QProcess>
#include <QString>
#include <QTimer>
#include <cstdint>
#include <optional>

#include "ui/event_parser.h"
#include "ui/generation_params.h"
#include "ui/worker_command.h"

namespace dit::ui {

/// A finished image (`image` event).
struct ImageResult {
  QString id;
  int image_index = 0;
  QString path;            ///< PNG written by the worker, with a "parameters" text chunk
  std::uint64_t seed = 0;  ///< the seed actually used (exact: never through a double)
  bool hasSeed = false;    ///< false when the event had no readable seed
  QJsonObject params;      ///< parameters as the worker reports them
  double seconds = 0;
};

/// A failure to show to the user: from an `error` event, mpirun's stderr, or QProcess.
struct WorkerFailure {
  QString id;          ///< request id, empty when not tied to a request
  int rank = -1;       ///< failing rank, -1 when unknown
  qint64 pid = -1;     ///< pid of that rank when known
  QString message;     ///< one sentence naming the rank and what it said
  QString detail;      ///< extra lines (mpirun's report, last stderr lines)
  bool fatal = false;  ///< the process group is (going) down
};

/// Controls one worker process group. States: Stopped -> Starting (mpirun running, model loading)
/// -> Ready (idle) <-> Busy (requests in flight) -> Stopping -> Stopped; an unexpected exit ->
/// Failed (start() again recovers).
class WorkerController : public QObject {
  Q_OBJECT
 public:
  enum class State { Stopped, Starting, Ready, Busy, Stopping, Failed };
  Q_ENUM(State)

  /// A queued request: `sent` once written to the worker (sent only after `ready`).
  struct Request {
    QString id;
    GenerationParams params;
    bool sent = false;
    int step = 0;
    int steps = 0;
    int image_index = 0;
    int queue_position = -1;
  };

  explicit WorkerController(QObject* parent = nullptr);
  /// Shuts a running group down (shutdown request, then SIGTERM, then SIGKILL; at most ~6 s).
  ~WorkerController() override;

  /// Starts mpirun with `config`. Returns false (and emits nothing) if a group is running.
  bool start(const LaunchConfig& config);
  /// Stops the group: requests not yet sent are dropped (requestCancelled), the running and the
  /// worker-queued ones get {"type":"cancel"} (the worker stops at the next denoising step), then
  /// {"type":"shutdown"}; mpirun is terminated after `graceMs` and killed 3 s later. Requests that
  /// were interrupted are never sent again by a later start().
  void stop(int graceMs = 5000);
  /// stop() then start(config) once the old group has exited (or start now if none runs).
  /// Unsent requests stay queued; in-flight ones are reported cancelled.
  void restart(const LaunchConfig& config);

  /// Queues a generate request; it is written when the group is ready. Returns its id, unique
  /// across launches ("r<n>-<launch tag>", the tag from this controller's creation time plus a
  /// random part), so image files named after it never collide with an earlier launch's.
  QString submit(const GenerationParams& params);
  /// The launch tag in every request id of this controller (e.g. "1201061230a7").
  QString launchTag() const { return launchTag_; }
  /// Cancels a request: unsent ones are dropped here, sent ones get {"type":"cancel","id":..}.
  /// Returns false for an unknown id.
  bool cancel(const QString& id);
  /// Cancels every queued request.
  void cancelAll();

  /// Directory the worker writes PNGs to (`output_dir` of each request).
  void setOutputDir(const QString& dir) { outputDir_ = dir; }
  QString outputDir() const { return outputDir_; }
  /// Preview cadence in steps (0 disables previews).
  void setPreviewEvery(int steps) { previewEvery_ = steps; }
  /// T5 sequence length sent with each request (0: the model's default).
  void setMaxSequenceLength(int n) { maxSequenceLength_ = n; }

  State state() const { return state_; }
  static QString stateName(State s);
  bool isRunning() const { return process_ && process_->state() != QProcess::NotRunning; }
  /// Config of the group that runs (or last ran).
  const LaunchConfig& config() const { return config_; }
  const LaunchCommand& command() const { return command_; }
  /// pid of each rank, from `hello` events.
  QMap<int, qint64> rankPids() const { return pids_; }
  int world() const { return world_; }
  /// The `ready` event of the running group (empty before).
  QJsonObject readyInfo() const { return readyInfo_; }
  QList<Request> queue() const { return queue_; }
  /// Id of the request being computed (first sent one), empty when idle.
  QString activeId() const;
  /// The group's current stage: "loading", "encoding", "denoising", "decoding", "idle" (from the
  /// worker's `status` events and rank 0's stage in `ranks` events), "stopped" or "failed"; empty
  /// before the first event.
  QString stage() const { return stage_; }
  /// Last failure (empty message when none).
  WorkerFailure lastFailure() const { return lastFailure_; }
  /// Seconds since start().
  double elapsedSeconds() const;
  /// mpirun's stderr (last 64 KiB).
  QString stderrTail() const { return QString::fromLocal8Bit(stderrTail_); }
  /// Feeds stdout bytes as if they came from the worker (used by tests).
  void feedStdoutForTest(const QByteArray& bytes) { handleStdout(bytes); }

 Q_SIGNALS:
  void stateChanged(dit::ui::WorkerController::State state);
  /// Every parsed event, before the typed signals below.
  void eventReceived(const dit::ui::WorkerEvent& event);
  void helloReceived(int rank, int world, qint64 pid);
  void readyReceived(const QJsonObject& info);
  void statusReceived(const QString& stage, const QString& message);
  /// stage() changed.
  void stageChanged(const QString& stage);
  void ranksUpdated(const QList<dit::ui::RankStats>& ranks);
  void queueChanged();
  void progressReceived(const QString& id, int step, int steps, double stepMs, double etaSeconds,
                        int imageIndex);
  void previewReceived(const QString& id, int step, int imageIndex, const QImage& image);
  void imageReceived(const dit::ui::ImageResult& image);
  void requestDone(const QString& id, double seconds);
  void requestCancelled(const QString& id, int step);
  void requestFailed(const QString& id, const QString& message);
  /// An `error` event (fatal or not) or a start failure.
  void errorReported(const dit::ui::WorkerFailure& failure);
  /// The group ended without being asked to (crash, abort, failed start).
  void groupFailed(const dit::ui::WorkerFailure& failure);
  /// The group ended after stop() (exit code of mpirun).
  void groupStopped(int exitCode);
  /// A log line: rank -1 for the launcher; level "stderr", "stdout" (noise) or the event's level.
  void logLine(int rank, const QString& level, const QString& message);

 private:
  void setState(State s);
  /// stop() without forgetting a pending restart; `dropUnsent` false keeps the requests not yet
  /// sent for the next group (restart).
  void shutdownGroup(int graceMs, bool dropUnsent);
  void setStage(const QString& stage);
  /// Drops the requests already written to a group that is gone (reported cancelled): they are
  /// never re-sent to the next group.
  void dropSent();
  void handleStdout(const QByteArray& bytes);
  void handleStderr(const QByteArray& bytes);
  void handleEvent(const WorkerEvent& ev);
  /// True for a fatal `error` event equal (rank, message) to the one already handled: abortGroup
  /// writes it to stdout and to stderr.
  bool isRepeatedFatalError(const WorkerEvent& ev) const;
  void handleFinished(int exitCode, QProcess::ExitStatus status);
  void handleProcessError(QProcess::ProcessError error);
  void flushQueue();
  bool writeLine(const dit::protocol::Request& request);
  void updateBusy();
  int indexOf(const QString& id) const;
  void failAll(const QString& message);
  WorkerFailure buildCrashFailure(int exitCode, QProcess::ExitStatus status) const;

  QProcess* process_ = nullptr;
  State state_ = State::Stopped;
  LaunchConfig config_;
  LaunchCommand command_;
  std::optional<LaunchConfig> pendingRestart_;
  bool stopRequested_ = false;
  bool sawBye_ = false;
  bool sawReady_ = false;
  LineSplitter out_, err_;
  QByteArray stderrTail_;
  QMap<int, qint64> pids_;
  QMap<int, RankStats> lastRanks_;
  int world_ = 0;
  QJsonObject readyInfo_;
  std::optional<WorkerFailure> fatalEvent_;
  WorkerFailure lastFailure_;
  QList<Request> queue_;
  int nextId_ = 1;
  QString launchTag_;
  QString stage_;
  QString outputDir_;
  int previewEvery_ = 1;
  int maxSequenceLength_ = 0;
  QTimer terminateTimer_;
  QTimer killTimer_;
  QElapsedTimer clock_;
};

}  // namespace dit::ui

Q_DECLARE_METATYPE(dit::ui::ImageResult)
Q_DECLARE_METATYPE(dit::ui::WorkerFailure)
Q_DECLARE_METATYPE(dit::ui::RankStats)
