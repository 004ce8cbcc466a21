// One group start for every front end (issue 45): ditstudio-cli, the GUI's window and
// ditstudio-server all put a process group together through this one path:
//   GroupSpec (ranks, strategy, hostfile, model + component paths, env, ports, CPU slice)
//     -> prepareGroup(): the hostfile plan and the ssh pre-flight of every other host (worker and
//        content fingerprints of the worker binary, the model and its components; the port range)
//     -> the mpirun argv (mpirunArgv, with the CPU slice of a server's group: withCpuSet)
//     -> WorkerSession::start(PreparedGroup::session)
//     -> naming of a silent or disconnected remote rank (PreparedGroup::watch, RemoteRankWatch)
//     -> teardown (WorkerSession's policy: shutdown line, grace, SIGTERM, SIGKILL).
// The front ends differ only in how they show what happens (CLI lines, the window's banner, the
// server's /v1/groups). Part of dit_launcher (app/launcher/): no Torch, no Qt.
#pragma once

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "app/launcher/host_group.h"
#include "app/launcher/launch.h"
#include "app/launcher/worker_session.h"

namespace dit::launcher {

/// What a front end asks for: one process group of `launch.strategy.world` ranks.
struct GroupSpec {
  /// The mpirun line: ranks (strategy.world), degrees and device, hostfile, worker executable,
  /// model, the worker's extra arguments (dtype, the component flags --config/--vae/...), network
  /// interface, ssh options, port range, extra mpirun arguments, oversubscription, isolation.
  MpirunLaunch launch;
  /// The model and its components on this host, as the pre-flight fingerprints them on every
  /// host; empty: modelSourcePaths(launch.model, launch.extra_worker_args).
  std::vector<std::string> model_paths;
  /// Environment of mpirun and the ranks it starts here (e.g. OMP_NUM_THREADS,
  /// CUDA_VISIBLE_DEVICES); a hostfile group forwards forwardedEnvironment() to the others.
  std::vector<std::pair<std::string, std::string>> env;
  /// Single-host groups: set = the group is placed by withCpuSet(argv, *cpu_set) (a server's
  /// groups side by side: "2,3" under taskset, "" unbound); unset = mpirun's own placement.
  std::optional<std::string> cpu_set;
  /// Hostfile groups: run the ssh pre-flight of every other host (off: the plan and the port
  /// range only, ditstudio-cli's --no-preflight).
  bool preflight = true;
  /// How a silent remote rank's host is asked about it (RemoteRankWatch); empty = over ssh.
  RemoteRankWatch::StateQuery state_query;
};

/// A group ready to start: what WorkerSession::start() takes, and what names its ranks.
struct PreparedGroup {
  SessionLaunch session;  ///< the argv (argv[0] the program), env and world
  HostGroupCheck hosts;   ///< hostfile groups: the plan and each other host's pre-flight
  /// Names a silent or disconnected remote rank of a hostfile group (inactive otherwise: its
  /// rewrite() leaves every message as it is). Shared: a GUI asks it off its UI thread.
  std::shared_ptr<RemoteRankWatch> watch;
  /// "H1: rank 0; H2: rank 1" for a hostfile group, "" otherwise.
  std::string planText() const { return describeHostPlan(hosts.plan); }
};

/// A group refused before mpirun started: a hostfile host failed its pre-flight. what() is
/// HostGroupCheck::failure() ("pre-flight failed:\n" and each failed host's message naming the
/// host, the file or cause and the fix); `host` the first host that failed.
class GroupRefused : public std::invalid_argument {
 public:
  GroupRefused(const std::string& message, std::string host)
      : std::invalid_argument(message), host(std::move(host)) {}
  std::string host;
};

/// The model sources the group reads: `model` and the value of each component flag of
/// `worker_args` (--config, --vae, --text-encoder, --text-encoder-2, --tokenizer, --tokenizer-2,
/// as "--flag VALUE" or "--flag=VALUE"), in that order, empty ones left out.
std::vector<std::string> modelSourcePaths(const std::string& model,
                                          const std::vector<std::string>& worker_args);

/// `worker_args` with the value of each component flag (as modelSourcePaths() finds them) made
/// absolute on this host (absoluteOnThisHost): a rank on another host starts in its user's home.
std::vector<std::string> absoluteComponentArgs(std::vector<std::string> worker_args);

/// argv of a single-host group (mpirunArgv) with its placement replaced by `--bind-to none`
/// (`--map-by` dropped), started under `taskset --cpu-list CPUS` (the affinity its daemon and
/// ranks inherit, on OpenMPI 4 and 5; CPUS empty: no taskset). A hostfile group's argv, and an
/// argv without `--bind-to`, is returned unchanged.
std::vector<std::string> withCpuSet(std::vector<std::string> argv, const std::string& cpus);

/// The group start up to mpirun: for a hostfile group the hostfile is read and planned, the port
/// range checked against the busiest host, and (spec.preflight) every other host that holds a
/// rank is checked over ssh, one after the other (checkHostGroup: the worker there, the content
/// fingerprint of this host's worker binary when it has one here, the model and its components,
/// the ports); the component paths of a hostfile group are made absolute here. Then the argv
/// (mpirunArgv, withCpuSet when spec.cpu_set is set) and the watch that names a silent remote
/// rank. Blocks while ssh runs (seconds a host; at most 20 s each): call it off a UI thread.
/// Throws std::invalid_argument for a spec mpirunArgv or the hostfile plan refuses (naming the
/// file, line or range and the fix), GroupRefused when a host failed its pre-flight, and
/// std::runtime_error when a model path cannot be fingerprinted here. `progress` reports the plan
/// and each host's check as they come.
PreparedGroup prepareGroup(const GroupSpec& spec, const HostGroupProgress& progress = {});

/// `message` (a fatal error's or the group's failure text) with each silent or disconnected
/// remote rank named by its host's answer (watch.rewrite(): stopped, exited, or the link down)
/// when the watch is active and the message names one; else `message` unchanged. May block while
/// a host is asked over ssh (10 s a host at most). Never throws (but std::bad_alloc).
std::string nameSilentRanks(RemoteRankWatch* watch, const std::string& message);

}  // namespace dit::launcher
