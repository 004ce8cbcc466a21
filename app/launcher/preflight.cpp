#include "app/launcher/preflight.h"

#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iterator>
#include <sstream>

#include "app/protocol/file_fingerprint.h"
#include "app/protocol/port_probe.h"

namespace dit::launcher {

bool isLocalHost(const std::string& host) {
  if (host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1") return true;
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) == 0 && host == name) return true;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return false;
  bool local = false;
  for (ifaddrs* i = ifs; i && !local; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    const int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    char addr[NI_MAXHOST] = {0};
    const socklen_t len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::getnameinfo(i->ifa_addr, len, addr, sizeof addr, nullptr, 0, NI_NUMERICHOST) == 0)
      local = host == addr;
  }
  ::freeifaddrs(ifs);
  return local;
}

namespace {
std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'')
      q.append("'\\''");
    else
      q.push_back(c);
  }
  q.push_back('\'');
  return q;
}
// What runBounded() saw.
struct Bounded {
  std::string text;  // stdout and stderr together
  int code = -1;     // exit code, -1 when killed or not started
  bool timedOut = false;
  bool stopped = false;  // onText asked to stop
};

// Runs `argv` (ssh) without a terminal (setsid; stdin /dev/null), its stdout and stderr into one
// pipe; `onText` sees the text so far after each chunk and returns false to stop (the child is
// killed); the child is killed after `timeout_s` seconds. execvp failing gives exit 127 and
// "exec ssh: ..." in the text.
Bounded runBounded(const std::vector<std::string>& argv, double timeout_s,
                   const std::function<bool(const std::string&)>& onText = nullptr) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  Bounded b;
  int out[2];
  if (::pipe(out) != 0) {
    b.text = "pipe failed";
    return b;
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();  // no controlling terminal: ssh can never prompt
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::close(out[0]);
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execvp(a[0], a.data());
    std::perror("exec ssh");
    ::_exit(127);
  }
  ::close(out[1]);
  for (;;) {
    const double left = timeout_s - std::chrono::duration<double>(Clock::now() - t0).count();
    if (left <= 0) {
      b.timedOut = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (n <= 0) continue;
    char buf[4096];
    const ssize_t got = ::read(out[0], buf, sizeof buf);
    if (got <= 0) break;
    if (b.text.size() < (4u << 20)) b.text.append(buf, static_cast<size_t>(got));
    if (onText && !onText(b.text)) {
      b.stopped = true;
      break;
    }
  }
  ::close(out[0]);
  if (b.timedOut || b.stopped) ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  b.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return b;
}

// `ssh -o BatchMode=yes -o ConnectTimeout=C [options] -- HOST REMOTE` ("--": a host name is
// never read as an ssh option; the hostfile refuses a leading '-' as well).
std::vector<std::string> sshArgv(const std::string& options, int connectTimeout,
                                 const std::string& host, const std::string& remote) {
  std::vector<std::string> argv{"ssh", "-o", "BatchMode=yes", "-o",
                                "ConnectTimeout=" + std::to_string(connectTimeout)};
  std::istringstream opts(options);
  for (std::string w; opts >> w;) argv.push_back(w);
  argv.insert(argv.end(), {"--", host, remote});
  return argv;
}

std::string lastLine(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  const auto nl = s.rfind('\n');
  return nl == std::string::npos ? s : s.substr(nl + 1);
}
}  // namespace

