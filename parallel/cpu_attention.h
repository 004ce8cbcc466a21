// The project's own CPU attention for LibTorch builds without a fused CPU kernel (LibTorch 1.13):
// the math path of torch.nn.functional.scaled_dot_product_attention, by blocks of queries.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dit {

/// softmax(Q K^T / sqrt(D)) V without mask or dropout, on the CPU, by blocks of queries:
///  - float32: head by head, S = Q K^T by one sgemm (at::mm_out on strided views: no copies of q,
///    k or v), the row softmax of S * scale in place, and O = P V by one sgemm written straight
///    into a [B, S_q, H, D] buffer; the score block stays within about 1 MiB (in cache);
///  - bfloat16: all heads of a query block at once (batched products: oneDNN's per-call cost is
///    high for one head's small products), scores [H, n, S_k] in bfloat16 within 16 MiB.
/// The row softmax (max, exp, sum and normalise in float32; Cephes-style exp) is vectorised per
/// instruction set (GCC vector extensions for AVX-512F / AVX2 + FMA / baseline x86-64, the
/// widest the CPU runs chosen once). Nothing of size [B, H, S_q, S_k] is ever allocated.
/// Follows PyTorch's _scaled_dot_product_attention_math (aten/src/ATen/native/transformers/
/// attention.cpp): in bfloat16 the scores and probabilities are rounded to bfloat16 as there (the
/// scale is applied in float32 inside the softmax instead of to q beforehand).
///
/// q: [B, H, S_q, D]; k, v: [B, H, S_k, D] (any strides; made contiguous in their last dimension
/// if they are not), float32 or bfloat16, one dtype, on the CPU; S_k >= 1. Returns [B, H, S_q, D]
/// in q's dtype as a transposed view of a contiguous [B, S_q, H, D] tensor (so that
/// out.transpose(1, 2).reshape({B, S_q, H * D}) is free). No autograd.
/// Throws std::invalid_argument for another device or dtype, or mismatched shapes.
at::Tensor cpuMathAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

/// Whether cpuMathAttention takes these inputs: CPU, float32 or bfloat16, no gradient needed
/// (requires_grad with grad mode on: the caller keeps ATen's differentiable path), S_k >= 1.
bool cpuMathAttentionApplies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

/// The row softmax of cpuMathAttention by instruction set, exposed for tests: rows[i, :] <-
/// softmax(rows[i, :] * scale) over a row-major float32 [nRows, n] block, in place, with the
/// kernel built for `isa` (2 AVX-512F, 1 AVX2 + FMA, 0 baseline x86-64). Throws
/// std::invalid_argument when this CPU cannot run that instruction set or isa is out of range.
void softmaxRowsCpu(float* rows, int64_t nRows, int64_t n, float scale, int isa);

}  // namespace dit
