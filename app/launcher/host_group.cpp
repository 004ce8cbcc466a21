#include "app/launcher/host_group.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <regex>
#include <stdexcept>

#include "app/protocol/file_fingerprint.h"

namespace dit::launcher {

std::string describeHostPlan(const HostPlan& plan) {
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
  return shown;
}

std::string hostOfRank(const HostPlan& plan, int rank) {
  for (const auto& [h, ranks] : plan)
    if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end()) return h;
  return {};
}

bool HostGroupCheck::ok() const {
  return std::all_of(hosts.begin(), hosts.end(), [](const PreflightResult& r) { return r.ok; });
}

std::string HostGroupCheck::failure() const {
  std::string failures;
  for (const PreflightResult& r : hosts)
    if (!r.ok) failures += (failures.empty() ? "" : "\n") + r.message;
  return failures.empty() ? std::string() : "pre-flight failed:\n" + failures;
}

std::string HostGroupCheck::failedHost() const {
  for (const PreflightResult& r : hosts)
    if (!r.ok) return r.host;
  return {};
}

HostGroupCheck checkHostGroup(const MpirunLaunch& launch,
                              const std::vector<std::string>& model_paths, bool preflight,
                              const HostGroupProgress& progress) {
  HostGroupCheck out;
  const std::string text = readHostfile(launch.hostfile);  // regular file, bounded
  out.plan = planHostfile(parseHostfile(text), launch.strategy.world, launch.oversubscribe,
                          launch.hostfile);
  if (progress.planned) progress.planned(out.plan);
  if (!launch.port_range.empty()) {
    // Each rank listens on a port of the ranks' part of the range.
    const PortPlan pp = planPortRange(launch.port_range);
    std::size_t most = 0;
    for (const auto& hr : out.plan) most = std::max(most, hr.second.size());
    if (static_cast<int>(most) > pp.btl_max - pp.btl_min + 1)
      throw std::invalid_argument("--port-range " + launch.port_range + " leaves " +
                                  std::to_string(pp.btl_max - pp.btl_min + 1) + " ports (" +
                                  std::to_string(pp.btl_min) + "-" + std::to_string(pp.btl_max) +
                                  ") for the ranks, but " + std::to_string(most) +
                                  " ranks run on one host: give a wider range");
  }
  if (!preflight) return out;
  // The worker binary is compared with the model (issue 45): a host with another build of the
  // worker at the same path is refused before mpirun starts, naming the file.
  std::vector<std::string> files = model_paths;
  std::error_code ec;
  if (!launch.worker.empty() && std::filesystem::is_regular_file(launch.worker, ec))
    files.push_back(launch.worker);
  const std::string mine = protocol::modelFingerprint(files);
  for (const auto& [host, ranks] : out.plan) {
    if (ranks.empty() || isLocalHost(host)) continue;
    if (progress.cancelled && progress.cancelled()) break;
    out.hosts.push_back(preflightHost(host, launch, files, mine));
    if (progress.checked) progress.checked(out.hosts.back());
  }
  return out;
}

RemoteRankWatch::RemoteRankWatch(HostPlan plan, std::string ssh_options, StateQuery query)
    : plan_(std::move(plan)), query_(std::move(query)), lastEvent_(SteadyClock::now()) {
  if (!query_)
    query_ = [ssh = std::move(ssh_options)](const std::string& host, std::int64_t pid) {
      return remoteProcessState(host, pid, ssh);
    };
}

void RemoteRankWatch::noteEvent(SteadyClock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  lastEvent_ = now;
  stallChecked_ = false;
}

bool RemoteRankWatch::stallDue(std::chrono::seconds stall, SteadyClock::time_point now) const {
  std::lock_guard<std::mutex> lock(mu_);
  return !plan_.empty() && !stallChecked_ && now - lastEvent_ >= stall;
}

bool RemoteRankWatch::claimStall() {
  std::lock_guard<std::mutex> lock(mu_);
  if (plan_.empty() || stallChecked_) return false;
  stallChecked_ = true;
  return true;
}

std::vector<RemoteRankState> RemoteRankWatch::checkStall(
    const std::map<int, std::int64_t>& rank_pids) {
  if (!claimStall()) return {};
  return askStall(rank_pids);
}

