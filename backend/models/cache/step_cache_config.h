// Step caching settings (diffusers hooks/first_block_cache.py FirstBlockCacheConfig and
// hooks/taylorseer_cache.py TaylorSeerCacheConfig) and their one-line spelling used by the CLI,
// the request protocol and PNG metadata:
//   "none" | "first-block:THRESHOLD" | "taylorseer:ORDER[,INTERVAL,WARMUP][,lite]".
// Torch-free (the GUI and the protocol parse it too).
#pragma once

#include <string>

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

}  // namespace dit
