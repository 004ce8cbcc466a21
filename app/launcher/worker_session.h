// WorkerSession: one worker process group driven through the protocol (app/PROTOCOL.md), with no
// Qt and no threads of its own: the request queue (ids, held until `ready`, cancel), typed-event
// dispatch, the fatal-event dedup (abortGroup writes the event to stdout and stderr), the failure
// attribution (error event, mpirun's report, the rank's last stage) and the state machine
//   Stopped -> Starting -> Ready <-> Busy -> Stopping -> Stopped;  any unexpected exit -> Failed.
// ditstudio-cli, the GUI (ui/worker_controller: QSocketNotifiers on pollFds() and a QTimer on
// nextTimeout()) and a server (one poll() over several sessions' fds: pollSessions()) all drive
// groups through it, like stable-diffusion.cpp's server drives its AsyncJobManager.
// Not thread-safe: every call from the thread that polls it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "app/launcher/group_process.h"
#include "app/protocol/events.h"
#include "app/protocol/protocol.h"

namespace dit::launcher {

/// A failure to show to the user: from an `error` event, mpirun's stderr, or a failed start.
struct GroupFailure {
  std::string id;  ///< request id, empty when not tied to a request
  int rank = -1;   ///< failing rank, -1 when unknown
  std::int64_t pid = -1;
  std::string message;  ///< one sentence naming the rank and what it said
  std::string detail;   ///< extra lines (mpirun's report, last stderr lines)
  bool fatal = false;   ///< the process group is (going) down
  std::string host;     ///< a hostfile host mpirun could not reach (ssh's report), else empty
};

/// A queued generate request; `sent` once written to the worker (only after `ready`),
/// `accepted` once the worker's `accepted` event for it came.
struct QueuedRequest {
  protocol::GenerateRequest request;
  bool sent = false;
  bool accepted = false;
  int step = 0, steps = 0, image_index = 0;
  std::int64_t queue_position = -1;
  const std::string& id() const { return request.id; }
};

/// What starting a group needs: the mpirun argv (mpirunArgv) and extra environment.
struct SessionLaunch {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  int world = 0;  ///< ranks (mpirun -np), before the `hello`/`ready` events confirm it
};

/// Receives a session's news; every method has an empty default. Called from the session's
/// calls (onReadable, onTimeout, start, stop, ...), never from another thread.
class SessionObserver {
 public:
  enum class State { Stopped, Starting, Ready, Busy, Stopping, Failed };
  virtual ~SessionObserver() = default;
  virtual void stateChanged(State) {}
  /// The group's stage: "loading", "encoding", "denoising", "decoding", "idle" (from `status`
  /// events and rank 0's stage in `ranks`), "stopped" or "failed".
  virtual void stageChanged(const std::string&) {}
  /// Every event (each fatal error once), typed, after the session's bookkeeping of it (pids,
  /// world, ready info, the queue entry's step) and before its consequences (state, the
  /// request callbacks below).
  virtual void event(const protocol::Event&, const protocol::WorkerEvent&) {}
  virtual void queueChanged() {}
  virtual void requestDone(const std::string& /*id*/, double /*seconds*/) {}
  virtual void requestCancelled(const std::string& /*id*/, int /*step*/) {}
  /// A request ended in an error: a non-fatal `error` event with its id, or a refusal of its
  /// line (`"refused": true`) that names no id, which fails the oldest sent request the worker
  /// has not accepted (a refused line gets no `accepted`), so none stays running forever.
  virtual void requestFailed(const std::string& /*id*/, const std::string& /*message*/) {}
  /// An `error` event (fatal or not).
  virtual void errorReported(const GroupFailure&) {}
  /// The group ended without being asked to (crash, abort, failed start). When OpenMPI 5
  /// reported a peer's disconnect (RankFailure::peer_lost), the message names each rank on the
  /// peer host (when the report names none: each rank on a host other than the reporter's, by
  /// their hellos) as "rank R (pid P on H) disconnected" (RemoteRankWatch::rewrite() names it by
  /// its host's answer over ssh), then ": rank L (pid Q on M) lost its connection to it mid-run". A
  /// hostfile group that ends so (or with no cause named) before `ready` gets
  /// protocol::hostNetworkAdvice() appended, as the start-up collective timeout carries it.
  virtual void groupFailed(const GroupFailure&) {}
  /// The group ended after stop() (mpirun's exit code; 128 + signal when it was killed).
  virtual void groupStopped(int /*exitCode*/) {}
  /// A message of the launcher (rank -1) or of a rank's `log`/`error` event, with its level.
  virtual void logLine(int /*rank*/, const std::string& /*level*/, const std::string& /*text*/) {}
  /// A line of the group's output that is not an event (library noise, the ranks' stderr, text
  /// before an event on a merged line). Once a rank has reported a fatal error, the group's
  /// stderr (mpirun's and OpenMPI's reports of the teardown it causes) goes to logLine(-1,
  /// "debug", ...) instead: the error event is the cause, named once. So do OpenMPI's reports
  /// between rules of dashes whose cause the session names itself (parseHostFailure,
  /// parseMpirunFailure), and, after OpenMPI 5's peer-disconnect report, the lines of the abort
  /// it causes ("[host:00000] *** ...": isMpiAbortLine).
  virtual void outputLine(GroupProcess::Stream, const std::string&) {}
  /// pollFds() changed (a group started, a stream ended, the group exited).
  virtual void fdsChanged() {}
};

class WorkerSession {
 public:
  using State = SessionObserver::State;

