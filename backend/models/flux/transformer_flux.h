// FluxTransformer2DModel (diffusers models/transformers/transformer_flux.py): the MMDiT of FLUX.1
// with num_layers double-stream blocks (FluxTransformerBlock) and num_single_layers single-stream
// blocks (FluxSingleTransformerBlock), AdaLN-Zero modulation, QK RMSNorm and 3-axis RoPE
// (FluxPosEmbed). Sizes come from transformer/config.json (flux_config.h). The classes below carry
// diffusers' names, module paths (= checkpoint name prefixes) and output names, so a reader can put
// this file next to transformer_flux.py.
//
// Parallelism (../shared/DESIGN.md section 3) is not in the blocks:
//  - tensor parallel: the WeightLoader builds every layer from the ShardingPlan (flux_plan.h):
//    ColumnParallelLinear projections hold their output shard, RowParallelLinear ones all-reduce
//    their partial product over the tp group and add the bias once (parallel/tensor_parallel/
//    layers.h). Blocks see only "a linear layer" and their local head count.
//  - context parallel: the declared plan (fluxContextParallelPlan in flux_plan.h, diffusers'
//    _cp_plan) is applied around the blocks by the generic ContextParallelRunner; attention runs
//    through the attention backend (local, or ContextParallel over the concatenated text+image
//    sequence of every rank).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/io/weight_loader.h"
#include "backend/models/diffusion_transformer.h"
#include "backend/models/flux/flux_config.h"
#include "backend/models/torch_registry.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

class WeightSource;
class StepCache;

/// The groups FLUX runs under (the generic TransformerParallelism).
using FluxParallelism = TransformerParallelism;

class FluxTransformer2DModel : public DiffusionTransformer {
 public:
  /// Loads weights through a WeightLoader driven by `plan` (null = the FLUX.1 plan,
  /// fluxShardingPlan(cfg)): each rank reads only its slices under tp. Before reading any weight,
  /// validates the plan against the declared parameters (fluxParameterTable) at the tp degree:
  /// throws std::invalid_argument naming the rule patterns, sizes and tp_degree (heads, sharded
  /// dims, packed blocks, stale rules). Throws ModelFileError for missing/mismatching tensors.
  FluxTransformer2DModel(const FluxTransformerConfig& cfg, WeightSource& w,
                         FluxParallelism par = {},
                         std::shared_ptr<const ShardingPlan> plan = nullptr);
  ~FluxTransformer2DModel() override;

  /// One forward pass, inputs replicated on every rank of the group:
  ///  hidden_states [B, S_img, in_channels], encoder_hidden_states [B, S_txt, joint_attention_dim],
  ///  pooled_projections [B, pooled_projection_dim], timestep [B] (sigma, i.e. t / 1000),
  ///  img_ids [S_img, 3], txt_ids [S_txt, 3] (float), guidance [B] (undefined when the model has
  ///  no guidance embedder). Returns [B, S_img, out_channels] (gathered; same on every rank).
  ///  Compute dtype = weights' dtype; RoPE tables float64 -> float32 as in diffusers.
  ///  Throws std::invalid_argument when the model needs guidance and none is given.
  ///  Collective over the tp and cp groups when they are set.
  at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                     const at::Tensor& pooled_projections, const at::Tensor& timestep,
                     const at::Tensor& img_ids, const at::Tensor& txt_ids,
                     const at::Tensor& guidance) const;
  /// DiffusionTransformer::forward: the same by name. Required: hidden_states,
  /// encoder_hidden_states, pooled_projections, timestep, img_ids, txt_ids; guidance required
  /// when the config has guidance_embeds (ignored otherwise, as diffusers does). Throws
  /// std::invalid_argument naming a missing input or an unknown name (listing the accepted ones).
  at::Tensor forward(const TransformerInputs& inputs) const override;

  /// Installs the per-block seam (not owned; null = none). Must outlive forward() calls.
  void setHooks(TransformerHooks* hooks) override;
  /// Installs step caching (models/cache/step_cache.h; not owned; null = none), driven at the
  /// per-block seam: First Block Cache with transformer_blocks.0 as the head block and the last
  /// single block as the tail (image and text residuals reused when the remaining blocks are
  /// skipped; norm_out and proj_out always run); TaylorSeer on every "<block>.attn" (double
  /// blocks: image and text attention outputs; single blocks: the attention output), or in lite
  /// mode on proj_out with every block skipped on predicted steps. Each forward() is one step of
  /// the cache's current context. Must outlive forward() calls.
  void setStepCache(StepCache* cache) override;
  bool supportsStepCache() const override { return true; }

  const FluxTransformerConfig& config() const;
  /// Every parameter as loaded on this rank: checkpoint name, global shape, stored dtype and its
  /// ShardSpec (the slice this rank holds).
  const std::vector<LoadedParameter>& parameters() const override;
  /// The plan the model was loaded with.
  const ShardingPlan& shardingPlan() const override;
  /// FLOPs of one forward for the given token counts (matmuls + attention), for TFLOP/s.
  static double flops(const FluxTransformerConfig& c, int64_t img_tokens, int64_t txt_tokens);
  double forwardFlops(int64_t imageTokens, int64_t textTokens) const override;
  /// Every linear layer (fused q/k/v[/mlp] indexed by its diffusers part names).
  tensor_parallel::LoraTargets& loraTargets() override;
  /// fluxKohyaTargets (models/flux/flux_lora.h).
  KohyaLoraMapping kohyaLoraMapping() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

/// The "FluxTransformer2DModel" Torch registration (models/torch_registry.cpp): parses the
/// config (flux_config.h) and builds the model with the FLUX.1 plan.
TransformerBuilder fluxTransformerBuilder();

}  // namespace dit