PreflightResult preflightHost(const std::string& host, const MpirunLaunch& launch,
                              const std::vector<std::string>& paths,
                              const std::string& expected_fingerprint, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  PreflightResult r;
  r.host = host;
  const int connect = std::max(1, std::min(10, static_cast<int>(timeout_s)));
  std::string fingerprint = quoted(launch.worker) + " --model-fingerprint";
  for (const std::string& p : paths) {
    if (p.empty()) continue;
    fingerprint += ' ';
    fingerprint += quoted(p);
  }
  // And the port probe (issue 36), started first and beside it (each start of the worker loads
  // its libraries: about a second): the worker listens on a port of each part of the group's
  // range there and this machine connects to it, so that a firewall dropping the range fails
  // here, in seconds, naming the host and the port. The fingerprint's exit code wins.
  std::vector<std::pair<int, int>> ranges;
  try {
    ranges = probeRanges(launch.port_range);
  } catch (const std::exception& e) {
    r.message = std::string(e.what());
    return r;
  }
  const double probeListen = std::max(1.0, std::min(10.0, timeout_s / 2));
  char listenSecs[32];
  std::snprintf(listenSecs, sizeof listenSecs, "%.0f", probeListen);
  const std::string remote = quoted(launch.worker) + " --probe-listen " +
                             protocol::probeSpec(ranges) + " " + listenSecs + " & " + fingerprint +
                             "; f=$?; wait $!; p=$?; [ $f -ne 0 ] && exit $f; exit $p";
  std::string probeFailure;  // "port P (which) ...: cause" when this machine could not connect
  bool probed = false;
  const Bounded run = runBounded(
      sshArgv(launch.ssh_options, connect, host, remote), timeout_s, [&](const std::string& text) {
        // The worker listens there: connect to each port now (it waits probeListen seconds).
        const auto at = text.find("probe listening");
        if (probed || at == std::string::npos || text.find('\n', at) == std::string::npos)
          return true;
        probed = true;
        std::istringstream ports(text.substr(at + 15, text.find('\n', at) - at - 15));
        int port = 0;
        for (std::size_t i = 0; ports >> port && probeFailure.empty(); ++i) {
          const double connectFor = std::max(1.0, std::min(5.0, probeListen - 1));
          if (const std::string why = protocol::probeConnect(host, port, connectFor);
              !why.empty()) {
            const std::string range =
                i < ranges.size() && ranges[i].second > 0
                    ? std::to_string(ranges[i].first) + "-" + std::to_string(ranges[i].second)
                    : std::string();
            const std::string which = range.empty()
                                          ? std::string(
                                                "an ephemeral port: without --port-range the group "
                                                "listens on any")
                                          : std::string(i == 0 ? "mpirun's channel, ports "
                                                               : "the ranks' channel, ports ") +
                                                range + " of --port-range " + launch.port_range;
            probeFailure = std::to_string(port) + " (" + which + "): " + why;
          }
        }
        return probeFailure.empty();
      });
  const std::string& text = run.text;
  const bool timedOut = run.timedOut;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const int code = run.code;
  const std::string why = lastLine(text);
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.0f", timeout_s);
  if (!probeFailure.empty()) {
    const bool ranged = launch.port_range.find_first_not_of(" \t") != std::string::npos;
    r.message = "host " + host + ": TCP port " + probeFailure +
                "; this machine cannot connect to it, so mpirun could not reach the group there "
                "(a firewall dropping the port?). Fix: " +
                (ranged ? "open TCP ports " + launch.port_range + " on " + host +
                              " (and every host) to the other hosts of the group"
                        : std::string("choose a port range, open it in the firewall of every "
                                      "host and pass it with --port-range MIN-MAX")) +
                " (docs/multi-host.md, Firewalls)";
  } else if (timedOut) {
    r.message =
        "host " + host + ": no answer over ssh within " + secs +
        " s (host down, wrong address, or a firewall dropping packets). Fix: check that `ssh " +
        host + " true` answers from this machine";
  } else if (code == 255 || (code == 127 && why.find("exec ssh") != std::string::npos)) {
    // The advice fits ssh's words: a refused or timed-out connection is not a key problem.
    const std::string fix = sshAdvice(text, host);
    const bool connect = text.find("ssh: connect to host") != std::string::npos ||
                         text.find("Could not resolve hostname") != std::string::npos;
    r.message = "host " + host +
                (connect ? ": ssh cannot connect (" : ": ssh cannot log in without a prompt (") +
                why + "). " +
                (fix.empty() ? "Fix: install this user's key there (ssh-copy-id " + host +
                                   "), accept its host key once (ssh " + host +
                                   " true), or pass the key and options with --ssh-options"
                             : fix);
  } else if (code == 4 || code == 5 || code == 2) {
    // The probe's own failures (after the fingerprint passed): no connection came, no free port
    // in the range, or a worker that does not know --probe-listen.
    r.message = "host " + host + ": the port probe failed (" + why + "). Fix: " +
                (code == 5 ? std::string("free ports of --port-range on ") + host +
                                 " or choose another range"
                           : std::string("install the same DiT Studio version on every host"));
  } else if (code == 126 || code == 127) {
    r.message = "host " + host + ": the worker " + launch.worker +
                " is missing or not executable (" + why +
                "). Fix: install DiT Studio at the same path on every host";
  } else if (code != 0) {
    r.message = "host " + host + ": the model is not readable there (" + why +
                "). Fix: copy the model to the same path on every host";
  } else if (const auto at = text.rfind("fingerprint "); at == std::string::npos) {
    r.message = "host " + host + ": unexpected answer from the worker (" + why + ")";
  } else {
    const std::string after = text.substr(at + 12);
    r.fingerprint = after.substr(0, after.find_first_of("\r\n"));
    if (!expected_fingerprint.empty() && r.fingerprint != expected_fingerprint) {
      // Name the files: the remote `file SIZE DIGEST PATH` lines against this machine's, the
      // worker binary's (when it was fingerprinted: one of `paths`) apart from the model's.
      std::vector<protocol::FileFingerprint> theirs;
      std::istringstream lines(text);
      for (std::string l; std::getline(lines, l);) {
        std::istringstream w(l);
        std::string tag, digest, path;
        std::uint64_t size = 0;
        if (!(w >> tag >> size >> digest) || tag != "file") continue;
        std::getline(w >> std::ws, path);
        theirs.push_back({path, size, digest});
      }
      std::string modelDiff, workerDiff;
      try {
        std::vector<protocol::FileFingerprint> mine = protocol::modelFileFingerprints(paths);
        auto isWorker = [&](const protocol::FileFingerprint& f) { return f.path == launch.worker; };
        std::vector<protocol::FileFingerprint> mineWorker, theirsWorker;
        std::copy_if(mine.begin(), mine.end(), std::back_inserter(mineWorker), isWorker);
        std::copy_if(theirs.begin(), theirs.end(), std::back_inserter(theirsWorker), isWorker);
        mine.erase(std::remove_if(mine.begin(), mine.end(), isWorker), mine.end());
        theirs.erase(std::remove_if(theirs.begin(), theirs.end(), isWorker), theirs.end());
        workerDiff = protocol::describeDifferences(mineWorker, theirsWorker);
        modelDiff = protocol::describeDifferences(mine, theirs);
      } catch (const std::exception&) {
        // This machine's files were fingerprinted a moment ago; nothing more to name.
      }
      if (!workerDiff.empty())
        r.message = "host " + host + " runs a different worker binary: " + workerDiff +
                    ". Fix: install the same DiT Studio build at the same path on every host";
      if (!modelDiff.empty() || workerDiff.empty()) {
        if (!r.message.empty()) r.message += "; ";
        r.message += "host " + host + " holds a different model at " + launch.model +
                     " (fingerprint " + r.fingerprint + ", this machine " + expected_fingerprint +
                     ")" + (modelDiff.empty() ? "" : ": " + modelDiff) +
                     ". Fix: copy the same checkpoint to the same path on every host";
      }
    } else {
      r.ok = true;
    }
  }
  return r;
}

std::string remoteProcessState(const std::string& host, std::int64_t pid,
                               const std::string& ssh_options, double timeout_s) {
  if (pid <= 0) return {};
  const int connect = std::max(1, std::min(10, static_cast<int>(timeout_s)));
  // The state letter of /proc/PID/stat (after the command name in parentheses), or "gone".
  const std::string remote = "s=$(cat /proc/" + std::to_string(pid) +
                             "/stat 2>/dev/null) && echo \"state ${s##*) }\" || echo state gone";
  const Bounded b = runBounded(sshArgv(ssh_options, connect, host, remote), timeout_s);
  const auto at = b.text.find("state ");
  if (b.timedOut || b.code != 0 || at == std::string::npos) return {};
  const std::string word = b.text.substr(at + 6, b.text.find_first_of(" \r\n", at + 6) - at - 6);
  if (word == "gone" || word == "Z" || word == "X") return "exited";
  if (word == "T" || word == "t") return "stopped (state " + word + ": SIGSTOP or a debugger)";
  return "running (state " + word + ")";
}

}  // namespace dit::launcher
