// Shared attention layers of the diffusion transformers (diffusers models/attention_processor.py,
// models/attention_dispatch.py, models/transformers/transformer_flux*.py's attention modules):
// joint text + image attention with RMSNorm on q and k (qk-norm), rotary position embeddings and
// an attention backend (local, or ContextParallel over the joint sequence of the cp group), and
// the step-cache seam TaylorSeer hooks around an attention module.
//
// Shapes: B batch, S sequence (this rank's local tokens under context parallelism), C inner_dim =
// num_attention_heads * attention_head_dim, H_local heads held by this rank (num_attention_heads /
// tp_degree), D attention_head_dim. Compute dtype = the weights' dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/io/weight_loader.h"
#include "backend/nn/attention_output_cache.h"
#include "parallel/tensor_parallel/layers.h"

namespace dit {

class ContextParallel;

namespace nn {

using LinearPtr = std::shared_ptr<const tensor_parallel::Linear>;
using FusedLinearPtr = std::shared_ptr<const tensor_parallel::FusedColumnParallelLinear>;

/// TaylorSeer's seam around a block's attention module (diffusers hooks the module "<block>.attn";
/// the cache is backend/models/cache/step_cache.h's StepCache through the AttentionOutputCache
/// interface): on predicted steps the attention outputs come from the
/// cache's Taylor extrapolation and the module does not run; on computed steps its outputs update
/// the cache. null = no caching.
struct AttentionCacheSeam {
  AttentionOutputCache* cache = nullptr;
  std::string module;  ///< e.g. "transformer_blocks.3.attn"
};

/// Whether the attention module behind `seam` is skipped this step (a TaylorSeer predicted step).
/// False without a seam or cache.
bool cachePredicts(const AttentionCacheSeam* seam);
/// Predicted step: the module's outputs extrapolated by the cache (float32, one per output, in the
/// order cacheRecord stored them). Throws std::logic_error before any computed step.
std::vector<at::Tensor> cachePrediction(const AttentionCacheSeam& seam);
/// Computed step: records the module's outputs in the cache (nothing without a seam or cache).
void cacheRecord(const AttentionCacheSeam* seam, const std::vector<at::Tensor>& outputs);

/// How attention is computed: locally, or by ContextParallel over the joint sequence of the cp
/// group. `localLens[r]` = local tokens (text + image) on cp rank r.
struct AttentionBackend {
  std::shared_ptr<ContextParallel> cp;  ///< null = local attention
  std::vector<int64_t> localLens;
  /// q, k, v [B, S, H_local, D] -> [B, S, H_local * D]. Collective over the cp group when set.
  at::Tensor operator()(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;
  /// The same attention with extra keys every query also attends to (FLUX.2 [klein] KV's
  /// reference K/V): refK, refV [B, S_ref, H_local, D], the same on every cp rank (not split).
  /// q, k, v [B, S, H_local, D] -> [B, S, H_local * D]. Locally one attention over
  /// cat(k, refK); under cp ContextParallel::attention with refK/refV (no extra communication).
  /// Collective over the cp group when set.
  at::Tensor operator()(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& refK, const at::Tensor& refV) const;
};

/// Attention of q over k, v on this rank only, never communicating (the reference tokens'
/// self-attention of the FLUX.2 [klein] KV modes, whose tokens every cp rank holds whole):
/// q [B, S_q, H, D], k, v [B, S_k, H, D] -> [B, S_q, H * D].
at::Tensor localSelfAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

/// diffusers RMSNorm over the last dim (eps, default 1e-6; affine weight w [D]): variance in
/// float32; half/bfloat16 weights multiply in their dtype, float32 weights in float32 then cast
/// back to x's dtype. x [..., D] -> [..., D].
at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& w, double eps = 1e-6);

/// The joint attention of the MMDiT families (diffusers FluxAttention + FluxAttnProcessor,
/// Flux2Attention + Flux2AttnProcessor, and the attention half of Flux2ParallelSelfAttention):
/// q/k/v projections, RMSNorm on q and k (norm_q/norm_k, eps 1e-6), RoPE, scaled dot-product
/// attention through the backend. The double-stream form also projects the text stream
/// (add_q/k/v_proj, norm_added_q/k), attends over cat(text, image) and projects both outputs
/// (to_out.0, to_add_out); the single-stream form (pre_only) takes q/k/v already projected by its
/// block and returns the attention output.
///
/// CPU fast path: when nn::rmsNormRopeCpuApplies (float32 / bfloat16, no autograd), RMSNorm + RoPE
/// run as one pass per head vector (nn::rmsNormRopeCpuOut), text and image written straight into
/// their places of the joint sequence, stored head-major for the attention.
class JointAttention {
 public:
  JointAttention() = default;
  /// Loads the module at `prefix` ("transformer_blocks.3.attn"). Double-stream (diffusers
  /// added_kv_proj_dim set) when `added_kv`: to_q/to_k/to_v and add_q_proj/add_k_proj/add_v_proj
  /// fused as two GEMMs, norm_q/norm_k/norm_added_q/norm_added_k [D], to_out.0 and to_add_out
  /// [C, C]. Else pre_only single-stream: only norm_q/norm_k (the block loads the projections);
  /// `headsLocal` = heads this rank computes (its to_q output rows / head dim, as the plan
  /// sharded them). `bias`: the projections have biases (FLUX.1) or not (FLUX.2).
  /// Throws ModelFileError for missing/mismatching tensors (WeightLoader).
  JointAttention(WeightLoader& w, const std::string& prefix, int64_t C, int64_t headDim,
                 bool added_kv, int64_t headsLocal = 0, bool bias = true);

