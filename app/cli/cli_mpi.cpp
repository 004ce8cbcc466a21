// ditstudio-cli with several ranks: mpirun + ditstudio-worker driven through dit_launcher's
// WorkerSession (the GUI's session too), in named steps: the mpirun line, the hostfile pre-flight,
// the session with its signal forwarding, what the CLI shows of its events, and the exit code.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "app/cli/cli_options.h"
#include "app/common/model_source_options.h"
#include "app/launcher/fingerprint.h"
#include "app/launcher/launch.h"
#include "app/launcher/preflight.h"
#include "app/launcher/worker_session.h"
#include "app/protocol/events.h"
#include "app/protocol/protocol.h"

namespace dit::cli {

namespace {

using HostPlan = std::vector<std::pair<std::string, std::vector<int>>>;

// Hostfile groups (issue 18): the hostfile is checked (slots= on every host) and the ranks per
// host are shown; every other host is checked over ssh (non-interactive, bounded) for the worker
// and the same model fingerprint before mpirun starts. Throws naming the host and the fix.
// Returns the ranks of each host.
HostPlan preflight(const CliOptions& o, const launcher::MpirunLaunch& launch) {
  const std::string text = launcher::readHostfile(o.hostfile);  // regular file, bounded
  const auto plan =
      launcher::planHostfile(launcher::parseHostfile(text), o.np, o.oversubscribe, o.hostfile);
  std::string shown;
  for (const auto& [host, ranks] : plan) {
    if (ranks.empty()) continue;
    if (!shown.empty()) shown += "; ";
    shown += host + ": rank";
    for (int r : ranks) {
      shown += ' ';
      shown += std::to_string(r);
    }
  }
  std::cerr << "hostfile " << o.hostfile << ": " << shown << std::endl;
  if (!launch.port_range.empty()) {
    // Each rank listens on a port of the ranks' part of the range.
    const launcher::PortPlan pp = launcher::planPortRange(launch.port_range);
    std::size_t most = 0;
    for (const auto& hr : plan) most = std::max(most, hr.second.size());
    if (static_cast<int>(most) > pp.btl_max - pp.btl_min + 1)
      throw std::invalid_argument("--port-range " + launch.port_range + " leaves " +
                                  std::to_string(pp.btl_max - pp.btl_min + 1) + " ports (" +
                                  std::to_string(pp.btl_min) + "-" + std::to_string(pp.btl_max) +
                                  ") for the ranks, but " + std::to_string(most) +
                                  " ranks run on one host: give a wider range");
  }
  if (o.noPreflight) return plan;
  const ModelSources s = o.sources();
  const std::vector<std::string> paths{s.model,          s.config,    s.vae,        s.text_encoder,
                                       s.text_encoder_2, s.tokenizer, s.tokenizer_2};
  const std::string mine = launcher::modelFingerprint(paths);
  std::string failures;
  for (const auto& [host, ranks] : plan) {
    if (ranks.empty() || launcher::isLocalHost(host)) continue;
    const auto r = launcher::preflightHost(host, launch, paths, mine);
    if (r.ok)
      std::cerr << "pre-flight " << host << ": ok (worker, model fingerprint " << r.fingerprint
                << ", " << std::lround(r.seconds * 1000) << " ms)" << std::endl;
    else
      failures += (failures.empty() ? "" : "\n") + r.message;
  }
  if (!failures.empty()) throw std::invalid_argument("pre-flight failed:\n" + failures);
  return plan;
}

// The hostfile host a rank runs on ("" when the plan does not name it).
std::string hostOfRank(const HostPlan& plan, int rank) {
  for (const auto& [h, ranks] : plan)
    if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end()) return h;
  return {};
}

// A rank another rank's collective timeout names as silent on another host ("rank R (pid P on
// H) is on another host that did not answer (is the link to it up?)") is named by what its host
// said over ssh: `known` (rank -> state, asked while the group stalled, before the abort ended
// the process), else asked now (bounded): a stopped process is named as stopped instead of the
// link being blamed; a host that does not answer over ssh either is said to be cut off.
// `message` with those clauses replaced.
std::string checkSilentRanks(std::string message, const HostPlan& plan,
                             const std::map<int, std::string>& known,
                             const std::string& sshOptions) {
  static const std::regex silent(
      R"(rank (\d+) \(pid (\d+) on ([^)]*)\) is on another host that did not answer \(is the link to it up\?\))");
  std::string out;
  std::smatch m;
  while (std::regex_search(message, m, silent)) {
    const int rank = std::stoi(m[1]);
    const std::string host = hostOfRank(plan, rank);
    std::string clause = m[0];
    if (!host.empty() && !launcher::isLocalHost(host)) {
      const auto k = known.find(rank);
      const std::string state =
          k != known.end() ? k->second
                           : launcher::remoteProcessState(host, std::stoll(m[2]), sshOptions);
      const std::string who = "rank " + m[1].str() + " (pid " + m[2].str() + " on " + m[3].str();
      if (state.rfind("stopped", 0) == 0)
        clause = who + ") is " + state + " (asked over ssh): it is not cut off, it does not run";
      else if (state == "exited")
        clause = who + ") has exited (asked over ssh)";
      else if (state.empty())
        clause = who + ") is on another host that did not answer, nor does " + host +
                 " over ssh: the link to it is down (or the host is)";
    }
    out += m.prefix().str() + clause;
    message = m.suffix().str();
  }
  return out + message;
}

// What the CLI shows of a group's session: progress and results on stdout / the log, the worker's
// events as JSON lines with --json, the group's own output on stderr.
class CliSessionView : public launcher::SessionObserver {
 public:
  explicit CliSessionView(const CliOptions& o) : o_(o) {}
  int images = 0;
  std::string firstError;
  HostPlan plan;  ///< hostfile groups: the ranks of each host (to ask a host about its rank)
  /// When the last event came (a stall is asked about: checkStall()).
  std::chrono::steady_clock::time_point lastEvent = std::chrono::steady_clock::now();
  bool stallChecked = false;
  /// rank -> state its host gave during a stall ("" = its host did not answer over ssh)
  std::map<int, std::string> remoteStates;

