#include "app/worker/liveness.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <thread>

namespace dit::worker {

std::string hostname() {
  char h[256] = {0};
  gethostname(h, sizeof h - 1);
  return h;
}

double heartbeatTimeoutSeconds() {
  double t = 10.0;
  if (const char* v = std::getenv("DITSTUDIO_HEARTBEAT_TIMEOUT_S"); v && *v) {
    char* end = nullptr;
    const double d = std::strtod(v, &end);
    if (end != v && std::isfinite(d) && d > 0) t = d;
  }
  if (const char* v = std::getenv("DITSTUDIO_COLLECTIVE_TIMEOUT_S"); v && *v) {
    const double c = std::strtod(v, nullptr);
    if (std::isfinite(c) && c > 0) t = std::min(t, c);
  }
  return t;
}

std::string processState(const Peer& p, const std::string& myHost) {
  if (p.pid <= 0 || p.host != myHost) return {};
  std::ifstream in("/proc/" + std::to_string(p.pid) + "/stat");
  std::string stat;
  if (!in || !std::getline(in, stat)) return "its process has exited";
  const auto close = stat.rfind(')');
  const char state = close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
  if (state == 'T' || state == 't')
    return "its process is stopped (state " + std::string(1, state) + ": SIGSTOP or a debugger)";
  if (state == 'Z' || state == 'X') return "its process has exited";
  return "its process is running (state " + std::string(1, state) + ") but does not answer";
}

std::string describePeer(int rank, const Peer& p) {
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(p.pid) + " on " + p.host + ")";
}

bool waitAll(std::vector<MPI_Request>& reqs, double seconds) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int done = 0;
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::string livenessReport(const std::vector<Peer>& peers, int self) {
  std::string out;
  for (int r = 0; r < static_cast<int>(peers.size()); ++r) {
    if (r == self) continue;
    const std::string state = processState(peers[static_cast<size_t>(r)], hostname());
    if (state.empty() && peers[static_cast<size_t>(r)].host != hostname()) {
      // Another host: only its silence is known here (it hangs, or the link to it is down).
      out += "; " + describePeer(r, peers[static_cast<size_t>(r)]) +
             " is on another host that did not answer (is the link to it up?)";
      continue;
    }
    if (state.empty() || state.rfind("its process is running", 0) == 0) continue;
    out += "; " + describePeer(r, peers[static_cast<size_t>(r)]) + " stopped responding: " + state;
  }
  return out;
}

}  // namespace dit::worker
