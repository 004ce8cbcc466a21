// Per-operator profile of one forward and its breakdown into step categories: see bench_profile.h.
#include "app/bench/bench_profile.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "app/common/device_stats.h"

namespace dit::bench {

using nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

enum Cat { kGemm, kAttention, kNorm, kRope, kCopy, kElementwise, kCollective, kOther };

// ATen operator names (without "aten::" and a trailing '_') by category. Composite operators
// whose callees belong to them are in the *Owning sets; the rest are counted by their own self
// time only (their callees, if any, are categorised by name).
const std::set<std::string> kGemmOwning = {"linear",
                                           "matmul",
                                           "mm",
                                           "addmm",
                                           "bmm",
                                           "baddbmm",
                                           "addbmm",
                                           "mv",
                                           "addmv",
                                           "dot",
                                           "vdot",
                                           "einsum",
                                           "_addmm_activation",
                                           "mkldnn_linear",
                                           "convolution",
                                           "_convolution",
                                           "conv2d",
                                           "conv1d",
                                           "conv3d",
                                           "mkldnn_convolution",
                                           "_int_mm",
                                           "_scaled_mm",
                                           "_weight_int8pack_mm",
                                           "_weight_int4pack_mm",
                                           "cudnn_convolution"};
const std::set<std::string> kAttentionOwning = {"scaled_dot_product_attention",
                                                "_softmax",
                                                "softmax",
                                                "_safe_softmax",
                                                "_flash_attention_forward",
                                                "_efficient_attention_forward"};
const std::set<std::string> kNormOwning = {
    "layer_norm",    "native_layer_norm",  "rms_norm",   "_fused_rms_norm",
    "group_norm",    "native_group_norm",  "batch_norm", "native_batch_norm",
    "instance_norm", "linalg_vector_norm", "norm"};
const std::set<std::string> kRopeOwning = {"view_as_complex", "view_as_real", "polar"};
const std::set<std::string> kCopyOwning = {"copy",
                                           "_to_copy",
                                           "to",
                                           "clone",
                                           "contiguous",
                                           "cat",
                                           "_cat",
                                           "stack",
                                           "repeat",
                                           "repeat_interleave",
                                           "roll",
                                           "flip",
                                           "constant_pad_nd",
                                           "pad",
                                           "narrow_copy",
                                           "index_select",
                                           "gather",
                                           "index",
                                           "index_put",
                                           "_index_put_impl",
                                           "pixel_shuffle",
                                           "pixel_unshuffle",
                                           "_unsafe_view",
                                           "view",
                                           "reshape",
                                           "_reshape_alias",
                                           "permute",
                                           "transpose",
                                           "t",
                                           "expand",
                                           "expand_as",
                                           "unsqueeze",
                                           "squeeze",
                                           "narrow",
                                           "slice",
                                           "select",
                                           "split",
                                           "split_with_sizes",
                                           "chunk",
                                           "unbind",
                                           "flatten",
                                           "unflatten",
                                           "as_strided",
                                           "alias",
                                           "detach",
                                           "view_as",
                                           "movedim",
                                           "unfold",
                                           "lift_fresh",
                                           "_reshape_copy",
                                           "resolve_conj",
                                           "resolve_neg"};
const std::set<std::string> kElementwiseOwning = {
    "add",          "sub",         "mul",         "div",
    "addcmul",      "addcdiv",     "gelu",        "silu",
    "sigmoid",      "tanh",        "relu",        "exp",
    "log",          "pow",         "sqrt",        "rsqrt",
    "neg",          "abs",         "clamp",       "clamp_min",
    "clamp_max",    "where",       "masked_fill", "lerp",
    "sin",          "cos",         "reciprocal",  "square",
    "mean",         "sum",         "amax",        "amin",
    "max",          "min",         "erf",         "sign",
    "floor",        "ceil",        "round",       "eq",
    "ne",           "lt",          "le",          "gt",
    "ge",           "logical_not", "logical_and", "cumsum",
    "arange",       "fill",        "zero",        "full",
    "full_like",    "zeros",       "zeros_like",  "ones",
    "ones_like",    "float_power", "true_divide", "rsub",
    "linspace",     "outer",       "exp2",        "sigmoid_backward",
    "hardtanh",     "leaky_relu",  "softplus",    "mish",
    "_log_softmax", "log_softmax", "var_mean",    "var",
    "std"};

std::string bareName(const std::string& name) {
  std::string n = name;
  if (const size_t p = n.rfind("::"); p != std::string::npos) n = n.substr(p + 2);
  if (n.size() > 1 && n.back() == '_' && n[n.size() - 2] != '_') n.pop_back();
  return n;
}

int scopeCategory(const std::string& name) {
  // "dit::<category>::<what>"
  static const std::map<std::string, int> kScopes = {{"gemm", kGemm},
                                                     {"attention", kAttention},
                                                     {"norm", kNorm},
                                                     {"rope", kRope},
                                                     {"copy", kCopy},
                                                     {"elementwise", kElementwise},
                                                     {"collective", kCollective},
                                                     {"other", kOther}};
  if (name.rfind("dit::", 0) != 0) return kOther;
  const std::string rest = name.substr(5);
  const auto it = kScopes.find(rest.substr(0, rest.find("::")));
  return it == kScopes.end() ? kOther : it->second;
}

struct OpStat {
  int64_t calls = 0;
  double totalMs = 0.0, selfMs = 0.0;
  std::array<double, kNumStepCategories> catSelfMs{};  ///< self time by the category it went to
  int mainCategory() const {
    return static_cast<int>(std::max_element(catSelfMs.begin(), catSelfMs.end()) -
                            catSelfMs.begin());
  }
};
struct OpFrame {
  const char* name;
  Clock::time_point t0;
  double childMs;
  bool scope;
  int cat;          ///< the category this frame's self time counts to
  bool owning;      ///< this frame or one around it owns its callees
  bool scopeOwned;  ///< ... and that owner is a profile scope
};

// One profile's state (this thread's).
struct Recorder {
  std::map<std::string, OpStat> ops, scopes;
  std::array<double, kNumStepCategories> catMs{};
  std::map<std::string, double> unmappedMs;  ///< operators counted to "other" by name
  double allocationMs = 0.0;                 ///< empty / empty_like / empty_strided / resize_
  std::vector<OpFrame> stack;
  // CUDA: a mark at every change of the category in force, tagged with the new one.
  DeviceEventMarks* marks = nullptr;
  std::vector<int> markCats;
  int current = kOther;
  void follow() {
    if (!marks || !marks->enabled()) return;
    const int c = stack.empty() ? kOther : stack.back().cat;
    if (c == current) return;
    marks->mark();
    markCats.push_back(c);
    current = c;
  }
};
thread_local Recorder* t_rec = nullptr;

// Operators that move data (not views): they keep copy_layout inside a composite operator's region
// (the input copy aten::linear makes of a strided tensor is a layout cost, not GEMM time); inside
// a profile scope they count to the scope, as everything does.
bool movesData(const std::string& bare) {
  static const std::set<std::string> kMoving = {"copy",
                                                "_to_copy",
                                                "to",
                                                "clone",
                                                "contiguous",
                                                "cat",
                                                "_cat",
                                                "stack",
                                                "repeat",
                                                "repeat_interleave",
                                                "index_select",
                                                "gather",
                                                "constant_pad_nd",
                                                "pad",
                                                "roll",
                                                "flip",
                                                "narrow_copy",
                                                "pixel_shuffle",
                                                "pixel_unshuffle",
                                                "_reshape_copy"};
  return kMoving.count(bare) > 0;
}

bool isAllocation(const std::string& bare) {
  return bare == "empty" || bare == "empty_like" || bare == "empty_strided" || bare == "resize" ||
         bare == "new_empty" || bare == "new_empty_strided" || bare == "set";
}

std::unique_ptr<at::ObserverContext> onOpStart(const at::RecordFunction& fn) {
  Recorder* r = t_rec;
  if (!r) return nullptr;
  const bool scope = fn.scope() == at::RecordScope::USER_SCOPE;
  const CategoryOf own = stepCategory(fn.name(), scope);
  OpFrame f{fn.name(), Clock::now(), 0.0, scope, own.category, own.owns, scope};
  if (!r->stack.empty()) {
    const OpFrame& up = r->stack.back();
    const bool keepCopy = own.category == kCopy && !up.scopeOwned && movesData(bareName(f.name));
    if (up.owning && !keepCopy) {
      f.cat = up.cat;
      f.owning = true;
      f.scopeOwned = up.scopeOwned;
    }
  }
  r->stack.push_back(f);
  r->follow();
  return nullptr;
}

void onOpEnd(const at::RecordFunction& /*fn*/, at::ObserverContext* /*ctx*/) {
  Recorder* r = t_rec;
  if (!r || r->stack.empty()) return;
  const OpFrame f = r->stack.back();
  r->stack.pop_back();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - f.t0).count();
  const double self = ms - f.childMs;
  OpStat& st = (f.scope ? r->scopes : r->ops)[f.name];
  ++st.calls;
  st.totalMs += ms;
  st.selfMs += self;
  st.catSelfMs[f.cat] += self;
  r->catMs[f.cat] += self;
  if (f.cat == kOther && !f.scope) {
    const std::string bare = bareName(f.name);
    if (isAllocation(bare))
      r->allocationMs += self;
    else
      r->unmappedMs[f.name] += self;
  }
  if (!r->stack.empty()) r->stack.back().childMs += ms;
  r->follow();
}

