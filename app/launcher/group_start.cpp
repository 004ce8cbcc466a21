#include "app/launcher/group_start.h"

#include <algorithm>
#include <array>
#include <string_view>

namespace dit::launcher {

namespace {

constexpr std::array<std::string_view, 6> kComponentFlags{
    "--config", "--vae", "--text-encoder", "--text-encoder-2", "--tokenizer", "--tokenizer-2"};

bool isComponentFlag(std::string_view flag) {
  return std::find(kComponentFlags.begin(), kComponentFlags.end(), flag) != kComponentFlags.end();
}

// Calls f(value) for each component flag's value in `args` ("--flag VALUE" or "--flag=VALUE"),
// in the order they come; f may change the value in place.
template <class F>
void forEachComponent(std::vector<std::string>& args, F f) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string& a = args[i];
    if (isComponentFlag(a) && i + 1 < args.size()) {
      f(args[++i]);
    } else if (const auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0 &&
                                            isComponentFlag(std::string_view(a).substr(0, eq))) {
      std::string value = a.substr(eq + 1);
      f(value);
      a = a.substr(0, eq + 1) + value;
    }
  }
}

}  // namespace

std::vector<std::string> modelSourcePaths(const std::string& model,
                                          const std::vector<std::string>& worker_args) {
  std::vector<std::string> paths;
  if (!model.empty()) paths.push_back(model);
  std::vector<std::string> args = worker_args;
  forEachComponent(args, [&](std::string& v) {
    if (!v.empty()) paths.push_back(v);
  });
  return paths;
}

std::vector<std::string> absoluteComponentArgs(std::vector<std::string> worker_args) {
  forEachComponent(worker_args, [](std::string& v) { v = absoluteOnThisHost(v); });
  return worker_args;
}

std::vector<std::string> withCpuSet(std::vector<std::string> argv, const std::string& cpus) {
  if (std::find(argv.begin(), argv.end(), "--hostfile") != argv.end()) return argv;
  auto bind = std::find(argv.begin(), argv.end(), "--bind-to");
  if (bind == argv.end() || bind + 1 == argv.end()) return argv;
  *(bind + 1) = "none";
  if (auto map = std::find(argv.begin(), argv.end(), "--map-by");
      map != argv.end() && map + 1 != argv.end())
    argv.erase(map, map + 2);
  // The CPU slice as the affinity mpirun starts with (util-linux's taskset), which its daemon
  // and the unbound ranks inherit: OpenMPI 4 and 5 alike (OpenMPI 5's --cpu-set becomes a PE
  // list that refuses --bind-to none).
  if (!cpus.empty()) argv.insert(argv.begin(), {"taskset", "--cpu-list", cpus});
  return argv;
}

PreparedGroup prepareGroup(const GroupSpec& spec, const HostGroupProgress& progress) {
  MpirunLaunch launch = spec.launch;
  std::vector<std::string> paths = spec.model_paths.empty()
                                       ? modelSourcePaths(launch.model, launch.extra_worker_args)
                                       : spec.model_paths;
  const bool hostfile = launch.hostfile.find_first_not_of(" \t") != std::string::npos;
  if (hostfile) {
    // Every host reads the same paths: those of this host, whatever folder a rank starts in.
    launch.worker = absoluteOnThisHost(launch.worker);
    launch.extra_worker_args = absoluteComponentArgs(std::move(launch.extra_worker_args));
    for (std::string& p : paths) p = absoluteOnThisHost(p);
  }
  PreparedGroup out;
  // The argv first: a spec it refuses (no worker, no ranks, a malformed port range) is refused
  // before any host is asked.
  std::vector<std::string> argv = mpirunArgv(launch);
  if (hostfile) {
    out.hosts = checkHostGroup(launch, paths, spec.preflight, progress);
    if (!out.hosts.ok()) throw GroupRefused(out.hosts.failure(), out.hosts.failedHost());
  } else if (spec.cpu_set) {
    argv = withCpuSet(std::move(argv), *spec.cpu_set);
  }
  out.session.argv = std::move(argv);
  out.session.env = spec.env;
  out.session.world = launch.strategy.world;
  out.watch =
      std::make_shared<RemoteRankWatch>(out.hosts.plan, launch.ssh_options, spec.state_query);
  return out;
}

std::string nameSilentRanks(RemoteRankWatch* watch, const std::string& message) {
  if (!watch || !watch->active() || !RemoteRankWatch::hasSilentRank(message)) return message;
  return watch->rewrite(message);
}

}  // namespace dit::launcher
