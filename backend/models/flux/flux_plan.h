// FLUX.1 (diffusers FluxTransformer2DModel, models/transformers/transformer_flux.py) declared as
// data, without Torch: its parameters, its tensor-parallel plan, its context-parallel plan and the
// family registration (both plans travel in the family's ModelDims). This is the one statement of
// how FLUX.1 is sharded: the weight loader, the strategy validation (worker, CLI, GUI), the
// benchmark's and the advisor's per-rank byte counts and the memory test all derive from it.
#pragma once

#include <cstdint>
#include <string>

#include "backend/models/flux/flux_config.h"
#include "parallel/context_parallel_plan_types.h"
#include "parallel/strategy.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

/// Every parameter of FluxTransformer2DModel for `c`, with diffusers' checkpoint names and global
/// shapes (weight [out_features, in_features]), stored as `dtype` ("F32", "BF16", ...) with
/// `elementBytes` bytes per element. Follows diffusers models/transformers/transformer_flux.py.
ParameterTable fluxParameterTable(const FluxTransformerConfig& c, const std::string& dtype = "F32",
                                  int64_t elementBytes = 4);

/// The FLUX.1 tensor-parallel plan (DESIGN.md section 3): double blocks attn.to_q/to_k/to_v,
/// attn.add_q_proj/add_k_proj/add_v_proj, ff.net.0.proj, ff_context.net.0.proj ColwiseParallel;
/// attn.to_out.0, attn.to_add_out, ff.net.2, ff_context.net.2 RowwiseParallel; single blocks
/// attn.to_q/to_k/to_v and proj_mlp ColwiseParallel, proj_out PackedRowwiseParallel over blocks
/// {inner_dim, mlp_hidden_dim}; tp_degree must divide num_attention_heads ("tp_heads").
/// Rules for a block kind are only declared when the config has such blocks. Everything else
/// (embedders, AdaLayerNorm linears, norm_out, proj_out of the model) is replicated.
ShardingPlan fluxShardingPlan(const FluxTransformerConfig& c);

/// FLUX's context-parallel plan (diffusers FluxTransformer2DModel._cp_plan): hidden_states and
/// encoder_hidden_states [B, S, C] split on dim 1, img_ids and txt_ids [S, 3] on dim 0; the joint
/// attention sequence is cat(encoder_hidden_states, hidden_states) (text then image); the output
/// [B, S_img, C_out] gathers on dim 1 following hidden_states' split.
ContextParallelPlan fluxContextParallelPlan();

/// ModelDims for strategy validation: heads, head dim, the VAE scale factor, the tensor-parallel
/// plan, the parameter table (F32) and the context-parallel plan.
ModelDims fluxModelDims(const FluxTransformerConfig& c, int vaeScaleFactor);

}  // namespace dit
