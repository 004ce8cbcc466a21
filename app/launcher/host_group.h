// A hostfile group's checks shared by ditstudio-cli and the GUI (issues 18 and 36): the plan of
// the hostfile with the pre-flight of every other host before mpirun starts
// (checkHostGroup), and, while the group runs, RemoteRankWatch: the other hosts asked over ssh
// about their ranks' processes when the group stalls, and a fatal error's clause "rank R (pid P
// on H) is on another host that did not answer (is the link to it up?)" named by what H said
// (stopped, exited, or H not answering over ssh either).
// Part of dit_launcher (app/launcher/): no Torch, no Qt.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "app/launcher/group_process.h"
#include "app/launcher/launch.h"
#include "app/launcher/preflight.h"

namespace dit::launcher {

/// The ranks of each host of a hostfile, as planHostfile() returns them: pairs of {host, ranks}
/// in hostfile order (a host may hold no rank).
using HostPlan = std::vector<std::pair<std::string, std::vector<int>>>;

/// "H1: rank 0 1; H2: rank 2" (hosts without a rank left out).
std::string describeHostPlan(const HostPlan& plan);

/// The host `plan` puts `rank` on; "" when it names none.
std::string hostOfRank(const HostPlan& plan, int rank);

/// What checkHostGroup() found.
struct HostGroupCheck {
  HostPlan plan;                       ///< the ranks of each host
  std::vector<PreflightResult> hosts;  ///< one per host checked over ssh, in hostfile order
  bool ok() const;                     ///< every host checked passed (true when none was)
  /// "" when ok(); else "pre-flight failed:\n" and each failed host's message (naming the host,
  /// the cause and the fix), one a line.
  std::string failure() const;
  /// The first host that failed, "" when none.
  std::string failedHost() const;
};

/// Optional news of checkHostGroup() while it runs (called on its thread).
struct HostGroupProgress {
  std::function<void(const HostPlan&)> planned;         ///< the hostfile is planned
  std::function<void(const PreflightResult&)> checked;  ///< a host's check ended
  /// Polled before each host's check: true stops checking (the hosts not yet checked are left
  /// out of the result).
  std::function<bool()> cancelled;
};

/// The hostfile plan and pre-flight of the group `launch` describes (launch.hostfile, not
/// empty): reads launch.hostfile (readHostfile: a regular file of at most 1 MiB), plans
/// launch.strategy.world ranks over it (planHostfile, with launch.oversubscribe), checks that
/// launch.port_range (when set) leaves a port for each rank of the busiest host, and, when
/// `preflight`, fingerprints `model_paths` and the worker binary launch.worker (when it is a
/// regular file here) on this host (protocol::modelFingerprint) and runs preflightHost() on
/// every host that holds a rank and is not this one (isLocalHost), one after the other (each
/// bounded: 20 s). Blocks for as long as ssh takes: call it off a UI thread. Throws
/// std::invalid_argument for a hostfile that cannot be read or planned (readHostfile,
/// parseHostfile, planHostfile: naming the file, line and fix) and "--port-range R leaves N ports
/// (A-B) for the ranks, but M ranks run on one host: give a wider range"; std::runtime_error
/// when a model path cannot be fingerprinted here. A host that fails its check does not throw:
/// see HostGroupCheck::failure().
HostGroupCheck checkHostGroup(const MpirunLaunch& launch,
                              const std::vector<std::string>& model_paths, bool preflight = true,
                              const HostGroupProgress& progress = {});

/// A process of a rank on another host, in a state worth naming (RemoteRankWatch::checkStall).
struct RemoteRankState {
  int rank = -1;
  std::int64_t pid = -1;
  std::string host;
  std::string state;  ///< remoteProcessState()'s words: "stopped (...)", "exited", or ""
};

/// Names the ranks of a hostfile group that stop answering (issue 36). While the group
/// computes and no event came for stallAfter() seconds, checkStall() asks every other host for
/// the state of its ranks' processes (once per stall) and keeps the stopped and exited ones (the
/// group's abort ends them before they could be asked afterwards); rewrite() then names a silent
/// rank of a fatal error by that state. Thread-safe: noteEvent() may be called on one thread
/// while checkStall() or rewrite() asks the hosts on another (the state queries run outside its
/// lock).
class RemoteRankWatch {
 public:
  /// The state of process `pid` on `host` (remoteProcessState()'s words); "" when the host does
  /// not answer. May block (ssh); must not throw.
  using StateQuery = std::function<std::string(const std::string& host, std::int64_t pid)>;

  /// `plan`: the ranks of each host (empty: the watch does nothing). `query` empty: ask over
  /// ssh, remoteProcessState(host, pid, ssh_options), at most 10 s a host.
  explicit RemoteRankWatch(HostPlan plan = {}, std::string ssh_options = {}, StateQuery query = {});

