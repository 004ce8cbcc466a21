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
  std::unique_ptr<Impl> d_;
};

}  // namespace dit
