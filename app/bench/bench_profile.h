// ditstudio-bench --profile: one more forward after the timed ones with RecordFunction callbacks
// on this thread (ATen operators as dispatched and the project's profile scopes,
// parallel/profile_scope.h; intra-op worker threads run inside them), aggregated by operator name:
// calls, total and self milliseconds (self = total minus the operators called inside it). Same
// idea as torch.profiler's key_averages() table; the callbacks add a few microseconds per op.
//
// The step is also broken into categories (stepCategory): gemm, attention, norm_modulation, rope,
// copy_layout, elementwise, collective, other. Each operator's self time goes to the category of
// the outermost enclosing region that owns its callees (a profile scope, or a composite operator
// such as aten::linear or aten::scaled_dot_product_attention), else to its own name's category;
// an operator that moves data (copy_, contiguous, cat, _to_copy, ...) stays copy_layout inside a
// composite operator, not inside a profile scope;
// the host time outside every operator and scope goes to "other". The categories sum to the step.
// On a CUDA device the same attribution is also made with device events recorded on the current
// stream at every change of category (one synchronisation after the step, none inside it):
// "device_categories_ms".
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace dit::bench {

/// The categories of a step, in report order.
inline constexpr const char* kStepCategories[] = {"gemm",       "attention",   "norm_modulation",
                                                  "rope",       "copy_layout", "elementwise",
                                                  "collective", "other"};
inline constexpr int kNumStepCategories = 8;

/// The category index (into kStepCategories) of an operator or scope name, and whether the
/// region owns what runs inside it (its callees count to it). `userScope`: a profile scope
/// ("dit::<category>::<what>"; an unknown category is "other"). Operators: ATen names
/// ("aten::addmm"), matched without the namespace and a trailing '_' (in-place forms); c10d::*
/// are collectives; anything unlisted is "other".
struct CategoryOf {
  int category;
  bool owns;
};
CategoryOf stepCategory(const std::string& name, bool userScope);

/// Runs fn once under the operator callbacks; returns {"step_ms", "ops_self_ms",
/// "outside_ops_ms", "categories_ms" {category: ms}, "categories_fraction", "other_detail",
/// "scopes", "ops": the top `top` operators by self time, "category_map": the mapping in
/// words}. `device`: on CUDA, also "device_step_ms" and "device_categories_ms" from events.
nlohmann::ordered_json profileOps(const std::function<void()>& fn, const c10::Device& device,
                                  size_t top = 25);

/// A readable table of a profile (categories with ms and % of the step, then the top operators).
std::string profileSummary(const nlohmann::ordered_json& profile, size_t topOps = 12);

}  // namespace dit::bench
