// Step caching for diffusion transformers, as diffusers defines it:
//  - First Block Cache (hooks/first_block_cache.py): every step runs the head block (the first
//    block); the relative L1 change d = mean|r - r_ref| / mean|r_ref| of its image-stream residual
//    r against r_ref, the residual of the last *computed* step, decides: d > threshold -> run
//    the remaining blocks and store their residuals (tail output - head output, image and text
//    streams); otherwise add the stored residuals to the head output and skip them.
//  - TaylorSeer (hooks/taylorseer_cache.py): per hooked module, Taylor factors F(0..max_order)
//    are updated by finite differences on computed steps and extrapolated on predicted ones.
//
// The model drives it from its per-block seam (FluxTransformer2DModel::setStepCache). State is
// kept per model-call context ("cond" / "uncond", diffusers' cache_context) and lives for one
// pipeline call. Under context parallel each rank holds its sequence slice of every stored
// tensor; First Block Cache's decision uses the numerator and denominator summed over the cp
// group (all-reduce, then a broadcast from rank 0 of the cp and of the tp group), so every rank
// takes the same decision, equal to the one-rank decision up to float rounding.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/models/cache/step_cache_config.h"
#include "backend/nn/attention_output_cache.h"

namespace dit {

class ProcessGroup;

class StepCache : public nn::AttentionOutputCache {
 public:
  /// cp: the context-parallel group (null = none); tp: the tensor-parallel group (null = none).
  StepCache(StepCacheConfig cfg, std::shared_ptr<ProcessGroup> cp = nullptr,
            std::shared_ptr<ProcessGroup> tp = nullptr);
  ~StepCache() override;
  const StepCacheConfig& config() const { return cfg_; }

  /// Selects the state used by the following model calls (diffusers' cache_context name).
  void setContext(const std::string& name);
  /// Called by the model at the start of each forward: advances the context's step counter.
  void beginForward();
  /// This context's 0-based step index of the current forward.
  int step() const;

  // ---- First Block Cache ----
  bool firstBlock() const { return cfg_.mode == StepCacheConfig::Mode::FirstBlock; }
  /// After the head block: head_residual = head output - head input, image stream, this rank's
  /// slice [B, S_img_local, C]. Returns true when the remaining blocks must run (first step of
  /// the context, or d > threshold). Collective over the cp and tp groups from the second step.
  bool shouldComputeRemaining(const at::Tensor& head_residual);
  /// On computed steps: tail output - head output for the image and text streams.
  void storeTailResiduals(const at::Tensor& image, const at::Tensor& text);
  const at::Tensor& imageResidual() const;
  const at::Tensor& textResidual() const;

  // ---- TaylorSeer ----
  bool taylorSeer() const { return cfg_.mode == StepCacheConfig::Mode::TaylorSeer; }
  bool lite() const { return taylorSeer() && cfg_.use_lite_mode; }
  /// Whether hooked modules run at the current step (TaylorSeerCacheConfig schedule).
  bool taylorComputes() const override;
  /// Computed step: updates the Taylor factors of `module` (one entry per output tensor).
  void update(const std::string& module, const std::vector<at::Tensor>& outputs) override;
  /// Predicted step: sum_j F(j) * (step - last)^j / j! per output, in the outputs' dtype.
  /// Throws std::logic_error when the module has no factors yet.
  std::vector<at::Tensor> predict(const std::string& module) const override;

  // ---- Reporting (of the current context's last forward) ----
  /// Whether the last forward computed (FBC: remaining blocks ran; TaylorSeer: modules ran).
  bool lastComputed() const;
  /// FBC: d of the last forward (-1 when there was nothing to compare).
  double lastRelL1() const;

 private:
  struct Factors {
    std::vector<std::vector<at::Tensor>> F;  // per output: F(0..n)
    int last = -1;
  };
  struct State {
    int step = -1;
    bool computed = true;
    double relL1 = -1;
    at::Tensor headResidual, imageResidual, textResidual;
    std::map<std::string, Factors> taylor;
  };
  State& cur();
  const State& cur() const;

  StepCacheConfig cfg_;
  std::shared_ptr<ProcessGroup> cp_, tp_;
  std::map<std::string, State> states_;
  std::string context_ = "cond";
};

}  // namespace dit
