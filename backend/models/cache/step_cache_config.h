// Step caching settings (diffusers hooks/first_block_cache.py FirstBlockCacheConfig and
// hooks/taylorseer_cache.py TaylorSeerCacheConfig) and their one-line spelling used by the CLI,
// the request protocol and PNG metadata:
//   "none" | "first-block:THRESHOLD" | "taylorseer:ORDER[,INTERVAL,WARMUP][,lite]".
// Torch-free and header-only (the GUI and the request protocol parse it without linking the
// backend).
#pragma once

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dit {

struct StepCacheConfig {
  enum class Mode { None, FirstBlock, TaylorSeer };
  Mode mode = Mode::None;
  /// FirstBlockCacheConfig.threshold: the remaining blocks run iff the relative L1 change of the
  /// first block's residual exceeds it (strictly).
  double threshold = 0.05;
  /// TaylorSeerCacheConfig.max_order (1 or 2 here; diffusers accepts any >= 1, so do we up to 4).
  int max_order = 1;
  /// TaylorSeerCacheConfig.cache_interval (K >= 1): after warm-up, every K-th step computes.
  int cache_interval = 5;
  /// TaylorSeerCacheConfig.disable_cache_before_step (W >= 0): steps 0..W-1 always compute.
  int disable_cache_before_step = 3;
  /// TaylorSeerCacheConfig.use_lite_mode: skip every block, Taylor-predict proj_out.
  bool use_lite_mode = false;

  bool enabled() const { return mode != Mode::None; }
  /// TaylorSeer's schedule: step i (0-based, per model call context) computes iff i < W or
  /// (i - W - 1) mod K == 0 (Python's non-negative mod).
  bool taylorComputes(int step) const;
  /// The canonical spelling ("none", "first-block:0.37", "taylorseer:2,3,2", ",lite" appended).
  std::string toString() const;
  bool operator==(const StepCacheConfig& o) const { return toString() == o.toString(); }
};

/// Parses the spelling above ("" and "none" = off). Throws std::invalid_argument naming the
/// text and the accepted forms: unknown mode, threshold not a finite number > 0, order outside
/// [1, 4], interval < 1, warm-up < 0 or > 1000, trailing junk.
StepCacheConfig parseStepCacheConfig(const std::string& text);

// ---- implementation ----

namespace step_cache_detail {
inline const char* const kForms =
    "use none, first-block:THRESHOLD (e.g. first-block:0.08) or "
    "taylorseer:ORDER[,INTERVAL,WARMUP][,lite] (e.g. taylorseer:1,5,3)";

[[noreturn]] inline void bad(const std::string& text, const std::string& why) {
  throw std::invalid_argument("cache mode '" + text + "': " + why + "; " + kForms);
}

inline double number(const std::string& text, const std::string& s) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    bad(text, "'" + s + "' is not a number");
  }
  if (used != s.size() || !std::isfinite(v)) bad(text, "'" + s + "' is not a finite number");
  return v;
}

inline int integer(const std::string& text, const std::string& s) {
  const double v = number(text, s);
  if (v != std::floor(v) || std::fabs(v) > 1e6) bad(text, "'" + s + "' is not an integer");
  return static_cast<int>(v);
}
}  // namespace step_cache_detail

inline bool StepCacheConfig::taylorComputes(int i) const {
  const int W = disable_cache_before_step, K = cache_interval;
  if (i < W) return true;
  const int r = ((i - W - 1) % K + K) % K;
  return r == 0;
}

inline std::string StepCacheConfig::toString() const {
  std::ostringstream o;
  o.precision(15);
  switch (mode) {
    case Mode::None:
      return "none";
    case Mode::FirstBlock:
      o << "first-block:" << threshold;
      return o.str();
    case Mode::TaylorSeer:
      o << "taylorseer:" << max_order << "," << cache_interval << "," << disable_cache_before_step;
      if (use_lite_mode) o << ",lite";
      return o.str();
  }
  return "none";
}

inline StepCacheConfig parseStepCacheConfig(const std::string& text) {
  StepCacheConfig c;
  if (text.empty() || text == "none") return c;
  const auto colon = text.find(':');
  const std::string mode = text.substr(0, colon);
  const std::string args = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (mode == "first-block") {
    if (args.empty()) step_cache_detail::bad(text, "first-block needs a threshold");
    c.mode = StepCacheConfig::Mode::FirstBlock;
    c.threshold = step_cache_detail::number(text, args);
    if (!(c.threshold > 0)) step_cache_detail::bad(text, "the threshold must be greater than 0");
    return c;
  }
  if (mode == "taylorseer") {
    if (args.empty()) step_cache_detail::bad(text, "taylorseer needs an order");
    std::vector<std::string> parts;
    std::stringstream ss(args);
    for (std::string p; std::getline(ss, p, ',');) parts.push_back(p);
    if (!args.empty() && args.back() == ',') step_cache_detail::bad(text, "empty field");
    if (!parts.empty() && parts.back() == "lite") {
      c.use_lite_mode = true;
      parts.pop_back();
    }
    if (parts.size() != 1 && parts.size() != 3)
      step_cache_detail::bad(text, "taylorseer takes ORDER or ORDER,INTERVAL,WARMUP");
    c.mode = StepCacheConfig::Mode::TaylorSeer;
    c.max_order = step_cache_detail::integer(text, parts[0]);
    if (c.max_order < 1 || c.max_order > 4)
      step_cache_detail::bad(text, "the order must be 1 to 4");
    if (parts.size() == 3) {
      c.cache_interval = step_cache_detail::integer(text, parts[1]);
      c.disable_cache_before_step = step_cache_detail::integer(text, parts[2]);
      if (c.cache_interval < 1) step_cache_detail::bad(text, "the interval must be at least 1");
      if (c.disable_cache_before_step < 0 || c.disable_cache_before_step > 1000)
        step_cache_detail::bad(text, "the warm-up must be 0 to 1000 steps");
    }
    return c;
  }
  step_cache_detail::bad(text, "unknown cache mode '" + mode + "'");
}

}  // namespace dit
