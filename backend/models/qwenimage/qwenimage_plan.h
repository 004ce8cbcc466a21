// Qwen-Image (diffusers QwenImageTransformer2DModel, models/transformers/transformer_qwenimage.py)
// declared as data, without Torch: its parameters, its tensor-parallel plan (diffusers' _tp_plan)
// and its context-parallel plan (diffusers' _cp_plan), as flux/flux_plan.h does for FLUX.1.
#pragma once

#include <string>

#include "backend/models/qwenimage/qwenimage_config.h"
#include "parallel/context_parallel_plan_types.h"
#include "parallel/strategy.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

/// Every parameter of QwenImageTransformer2DModel for `c` with diffusers' checkpoint names and
/// global shapes (weight [out, in], every linear with a bias; txt_norm and the q/k RMSNorm
/// weights), stored as `dtype` with `elementBytes` bytes per element.
ParameterTable qwenImageParameterTable(const QwenImageTransformerConfig& c,
                                       const std::string& dtype = "F32", int64_t elementBytes = 4);

/// diffusers QwenImageTransformer2DModel._tp_plan: transformer_blocks.*.attn.to_q/to_k/to_v and
/// add_q_proj/add_k_proj/add_v_proj ColwiseParallel, attn.to_out.0 and attn.to_add_out
/// RowwiseParallel, img_mlp / txt_mlp net.0.proj ColwiseParallel and net.2 RowwiseParallel;
/// img_in, txt_norm, txt_in, the time embedding, img_mod / txt_mod, norm_out and proj_out
/// replicated. tp_degree must divide num_attention_heads ("tp_heads").
ShardingPlan qwenImageShardingPlan(const QwenImageTransformerConfig& c);

/// diffusers QwenImageTransformer2DModel._cp_plan: hidden_states and encoder_hidden_states
/// [B, S, C] split on dim 1 (at transformer_blocks.0), the rotary tables split on dim 0 with
/// their streams (here the position ids img_ids / txt_ids [S, 3] the model builds from
/// img_shapes), joint sequence cat(text, image), output gathered on dim 1 (proj_out).
ContextParallelPlan qwenImageContextParallelPlan();

/// ModelDims for strategy validation (heads, head dim, MLP hidden, plans, parameter table).
ModelDims qwenImageModelDims(const QwenImageTransformerConfig& c, int vaeScaleFactor);

}  // namespace dit
