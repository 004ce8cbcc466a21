// WorkerController: the Qt adapter of dit_launcher's WorkerSession (app/launcher/worker_session.h),
// which owns the mpirun process group (in its own process group), the request queue, the typed
// events, the fatal-event dedup and the teardown policy shared with ditstudio-cli. This class
// watches the session's fds with QSocketNotifiers and its deadlines with a QTimer, and turns the
// session's news into Qt signals and types. Never blocks the event loop (the destructor is the one
// place that waits, bounded).
#pragma once

#include <QImage>
#include <QJsonObject>
#include <QList>
#include <QMap>
#include <QObject>
#include <QSocketNotifier>
#include <QString>
#include <QTimer>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "app/launcher/group_start.h"
#include "app/launcher/host_group.h"
#include "app/launcher/worker_session.h"
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
  QString host;        ///< a hostfile host mpirun could not reach (ssh's report), else empty
};

/// Controls one worker process group. States: Stopped -> Starting (mpirun running, model loading)
/// -> Ready (idle) <-> Busy (requests in flight) -> Stopping -> Stopped; an unexpected exit ->
/// Failed (start() again recovers). Requests queued while a group fails to start (an unreachable
/// host, a model that does not load) were never sent: they stay queued for the next start.
/// Every group is put together by dit_launcher's one group start (launcher::prepareGroup, the CLI's
/// and the server's too). Hostfile groups (docs/multi-host.md) share ditstudio-cli's checks,
/// run off the UI thread: start() first runs the pre-flight (checkingHosts(); mpirun starts only
/// when every other host passed, else hostCheckFailed), and while the group computes without an
/// event for RemoteRankWatch::stallAfter() seconds the other hosts are asked over ssh about their
/// ranks; a fatal error naming a rank "on another host that did not answer" is held back until
/// that rank is named by its host's answer (stopped, exited, or the host cut off), then
/// errorReported and groupFailed carry the CLI's words; so is a group failure naming a rank that
/// "disconnected" (OpenMPI 5's peer-disconnect report): its log line, request failures and
/// groupFailed.
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
  /// Shuts a running group down: cancel lines, shutdown, then SIGTERM and SIGKILL to mpirun's
  /// process group and every descendant (the session's teardown policy; at most ~5 s).
  ~WorkerController() override;

  /// Starts mpirun with `config`. Returns false (and emits nothing) if a group is running or its
  /// hosts are being checked. With a hostfile (and preflight()), the hostfile plan and the
  /// pre-flight of every other host run first on a worker thread (ssh, at most 20 s a host):
  /// hostCheckChanged(true), then hostCheckPassed and the group starts, or hostCheckFailed and
  /// nothing starts (queued requests stay queued); true is returned as soon as the check runs.
  bool start(const LaunchConfig& config);
  /// Stops the group: requests not yet sent are dropped (requestCancelled), the running and the
  /// worker-queued ones get {"type":"cancel"} (the worker stops at the next denoising step), then
  /// {"type":"shutdown"}; after `graceMs` mpirun's process group and every descendant get SIGTERM,
  /// 3 s later SIGKILL (the teardown policy of dit_launcher's GroupProcess). Requests that
  /// were interrupted are never sent again by a later start(). During the hostfile pre-flight:
  /// the check is abandoned (its result ignored, no group starts) and the queued requests are
  /// dropped (requestCancelled).
  void stop(int graceMs = 5000);
  /// stop() then start(config) once the old group has exited (or start now if none runs).
  /// Unsent requests stay queued; in-flight ones are reported cancelled.
  void restart(const LaunchConfig& config);

  /// Queues another front end's request (the Serve API's jobs, app/server's Pool through an
  /// AttachedGroup) in this group's queue, beside the window's own: its id (an empty one gets the
  /// window's kind), output folder and preview cadence are kept as given (the window's settings
  /// apply to its own requests only). It shows in queue() and the window's signals like the
  /// window's requests. Returns its id.
  QString submitRequest(dit::protocol::GenerateRequest request);
  /// Another observer of this group's session (the Serve API's pool): it gets every callback of
  /// launcher::SessionObserver on this thread, after the controller's bookkeeping and with the
  /// failures of requests and of the group in the words the window shows (a silent remote rank
  /// named by its host). On adding, it is told the group's state, stage and, when the group is
  /// ready, its ready event. Not owned; remove it before it is destroyed.
  void addObserver(dit::launcher::SessionObserver* observer);
  void removeObserver(dit::launcher::SessionObserver* observer);

  /// Queues a generate request; it is written when the group is ready. Returns its id, unique
  /// across launches ("r<n>-<launch tag>", the tag from this controller's creation time plus a
  /// random part), so image files named after it never collide with an earlier launch's.
  QString submit(const GenerationParams& params);
  /// The launch tag in every request id of this controller (e.g. "1201061230a7").
  QString launchTag() const { return QString::fromStdString(session_.idTag()); }
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

  /// True while start() runs the hostfile pre-flight (no group runs yet).
  bool checkingHosts() const { return checking_; }
  /// Whether start() runs the pre-flight of a hostfile group's other hosts (default on; the
  /// hostfile is planned and the port range checked either way). ditstudio-cli's --no-preflight.
  void setPreflight(bool on) { preflight_ = on; }
  bool preflight() const { return preflight_; }
  /// The running hostfile group's ranks per host ("H1: rank 0; H2: rank 1"), empty otherwise.
  QString hostPlan() const;
  /// How a hostfile group's other hosts are asked about a rank's process (the stall check and
  /// the naming of a silent rank, off the UI thread): empty (the default) asks over ssh
  /// (launcher::remoteProcessState, at most 10 s a host); tests inject a fake. Applies to the
  /// groups started after the call.
  void setRemoteStateQuery(dit::launcher::RemoteRankWatch::StateQuery query) {
    stateQuery_ = std::move(query);
  }

  State state() const;
  static QString stateName(State s);
  bool isRunning() const { return session_.isRunning(); }
  /// Config of the group that runs (or last ran).
  const LaunchConfig& config() const { return config_; }
  const LaunchCommand& command() const { return command_; }
  /// pid of each rank, from `hello` events.
  QMap<int, qint64> rankPids() const;
  int world() const { return session_.world(); }
  /// The `ready` event of the running group (empty before).
  QJsonObject readyInfo() const { return readyInfo_; }
  QList<Request> queue() const;
  /// Id of the request being computed (first sent one), empty when idle.
  QString activeId() const;
  /// The group's current stage: "loading", "encoding", "denoising", "decoding", "idle" (from the
  /// worker's `status` events and rank 0's stage in `ranks` events), "stopped" or "failed"; empty
  /// before the first event.
  QString stage() const { return QString::fromStdString(session_.stage()); }
  /// Last failure (empty message when none).
  WorkerFailure lastFailure() const { return toQt(session_.lastFailure()); }
  /// Seconds since start().
  double elapsedSeconds() const;
  /// mpirun's stderr (last 64 KiB).
  QString stderrTail() const { return QString::fromLocal8Bit(session_.stderrTail()); }
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
  /// The hostfile pre-flight began (true) or ended (false: passed, failed or abandoned).
  void hostCheckChanged(bool checking);
  /// Every other host passed the pre-flight; `plan`: the ranks of each host. The group starts.
  void hostCheckPassed(const QString& plan);
  /// The hostfile cannot be used or a host failed the pre-flight: `host` (empty when the
  /// hostfile itself is at fault) and the message naming the host, the cause and the fix.
  void hostCheckFailed(const QString& host, const QString& message);
  /// A log line: rank -1 for the launcher; level "stderr", "stdout" (noise) or the event's level.
  void logLine(int rank, const QString& level, const QString& message);

 private:
  class View;
  friend class View;
  /// Watches the session's current fds (after a group starts, a stream ends, the group exits).
  void syncNotifiers();
  /// Arms the timer for the session's next deadline.
  void armTimer();
  void handleStdout(const QByteArray& bytes);
  WorkerFailure toQt(const dit::launcher::GroupFailure& f) const;
  /// `message` as the hosts named it (a fatal error naming a silent remote rank), else as it is.
  QString namedMessage(const std::string& message) const;
  /// Starts the session of a prepared group (after the pre-flight for a hostfile group).
  bool startSession(const LaunchConfig& config, const dit::launcher::PreparedGroup& group);
  /// requestFailed / groupFailed to the window and the other observers, in the named words.
  void emitRequestFailed(const std::string& id, const std::string& message);
  void emitGroupFailed(const dit::launcher::GroupFailure& f);
  /// Abandons a running pre-flight (its result is ignored).
  void abandonHostCheck();
  /// The stall check: asks the other hosts off the UI thread when the group stalls.
  void checkStall();
  /// A fatal error naming a silent remote rank (or, `reportError` false, the group's failure
  /// naming a disconnected one: its error log line): named off the UI thread, then emitted
  /// (errorReported, or the log line), with the request failures and groupFailed held meanwhile.
  void nameSilentRanks(const dit::launcher::GroupFailure& f, bool reportError = true);

  struct HostCheckOutcome {
    dit::launcher::PreparedGroup group;  ///< launcher::prepareGroup's result when it passed
    std::string error;  ///< a host failed, the hostfile or port range refused, or the model
                        ///< not fingerprinted
    std::string host;   ///< the host that failed its pre-flight ("" for the hostfile's fault)
  };

  std::unique_ptr<View> view_;
  dit::launcher::WorkerSession session_;
  LaunchConfig config_;
  LaunchCommand command_;
  std::optional<std::pair<LaunchConfig, LaunchCommand>> pendingRestart_;
  QJsonObject readyInfo_;
  QString outputDir_;
  int previewEvery_ = 1;
  int maxSequenceLength_ = 0;
  QList<QSocketNotifier*> notifiers_;
  QTimer timer_;
  // Hostfile groups: the pre-flight, the stall check and the naming of a silent rank.
  bool preflight_ = true;
  bool checking_ = false;
  std::shared_ptr<std::atomic<bool>> checkCancelled_;
  quint64 checkSerial_ = 0;  ///< which start()'s pre-flight counts (older ones are abandoned)
  std::shared_ptr<dit::launcher::RemoteRankWatch> watch_;
  dit::launcher::RemoteRankWatch::StateQuery stateQuery_;
  std::chrono::seconds stall_{60};
  QTimer stallTimer_;
  std::optional<LaunchConfig> pendingHostStart_;  ///< restart() of a hostfile group
  bool naming_ = false;
  quint64 namingSerial_ = 0;  ///< a fatal error is being named (held back until then)
  std::optional<dit::launcher::GroupFailure> heldError_, heldFailure_;
  bool heldIsError_ = true;  ///< heldError_ is an error event's (else the group's failure line)
  std::vector<std::pair<std::string, std::string>> heldRequestFailures_;  ///< id, message
  std::map<std::string, std::string> named_;           ///< fatal messages as named by the hosts
  std::vector<dit::launcher::SessionObserver*> taps_;  ///< addObserver()'s
  std::set<std::string> external_;  ///< ids of submitRequest()'s requests not finished yet
};

}  // namespace dit::ui

Q_DECLARE_METATYPE(dit::ui::ImageResult)
Q_DECLARE_METATYPE(dit::ui::WorkerFailure)
Q_DECLARE_METATYPE(dit::ui::RankStats)