  /// `idTag` ends every request id ("r<n>-<tag>"); "" = the creation time (MMddHHmmss) plus four
  /// random hex digits, so ids (and the image files named after them) differ across launches.
  explicit WorkerSession(SessionObserver* observer = nullptr, std::string idTag = {});
  /// Ends a running group: cancel lines for the sent requests, then the teardown policy with
  /// a 2 s grace and SIGKILL 2 s after SIGTERM (blocking, bounded).
  ~WorkerSession();
  WorkerSession(const WorkerSession&) = delete;
  WorkerSession& operator=(const WorkerSession&) = delete;

  void setObserver(SessionObserver* o) { observer_ = o ? o : &none_; }
  /// Delays of the teardown policy after a fatal error event (default: 10 s, then SIGKILL, no
  /// SIGTERM first): mpirun normally exits within seconds, but it can wait forever on a host it
  /// cannot reach, and a SIGTERM then crashes it (a backtrace instead of the named cause).
  void setFatalTeardown(GroupProcess::Teardown t) { fatalTeardown_ = t; }
  /// Called on each generate request just before it is written (output folder, preview
  /// cadence, ...); may be empty.
  std::function<void(protocol::GenerateRequest&)> prepareRequest;
  /// When the group fails before `ready` (a host that cannot be reached, a model that does not
  /// load), the requests it never received stay queued for the next start instead of failing
  /// (the GUI's choice; off: every queued request fails with the group).
  bool keepUnsentOnFailedStart = false;

  /// Starts the group. False (nothing emitted) when one is running or `launch.argv` is empty. A
  /// program that cannot be executed returns true and reports groupFailed ("cannot start ...").
  /// Requests sent to an earlier group are dropped (requestCancelled): never re-run by
  /// themselves.
  bool start(const SessionLaunch& launch);
  /// Stop = cancel: requests not yet sent are dropped (requestCancelled), sent ones get a
  /// `cancel`, then `shutdown`; the teardown policy follows (SIGTERM to the process group and
  /// its descendants after `grace`, SIGKILL 3 s later).
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(5000));
  /// stop() then start(launch) once the old group has exited (or start now if none runs).
  /// Unsent requests stay queued for the new group; in-flight ones are reported cancelled.
  void restart(const SessionLaunch& launch);
  /// restart() without the new group: in-flight requests are reported cancelled, unsent ones
  /// stay queued, and the group is stopped; nothing starts by itself (the caller's start()
  /// follows, e.g. once a hostfile group's pre-flight passed). Nothing when no group runs.
  void stopForRestart();
  /// Once the queue is empty (every request done, cancelled or failed) the group is stopped
  /// (the CLI's single request).
  void stopWhenIdle();

  /// Queues a generate request (held until `ready`). An empty id gets "r<n>-<tag>". Returns it.
  std::string submit(protocol::GenerateRequest request);
  /// Unsent: dropped here; sent: a `cancel` line. False for an unknown id.
  bool cancel(const std::string& id);
  void cancelAll();

  // --- the poll loop ------------------------------------------------------------------------
  enum class FdKind { Stdout, Stderr, Exit };
  struct PollFd {
    int fd;
    FdKind kind;
  };
  /// The fds to watch for reading (changes are announced by fdsChanged()).
  std::vector<PollFd> pollFds() const;
  /// One of pollFds() is readable (or at its end).
  void onReadable(int fd);
  /// When onTimeout() has work (teardown deadlines, exit polling without a pidfd); nullopt:
  /// none.
  std::optional<SteadyClock::time_point> nextTimeout() const;
  /// Runs due deadlines and notices an exit.
  void onTimeout();
  /// poll() over this session's fds for at most `maxWait`, then the handlers above.
  void pollOnce(std::chrono::milliseconds maxWait);
  /// Test hook: handles `bytes` as if the group had written them to stdout.
  void feedStdout(std::string_view bytes);

