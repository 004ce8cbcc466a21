// The building blocks of FluxTransformer2DModel, named and structured as diffusers names them
// (models/transformers/transformer_flux.py, models/normalization.py, models/embeddings.py,
// models/attention.py). Each class holds its layers under the module path of the checkpoint
// ("transformer_blocks.3.attn.to_q" ...) and computes exactly what diffusers computes, in the same
// op order and dtypes (the goldens in tests/data/tiny-flux-A/golden hold it to that).
//
// Shapes: B batch, S sequence (this rank's local tokens under context parallelism), C inner_dim =
// num_attention_heads * attention_head_dim, M mlp hidden (4 C), H_local heads held by this rank
// (num_attention_heads / tp_degree), D attention_head_dim. Compute dtype = the weights' dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/io/weight_loader.h"
#include "parallel/tensor_parallel/layers.h"

namespace dit {

class ContextParallel;
class StepCache;

namespace flux {

/// TaylorSeer's seam around a block's attention module (diffusers hooks the module "<block>.attn",
/// backend/models/cache/step_cache.h): on predicted steps the attention outputs come from the
/// cache's Taylor extrapolation and the module does not run; on computed steps its outputs update
/// the cache. null = no caching.
struct AttentionCacheSeam {
  StepCache* cache = nullptr;
  std::string module;  ///< e.g. "transformer_blocks.3.attn"
};

using LinearPtr = std::shared_ptr<const tensor_parallel::Linear>;
using FusedLinearPtr = std::shared_ptr<const tensor_parallel::FusedColumnParallelLinear>;

/// How attention is computed: locally, or by ContextParallel over the joint sequence of the cp
/// group. `localLens[r]` = local tokens (text + image) on cp rank r.
struct AttentionBackend {
  std::shared_ptr<ContextParallel> cp;  ///< null = local attention
  std::vector<int64_t> localLens;
  /// q, k, v [B, S, H_local, D] -> [B, S, H_local * D]. Collective over the cp group when set.
  at::Tensor operator()(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;
};

/// diffusers AdaLayerNormZero (norm_type "layer_norm", elementwise_affine False, eps 1e-6):
/// linear(silu(temb)) chunked into the six modulation vectors, by their diffusers names.
class AdaLayerNormZero {
 public:
  struct Output {
    at::Tensor norm_hidden_states;  ///< LayerNorm(x) * (1 + scale_msa) + shift_msa, [B, S, C]
    at::Tensor shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp;  ///< each [B, C]
  };
  AdaLayerNormZero() = default;
  /// Loads `<prefix>.linear` [6C, C].
  AdaLayerNormZero(WeightLoader& w, const std::string& prefix, int64_t C);
  /// x [B, S, C]; silu_temb = silu(temb) [B, C] (computed once per forward by the model, the
  /// value diffusers computes inside every norm).
  Output operator()(const at::Tensor& x, const at::Tensor& silu_temb) const;

 private:
  LinearPtr linear_;
};

/// diffusers AdaLayerNormZeroSingle: linear(silu(temb)) -> shift_msa, scale_msa, gate_msa.
class AdaLayerNormZeroSingle {
 public:
  struct Output {
    at::Tensor norm_hidden_states;              ///< [B, S, C]
    at::Tensor shift_msa, scale_msa, gate_msa;  ///< each [B, C]
  };
  AdaLayerNormZeroSingle() = default;
  /// Loads `<prefix>.linear` [3C, C].
  AdaLayerNormZeroSingle(WeightLoader& w, const std::string& prefix, int64_t C);
  Output operator()(const at::Tensor& x, const at::Tensor& silu_temb) const;

 private:
  LinearPtr linear_;
};

/// diffusers AdaLayerNormContinuous (norm_out; elementwise_affine False, eps 1e-6):
/// emb = linear(silu(conditioning)).to(x.dtype); scale, shift = chunk(2);
/// LayerNorm(x) * (1 + scale) + shift.
class AdaLayerNormContinuous {
 public:
  AdaLayerNormContinuous() = default;
  /// Loads `<prefix>.linear` [2C, C] (+ bias [2C] when `bias`; FLUX.2 has none).
  AdaLayerNormContinuous(WeightLoader& w, const std::string& prefix, int64_t C, bool bias = true);
  /// x [B, S, C], silu_temb [B, C] -> [B, S, C].
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& silu_temb) const;

 private:
  LinearPtr linear_;
};

/// diffusers FluxPosEmbed(theta 10000, axes_dim) and Flux2PosEmbed(theta, axes_dim; FLUX.2:
/// theta 2000, four axes): per-axis rotary tables from the position ids, computed in float64 and
/// cast to float32, each frequency repeated twice (use_real, repeat_interleave_real).
class FluxPosEmbed {
 public:
  explicit FluxPosEmbed(std::vector<int> axes_dim = {}, double theta = 10000.0)
      : axes_dim_(std::move(axes_dim)), theta_(theta) {}
  /// ids [S, n_axes] (float) -> {cos, sin}, each float32 [S, sum(axes_dim)].
  std::pair<at::Tensor, at::Tensor> operator()(const at::Tensor& ids) const;

