// The guider of the flow-matching loop: one component owns whether a step runs a second
// (unconditional) branch and how the two predictions combine, built from the family's declared
// GuiderSpec (backend/models/request_spec.h) and a request's resolved values. It follows
// diffusers' guiders package (guiders/classifier_free_guidance.py: ClassifierFreeGuidance with
// guidance_scale, start/stop; guider_utils.py) and FluxPipeline's true CFG; the families declare
// their kind and parameters instead of coding a CFG policy each.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "backend/models/request_spec.h"

namespace dit {

struct PipelineInputs;

class Guider {
 public:
  /// The guider for resolved inputs `p` under `spec`: enabled as GuiderSpec::Kind says (classic
  /// CFG: the scale field above the threshold; true CFG: also a negative prompt given), with the
  /// scale, the negative prompt ("" when none was given), and the knobs it reads from
  /// p.options (truncation, normalization; absent: off).
  Guider(const GuiderSpec& spec, const PipelineInputs& p);

  /// Two predictions per step (the conditional and the unconditional one).
  bool enabled() const { return enabled_; }
  /// Conditions per guided step (diffusers' num_conditions): 2 when enabled, else 1.
  int numConditions() const { return enabled_ ? 2 : 1; }
  double scale() const { return scale_; }
  /// What the unconditional branch encodes.
  const std::string& negativePrompt() const { return negative_; }
  /// When CFG runs, in words (the cfg_degree 2 refusal).
  const std::string& requirement() const { return spec_.requirement; }
  /// Whether the step at scheduler timestep `timestep` (0..1000) runs both branches: every step
  /// when enabled, except those whose normalised time (1000 - timestep) / 1000 (float32, as
  /// ZImagePipeline computes it) is above the truncation value when it is <= 1.
  bool activeAt(double timestep) const;
  /// The guided prediction from the conditional and unconditional ones (same shape, e.g.
  /// [B, S_img, C], the compute dtype; the result has cond's dtype), identical on both ranks of
  /// a cfg group: UncondPlus: uncond + s (cond - uncond); CondPlus (float32): cond + s (cond -
  /// uncond); then PerTokenNorm: each token scaled to cond's L2 norm over the last dimension
  /// (QwenImagePipeline), or GlobalNormClip: the whole prediction's L2 norm clipped at
  /// normalization x cond's when normalization > 0 (ZImagePipeline).
  at::Tensor combine(const at::Tensor& cond, const at::Tensor& uncond) const;

 private:
  GuiderSpec spec_;
  bool enabled_ = false;
  double scale_ = 1.0;
  std::string negative_;
  double truncation_ = 2.0;     ///< > 1: no truncation
  double normalization_ = 0.0;  ///< 0: off
};

}  // namespace dit