ordered_json categoriesJson(const std::array<double, kNumStepCategories>& ms, double stepMs) {
  ordered_json j;
  for (int c = 0; c < kNumStepCategories; ++c) j[kStepCategories[c]] = ms[c];
  ordered_json f;
  for (int c = 0; c < kNumStepCategories; ++c)
    f[kStepCategories[c]] = stepMs > 0 ? ms[c] / stepMs : 0.0;
  return {{"ms", j}, {"fraction", f}};
}

const char* kCategoryMap =
    "self time of each ATen operator and profile scope (parallel/profile_scope.h), counted to the "
    "category of the outermost enclosing region that owns its callees, else to its own (an "
    "operator that moves data, copy_ / contiguous / cat / _to_copy ..., stays copy_layout inside "
    "a composite operator such as aten::linear, but not inside a profile scope): "
    "gemm = linear, matmul, mm, addmm, bmm, baddbmm, addbmm, mv, addmv, dot, einsum, "
    "convolutions, int/scaled mm, dit::gemm::* scopes; "
    "attention = scaled_dot_product_attention and its fused kernels (_scaled_dot_product_*, "
    "_flash_attention_forward, _efficient_attention_forward), softmax, dit::attention::* "
    "(the project's CPU attention kernel); "
    "norm_modulation = layer_norm, rms_norm, group_norm, batch_norm, vector norms, dit::norm::*; "
    "rope = view_as_complex, view_as_real, polar, dit::rope::* (the fused q/k RMSNorm + RoPE "
    "kernel counts here); "
    "copy_layout = copy_, _to_copy, to, clone, contiguous, cat, stack, repeat, pad, index/gather, "
    "and the view operators (view, reshape, permute, transpose, expand, narrow, slice, select, "
    "split, chunk, unbind, flatten, as_strided, ...), dit::copy::*; "
    "elementwise = add, sub, mul, div, addcmul, gelu, silu, sigmoid, tanh, exp, pow, rsqrt, "
    "where, clamp, reductions (mean, sum, amax), fills and factories (zeros, full, arange), "
    "dit::elementwise::* (the project's activation kernels) - modulation, gating and residual "
    "adds written as ATen arithmetic land here, not in norm_modulation; "
    "collective = dit::collective::* (every process-group call and Work::wait) and c10d::*; "
    "other = allocation (empty*, resize_), unlisted operators (other_detail.unmapped_ops) and "
    "the host time outside every operator and scope (other_detail.outside_ops_ms)";

}  // namespace

