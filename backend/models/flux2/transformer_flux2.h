// Flux2Transformer2DModel (diffusers models/transformers/transformer_flux2.py): the MMDiT of
// FLUX.2 [klein] / [dev]. Differences from FLUX.1 (flux/transformer_flux.h), all from diffusers:
//  - modulation is shared: three Flux2Modulation linears (double_stream_modulation_img/_txt with
//    two (shift, scale, gate) sets, single_stream_modulation with one) computed once per forward
//    from silu(temb), instead of one AdaLayerNormZero per block;
//  - feed-forwards are SwiGLU (Flux2FeedForward: linear_in [2M, C] -> silu(gate) * value ->
//    linear_out [C, M]); single blocks fuse q, k, v, gate and value rows into one tensor
//    (attn.to_qkv_mlp_proj [3C + 2M, C]) and the attention and MLP outputs into attn.to_out
//    [C, C + M] (Flux2ParallelSelfAttention);
//  - no biases, no pooled text projection, guidance embedder only when guidance_embeds;
//  - four RoPE axes (T, H, W, L) with theta rope_theta (2000), interleaved pairs as FLUX.1.
// The skeleton (declared-vs-loaded check, input validation, context-parallel split/gather, the
// hooked block loop, First Block Cache / TaylorSeer, FLOPs) is the shared driver's
// (models/dit/dit_model.h); the layers are backend/nn/'s. Parallelism is as FLUX.1's: the
// WeightLoader builds layers from flux2ShardingPlan (flux2/flux2_plan.h; packed column/row styles
// for the fused tensors), the driver applies flux2ContextParallelPlan, attention goes through the
// attention backend.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/models/diffusion_transformer.h"
#include "backend/models/dit/dit_model.h"
#include "backend/models/flux2/flux2_config.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

class WeightSource;
namespace flux2 {
struct Flux2LayerKV;
}

/// diffusers Flux2KVCache (transformer_flux2.py; Flux2KleinKVPipeline): the reference tokens'
/// keys and values (after RMSNorm and RoPE) of every double and single block, extracted by one
/// forward and reused by the later ones, so the reference tokens are computed once per request.
/// Under tensor parallelism each rank holds its heads; under context parallelism every cp rank
/// holds every reference token (the references are not split: each rank computes them whole in
/// the extracting forward); under Ulysses (and unified) a rank keeps only the heads it attends
/// over after the all-to-all (1 / ulysses_degree of them), under ring all its heads.
///
/// Install it with Flux2Transformer2DModel::setKVCache. A forward then runs diffusers'
/// kv_cache_mode:
///  - "extract" when the cache is empty (or recompute() is set): the LAST numRefTokens() tokens
///    of hidden_states and img_ids are the reference tokens (the layout FlowMatchLatents::
///    reference_tokens gives; diffusers puts them first, which only reorders the keys). They
///    form a stream of their own, modulated with the fixed timestep 0 and attending to each
///    other only; the text and image tokens attend to everything; the K/V are stored. The
///    prediction covers the image tokens only ([B, S_img, out_channels]).
///  - "cached" when it holds K/V: hidden_states / img_ids are the image tokens alone, or the
///    image tokens followed by the same numRefTokens() reference tokens (ignored); the stored K/V
///    join the keys of every text and image query.
/// The cached result equals the extracting one (the references' K/V never depend on the step).
class Flux2KVCache {
 public:
  /// `num_ref_tokens` > 0: the reference tokens at the tail of an extracting forward's
  /// hidden_states / img_ids. `recompute`: every forward extracts again (the uncached form of the
  /// same causal attention). Throws std::invalid_argument when num_ref_tokens < 1.
  explicit Flux2KVCache(int64_t num_ref_tokens, bool recompute = false);
  ~Flux2KVCache();
  Flux2KVCache(const Flux2KVCache&) = delete;
  Flux2KVCache& operator=(const Flux2KVCache&) = delete;

