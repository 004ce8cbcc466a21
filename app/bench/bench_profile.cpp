// Per-operator profile of one forward: see bench_profile.h.
#include "app/bench/bench_profile.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dit::bench {

using nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

struct OpStat {
  int64_t calls = 0;
  double totalMs = 0.0, selfMs = 0.0;
};
struct OpFrame {
  const char* name;
  Clock::time_point t0;
  double childMs;
};
thread_local std::vector<OpFrame> t_opStack;
thread_local std::map<std::string, OpStat>* t_opStats = nullptr;

std::unique_ptr<at::ObserverContext> onOpStart(const at::RecordFunction& fn) {
  if (t_opStats) t_opStack.push_back({fn.name(), Clock::now(), 0.0});
  return nullptr;
}

void onOpEnd(const at::RecordFunction& /*fn*/, at::ObserverContext* /*ctx*/) {
  if (!t_opStats || t_opStack.empty()) return;
  const OpFrame f = t_opStack.back();
  t_opStack.pop_back();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - f.t0).count();
  OpStat& st = (*t_opStats)[f.name];
  ++st.calls;
  st.totalMs += ms;
  st.selfMs += ms - f.childMs;
  if (!t_opStack.empty()) t_opStack.back().childMs += ms;
}

}  // namespace

ordered_json profileOps(const std::function<void()>& fn, size_t top) {
  std::map<std::string, OpStat> stats;
  t_opStats = &stats;
  t_opStack.clear();
  const at::CallbackHandle h = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&onOpStart, &onOpEnd).scopes({at::RecordScope::FUNCTION}));
  const auto t0 = Clock::now();
  fn();
  const double stepMs = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  at::removeCallback(h);
  t_opStats = nullptr;
  std::vector<std::pair<std::string, OpStat>> v(stats.begin(), stats.end());
  std::sort(v.begin(), v.end(),
            [](const auto& x, const auto& y) { return x.second.selfMs > y.second.selfMs; });
  ordered_json ops = ordered_json::array();
  double selfSum = 0.0;
  for (const auto& [name, st] : v) selfSum += st.selfMs;
  for (size_t i = 0; i < v.size() && i < top; ++i)
    ops.push_back({{"op", v[i].first},
                   {"calls", v[i].second.calls},
                   {"self_ms", v[i].second.selfMs},
                   {"total_ms", v[i].second.totalMs}});
  return {{"step_ms", stepMs},
          {"ops_self_ms", selfSum},
          {"outside_ops_ms", stepMs - selfSum},
          {"ops", ops}};
}

}  // namespace dit::bench