CategoryOf stepCategory(const std::string& name, bool userScope) {
  if (userScope) return {scopeCategory(name), true};
  if (name.rfind("c10d::", 0) == 0) return {kCollective, true};
  const std::string n = bareName(name);
  if (n.rfind("_scaled_dot_product", 0) == 0) return {kAttention, true};
  if (kGemmOwning.count(n)) return {kGemm, true};
  if (kAttentionOwning.count(n)) return {kAttention, true};
  if (kNormOwning.count(n)) return {kNorm, true};
  if (kRopeOwning.count(n)) return {kRope, true};
  if (kCopyOwning.count(n)) return {kCopy, true};
  if (kElementwiseOwning.count(n)) return {kElementwise, true};
  return {kOther, false};
}

ordered_json profileOps(const std::function<void()>& fn, const c10::Device& device, size_t top) {
  Recorder rec;
  DeviceEventMarks marks(device);
  if (marks.enabled()) {
    rec.marks = &marks;
    marks.mark();  // the step's start, in "other" until the first operator
    rec.markCats.push_back(kOther);
  }
  double stepMs = 0.0;
  {
    // Installed for fn only, removed also when it throws.
    struct Installed {
      at::CallbackHandle h;
      explicit Installed(Recorder* r)
          : h(at::addThreadLocalCallback(
                at::RecordFunctionCallback(&onOpStart, &onOpEnd)
                    .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}))) {
        t_rec = r;
      }
      ~Installed() {
        at::removeCallback(h);
        t_rec = nullptr;
      }
    } installed(&rec);
    const auto t0 = Clock::now();
    fn();
    stepMs = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  if (marks.enabled()) marks.mark();  // the step's end (fn synchronised the device)

  double selfSum = 0.0;
  for (const auto& [name, st] : rec.ops) selfSum += st.selfMs;
  for (const auto& [name, st] : rec.scopes) selfSum += st.selfMs;
  const double outside = stepMs - selfSum;
  std::array<double, kNumStepCategories> cat = rec.catMs;
  cat[kOther] += outside;

  auto sorted = [](const std::map<std::string, OpStat>& m) {
    std::vector<std::pair<std::string, OpStat>> v(m.begin(), m.end());
    std::sort(v.begin(), v.end(),
              [](const auto& x, const auto& y) { return x.second.selfMs > y.second.selfMs; });
    return v;
  };
  ordered_json ops = ordered_json::array();
  const auto vo = sorted(rec.ops);
  for (size_t i = 0; i < vo.size() && i < top; ++i)
    ops.push_back({{"op", vo[i].first},
                   {"category", kStepCategories[vo[i].second.mainCategory()]},
                   {"calls", vo[i].second.calls},
                   {"self_ms", vo[i].second.selfMs},
                   {"total_ms", vo[i].second.totalMs}});
  ordered_json scopes = ordered_json::array();
  for (const auto& [name, st] : sorted(rec.scopes))
    scopes.push_back({{"scope", name},
                      {"category", kStepCategories[scopeCategory(name)]},
                      {"calls", st.calls},
                      {"self_ms", st.selfMs},
                      {"total_ms", st.totalMs}});
  std::vector<std::pair<std::string, double>> um(rec.unmappedMs.begin(), rec.unmappedMs.end());
  std::sort(um.begin(), um.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
  ordered_json unmapped = ordered_json::array();
  for (size_t i = 0; i < um.size() && i < 10; ++i)
    unmapped.push_back({{"op", um[i].first}, {"self_ms", um[i].second}});

  ordered_json j;
  j["step_ms"] = stepMs;
  j["ops_self_ms"] = selfSum;
  j["outside_ops_ms"] = outside;
  const ordered_json cj = categoriesJson(cat, stepMs);
  j["categories_ms"] = cj["ms"];
  j["categories_fraction"] = cj["fraction"];
  j["other_detail"] = {
      {"outside_ops_ms", outside}, {"allocation_ms", rec.allocationMs}, {"unmapped_ops", unmapped}};
  if (marks.enabled()) {
    const std::vector<double> iv = marks.intervalsMs();
    std::array<double, kNumStepCategories> dev{};
    double devStep = 0.0;
    for (size_t i = 0; i < iv.size() && i < rec.markCats.size(); ++i) {
      dev[rec.markCats[i]] += iv[i];
      devStep += iv[i];
    }
    j["device_step_ms"] = devStep;
    const ordered_json dj = categoriesJson(dev, devStep);
    j["device_categories_ms"] = dj["ms"];
    j["device_categories_fraction"] = dj["fraction"];
    j["device_marks"] = marks.size();
    j["device_note"] =
        "CUDA events on the current stream at every change of category (no synchronisation "
        "inside the step); an interval counts to the category in force on the host when it "
        "began, so device time is attributed by the host code that queued it, and idle device "
        "time between queued kernels counts to the category the host was in";
  }
  j["scopes"] = scopes;
  j["ops"] = ops;
  j["category_map"] = kCategoryMap;
  return j;
}