  /// Double-stream: hidden [B, S_img, C], encoder [B, S_txt, C] (both already modulated), rotary
  /// tables cos/sin float32 [S_txt + S_img, D] over cat(text, image) -> {hidden attention output
  /// [B, S_img, C], encoder attention output [B, S_txt, C]} after to_out.0 / to_add_out (image
  /// first: the rowwise reduces run in this order on every rank). Throws std::invalid_argument
  /// when the rotary tables' length is not S_txt + S_img.
  std::pair<at::Tensor, at::Tensor> operator()(const at::Tensor& hidden, const at::Tensor& encoder,
                                               const at::Tensor& cos, const at::Tensor& sin,
                                               const AttentionBackend& attention) const;
  /// Single-stream (pre_only): q, k, v [B, S, H_local * D] projected by the block ->
  /// [B, S, H_local * D] in the compute dtype.
  at::Tensor attendProjected(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& cos, const at::Tensor& sin,
                             const AttentionBackend& attention) const;

  // ---- FLUX.2 [klein] KV modes (diffusers Flux2KVAttnProcessor,
  // Flux2KVParallelSelfAttnProcessor, _flux2_kv_causal_attention). The reference tokens are a
  // stream of their own: they attend to each other only, and the text and image queries attend
  // to the joint sequence plus the references' keys. refK / refV: the references' keys and values
  // after RMSNorm and RoPE, [B, S_ref, H_local, D], the same on every cp rank. ----

  /// Double-stream, text and image: as operator() with refK/refV added to the keys every text and
  /// image query attends to. Collective over the cp group (attention) and tp (to_out.0,
  /// to_add_out). Throws as operator().
  std::pair<at::Tensor, at::Tensor> operator()(const at::Tensor& hidden, const at::Tensor& encoder,
                                               const at::Tensor& cos, const at::Tensor& sin,
                                               const AttentionBackend& attention,
                                               const at::Tensor& refK,
                                               const at::Tensor& refV) const;
  /// Double-stream, the references: ref [B, S_ref, C] (modulated image-stream tokens) through the
  /// image projections (to_q/k/v, norm_q/norm_k), RoPE with their tables cos/sin [S_ref, D],
  /// self-attention, to_out.0 -> {output [B, S_ref, C], k, v [B, S_ref, H_local, D] post-RoPE}.
  /// No cp communication; collective over tp (to_out.0's reduce).
  std::tuple<at::Tensor, at::Tensor, at::Tensor> referenceAttention(const at::Tensor& ref,
                                                                    const at::Tensor& cos,
                                                                    const at::Tensor& sin) const;
  /// Single-stream: as attendProjected with refK/refV added to the keys.
  at::Tensor attendProjected(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& cos, const at::Tensor& sin,
                             const AttentionBackend& attention, const at::Tensor& refK,
                             const at::Tensor& refV) const;
  /// Single-stream, the references: q, k, v [B, S_ref, H_local * D] projected by the block ->
  /// {self-attention [B, S_ref, H_local * D], k, v [B, S_ref, H_local, D] post-RoPE}. Local.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> referenceProjected(const at::Tensor& q,
                                                                    const at::Tensor& k,
                                                                    const at::Tensor& v,
                                                                    const at::Tensor& cos,
                                                                    const at::Tensor& sin) const;

  FusedLinearPtr qkv;      ///< to_q, to_k, to_v as one GEMM (double-stream only)
  FusedLinearPtr add_qkv;  ///< add_q_proj, add_k_proj, add_v_proj as one GEMM (double-stream only)
  at::Tensor norm_q, norm_k, norm_added_q, norm_added_k;  ///< RMSNorm weights [D]
  LinearPtr to_out;                                       ///< to_out.0 (double-stream only)
  LinearPtr to_add_out;                                   ///< to_add_out (double-stream only)

 private:
  at::Tensor heads(const at::Tensor& x) const;
  // The double-stream q, k, v [B, S_txt + S_img, H_local, D] after RMSNorm and RoPE, and the
  // attention output split and projected ({image, text}).
  std::tuple<at::Tensor, at::Tensor, at::Tensor> jointQkv(const at::Tensor& hidden,
                                                          const at::Tensor& encoder,
                                                          const at::Tensor& cos,
                                                          const at::Tensor& sin) const;
  std::pair<at::Tensor, at::Tensor> jointOutputs(const at::Tensor& a, int64_t txt) const;
  // RMSNorm + RoPE of one stream's projected q and k [B, S, H_local * D] -> [B, S, H_local, D].
  std::pair<at::Tensor, at::Tensor> normRope(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& cos, const at::Tensor& sin) const;
  int64_t headDim_ = 0, headsLocal_ = 0;
};

}  // namespace nn
}  // namespace dit
