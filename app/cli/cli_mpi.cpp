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
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "app/cli/cli_options.h"
#include "app/common/model_source_options.h"
#include "app/launcher/group_start.h"
#include "app/launcher/host_group.h"
#include "app/launcher/launch.h"
#include "app/launcher/preflight.h"
#include "app/launcher/worker_session.h"
#include "app/protocol/events.h"
#include "app/protocol/protocol.h"

namespace dit::cli {

namespace {

// The group through dit_launcher's one group start (prepareGroup, the GUI's and the server's
// too): for a hostfile group the hostfile is checked (slots= on every host) and the ranks per host
// are shown; every other host is checked over ssh (non-interactive, bounded) for the worker, the
// same worker binary and the same model fingerprint before mpirun starts. Throws naming the host
// and the fix.
launcher::PreparedGroup prepare(const CliOptions& o, const launcher::MpirunLaunch& launch) {
  const ModelSources s = o.sources();
  launcher::GroupSpec spec;
  spec.launch = launch;
  spec.model_paths = {s.model,          s.config,    s.vae,        s.text_encoder,
                      s.text_encoder_2, s.tokenizer, s.tokenizer_2};
  spec.preflight = !o.noPreflight;
  launcher::HostGroupProgress progress;
  progress.planned = [&](const launcher::HostPlan& plan) {
    std::cerr << "hostfile " << o.hostfile << ": " << launcher::describeHostPlan(plan) << std::endl;
  };
  progress.checked = [](const launcher::PreflightResult& r) {
    if (r.ok)
      std::cerr << "pre-flight " << r.host << ": ok (worker, model fingerprint " << r.fingerprint
                << ", " << std::lround(r.seconds * 1000) << " ms)" << std::endl;
  };
  return launcher::prepareGroup(spec, progress);
}

// What the CLI shows of a group's session: progress and results on stdout / the log, the worker's
// events as JSON lines with --json, the group's own output on stderr.
class CliSessionView : public launcher::SessionObserver {
 public:
  CliSessionView(const CliOptions& o, std::shared_ptr<launcher::RemoteRankWatch> w)
      : watch(std::move(w)), o_(o) {}
  int images = 0;
  std::string firstError;
  bool peerLostShown = false;  ///< the group's failure naming a disconnected rank was shown
  /// Hostfile groups: the ranks of each host, the stall check and the naming of a silent rank
  /// (launcher::RemoteRankWatch, the GUI's and the server's too, from prepareGroup); inactive
  /// without a hostfile.
  std::shared_ptr<launcher::RemoteRankWatch> watch;

  // The group computes but no event came for `stall`: ask every other host over ssh (bounded)
  // for the state of its ranks' processes, once per stall, and keep the stopped or exited ones
  // for the error that follows (the group's abort ends them before it could be asked then).
  void checkStall(const launcher::WorkerSession& session, std::chrono::seconds stall) {
    if (!watch->stallDue(stall)) return;
    for (const launcher::RemoteRankState& r : watch->checkStall(session.rankPids()))
      spdlog::warn("rank {} (pid {} on {}) is {} (asked over ssh while the group stalled)", r.rank,
                   r.pid, r.host, r.state);
  }

  void event(const protocol::Event& raw, const protocol::WorkerEvent& ev) override {
    watch->noteEvent();
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
      else if (l->level == "info" && !o_.jsonEvents)
        spdlog::info("{}", l->message);
    } else if (const auto* e = std::get_if<protocol::ErrorEvent>(&ev)) {
      const std::string msg =
          "rank " + std::to_string(e->rank) + ": " +
          (e->fatal && watch->active() ? watch->rewrite(e->message) : e->message);
      if (firstError.empty()) firstError = msg;
      std::cerr << "error: " << msg << std::endl;
    }
  }
  void logLine(int rank, const std::string& level, const std::string& text) override {
    if (level == "error" && launcher::RemoteRankWatch::hasDisconnectedRank(text)) {
      // The group's failure naming the ranks on a peer host that disconnected (OpenMPI 5):
      // named by the host's answer over ssh (hostfile groups), shown once.
      if (!peerLostShown) std::cerr << "error: " << watch->rewrite(text) << std::endl;
      peerLostShown = true;
      return;
    }
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
  for (const auto& a : protocol::runOptionArgs(o.run)) launch.extra_worker_args.push_back(a);
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
// cause: issue 36), 1 when mpirun named a rank killed by a signal (its code, 128 + N, would read
// as the CLI's own death), and 1 when OpenMPI 5 aborted a rank that lost its peer (the session
// named the peer; prterun's code is the abort's).
int exitCode(const CliOptions& o, const launcher::WorkerSession& session,
             const CliSessionView& view) {
  const std::optional<launcher::ExitStatus> exit = session.exitStatus();
  if (!exit) return 127;  // could not start mpirun (reported)
  const int rc = exit->shellCode();
  if (!view.firstError.empty()) return rc && exit->exited ? rc : 1;
  if (rc != 0) {
    // OpenMPI 5 aborted the rank that lost its peer (issue 36): the session named the peer; the
    // code is prterun's for that abort, not the cause's.
    if (auto f = session.process().rankFailure(); f && f->peer_lost) {
      if (!view.peerLostShown) std::cerr << "error: " << session.lastFailure().message << std::endl;
      return 1;
    }
    if (auto f = session.process().rankFailure(); f && f->rank >= 0) {
      std::cerr << "error: " << f->reason
                << " without reporting an error; mpirun ended the process group" << std::endl;
      // A rank killed by a signal: mpirun's 128 + N would read as the CLI's own death (and
      // OpenMPI 5 reports the same death as another rank's abort, code 14): 1, as there.
      return f->signal > 0 ? 1 : rc;
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
  const launcher::PreparedGroup group = prepare(o, mpirunLaunch(o));
  CliSessionView view(o, group.watch);

  launcher::WorkerSession session(&view, "cli");
  session.start(group.session);
  forwardSignalsTo(session.process().pid());
  session.submit(request(o));  // id "cli"
  session.stopWhenIdle();
  using State = launcher::WorkerSession::State;
  // A stall worth asking the other hosts about: half the collective timeout (2..60 s).
  const std::chrono::seconds stall = launcher::RemoteRankWatch::stallAfter();
  while (session.state() != State::Stopped && session.state() != State::Failed) {
    session.pollOnce(std::chrono::seconds(1));
    if (session.state() == State::Busy) view.checkStall(session, stall);
  }
  g_child = 0;
  return exitCode(o, session, view);
}

}  // namespace dit::cli