  // The group computes but no event came for `stall`: ask every other host over ssh (bounded)
  // for the state of its ranks' processes, once per stall, and keep the stopped or exited ones
  // for the error that follows (the group's abort ends them before it could be asked then).
  void checkStall(const launcher::WorkerSession& session, std::chrono::seconds stall) {
    if (plan.empty() || stallChecked || std::chrono::steady_clock::now() - lastEvent < stall)
      return;
    stallChecked = true;
    for (const auto& [rank, pid] : session.rankPids()) {
      const std::string host = hostOfRank(plan, rank);
      if (host.empty() || launcher::isLocalHost(host)) continue;
      const std::string state = launcher::remoteProcessState(host, pid, o_.sshOptions);
      if (state.empty())  // no answer over ssh either: not asked again for the error
        remoteStates[rank] = state;
      if (state.rfind("stopped", 0) == 0 || state == "exited") {
        remoteStates[rank] = state;
        spdlog::warn("rank {} (pid {} on {}) is {} (asked over ssh while the group stalled)", rank,
                     pid, host, state);
      }
    }
  }

  void event(const protocol::Event& raw, const protocol::WorkerEvent& ev) override {
    lastEvent = std::chrono::steady_clock::now();
    stallChecked = false;
    if (o_.jsonEvents) std::cout << raw.data.dump() << std::endl;
    if (const auto* h = std::get_if<protocol::HelloEvent>(&ev)) {
      // Each rank's BLAS kernel (issue 36: a remote rank on a slower kernel than rank 0).
      const auto& b = h->blas;
      auto field = [&](const char* k) {
        return b.is_object() && b.contains(k) && b[k].is_string() ? b[k].get<std::string>()
                                                                  : std::string();
      };
      if (b.is_object())
        spdlog::info("rank {} (pid {} on {}): BLAS {} core {} ({}){}", h->rank, h->pid, h->host,
                     field("library"), field("core"), field("selection"),
                     field("thread_policy").empty() ? "" : ", " + field("thread_policy"));
    } else if (const auto* r = std::get_if<protocol::ReadyEvent>(&ev)) {
      spdlog::info("process group ready: {} ranks, {} (loaded in {:.2f} s)", r->world,
                   r->strategy.dump(), r->load_seconds);
    } else if (const auto* p = std::get_if<protocol::ProgressEvent>(&ev)) {
      spdlog::info("image {} step {}/{} ({:.1f} ms)", p->image_index, p->step, p->steps,
                   p->step_ms);
    } else if (const auto* i = std::get_if<protocol::ImageEvent>(&ev)) {
      ++images;
      if (!o_.jsonEvents)
        std::cout << "wrote " << i->path << " (seed "
                  << (i->has_seed ? std::to_string(i->seed) : std::string("null")) << ")"
                  << std::endl;
    } else if (const auto* l = std::get_if<protocol::LogEvent>(&ev)) {
      if (l->level == "warning" && !o_.jsonEvents)
        std::cerr << "warning: " << l->message << std::endl;
    } else if (const auto* e = std::get_if<protocol::ErrorEvent>(&ev)) {
      const std::string msg = "rank " + std::to_string(e->rank) + ": " +
                              (e->fatal && !plan.empty()
                                   ? checkSilentRanks(e->message, plan, remoteStates, o_.sshOptions)
                                   : e->message);
      if (firstError.empty()) firstError = msg;
      std::cerr << "error: " << msg << std::endl;
    }
  }
  void logLine(int rank, const std::string& level, const std::string& text) override {
    if (rank >= 0) return;  // the rank's own events are shown above
    if (level == "error")
      std::cerr << "error: " << text << std::endl;
    else if (level == "debug")  // e.g. OpenMPI's reports of the teardown after a named error
      spdlog::debug("{}", text);
    else if (text.find("SIGTERM") != std::string::npos || text.find("killing") != std::string::npos)
      spdlog::warn("{}", text);  // the teardown policy had to end the group
    else
      spdlog::debug("{}", text);
  }
  void outputLine(launcher::GroupProcess::Stream, const std::string& text) override {
    std::cerr << text << '\n';
  }

