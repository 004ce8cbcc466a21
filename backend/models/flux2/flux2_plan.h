// FLUX.2 (diffusers Flux2Transformer2DModel, models/transformers/transformer_flux2.py) declared
// as data, without Torch: its parameters, its tensor-parallel plan, its context-parallel plan and
// the family registration, as flux/flux_plan.h does for FLUX.1. Nothing in parallel/ knows FLUX.2:
// validation, shard-on-load and per-rank bytes all follow from these declarations.
#pragma once

#include <string>

#include "backend/models/flux2/flux2_config.h"
#include "parallel/context_parallel_plan_types.h"
#include "parallel/strategy.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

/// Every parameter of Flux2Transformer2DModel for `c` with diffusers' checkpoint names and global
/// shapes (weight [out_features, in_features]; FLUX.2 linears have no bias), stored as `dtype`
/// with `elementBytes` bytes per element.
ParameterTable flux2ParameterTable(const Flux2TransformerConfig& c,
                                   const std::string& dtype = "F32", int64_t elementBytes = 4);

/// The FLUX.2 tensor-parallel plan. Double blocks: attn.to_q/to_k/to_v and
/// attn.add_q_proj/add_k_proj/add_v_proj ColwiseParallel; ff.linear_in and ff_context.linear_in
/// PackedColwiseParallel over {M, M} (the SwiGLU gate and value halves of one tensor);
/// attn.to_out.0, attn.to_add_out, ff.linear_out, ff_context.linear_out RowwiseParallel.
/// Single blocks: attn.to_qkv_mlp_proj PackedColwiseParallel over {C, C, C, M, M} (q, k, v, gate,
/// value rows of one fused tensor), attn.to_out PackedRowwiseParallel over {C, M} (its input is
/// cat(attention, mlp)). Embedders, the shared modulations, norm_out and proj_out are replicated.
/// tp_degree must divide num_attention_heads ("tp_heads"). C = inner_dim, M = mlp hidden.
ShardingPlan flux2ShardingPlan(const Flux2TransformerConfig& c);

/// diffusers Flux2Transformer2DModel._cp_plan: hidden_states and encoder_hidden_states [B, S, C]
/// split on dim 1, img_ids and txt_ids [S, 4] on dim 0, joint sequence cat(text, image), output
/// gathered on dim 1 following hidden_states.
ContextParallelPlan flux2ContextParallelPlan();

/// ModelDims for strategy validation (heads, head dim, plans, parameter table).
ModelDims flux2ModelDims(const Flux2TransformerConfig& c, int vaeScaleFactor);

}  // namespace dit