 private:
  std::vector<int> axes_dim_;
  double theta_ = 10000.0;
};

/// diffusers Timesteps(dim, flip_sin_to_cos=True, downscale_freq_shift=0) (get_timestep_embedding):
/// t [B] (already x 1000) -> float32 [B, dim], cos half first.
at::Tensor timestepProjection(const at::Tensor& t, int64_t dim = 256);

/// diffusers RMSNorm over the last dim (eps 1e-6, affine weight w): variance in float32.
at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& w);

/// diffusers FeedForward(activation_fn "gelu-approximate"): net.0.proj (ColwiseParallel) ->
/// gelu(tanh) -> net.2 (RowwiseParallel). x [B, S, C] -> [B, S, C].
struct FeedForward {
  LinearPtr proj;  ///< net.0.proj (ColwiseParallel in the FLUX plan: weight [M/tp, C])
  LinearPtr out;   ///< net.2 (RowwiseParallel: weight [C, M/tp], all-reduce inside)
  at::Tensor operator()(const at::Tensor& x) const;
};

/// diffusers FluxAttention (+ FluxAttnProcessor): q/k/v projections, RMSNorm on q and k
/// (norm_q/norm_k, eps 1e-6), RoPE, scaled dot-product attention through the backend. The
/// double-stream form also projects the text stream (add_q/k/v_proj, norm_added_q/k), attends over
/// cat(text, image) and projects both outputs (to_out.0, to_add_out); the single-stream form
/// (pre_only) takes q/k/v already projected by its block and returns the attention output.
class FluxAttention {
 public:
  FluxAttention() = default;
  /// Double-stream (added_kv_proj_dim set) when `added_kv`, else pre_only single-stream (its
  /// block loads to_q/to_k/to_v fused with proj_mlp). `headsLocal` = heads this rank computes
  /// (its to_q output rows / head dim, as the plan sharded them).
  /// `bias`: the projections have biases (FLUX.1) or not (FLUX.2's Flux2Attention, whose math
  /// is otherwise this class's).
  FluxAttention(WeightLoader& w, const std::string& prefix, int64_t C, int64_t headDim,
                bool added_kv, int64_t headsLocal = 0, bool bias = true);

  /// Double-stream: hidden [B, S_img, C], encoder [B, S_txt, C] (both already modulated), rotary
  /// tables over cat(text, image) -> {hidden attention output [B, S_img, C], encoder attention
  /// output [B, S_txt, C]} after to_out.0 / to_add_out (image first: the rowwise reduces run in
  /// this order on every rank).
  std::pair<at::Tensor, at::Tensor> operator()(const at::Tensor& hidden, const at::Tensor& encoder,
                                               const at::Tensor& cos, const at::Tensor& sin,
                                               const AttentionBackend& attention) const;
  /// Single-stream (pre_only): q, k, v [B, S, H_local * D] projected by the block ->
  /// [B, S, H_local * D] in the compute dtype.
  at::Tensor attendProjected(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& cos, const at::Tensor& sin,
                             const AttentionBackend& attention) const;

  FusedLinearPtr qkv;      ///< to_q, to_k, to_v as one GEMM (double-stream only)
  FusedLinearPtr add_qkv;  ///< add_q_proj, add_k_proj, add_v_proj as one GEMM (double-stream only)
  at::Tensor norm_q, norm_k, norm_added_q, norm_added_k;  ///< RMSNorm weights [D]
  LinearPtr to_out;                                       ///< to_out.0 (double-stream only)
  LinearPtr to_add_out;                                   ///< to_add_out (double-stream only)

 private:
  at::Tensor heads(const at::Tensor& x) const;
  int64_t headDim_ = 0, headsLocal_ = 0;
};

/// diffusers FluxTransformerBlock (double stream): norm1 / norm1_context (AdaLayerNormZero),
/// attn (FluxAttention with added kv), ff / ff_context (FeedForward), residual gates; float16
/// clips the text stream to +-65504 as diffusers does.
class FluxTransformerBlock {
 public:
  /// Loads every layer of block `prefix` ("transformer_blocks.<i>") through the loader.
  FluxTransformerBlock(WeightLoader& w, const std::string& prefix, int64_t C, int64_t M,
                       int64_t headDim);
  /// hidden [B, S_img, C], encoder [B, S_txt, C], silu_temb [B, C], rotary cos/sin
  /// [S_txt + S_img, D] -> {encoder, hidden} (diffusers returns encoder_hidden_states first).
  std::pair<at::Tensor, at::Tensor> operator()(const at::Tensor& hidden, const at::Tensor& encoder,
                                               const at::Tensor& silu_temb, const at::Tensor& cos,
                                               const at::Tensor& sin,
                                               const AttentionBackend& attention,
                                               const AttentionCacheSeam* seam = nullptr) const;

  AdaLayerNormZero norm1, norm1_context;
  FluxAttention attn;
  FeedForward ff, ff_context;
};

/// diffusers FluxSingleTransformerBlock: norm (AdaLayerNormZeroSingle), attn (pre_only
/// FluxAttention) in parallel with proj_mlp + gelu(tanh), proj_out over cat(attention, mlp)
/// (PackedRowwiseParallel over blocks {C, M}), gated residual; float16 clips to +-65504.
/// attn.to_q/to_k/to_v and proj_mlp share their input and run as one fused GEMM (qkv_mlp).
class FluxSingleTransformerBlock {
 public:
  /// Loads every layer of block `prefix` ("single_transformer_blocks.<i>") through the loader.
  FluxSingleTransformerBlock(WeightLoader& w, const std::string& prefix, int64_t C, int64_t M,
                             int64_t headDim);
  /// x = cat(text, image) [B, S, C] -> [B, S, C].
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& silu_temb, const at::Tensor& cos,
                        const at::Tensor& sin, const AttentionBackend& attention,
                        const AttentionCacheSeam* seam = nullptr) const;

  AdaLayerNormZeroSingle norm;
  FusedLinearPtr qkv_mlp;  ///< attn.to_q, attn.to_k, attn.to_v, proj_mlp as one GEMM
  FluxAttention attn;
  LinearPtr proj_out;  ///< PackedRowwiseParallel over {C, M} in the FLUX plan
};

}  // namespace flux
}  // namespace dit
