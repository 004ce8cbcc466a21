// The tensor half of FlowMatchEulerDiscreteScheduler (diffusers
// schedulers/scheduling_flow_match_euler_discrete.py: step, scale_noise); compiled into the
// Torch-side dit_backend so that dit_backend_core (the tables) stays Torch-free.
#include <ATen/ATen.h>

#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"

namespace dit {

at::Tensor FlowMatchEulerDiscreteScheduler::step(const at::Tensor& model_output, int i,
                                                 const at::Tensor& sample) const {
  (void)timestep(i);  // bounds check: a step needs sigma[i + 1]
  const float s = sigma(i), sNext = sigma(i + 1);
  // diffusers: sample.to(float32); dt = sigma_next - sigma (float32); prev = sample + dt * v,
  // the product in v's dtype (a 0-dim float32 tensor does not promote it), the sum in float32,
  // then prev.to(model_output.dtype). Identical in float32; matches bfloat16/float16 rounding.
  const at::Tensor prev = sample.to(at::kFloat) + ((sNext - s) * model_output).to(at::kFloat);
  return prev.to(model_output.scalar_type());
}

at::Tensor FlowMatchEulerDiscreteScheduler::predOriginalSample(const at::Tensor& model_output,
                                                               int i,
                                                               const at::Tensor& sample) const {
  return sample.to(at::kFloat) - sigma(i) * model_output.to(at::kFloat);
}

at::Tensor FlowMatchEulerDiscreteScheduler::scaleNoise(const at::Tensor& sample, int i,
                                                       const at::Tensor& noise) const {
  return scaleNoiseAtSigma(sample, sigma(i), noise);
}

at::Tensor FlowMatchEulerDiscreteScheduler::scaleNoiseAtSigma(const at::Tensor& sample, float sigma,
                                                              const at::Tensor& noise) {
  // scale_noise: sigma * noise + (1.0 - sigma) * sample with sigma a float32 value; 1 - sigma is
  // exact in double and rounds once to float32 as numpy's float32 subtraction does.
  return sigma * noise + (1.0 - sigma) * sample;
}

}  // namespace dit