std::string profileSummary(const ordered_json& p, size_t topOps) {
  std::ostringstream o;
  char line[256];
  const double step = p.value("step_ms", 0.0);
  const bool dev = p.contains("device_categories_ms");
  std::snprintf(line, sizeof line, "step profile: %.2f ms on the host%s\n", step,
                dev ? " (device columns: CUDA events)" : "");
  o << line;
  std::snprintf(line, sizeof line, "  %-16s %10s %7s%s\n", "category", "ms", "%",
                dev ? "   device_ms  dev_%" : "");
  o << line;
  for (int c = 0; c < kNumStepCategories; ++c) {
    const char* k = kStepCategories[c];
    std::snprintf(line, sizeof line, "  %-16s %10.2f %6.1f%%", k,
                  p["categories_ms"][k].get<double>(),
                  100.0 * p["categories_fraction"][k].get<double>());
    o << line;
    if (dev) {
      std::snprintf(line, sizeof line, " %11.2f %5.1f%%",
                    p["device_categories_ms"][k].get<double>(),
                    100.0 * p["device_categories_fraction"][k].get<double>());
      o << line;
    }
    o << "\n";
  }
  std::snprintf(line, sizeof line, "  (other: %.2f ms outside operators, %.2f ms allocation)\n",
                p["other_detail"]["outside_ops_ms"].get<double>(),
                p["other_detail"]["allocation_ms"].get<double>());
  o << line;
  o << "  top operators by self time:\n";
  size_t n = 0;
  for (const auto& op : p["ops"]) {
    if (n++ >= topOps) break;
    std::snprintf(line, sizeof line, "    %-44s %-15s %6lld calls %9.2f ms\n",
                  op["op"].get<std::string>().c_str(), op["category"].get<std::string>().c_str(),
                  static_cast<long long>(op["calls"].get<int64_t>()), op["self_ms"].get<double>());
    o << line;
  }
  if (!p["scopes"].empty()) o << "  profile scopes:\n";
  for (const auto& s : p["scopes"]) {
    std::snprintf(line, sizeof line, "    %-44s %-15s %6lld calls %9.2f ms (self %.2f)\n",
                  s["scope"].get<std::string>().c_str(), s["category"].get<std::string>().c_str(),
                  static_cast<long long>(s["calls"].get<int64_t>()), s["total_ms"].get<double>(),
                  s["self_ms"].get<double>());
    o << line;
  }
  return o.str();
}

}  // namespace dit::bench
