#include "app/launcher/launch.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "app/protocol/strategy_args.h"

extern char** environ;

namespace dit::launcher {

std::string defaultMpirun() {
  const char* env = std::getenv("DITSTUDIO_MPIRUN");
  return env && *env ? std::string(env) : std::string("mpirun");
}

namespace {
std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}
}  // namespace

std::vector<std::pair<std::string, std::string>> networkMcaParams(const MpirunLaunch& l) {
  if (trim(l.hostfile).empty())
    // One host: ranks talk through shared memory only (ob1 over self + shared memory: no TCP or
    // libfabric transport, so no rank listens on any socket), and the runtime's out-of-band
    // channel is confined to loopback.
    // No oob_tcp_if_include: OpenMPI 5's PRRTE drops loopback before reading an include list
    // when the host has another interface and then refuses to start ("No network interfaces were
    // found for out-of-band communications", openpmix/prrte#2788), and OpenMPI 4.1's mpirun
    // listens on the wildcard address whatever it says (ompi#12668). The runtime's channel is
    // confined by running the group in a loopback-only network namespace (ditstudio-isolate).
    return {{"pml", "ob1"}, {"btl", "^tcp,ofi,openib,usnic,uct"}};
  const std::string iface = trim(l.network_interface);
  std::vector<std::pair<std::string, std::string>> p;
  if (!iface.empty()) p = {{"btl_tcp_if_include", iface}, {"oob_tcp_if_include", iface}};
  if (const std::string pr = trim(l.port_range); !pr.empty()) {
    const PortPlan pp = planPortRange(pr);
    // One range for every listener of the group: mpirun's and its daemons' channel (ORTE and
    // PRRTE both read this name; OpenMPI 5's mpirun passes oob_* parameters on to PRRTE) ...
    p.push_back({"oob_tcp_dynamic_ipv4_ports",
                 std::to_string(pp.oob_min) + "-" + std::to_string(pp.oob_max)});
    // ... and the ranks' TCP transport.
    p.push_back({"btl_tcp_port_min_v4", std::to_string(pp.btl_min)});
    p.push_back({"btl_tcp_port_range_v4", std::to_string(pp.btl_max - pp.btl_min + 1)});
  }
  return p;
}

PortPlan planPortRange(const std::string& range) {
  const std::string pr = trim(range);
  static const std::regex re("^([0-9]{1,5})-([0-9]{1,5})$");
  std::smatch m;
  const long lo = std::regex_match(pr, m, re) ? std::stol(m[1]) : -1;
  const long hi = lo >= 0 ? std::stol(m[2]) : -1;
  if (lo < 1024 || hi > 65535 || hi < lo)
    throw std::invalid_argument("port range '" + pr +
                                "': expected MIN-MAX with 1024 <= MIN <= MAX <= 65535");
  const int n = static_cast<int>(hi - lo + 1);
  if (n < kMinPortRange)
    throw std::invalid_argument(
        "port range '" + pr + "' holds " + std::to_string(n) + " port" + (n == 1 ? "" : "s") +
        "; a group needs at least " + std::to_string(kMinPortRange) +
        " (2 for mpirun's channel, 2 for the ranks): give a wider range, e.g. " +
        std::to_string(lo) + "-" + std::to_string(std::min<long>(lo + 99, 65535)));
  PortPlan pp;
  pp.min = static_cast<int>(lo);
  pp.max = static_cast<int>(hi);
  const int oob = std::clamp(n / 4, 2, 64);
  pp.oob_min = pp.min;
  pp.oob_max = pp.min + oob - 1;
  pp.btl_min = pp.oob_max + 1;
  pp.btl_max = pp.max;
  return pp;
}

std::vector<std::pair<int, int>> probeRanges(const std::string& port_range) {
  if (trim(port_range).empty()) return {{0, 0}};
  const PortPlan pp = planPortRange(port_range);
  return {{pp.oob_min, pp.oob_max}, {pp.btl_min, pp.btl_max}};
}