  // --- state ---------------------------------------------------------------------------------
  State state() const { return state_; }
  static const char* stateName(State s);
  bool isRunning() const { return process_.running(); }
  const std::vector<QueuedRequest>& queue() const { return queue_; }
  /// The first sent request (the one computing); "" when idle.
  std::string activeId() const;
  const std::string& stage() const { return stage_; }
  const std::string& idTag() const { return idTag_; }
  int world() const { return world_; }
  const std::map<int, std::int64_t>& rankPids() const { return pids_; }
  /// Each rank's host name as its `hello` event gave it (rank -> host; ranks without one left
  /// out).
  const std::map<int, std::string>& rankHosts() const { return hosts_; }
  /// The `ready` event's object (null before).
  const nlohmann::json& readyInfo() const { return readyInfo_; }
  const GroupFailure& lastFailure() const { return lastFailure_; }
  double elapsedSeconds() const;
  const std::string& stderrTail() const { return process_.stderrTail(); }
  std::optional<ExitStatus> exitStatus() const { return process_.exitStatus(); }
  const GroupProcess& process() const { return process_; }

 private:
  void setState(State s);
  void setStage(const std::string& s);
  void shutdownGroup(std::chrono::milliseconds grace, bool dropUnsent);
  void restartTo(const std::optional<SessionLaunch>& launch);
  void dropSent();
  void flushQueue();
  bool writeRequest(const protocol::Request& r);
  void updateBusy();
  int indexOf(const std::string& id) const;
  void failAll(const std::string& message);
  void handleStdoutLine(const std::string& line);
  void handleStderrLine(const std::string& line);
  void flushHelp();
  void handleEvent(const protocol::Event& ev);
  void handleError(const protocol::ErrorEvent& e);
  bool isRepeatedFatal(const protocol::Event& ev) const;
  void handleExit();
  void maybeStopWhenIdle();
  void advanceTeardown();
  GroupFailure crashFailure(const ExitStatus& status, bool wasReady) const;
  std::string peerLostMessage(const RankFailure& mp, GroupFailure& f) const;
  bool peerLostReported() const;

  SessionObserver none_;
  SessionObserver* observer_;
  GroupProcess process_;
  State state_ = State::Stopped;
  std::string stage_, idTag_;
  std::optional<SessionLaunch> pendingRestart_;
  bool stopRequested_ = false, sawReady_ = false, sawBye_ = false, stopWhenIdle_ = false;
  bool exitHandled_ = true;
  bool hostfileGroup_ = false;  ///< the launch names a hostfile (ranks on several hosts)
  std::map<int, std::int64_t> pids_;
  std::map<int, std::string> hosts_;
  std::map<int, protocol::RankStats> lastRanks_;
  int world_ = 0;
  nlohmann::json readyInfo_;
  /// The group's first fatal error event: the cause the session reports when the group ends.
  /// Later fatal errors are the teardown's consequences (a stopped rank that MPI_Abort's SIGCONT
  /// wakes finds its own collective timed out, issue 45) and never replace it.
  std::optional<GroupFailure> fatalEvent_;
  /// Every fatal error event seen (rank, message as rankMessage() words it): a rank's second copy
  /// of one (abortGroup writes it to stdout and stderr) is dropped.
  std::vector<std::pair<int, std::string>> fatalSeen_;
  GroupFailure lastFailure_;
  std::vector<QueuedRequest> queue_;
  int nextId_ = 1;
  std::optional<SteadyClock::time_point> started_;
  GroupProcess::Teardown fatalTeardown_{std::chrono::seconds(10), std::chrono::seconds(5),
                                        /*sigterm=*/false};
  LineBuffer fed_;                 ///< feedStdout()'s partial line
  bool inHelp_ = false;            ///< inside one of OpenMPI's blocks between rules of dashes
  std::vector<std::string> help_;  ///< that block's lines so far
};

/// One poll() over several sessions' fds (a server's groups), then each session's handlers;
/// waits at most `maxWait` (less when a session has a deadline).
void pollSessions(const std::vector<WorkerSession*>& sessions, std::chrono::milliseconds maxWait);

}  // namespace dit::launcher
