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
//  - context parallel: the declared plan (fluxContextParallelPlan, diffusers' _cp_plan) is applied
//    around the blocks by the generic ContextParallelRunner; attention runs through the attention
//    backend (local, or ContextParallel over the concatenated text+image sequence of every rank).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/io/weight_loader.h"
#include "backend/models/flux/flux_config.h"
#include "parallel/context_parallel_plan.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

class WeightSource;
class ProcessGroup;
class ContextParallel;

struct FluxParallelism {
  std::shared_ptr<ProcessGroup> tp;     ///< tensor-parallel group; null or size 1 = none
  std::shared_ptr<ContextParallel> cp;  ///< context-parallel attention; null = none
  int tpRank() const;
  int tpSize() const;
};

/// Per-block seam (for step caching, profiling, activation dumps): called by
/// FluxTransformer2DModel::forward around every block, in order, on every rank. `kind` is
/// "transformer_blocks" or "single_transformer_blocks", `index` the block index within its kind.
/// Tensors are this rank's local (context-parallel) slices:
///  - double blocks: hidden_states [B, S_img_local, C], encoder_hidden_states [B, S_txt_local, C];
///  - single blocks: hidden_states = cat(text, image) [B, S_local, C], encoder_hidden_states
///    undefined.
/// Hooks must not change collective order across ranks (a skip decision must be agreed by all
/// ranks of the cp/tp groups). Default implementations do nothing.
class TransformerHooks {
 public:
  virtual ~TransformerHooks() = default;
  virtual void beforeBlock(const char* kind, int index, const at::Tensor& hidden_states,
                           const at::Tensor& encoder_hidden_states);
  virtual void afterBlock(const char* kind, int index, const at::Tensor& hidden_states,
                          const at::Tensor& encoder_hidden_states);
};

class FluxTransformer2DModel {
 public:
  /// Loads weights through a WeightLoader driven by `plan` (null = the FLUX.1 plan,
  /// fluxShardingPlan(cfg)): each rank reads only its slices under tp. Before reading any weight,
  /// validates the plan against the declared parameters (fluxParameterTable) at the tp degree:
  /// throws std::invalid_argument naming the rule patterns, sizes and tp_degree (heads, sharded
  /// dims, packed blocks, stale rules). Throws ModelFileError for missing/mismatching tensors.
  FluxTransformer2DModel(const FluxTransformerConfig& cfg, WeightSource& w, FluxParallelism par = {},
                         std::shared_ptr<const ShardingPlan> plan = nullptr);
  ~FluxTransformer2DModel();

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

  /// Installs the per-block seam (not owned; null = none). Must outlive forward() calls.
  void setHooks(TransformerHooks* hooks);

  const FluxTransformerConfig& config() const;
  /// Every parameter as loaded on this rank: checkpoint name, global shape, stored dtype and its
  /// ShardSpec (the slice this rank holds).
  const std::vector<LoadedParameter>& parameters() const;
  /// The plan the model was loaded with.
  const ShardingPlan& shardingPlan() const;
  /// FLOPs of one forward for the given token counts (matmuls + attention), for TFLOP/s.
  static double flops(const FluxTransformerConfig& c, int64_t img_tokens, int64_t txt_tokens);

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

/// FLUX's context-parallel plan (diffusers FluxTransformer2DModel._cp_plan): hidden_states and
/// encoder_hidden_states split on dim 1, img_ids and txt_ids on dim 0, the joint attention sequence
/// is cat(encoder_hidden_states, hidden_states), the output gathers on dim 1 following
/// hidden_states' split.
ContextParallelPlan fluxContextParallelPlan();

}  // namespace dit
