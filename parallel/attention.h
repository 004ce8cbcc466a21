// Scaled dot-product attention kernels used by the FLUX transformer and by context parallelism.
//
// No communication here: these are local (single-rank) functions. Semantics follow
// torch.nn.functional.scaled_dot_product_attention with attn_mask=None, dropout_p=0,
// is_causal=False and the default scale 1/sqrt(D).
//
// Backends (LibTorch version differences live in parallel/torch_compat.h; the run-time choice is
// PyTorch's own, at::_fused_sdp_choice):
//  - LibTorch 1.13 (Debian 12, CPU): localAttention runs the project's cpuMathAttention
//    (parallel/cpu_attention.h: head by head, vectorised row softmax, no copies of q/k/v, output
//    written in [B, S_q, H, D] order) for float32 / bfloat16 without autograd; otherwise
//    at::_scaled_dot_product_attention (math path), evaluated in query chunks so that the
//    [B, H, S_q, S_k] score matrix never exceeds about 256 MiB.
//  - LibTorch 2.x: at::scaled_dot_product_attention with the backend PyTorch picks: on the CPU
//    the fused flash kernel (float32/float64/bfloat16/float16, equal head dims), on CUDA flash /
//    memory-efficient / cuDNN; where none applies, cpuMathAttention or the math path as above.
//    attentionWithLse uses at::_scaled_dot_product_flash_attention_for_cpu on the CPU (2.2+),
//    at::_scaled_dot_product_flash_attention (fp16/bf16) or
//    at::_scaled_dot_product_efficient_attention (2.1+) on CUDA, which return the log-sum-exp;
//    everywhere else the chunked float32 math path (mathAttentionWithLse).
// attentionKernelsUsed() names the kernels that ran (the benchmark prints it).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace dit {

/// Scaled dot-product attention softmax(Q K^T / sqrt(D)) V without mask or dropout.
///
/// q: [B, H, S_q, D]; k, v: [B, H, S_k, D]; all of the same dtype (float32, bfloat16 or float16)
/// and device. Returns [B, H, S_q, D] in q's dtype: contiguous, except from cpuMathAttention
/// ("math_cpu"), which returns a transposed view of a contiguous [B, S_q, H, D] tensor (so the
/// caller's transpose back to [B, S_q, H * D] is free). S_q == 0 yields an empty result;
/// S_k == 0 yields zeros (an empty softmax contributes nothing; PyTorch would give NaN).
/// Matches torch.nn.functional.scaled_dot_product_attention (math path with LibTorch 1.13; the
/// fused kernel PyTorch picks with LibTorch 2.x). float16 on the CPU is computed in float32 and
/// rounded back (math path) or accumulated in float32 (CPU flash kernel).
/// Throws std::invalid_argument on rank/shape/dtype mismatches.
at::Tensor localAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

/// The same attention, also returning the log-sum-exp of the scaled scores
/// lse[b, h, i] = log(sum_j exp(q_i . k_j / sqrt(D))), as float32 [B, H, S_q].
///
/// Returns {out [B, H, S_q, D] in q's dtype, lse float32 [B, H, S_q]}. With S_k == 0 the output
/// is zeros and lse is -inf (the neutral element of the log-sum-exp merge). With LibTorch 2.x the
/// CPU flash kernel (where PyTorch's SDPA choice is flash), or on CUDA the flash (fp16/bf16) or
/// memory-efficient kernel, provides lse; elsewhere mathAttentionWithLse.
/// Used by RingAttention to merge partial results (see mergeAttention).
std::pair<at::Tensor, at::Tensor> attentionWithLse(const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v);

/// The unfused reference for attentionWithLse (also its fallback): scores computed in float32 in
/// query chunks (at most about 256 MiB of scores at a time), lse = at::logsumexp of the scaled
/// scores, output rounded to q's dtype. Same shapes, edge cases and errors as attentionWithLse.
std::pair<at::Tensor, at::Tensor> mathAttentionWithLse(const at::Tensor& q, const at::Tensor& k,
                                                       const at::Tensor& v);

/// Names of the attention kernels localAttention / attentionWithLse have run in this process
/// since start or the last resetAttentionKernelsUsed(), in a fixed order: "math" (unfused, query-
/// chunked), "math_cpu" (cpuMathAttention), "flash_cpu", "flash_cuda", "efficient_cuda",
/// "cudnn_cuda", "fused_other". Empty
/// inputs (no queries or no keys) run no kernel. Thread-safe.
std::vector<std::string> attentionKernelsUsed();

/// Clears the record read by attentionKernelsUsed().
void resetAttentionKernelsUsed();

/// Merges a partial attention result into a running one, in float32 (ring-flash-attention's
/// convert_to_fp32 merge): with new_lse = logaddexp(lse, block_lse),
///   out = out * exp(lse - new_lse) + block_out * exp(block_lse - new_lse),  lse = new_lse.
/// out: float32 [B, H, S, D] (updated in place); lse: float32 [B, H, S] (updated in place);
/// block_out: [B, H, S, D] any floating dtype; block_lse: float32 [B, H, S]. Rows whose block_lse
/// is -inf (no keys) are left unchanged.
void mergeAttention(at::Tensor& out, at::Tensor& lse, const at::Tensor& block_out,
                    const at::Tensor& block_lse);

}  // namespace dit
