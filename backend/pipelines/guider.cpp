#include "backend/pipelines/guider.h"

#include <ATen/ATen.h>

#include "backend/pipelines/diffusion_pipeline.h"

namespace dit {

namespace {
double option(const PipelineInputs& p, const std::string& name, double fallback) {
  return name.empty() ? fallback : p.option(name, fallback);
}
// The CFG scale: the common guidance field or the knob the family's GuiderSpec names.
double scaleOf(const PipelineInputs& p, const std::string& field) {
  if (field == "guidance") return p.guidance;
  return option(p, field, 1.0);
}
}  // namespace

Guider::Guider(const GuiderSpec& spec, const PipelineInputs& p) : spec_(spec) {
  switch (spec.kind) {
    case GuiderSpec::Kind::None:
      enabled_ = false;
      break;
    case GuiderSpec::Kind::ClassicCfg:
      scale_ = scaleOf(p, spec.scale_field);
      enabled_ = scale_ > spec.threshold;
      break;
    case GuiderSpec::Kind::TrueCfg:
      scale_ = scaleOf(p, spec.scale_field);
      enabled_ = p.hasNegativePrompt() && scale_ > spec.threshold;
      break;
  }
  negative_ = p.negative_prompt;  // None -> "" (diffusers' pipelines encode "" then)
  truncation_ = option(p, spec.truncation_field, 2.0);
  normalization_ = option(p, spec.normalization_field, 0.0);
}

bool Guider::activeAt(double timestep) const {
  if (!enabled_) return false;
  if (spec_.truncation_field.empty() || truncation_ > 1.0) return true;
  // t_norm = ((1000 - timestep) / 1000)[0].item(): float32 arithmetic.
  const float tNorm = (1000.0f - static_cast<float>(timestep)) / 1000.0f;
  return !(static_cast<double>(tNorm) > truncation_);
}

at::Tensor Guider::combine(const at::Tensor& cond, const at::Tensor& uncond) const {
  at::Tensor pred;
  if (spec_.formula == GuiderSpec::Formula::CondPlus) {
    const at::Tensor pos = cond.to(at::kFloat), neg = uncond.to(at::kFloat);
    pred = pos + scale_ * (pos - neg);
    if (spec_.rescale == GuiderSpec::Rescale::GlobalNormClip && normalization_ > 0.0) {
      // The whole item's L2 norm at most normalization x the positive one's.
      const at::Tensor posNorm = at::linalg_vector_norm(pos);
      const at::Tensor predNorm = at::linalg_vector_norm(pred);
      const at::Tensor maxNorm = posNorm * normalization_;
      if (predNorm.item<double>() > maxNorm.item<double>()) pred = pred * (maxNorm / predNorm);
    }
    return pred.to(cond.scalar_type());
  }
  pred = uncond + scale_ * (cond - uncond);
  if (spec_.rescale == GuiderSpec::Rescale::PerTokenNorm) {
    const at::Tensor condNorm = at::norm(cond, 2, {-1}, true);
    const at::Tensor noiseNorm = at::norm(pred, 2, {-1}, true);
    pred = pred * (condNorm / noiseNorm);
  } else if (spec_.rescale == GuiderSpec::Rescale::GlobalNormClip && normalization_ > 0.0) {
    const at::Tensor condNorm = at::linalg_vector_norm(cond.to(at::kFloat));
    const at::Tensor predNorm = at::linalg_vector_norm(pred.to(at::kFloat));
    const at::Tensor maxNorm = condNorm * normalization_;
    if (predNorm.item<double>() > maxNorm.item<double>())
      pred = (pred.to(at::kFloat) * (maxNorm / predNorm)).to(cond.scalar_type());
  }
  return pred;
}

}  // namespace dit
