#include "backend/nn/adaln.h"

#include <ATen/ATen.h>

#include "backend/io/weight_loader.h"
#include "backend/nn/fused_ops.h"
#include "parallel/torch_compat.h"

namespace dit::nn {
namespace {

// LayerNorm without affine parameters, eps 1e-6 (diffusers norm1/norm/norm_out, norm2).
at::Tensor layerNorm(const at::Tensor& x) { return at::layer_norm(x, {x.size(-1)}, {}, {}, 1e-6); }

// Reduced precision on the CPU where LibTorch's own LayerNorm for it is slow (float16 always;
// bfloat16 on LibTorch 1.x, see torch_compat::kSlowBf16CpuLayerNorm): LayerNorm + modulation then
// run in float32 with one rounding at the end.
bool reducedOnCpu(const at::Tensor& x) {
  return x.is_cpu() && ((x.scalar_type() == at::kBFloat16 && torch_compat::kSlowBf16CpuLayerNorm) ||
                        x.scalar_type() == at::kHalf);
}

// The fused float32 CPU kernel takes x [B, S, C] and per-batch scale/shift.
bool fusedModulationApplies(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift) {
  return x.dim() == 3 && fusedRowsApply(x) && fusedRowsApply(scale) && fusedRowsApply(shift);
}

}  // namespace

// bfloat16/float16 on the CPU: the norm and the modulation in float32 with one rounding to x's
// dtype at the end (one fused addcmul): LibTorch 1.13's reduced-precision CPU layer_norm is about
// 8x slower than its float32 kernel (measured: [1, 320, 512] 1.16 ms against 0.14 ms for norm +
// modulation), and the single rounding is at least as accurate as diffusers' three bf16 roundings
// (norm, mul, add).
at::Tensor layerNormModulate(const at::Tensor& x, const at::Tensor& scale,
                             const at::Tensor& shift) {
  // float32 on the CPU: norm and modulation in one pass over each row (nn::layerNormModulateCpu)
  // instead of layer_norm, 1 + scale and addcmul.
  if (fusedModulationApplies(x, scale, shift)) return layerNormModulateCpu(x, scale, shift, 1e-6);
  if (reducedOnCpu(x)) {
    const at::Tensor h = layerNorm(x.to(at::kFloat));
    return at::addcmul(shift.unsqueeze(1).to(at::kFloat), h,
                       (1 + scale.unsqueeze(1)).to(at::kFloat))
        .to(x.scalar_type());
  }
  return at::addcmul(shift.unsqueeze(1), layerNorm(x), 1 + scale.unsqueeze(1));
}

AdaLayerNormZero::AdaLayerNormZero(WeightLoader& w, const std::string& prefix, int64_t C)
    : linear_(w.linear(prefix + ".linear", C, 6 * C)) {}

AdaLayerNormZero::Output AdaLayerNormZero::operator()(const at::Tensor& x,
                                                      const at::Tensor& silu_temb,
                                                      const at::Tensor& emb) const {
  auto e = (emb.defined() ? emb : linear_->forward(silu_temb)).chunk(6, 1);
  Output o;
  o.shift_msa = e[0];
  o.scale_msa = e[1];
  o.gate_msa = e[2];
  o.shift_mlp = e[3];
  o.scale_mlp = e[4];
  o.gate_mlp = e[5];
  o.norm_hidden_states = layerNormModulate(x, o.scale_msa, o.shift_msa);
  return o;
}

AdaLayerNormZeroSingle::AdaLayerNormZeroSingle(WeightLoader& w, const std::string& prefix,
                                               int64_t C)
    : linear_(w.linear(prefix + ".linear", C, 3 * C)) {}

AdaLayerNormZeroSingle::Output AdaLayerNormZeroSingle::operator()(const at::Tensor& x,
                                                                  const at::Tensor& silu_temb,
                                                                  const at::Tensor& emb) const {
  auto e = (emb.defined() ? emb : linear_->forward(silu_temb)).chunk(3, 1);
  Output o;
  o.shift_msa = e[0];
  o.scale_msa = e[1];
  o.gate_msa = e[2];
  o.norm_hidden_states = layerNormModulate(x, o.scale_msa, o.shift_msa);
  return o;
}

AdaLayerNormContinuous::AdaLayerNormContinuous(WeightLoader& w, const std::string& prefix,
                                               int64_t C, bool bias)
    : linear_(w.linear(prefix + ".linear", C, 2 * C, bias)) {}

at::Tensor AdaLayerNormContinuous::operator()(const at::Tensor& x,
                                              const at::Tensor& silu_temb) const {
  auto e = linear_->forward(silu_temb).to(x.scalar_type()).chunk(2, 1);  // scale, shift
  return layerNormModulate(x, e[0], e[1]);
}

Modulation::Modulation(WeightLoader& w, const std::string& prefix, int64_t C, int sets, bool bias)
    : linear_(w.linear(prefix + ".linear", C, 3 * sets * C, bias)), sets_(sets) {}

std::vector<Modulation::Params> Modulation::operator()(const at::Tensor& silu_temb) const {
  const auto chunks = linear_->forward(silu_temb).unsqueeze(1).chunk(3 * sets_, -1);
  std::vector<Params> out;
  for (int s = 0; s < sets_; ++s)
    out.push_back({chunks[3 * s], chunks[3 * s + 1], chunks[3 * s + 2]});
  return out;
}

at::Tensor Modulation::apply(const at::Tensor& x, const Params& p) {
  if (fusedModulationApplies(x, p.scale, p.shift))
    return layerNormModulateCpu(x, p.scale, p.shift, 1e-6);
  return (1 + p.scale) * layerNorm(x) + p.shift;
}

}  // namespace dit::nn