  int64_t numRefTokens() const { return numRef_; }
  bool recompute() const { return recompute_; }
  /// Whether K/V have been extracted (the next forward is "cached" unless recompute()).
  bool filled() const;
  /// The image tokens of the extracting forward (0 before).
  int64_t imageTokens() const { return imgTokens_; }
  /// Bytes of the stored K/V on this rank.
  int64_t bytes() const;
  /// Drops the K/V (the next forward extracts again).
  void clear();

 private:
  friend class Flux2Transformer2DModel;
  int64_t numRef_ = 0, imgTokens_ = 0, batch_ = 0;
  bool recompute_ = false;
  std::vector<flux2::Flux2LayerKV> double_, single_;
};

class Flux2Transformer2DModel : public DiTModel {
 public:
  /// Loads weights through a WeightLoader driven by flux2ShardingPlan(cfg) (each rank reads only
  /// its slices under tp). Validates the plan against flux2ParameterTable at the tp degree before
  /// reading any weight (std::invalid_argument naming the rule: heads not divisible, ...). Throws
  /// ModelFileError for missing/mismatching tensors; std::invalid_argument for eps other than
  /// 1e-6 (the RMSNorm/LayerNorm epsilon the kernels use).
  Flux2Transformer2DModel(const Flux2TransformerConfig& cfg, WeightSource& w,
                          TransformerParallelism par = {});
  ~Flux2Transformer2DModel() override;

  // forward (DiTModel): one forward pass, inputs replicated on every rank of the groups:
  //  hidden_states [B, S_img, in_channels], encoder_hidden_states [B, S_txt,
  //  joint_attention_dim], timestep [B] (sigma = scheduler timestep / 1000), img_ids [S_img, 4]
  //  and txt_ids [S_txt, 4] (integers or floats; a leading batch dim of 1 is dropped, as diffusers
  //  does), guidance [B] (only with guidance_embeds; required then). Returns [B, S_img,
  //  out_channels] in the compute dtype (gathered; the same on every rank). Collective over the
  //  tp and cp groups. Throws std::invalid_argument naming a missing or unknown input.
  // setHooks, setStepCache (First Block Cache with transformer_blocks.0 as the head block;
  // TaylorSeer on every "<block>.attn": Flux2Attention's two outputs, and the whole
  // Flux2ParallelSelfAttention of a single block, its MLP and to_out included; lite on proj_out),
  // parameters, shardingPlan, loraTargets: DiTModel's.

  /// Installs the reference K/V cache of the KV modes (not owned; null = the plain forward,
  /// unchanged). Must outlive the forward() calls made with it. Every rank of the tp and cp groups
  /// installs a cache of the same numRefTokens() and runs the same forwards, so every rank takes
  /// the same mode. forward() then throws std::invalid_argument when an extracting forward has
  /// no more tokens than numRefTokens() or its batch differs, or when a cached forward's
  /// hidden_states hold neither imageTokens() nor imageTokens() + numRefTokens() tokens.
  void setKVCache(Flux2KVCache* cache);
  Flux2KVCache* kvCache() const;

  const Flux2TransformerConfig& config() const;
  /// FLOPs of one forward (matmuls + attention), batch 1.
  static double flops(const Flux2TransformerConfig& c, int64_t img_tokens, int64_t txt_tokens);

  /// Debug aids the goldens check (dit.0.rope_cos/sin, dit.0.temb): the RoPE tables for
  /// cat(txt_ids, img_ids) ({cos, sin} float32 [S, head_dim]) and the time embedding [B, C].
  std::pair<at::Tensor, at::Tensor> rotaryTables(const at::Tensor& txt_ids,
                                                 const at::Tensor& img_ids) const;
  at::Tensor timeEmbedding(const at::Tensor& timestep, const at::Tensor& guidance = {}) const;

 private:
  struct Impl;
  // The KV mode of one forward, decided on the whole inputs (DiTSpec::prepare).
  static void prepareKV(Impl& D, TransformerInputs& inputs);
  std::unique_ptr<Impl> d_;
};

}  // namespace dit
