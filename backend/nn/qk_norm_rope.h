// The attention's query/key preparation of FLUX (diffusers FluxAttnProcessor: attn.norm_q /
// attn.norm_k, an RMSNorm over each head, then apply_rotary_emb) as one CPU pass.
#pragma once

#include <ATen/core/Tensor.h>

namespace dit::nn {

/// out[b, s, h, :] = RoPE(RMSNorm(x[b, s, h, :]) * weight) for every head vector, on the CPU in one
/// pass, with diffusers' roundings:
///  - RMSNorm (diffusers RMSNorm, eps, elementwise_affine): r = 1 / sqrt(mean(x^2) + eps) in
///    float32; with a bfloat16 weight x * r is rounded to bfloat16 and multiplied in bfloat16
///    (rounded again), with a float32 weight multiplied in float32 and rounded to x's dtype;
///  - RoPE (apply_rotary_emb, use_real, unbind_dim -1): per pair (2j, 2j+1) the product
///    (a + i b)(cos + i sin) in float32, rounded to x's dtype.
/// x: [B, S, H, D] float32 or bfloat16 on the CPU, unit stride along D (other strides free, e.g.
/// a head view of a fused projection's output); weight: [D], x's dtype or float32; cos, sin:
/// float32 [S, D], each value repeated for the pair (FluxPosEmbed's repeat_interleave_real);
/// out: [B, S, H, D] of x's dtype, unit stride along D (for instance a narrow of a longer sequence,
/// or a transposed view of a [B, H, S, D] tensor) that does not overlap x. D even. No autograd
/// (callers keep the ATen ops for training). Per-row sums differ from ATen's by rounding order only
/// (float32 output within about 1e-6 of the ATen ops). Split over the sequence on the intra-op
/// threads (at::parallel_for). Throws std::invalid_argument on another device, dtype or shape, or
/// when out overlaps x.
void rmsNormRopeCpuOut(const at::Tensor& x, const at::Tensor& weight, double eps,
                       const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& out);

/// Whether rmsNormRopeCpuOut takes x and weight: CPU, float32 or bfloat16, weight of x's dtype or
/// float32, even head dim, no gradient needed.
bool rmsNormRopeCpuApplies(const at::Tensor& x, const at::Tensor& weight);

}  // namespace dit::nn