std::vector<RemoteRankState> RemoteRankWatch::askStall(
    const std::map<int, std::int64_t>& rank_pids) {
  // The remote ranks, marked as being asked about before the first question: an error that
  // comes meanwhile waits for these answers instead of asking again (rewriteWith).
  std::vector<std::pair<int, std::int64_t>> remote;
  for (const auto& [rank, pid] : rank_pids) {
    const std::string host = hostOfRank(plan_, rank);
    if (!host.empty() && !isLocalHost(host)) remote.emplace_back(rank, pid);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& rp : remote) ++asking_[rp.first];
  }
  std::vector<RemoteRankState> named;
  for (const auto& [rank, pid] : remote) {
    const std::string host = hostOfRank(plan_, rank);
    std::string state;
    try {
      state = query_(host, pid);  // outside the lock: ssh takes seconds
    } catch (...) {               // documented not to throw
    }
    const bool stoppedOrExited = state.rfind("stopped", 0) == 0 || state == "exited";
    {
      // Kept for the error that follows. No answer is not kept: on a loaded host one ssh can
      // take longer than its bound, and the error's rewrite() asks once more (bounded too).
      std::lock_guard<std::mutex> lock(mu_);
      if (stoppedOrExited) known_[rank] = state;
      if (--asking_[rank] <= 0) asking_.erase(rank);
    }
    asked_.notify_all();
    if (stoppedOrExited) named.push_back({rank, pid, host, state});
  }
  return named;
}

namespace {
// m[4] matched: a rank an error named silent; m[5] matched: a rank OpenMPI 5 saw disconnect
// (WorkerSession's peer-lost failure).
const std::regex& silentClause() {
  static const std::regex silent(
      R"(rank (\d+) \(pid (\d+) on ([^)]*)\) (?:(is on another host that did not answer \(is the link to it up\?\))|(disconnected)))");
  return silent;
}
}  // namespace

bool RemoteRankWatch::hasSilentRank(const std::string& message) {
  return std::regex_search(message, silentClause());
}

bool RemoteRankWatch::hasDisconnectedRank(const std::string& message) {
  for (std::sregex_iterator it(message.begin(), message.end(), silentClause()), end; it != end;
       ++it)
    if ((*it)[5].matched) return true;
  return false;
}

std::string RemoteRankWatch::rewrite(const std::string& message) {
  return rewriteWith(message, true);
}

std::string RemoteRankWatch::rewriteKnown(const std::string& text) {
  return rewriteWith(text, false);
}

std::string RemoteRankWatch::rewriteWith(const std::string& given, bool ask) {
  std::string message = given, out;
  std::smatch m;
  while (std::regex_search(message, m, silentClause())) {
    // Digits only (the pattern); a number too large for a rank or pid names none.
    const long long rankNumber = std::strtoll(m[1].str().c_str(), nullptr, 10);
    const int rank = rankNumber >= 0 && rankNumber < (1 << 30) ? static_cast<int>(rankNumber) : -1;
    const std::string host = hostOfRank(plan_, rank);
    std::string clause = m[0];
    if (!host.empty() && !isLocalHost(host)) {
      std::optional<std::string> state;
      {
        std::unique_lock<std::mutex> lock(mu_);
        // A stall check asking about this rank now: its answer, not a second question.
        if (ask)
          asked_.wait_for(lock, std::chrono::seconds(30), [&] { return !asking_.count(rank); });
        if (const auto k = known_.find(rank); k != known_.end()) state = k->second;
      }
      if (!state && ask) {
        state = query_(host, std::strtoll(m[2].str().c_str(), nullptr, 10));  // outside the lock
        if (state->rfind("running", 0) != 0) {  // kept for the same clause elsewhere
          std::lock_guard<std::mutex> lock(mu_);
          known_[rank] = *state;
        }
      }
      const bool disconnected = m[5].matched;
      // A disconnected rank is named by its hello's host name: the hostfile's name is added.
      const std::string where =
          disconnected && m[3].str() != host ? host + ", host name " + m[3].str() : m[3].str();
      const std::string who = "rank " + m[1].str() + " (pid " + m[2].str() + " on " + where;
      if (!state) {
        // not known and not asked: the clause stays as it is
      } else if (state->rfind("stopped", 0) == 0) {
        clause = who + ") is " + *state + " (asked over ssh): it is not cut off, it does not run";
      } else if (*state == "exited") {
        clause = who + ") has exited (asked over ssh)";
      } else if (state->empty() && disconnected) {
        clause = who + ") disconnected, and " + host +
                 " does not answer over ssh either: the link to it is down (or the host is)";
      } else if (state->empty()) {
        clause = who + ") is on another host that did not answer, nor does " + host +
                 " over ssh: the link to it is down (or the host is)";
      } else if (disconnected) {  // running
        clause = who + ") is still " + *state +
                 " (asked over ssh): the connection between the hosts dropped, not the rank";
      }
    }
    out += m.prefix().str() + clause;
    message = m.suffix().str();
  }
  return out + message;
}

std::map<int, std::string> RemoteRankWatch::known() const {
  std::lock_guard<std::mutex> lock(mu_);
  return known_;
}

std::chrono::seconds RemoteRankWatch::stallAfter(double collective_timeout_s) {
  double t = collective_timeout_s;
  if (t <= 0) {
    const char* ct = std::getenv("DITSTUDIO_COLLECTIVE_TIMEOUT_S");
    t = ct && std::atof(ct) > 0 ? std::atof(ct) : 300.0;
  }
  return std::chrono::seconds(static_cast<long>(std::clamp(t / 2, 2.0, 60.0)));
}

}  // namespace dit::launcher