  const HostPlan& plan() const { return plan_; }
  /// True for a hostfile group with a plan.
  bool active() const { return !plan_.empty(); }

  /// An event came from the group: a stall starts counting again (and may be asked about again).
  void noteEvent(SteadyClock::time_point now = SteadyClock::now());
  /// True when the group has had no event for `stall` since the last noteEvent() (or since the
  /// watch was made) and this stall was not asked about yet.
  bool stallDue(std::chrono::seconds stall, SteadyClock::time_point now = SteadyClock::now()) const;
  /// Asks the host of each rank in `rank_pids` (rank -> pid; local hosts skipped) for its
  /// process's state, once per stall: claimStall(), then askStall(); a second call before the
  /// next noteEvent() asks nothing. Returns the stopped and exited ones (to log). Blocks while
  /// the hosts are asked (the query's bound each, one after the other).
  std::vector<RemoteRankState> checkStall(const std::map<int, std::int64_t>& rank_pids);
  /// Marks this stall as asked about. Returns false when it was already, or the watch is not
  /// active. (A GUI claims the stall on its own thread, then runs askStall() on another.)
  bool claimStall();
  /// Asks as checkStall() does, without claiming: keeps the stopped and exited ranks (a rank
  /// whose host did not answer is not kept: rewrite() asks its host again). Returns the stopped and
  /// exited ones. Blocks while the hosts are asked. Never throws (but std::bad_alloc).
  std::vector<RemoteRankState> askStall(const std::map<int, std::int64_t>& rank_pids);

  /// `message` (a fatal error's text) with each clause "rank R (pid P on H) is on another host
  /// that did not answer (is the link to it up?)" of a rank the plan puts on another host named
  /// by its state: "rank R (pid P on H) is stopped (state T: SIGSTOP or a debugger) (asked over
  /// ssh): it is not cut off, it does not run", "rank R (pid P on H) has exited (asked over
  /// ssh)", or "rank R (pid P on H) is on another host that did not answer, nor does HOST over
  /// ssh: the link to it is down (or the host is)". Likewise each clause "rank R (pid P on H)
  /// disconnected" (WorkerSession's naming of OpenMPI 5's peer-disconnect report; H is the
  /// rank's own host name, shown as "HOST, host name H" when the plan's HOST differs): "... is
  /// stopped (...)", "... has exited (asked over ssh)", "rank R (pid P on HOST) disconnected, and
  /// HOST does not answer over ssh either: the link to it is down (or the host is)", or, running,
  /// "rank R (pid P on HOST) is still running (...) (asked over ssh): the connection between the
  /// hosts dropped, not the rank". The state kept by checkStall() is used when there is one,
  /// else the host is asked now (blocking: the query's bound); a rank a stall check is asking
  /// about at that moment is not asked again: its answer is waited for (at most 30 s; on a
  /// loaded host that ssh can outlast the error, and the group's abort would then end a stopped
  /// rank before a second question, which would say "exited"). A running rank's silent clause,
  /// and any other text, stay as they are. Never throws (but std::bad_alloc).
  std::string rewrite(const std::string& message);
  /// rewrite() with the states known so far only (never asks): a clause whose rank's state is
  /// not known stays as it is. For the other copies of a named error (a rank's stderr lines).
  /// rewrite() keeps what it was told (except a running rank) for this.
  std::string rewriteKnown(const std::string& text);
  /// True when `message` holds a clause rewrite() would ask about or change (a silent rank's, or
  /// a disconnected rank's).
  static bool hasSilentRank(const std::string& message);
  /// True when `message` holds a clause "rank R (pid P on H) disconnected" (a group failure
  /// naming the ranks on the peer host of OpenMPI 5's peer-disconnect report).
  static bool hasDisconnectedRank(const std::string& message);

  /// The states kept so far (rank -> state; "" = its host did not answer rewrite()'s ssh).
  std::map<int, std::string> known() const;

  /// How long a group may go without an event before the hosts are asked: half the collective
  /// timeout, clamped to 2..60 s. `collective_timeout_s` <= 0: $DITSTUDIO_COLLECTIVE_TIMEOUT_S
  /// when set and positive, else 300 s (the worker's default).
  static std::chrono::seconds stallAfter(double collective_timeout_s = 0);

 private:
  HostPlan plan_;
  StateQuery query_;
  mutable std::mutex mu_;
  SteadyClock::time_point lastEvent_;
  bool stallChecked_ = false;
  std::map<int, std::string> known_;
  std::map<int, int> asking_;      ///< ranks a stall check is asking about now (how many checks)
  std::condition_variable asked_;  ///< notified when a stall check's question is answered

  std::string rewriteWith(const std::string& text, bool ask);
};

}  // namespace dit::launcher