 private:
  const CliOptions& o_;
};

// The mpirun line of the options: the strategy, the worker beside this executable, its model and
// dtype arguments, and the hostfile group's settings.
launcher::MpirunLaunch mpirunLaunch(const CliOptions& o) {
  launcher::MpirunLaunch launch;
  launch.strategy = o.strategy;
  launch.strategy.world = o.np;
  launch.hostfile = o.hostfile;
  launch.omp_threads = o.ompThreads > 0 ? o.ompThreads : 1;
  launch.worker = exeDir() + "/ditstudio-worker";
  launch.model = o.model;
  launch.extra_worker_args = {"--dtype", o.dtype};
  for (const auto& a : modelSourceArgs(o.src)) launch.extra_worker_args.push_back(a);
  if (o.allowNonFinite) launch.extra_worker_args.push_back("--allow-nonfinite-weights");
  launch.network_interface = o.networkInterface;
  launch.isolate = launcher::isolationProgram(exeDir());
  launch.ssh_options = o.sshOptions;
  launch.port_range = o.portRange;
  launch.extra_mpirun_args = o.mpirunArgs;
  launch.oversubscribe = o.oversubscribe;
  return launch;
}

// Ctrl-C / SIGTERM on the CLI ends the group too (mpirun forwards it to every rank). 0: none.
pid_t g_child = 0;
void forwardSignalsTo(pid_t child) {
  g_child = child;
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    if (g_child > 0) ::kill(g_child, sig);
  };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// The session's outcome as the CLI's exit code: the group's own code, with the reason on stderr
// when no rank reported an error; 1 when fewer images came than asked for, and 1 when a rank
// named a fatal error and mpirun then had to be killed (its signal is the teardown's, not a
// cause: issue 36).
int exitCode(const CliOptions& o, const launcher::WorkerSession& session,
             const CliSessionView& view) {
  const std::optional<launcher::ExitStatus> exit = session.exitStatus();
  if (!exit) return 127;  // could not start mpirun (reported)
  const int rc = exit->shellCode();
  if (!view.firstError.empty()) return rc && exit->exited ? rc : 1;
  if (rc != 0) {
    if (auto f = session.process().rankFailure(); f && f->rank >= 0) {
      std::cerr << "error: " << f->reason
                << " without reporting an error; mpirun ended the process group" << std::endl;
      return rc;
    }
    // A host mpirun could not reach was named by the session (ssh's words and the fix).
    if (session.lastFailure().message.find("mpirun could not start the group there") ==
        std::string::npos)
      std::cerr << "error: the process group exited with " << exit->describe() << std::endl;
    return rc;
  }
  const int expected = request(o).imageCount();
  if (view.images < expected) {
    std::cerr << "error: expected " << expected << " images, got " << view.images << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace

// Several ranks: the request, then shutdown once it is done; a fatal error ends the group within
// the teardown policy's bounds.
int runMpi(const CliOptions& given) {
  // The model sources as absolute paths of this host (issue 36): a rank on another host starts
  // in another folder, and the pre-flight checks each host for these very paths. (LoRAs, init
  // images, masks and outputs are made absolute by request().)
  CliOptions o = given;
  for (std::string* p : {&o.model, &o.src.config, &o.src.vae, &o.src.text_encoder,
                         &o.src.text_encoder_2, &o.src.tokenizer, &o.src.tokenizer_2})
    *p = launcher::absoluteOnThisHost(*p);
  const launcher::MpirunLaunch launch = mpirunLaunch(o);
  const std::vector<std::string> args = launcher::mpirunArgv(launch);
  CliSessionView view(o);
  if (!o.hostfile.empty()) view.plan = preflight(o, launch);

  launcher::WorkerSession session(&view, "cli");
  session.start(launcher::SessionLaunch{args, {}, o.np});
  forwardSignalsTo(session.process().pid());
  session.submit(request(o));  // id "cli"
  session.stopWhenIdle();
  using State = launcher::WorkerSession::State;
  // A stall worth asking the other hosts about: half the collective timeout (2..60 s).
  const char* ct = std::getenv("DITSTUDIO_COLLECTIVE_TIMEOUT_S");
  const double timeoutS = ct && std::atof(ct) > 0 ? std::atof(ct) : 300.0;
  const std::chrono::seconds stall(static_cast<long>(std::clamp(timeoutS / 2, 2.0, 60.0)));
  while (session.state() != State::Stopped && session.state() != State::Failed) {
    session.pollOnce(std::chrono::seconds(1));
    if (session.state() == State::Busy) view.checkStall(session, stall);
  }
  g_child = 0;
  return exitCode(o, session, view);
}

}  // namespace dit::cli
