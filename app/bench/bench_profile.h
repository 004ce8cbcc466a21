// ditstudio-bench --profile: one more forward after the timed ones with RecordFunction callbacks
// on this thread (ATen operators as dispatched; intra-op worker threads run inside them),
// aggregated by operator name: calls, total and self milliseconds (self = total minus the
// operators called inside it). Same idea as torch.profiler's key_averages() table; the callbacks
// add a few microseconds per op.
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>

namespace dit::bench {

/// Runs fn once under the operator callbacks; returns {"step_ms", "ops_self_ms",
/// "outside_ops_ms", "ops": the top `top` operators by self time}.
nlohmann::ordered_json profileOps(const std::function<void()>& fn, size_t top = 25);

}  // namespace dit::bench
