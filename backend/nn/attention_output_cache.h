// What the attention step-cache seam (nn/attention.h, AttentionCacheSeam) asks of a step cache:
// whether hooked modules run this step, and the Taylor update / prediction of one module's
// outputs. backend/models/cache/step_cache.h (StepCache, TaylorSeer) implements it, so the shared
// layers in backend/nn/ never include the models above them (tests/layering_check.sh).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace dit::nn {

class AttentionOutputCache {
 public:
  virtual ~AttentionOutputCache() = default;
  /// Whether hooked modules run at the current step (false: their outputs are predicted).
  virtual bool taylorComputes() const = 0;
  /// Computed step: records `module`'s outputs (one entry per output tensor).
  virtual void update(const std::string& module, const std::vector<at::Tensor>& outputs) = 0;
  /// Predicted step: `module`'s outputs extrapolated from the recorded ones, in their dtype.
  /// Throws std::logic_error when the module has recorded nothing yet.
  virtual std::vector<at::Tensor> predict(const std::string& module) const = 0;
};

}  // namespace dit::nn
