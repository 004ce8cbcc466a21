// Scaled dot-product attention kernels used by the FLUX transformer and by context parallelism.
//
// No communication here: these are local (single-rank) functions. Semantics follow
// torch.nn.functional.scaled_dot_product_attention with attn_mask=None, dropout_p=0,
// is_causal=False and the default scale 1/sqrt(D).
//
// Backends (chosen at compile time from <torch/version.h> and at run time from the device):
//  - LibTorch 1.13 (Debian, CPU): at::_scaled_dot_product_attention (math path), evaluated in
//    query chunks so that the [B, H, S_q, S_k] score matrix never exceeds about 256 MiB.
//  - LibTorch 2.x: at::scaled_dot_product_attention (flash / memory-efficient / math as PyTorch
//    chooses). attentionWithLse uses at::_scaled_dot_product_flash_attention (fp16/bf16) or
//    at::_scaled_dot_product_efficient_attention (2.1+) on CUDA, which return the log-sum-exp;
//    everywhere else it uses the chunked float32 math path below.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace dit {

/// Scaled dot-product attention softmax(Q K^T / sqrt(D)) V without mask or dropout.
///
/// q: [B, H, S_q, D]; k, v: [B, H, S_k, D]; all of the same dtype (float32, bfloat16 or float16)
/// and device. Returns [B, H, S_q, D] in q's dtype, contiguous. S_q == 0 yields an empty result;
/// S_k == 0 yields zeros (an empty softmax contributes nothing; PyTorch would give NaN).
/// Matches torch.nn.functional.scaled_dot_product_attention (math path on CPU; the fused kernels
/// on CUDA with LibTorch 2.x). float16 on the CPU is computed in float32 and rounded back.
/// Throws std::invalid_argument on rank/shape/dtype mismatches.
at::Tensor localAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

/// The same attention, also returning the log-sum-exp of the scaled scores
/// lse[b, h, i] = log(sum_j exp(q_i . k_j / sqrt(D))), as float32 [B, H, S_q].
///
/// Returns {out [B, H, S_q, D] in q's dtype, lse float32 [B, H, S_q]}. With S_k == 0 the output
/// is zeros and lse is -inf (the neutral element of the log-sum-exp merge). On CUDA with
/// LibTorch 2.x the flash (fp16/bf16) or memory-efficient kernel provides lse; elsewhere the
/// scores are computed in float32 (query-chunked) and the output is rounded to q's dtype.
/// Used by RingAttention to merge partial results (see mergeAttention).
std::pair<at::Tensor, at::Tensor> attentionWithLse(const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v);

/// Merges a partial attention result into a running one, in float32 (ring-flash-attention's
/// convert_to_fp32 merge): with new_lse = logaddexp(lse, block_lse),
///   out = out * exp(lse - new_lse) + block_out * exp(block_lse - new_lse),  lse = new_lse.
/// out: float32 [B, H, S, D] (updated in place); lse: float32 [B, H, S] (updated in place);
/// block_out: [B, H, S, D] any floating dtype; block_lse: float32 [B, H, S]. Rows whose block_lse
/// is -inf (no keys) are left unchanged.
void mergeAttention(at::Tensor& out, at::Tensor& lse, const at::Tensor& block_out,
                    const at::Tensor& block_lse);

}  // namespace dit