std::string readHostfile(const std::string& path) {
  auto kind = [](mode_t m) -> std::string {
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
  };
  auto refuse = [&](const std::string& why) -> std::invalid_argument {
    return std::invalid_argument("hostfile " + path + " " + why);
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw refuse(std::string("cannot be read: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw refuse("is " + kind(st.st_mode) + ", not a regular file");
  if (static_cast<std::uint64_t>(st.st_size) > kMaxHostfileBytes)
    throw refuse("is " + std::to_string(st.st_size) + " bytes; hostfiles are limited to " +
                 std::to_string(kMaxHostfileBytes));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) throw refuse(std::string("cannot be read: ") + std::strerror(errno));
  struct stat st2 {};
  if (::fstat(fd, &st2) != 0 || !S_ISREG(st2.st_mode)) {
    ::close(fd);
    throw refuse("is " + kind(st2.st_mode) + ", not a regular file");
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw refuse(std::string("cannot be read: ") + std::strerror(e));
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > kMaxHostfileBytes) {  // grew after the stat
      ::close(fd);
      throw refuse("is more than " + std::to_string(kMaxHostfileBytes) +
                   " bytes; hostfiles are limited to " + std::to_string(kMaxHostfileBytes));
    }
  }
  ::close(fd);
  return text;
}

std::vector<HostfileEntry> parseHostfile(const std::string& text) {
  std::vector<HostfileEntry> out;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
    std::istringstream words(line);
    HostfileEntry e;
    e.line = n;
    if (!(words >> e.host)) continue;
    if (e.host[0] == '-')
      throw std::invalid_argument("hostfile line " + std::to_string(n) + ": host '" + e.host +
                                  "' starts with '-'; ssh and mpirun would read it as an option");
    for (std::string w; words >> w;) {
      if (w.rfind("slots=", 0) != 0) continue;  // max_slots= and others: mpirun's business
      const std::string v = w.substr(6);
      if (v.empty() || v.size() > 6 || v.find_first_not_of("0123456789") != std::string::npos ||
          std::stoi(v) < 1)
        throw std::invalid_argument("hostfile line " + std::to_string(n) + ": '" + w +
                                    "' is not a positive slot count");
      e.slots = std::stoi(v);
    }
    out.push_back(e);
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<int>>> planHostfile(
    const std::vector<HostfileEntry>& hosts, int world, bool oversubscribe,
    const std::string& file) {
  if (hosts.empty())
    throw std::invalid_argument("hostfile " + file + " names no host (one 'HOST slots=N' a line)");
  int total = 0;
  for (const HostfileEntry& e : hosts) {
    if (e.slots < 1)
      throw std::invalid_argument(
          "hostfile " + file + " line " + std::to_string(e.line) + ": host " + e.host +
          " has no slots=N; mpirun would put every rank on the first host. Write '" + e.host +
          " slots=N' with N the number of ranks to run there");
    total += e.slots;
  }
  if (total < world && !oversubscribe)
    throw std::invalid_argument("hostfile " + file + " has " + std::to_string(total) +
                                " slots for " + std::to_string(world) +
                                " ranks: add slots, or ask for --oversubscribe");
  std::vector<std::pair<std::string, std::vector<int>>> plan;
  for (const HostfileEntry& e : hosts) plan.push_back({e.host, {}});
  // --map-by slot: fill each host's slots in order; oversubscribed ranks wrap around.
  int r = 0;
  while (r < world)
    for (size_t i = 0; i < hosts.size() && r < world; ++i)
      for (int k = 0; k < hosts[i].slots && r < world; ++k) plan[i].second.push_back(r++);
  return plan;
}

std::vector<std::string> forwardedEnvironment() {
  // The BLAS kernel and thread policy (app/common/blas_kernel.h): without them a remote rank
  // sees DITSTUDIO_BLAS_AUTO (the launcher's choice) but not the kernel it names, and falls back
  // to its library's own pick (issue 36: Prescott instead of SkylakeX).
  static const char* const kThreads[] = {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"};
  std::vector<std::string> names;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv(*e);
    const auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = kv.substr(0, eq);
    const bool threads =
        std::find(std::begin(kThreads), std::end(kThreads), name) != std::end(kThreads);
    if (name.rfind("DITSTUDIO_", 0) == 0 || name.rfind("OPENBLAS_", 0) == 0 || threads)
      names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string absoluteOnThisHost(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}

std::string isolationProgram(const std::string& dir) {
  const char* env = std::getenv("DITSTUDIO_NETWORK_ISOLATION");
  if (env && std::string(env) == "0") return {};
  const std::string p = (dir.empty() ? std::string(".") : dir) + "/ditstudio-isolate";
  return ::access(p.c_str(), X_OK) == 0 ? p : std::string();
}

int availableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) {
    const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? static_cast<int>(n) : 1;
  }
  std::set<std::pair<std::string, std::string>> cores;
  int cpus = 0;
  bool topology = true;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    ++cpus;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    std::ifstream pkg(dir + "physical_package_id"), core(dir + "core_id");
    std::string p, k;
    if (!(pkg >> p) || !(core >> k)) topology = false;
    cores.emplace(p, k);
  }
  const int n = topology ? static_cast<int>(cores.size()) : cpus;
  return std::max(n, 1);
}

std::vector<std::string> threadPlacementArgs(int world, int threads, int cores) {
  if (world < 1 || threads < 1 || cores < 1)
    throw std::invalid_argument("thread placement: ranks " + std::to_string(world) + ", threads " +
                                std::to_string(threads) + ", cores " + std::to_string(cores) +
                                " must all be at least 1");
  const char* env = std::getenv("DITSTUDIO_THREAD_PLACEMENT");
  if (env && std::string(env) == "0") return {};
  if (static_cast<int64_t>(world) * threads > cores) return {"--bind-to", "none"};
  return {"--map-by",  "slot:PE=" + std::to_string(threads),
          "--bind-to", "core",
          "-x",        "OMP_PROC_BIND=close",
          "-x",        "OMP_PLACES=cores"};
}

std::vector<std::string> mpirunArgv(const MpirunLaunch& l) {
  if (l.strategy.world < 1)
    throw std::invalid_argument("mpirun -np " + std::to_string(l.strategy.world) +
                                ": world size must be at least 1");
  if (l.omp_threads < 1)
    throw std::invalid_argument("OMP_NUM_THREADS " + std::to_string(l.omp_threads) +
                                " must be at least 1");
  if (l.worker.empty()) throw std::invalid_argument("no ditstudio-worker executable given");
  std::vector<std::string> a;
  if (trim(l.hostfile).empty() && !l.isolate.empty()) a.push_back(l.isolate);
  const std::string hf = trim(l.hostfile);
  a.push_back(l.mpirun.empty() ? defaultMpirun() : l.mpirun);
  a.push_back("--allow-run-as-root");
  if (hf.empty() || l.oversubscribe) a.push_back("--oversubscribe");
  a.insert(a.end(), {"-np", std::to_string(l.strategy.world)});
  if (!hf.empty()) {
    // Each host's scheduler places its ranks (OpenMPI binds 1-2 ranks to a core otherwise:
    // ranks with several OpenMP threads would share it); ssh never prompts and gives up.
    a.insert(a.end(), {"--hostfile", hf, "--bind-to", "none", "--mca", "plm_rsh_args",
                       trim("-o BatchMode=yes -o ConnectTimeout=10 " + trim(l.ssh_options))});
  }
  for (const auto& [k, v] : networkMcaParams(l)) a.insert(a.end(), {"--mca", k, v});
  if (hf.empty()) {
    const auto p = threadPlacementArgs(l.strategy.world, l.omp_threads,
                                       l.cores > 0 ? l.cores : availableCores());
    a.insert(a.end(), p.begin(), p.end());
  }
  a.insert(a.end(), {"-x", "OMP_NUM_THREADS=" + std::to_string(l.omp_threads)});
  if (!hf.empty()) {
    for (const std::string& n : forwardedEnvironment()) a.insert(a.end(), {"-x", n});
    std::istringstream extra(l.extra_mpirun_args);
    for (std::string w; extra >> w;) a.push_back(w);
  }
  a.insert(a.end(), {l.worker, "--model", hf.empty() ? l.model : absoluteOnThisHost(l.model)});
  const auto s = protocol::strategyArgs(l.strategy);
  a.insert(a.end(), s.begin(), s.end());
  a.insert(a.end(), l.extra_worker_args.begin(), l.extra_worker_args.end());
  return a;
}

std::string shellQuoted(const std::vector<std::string>& argv) {
  static const std::regex safe("^[A-Za-z0-9_./=:,+@%-]+$");
  std::string out;
  for (const std::string& a : argv) {
    if (!out.empty()) out += ' ';
    if (!a.empty() && std::regex_match(a, safe)) {
      out += a;
      continue;
    }
    out += '\'';
    for (char c : a) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

std::optional<RankFailure> parseMpirunFailure(std::string_view textIn) {
  const std::string text(textIn);
  using std::regex;
  static const regex signalRe(
      R"(process\s+rank\s+(\d+)\s+with\s+PID\s+(\d+)\s+on\s+node\s+(\S+)\s+exited\s+on\s+signal\s+(\d+)(?:\s+\(([^)]*)\))?)");
  static const regex noticedExitRe(
      R"(process\s+rank\s+(\d+)\s+with\s+PID\s+(\d+)\s+on\s+node\s+(\S+)\s+exited\s+with\s+(?:non-zero\s+)?(?:status|exit\s+code)\s+(-?\d+))");
  static const regex abortRe(
      R"(MPI_ABORT\s+was\s+invoked\s+on\s+rank\s+(\d+)(?:[^\n]*?\n?[^\n]*?errorcode\s+(\d+))?)");
  // OpenMPI 4: "Process name: [[job,1],R]"; OpenMPI 5 (prterun): "Process name:
  // [prterun-host-pid@1,R]".
  static const regex procRe(
      R"(Process\s+name:\s*\[(?:\[\d+,\d+\]|[^\]\s@]+@\d+),(\d+)\]\s*(?:Exit\s+code:\s*(-?\d+))?)");
  static const regex primaryRe(
      R"(Primary\s+job\s+terminated\s+normally,\s+but\s+(\d+)\s+process(?:es)?\s+returned)");
  std::smatch m;
  RankFailure f;
  if (std::regex_search(text, m, signalRe)) {
    f.rank = std::stoi(m[1]);
    f.pid = std::stoll(m[2]);
    f.node = m[3];
    f.signal = std::stoi(m[4]);
    f.reason = "rank " + m[1].str() + " (pid " + m[2].str() + " on " + f.node +
               ") was killed by signal " + m[4].str() +
               (m[5].matched && m[5].length() > 0 ? " (" + m[5].str() + ")" : std::string());
    return f;
  }
  if (std::regex_search(text, m, noticedExitRe)) {
    f.rank = std::stoi(m[1]);
    f.pid = std::stoll(m[2]);
    f.node = m[3];
    f.exit_code = std::stoi(m[4]);
    f.reason = "rank " + m[1].str() + " exited with code " + m[4].str() + " (pid " + m[2].str() +
               " on " + f.node + ")";
    return f;
  }
  if (std::regex_search(text, m, abortRe)) {
    f.rank = std::stoi(m[1]);
    if (m[2].matched) f.exit_code = std::stoi(m[2]);
    f.reason = "rank " + m[1].str() + " aborted the group (MPI_Abort" +
               (f.exit_code >= 0 ? ", error code " + std::to_string(f.exit_code) : std::string()) +
               ")";
    return f;
  }
  if (std::regex_search(text, m, procRe)) {
    f.rank = std::stoi(m[1]);
    if (m[2].matched) f.exit_code = std::stoi(m[2]);
    f.reason = "rank " + m[1].str() +
               (f.exit_code >= 0 ? " exited with code " + std::to_string(f.exit_code)
                                 : std::string(" exited with a non-zero code"));
    return f;
  }
  if (std::regex_search(text, m, primaryRe)) {
    f.reason = m[1].str() + " rank process returned a non-zero exit code";
    return f;
  }
  // OpenMPI 5 (issue 36): a rank's TCP BTL saw its peer's socket close and aborted that rank at
  // once, so prterun reports that rank's abort, not the peer's death.
  static const regex peerRe(
      R"(An\s+MPI\s+communication\s+peer\s+process\s+has\s+unexpectedly\s+disconnected)");
  static const regex socketRe(R"(An\s+error\s+occurred\s+in\s+Socket\s+closed)");
  static const regex localHostRe(R"(Local\s+host:[ \t]*([^\s]+))");
  static const regex localPidRe(R"(Local\s+PID:[ \t]*(\d+))");
  static const regex peerHostRe(R"(Peer\s+host:[ \t]*([^\s]+))");
  // "[vm:00000] *** reported by process [3333816321,0]"
  static const regex reporterRe(
      R"(\[([^\]\s:]+):\d+\]\s+\*\*\*\s+reported\s+by\s+process\s+\[\d+,(\d+)\])");
  const bool peer = std::regex_search(text, peerRe);
  if (!peer && !std::regex_search(text, socketRe)) return std::nullopt;
  f.peer_lost = true;
  if (peer && std::regex_search(text, m, peerHostRe)) f.peer_host = m[1];
  if (peer && std::regex_search(text, m, localHostRe)) f.node = m[1];
  if (peer && std::regex_search(text, m, localPidRe)) f.pid = std::stoll(m[1]);
  if (std::regex_search(text, m, reporterRe)) {
    const long long r = std::strtoll(m[2].str().c_str(), nullptr, 10);
    if (r >= 0 && r < (1 << 30)) f.rank = static_cast<int>(r);
    if (f.node.empty()) f.node = m[1];
  }
  std::string who = f.rank >= 0 ? "rank " + std::to_string(f.rank) : std::string("a rank");
  if (f.pid > 0 || !f.node.empty()) {
    who += " (";
    if (f.pid > 0) who += "pid " + std::to_string(f.pid) + (f.node.empty() ? "" : " ");
    if (!f.node.empty()) who += "on " + f.node;
    who += ")";
  }
  f.reason = who + " lost its connection to " +
             (f.peer_host.empty() ? std::string("another rank") : "a rank on " + f.peer_host) +
             " mid-run";
  return f;
}

bool isMpiAbortLine(std::string_view line) {
  // NUL bytes (OpenMPI 5 starts its abort report with one) or their "\0" as a log shows them.
  static const std::regex abortLine(R"(^(?:[\s\x00]|\\0)*\[[^\]]*\]\s+\*\*\*)");
  const std::string l(line);
  return std::regex_search(l, abortLine);
}

std::optional<HostFailure> parseHostFailure(std::string_view textIn) {
  const std::string text(textIn);
  using std::regex;
  static const regex resolveRe(
      R"(ssh:\s+Could\s+not\s+resolve\s+hostname\s+([^\s:]+):\s*([^\r\n]*))");
  static const regex connectRe(
      R"(ssh:\s+connect\s+to\s+host\s+(\S+)\s+port\s+(\d+):\s*([^\r\n]*))");
  static const regex deniedRe(
      R"((?:^|\n)\s*(?:[^@\s]+@)?([^\s:@]+):\s+Permission\s+denied\s*([^\r\n]*))");
  static const regex hostKeyRe(R"(Host\s+key\s+verification\s+failed)");
  auto trimDot = [](std::string s) {
    while (!s.empty() && (s.back() == '.' || s.back() == ' ')) s.pop_back();
    return s;
  };
  std::smatch m;
  std::optional<HostFailure> f;
  if (std::regex_search(text, m, resolveRe))
    f = HostFailure{m[1], "ssh could not resolve the host name (" + trimDot(m[2]) + ")", {}};
  else if (std::regex_search(text, m, connectRe))
    f = HostFailure{
        m[1], "ssh could not connect to port " + m[2].str() + " (" + trimDot(m[3]) + ")", {}};
  else if (std::regex_search(text, m, deniedRe))
    f = HostFailure{m[1],
                    "ssh could not log in without a prompt (Permission denied" +
                        (m[2].length() > 0 ? " " + trimDot(m[2]) : std::string()) + ")",
                    {}};
  else if (std::regex_search(text, m, hostKeyRe))
    f = HostFailure{{}, "ssh refused the host's key (Host key verification failed)", {}};
  if (f) f->fix = sshAdvice(text, f->host);
  return f;
}

std::string sshAdvice(std::string_view textIn, const std::string& hostIn) {
  const std::string text(textIn);
  // In prose "the host" when ssh named none; in a command line the placeholder HOST.
  const std::string host = hostIn.empty() ? std::string("the host") : hostIn;
  const std::string cmdHost = hostIn.empty() ? std::string("HOST") : hostIn;
  auto says = [&](const char* words) { return text.find(words) != std::string::npos; };
  if (says("Could not resolve hostname"))
    return "Fix: check the host name " + host +
           " in the hostfile (or give its address); this machine cannot resolve it";
  if (says("Connection refused"))
    return "Fix: nothing accepts ssh connections there: start sshd on " + host +
           ", or, if it listens on another port, pass it with --ssh-options '-p PORT'";
  if (says("Connection timed out") || says("No route to host") || says("Network is unreachable") ||
      says("Operation timed out"))
    return "Fix: " + host +
           " does not answer on the ssh port: check that the address is right and the host is "
           "up, and that no firewall drops ssh (TCP port 22, or the port in --ssh-options) "
           "between this machine and it";
  if (says("Permission denied"))
    return "Fix: the host refused this user's key: install it there (ssh-copy-id " + cmdHost +
           "), or pass the right key with --ssh-options '-i KEY'";
  if (says("Host key verification failed"))
    return "Fix: this machine does not know (or no longer trusts) the host's key: accept it once "
           "with `ssh " +
           cmdHost + " true`, or pass a UserKnownHostsFile in --ssh-options";
  return {};
}

}  // namespace dit::launcher
