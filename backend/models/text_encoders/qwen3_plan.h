// Qwen3 text encoder (transformers Qwen3Model, models/qwen3/modeling_qwen3.py) declared as data,
// without Torch: its parameters and its tensor-parallel plan. The weight loader, the byte counts
// and the tests derive per-rank shards from it.
#pragma once

#include <cstdint>
#include <string>

#include "backend/models/text_encoders/qwen3_config.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

/// Parameters of the first `layers` decoder layers of Qwen3Model (transformers checkpoint names
/// under `prefix`, default "model."; Qwen2.5-VL's "model.language_model.": embed_tokens.weight
/// [vocab, hidden], layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ q/k/v biases with qkv_bias or
/// attention_bias, the o_proj bias with attention_bias), layers.{i}.self_attn.{q,k}_norm.weight
/// [head_dim] (qk_norm), layers.{i}.mlp.{gate,up,down}_proj.weight,
/// layers.{i}.{input,post_attention}_layernorm.weight [hidden], norm.weight [hidden] when
/// `withFinalNorm`). layers < 0: all num_hidden_layers.
ParameterTable qwen3ParameterTable(const Qwen3Config& c, int layers = -1, bool withFinalNorm = true,
                                   const std::string& dtype = "F32", int64_t elementBytes = 4,
                                   const std::string& prefix = "model.");

/// The Qwen3 tensor-parallel plan (Megatron/vLLM style): q_proj, k_proj, v_proj, gate_proj,
/// up_proj ColwiseParallel; o_proj, down_proj RowwiseParallel. GQA-aware: k_proj/v_proj are
/// sharded only when tp divides num_key_value_heads, else replicated on every rank (each rank then
/// maps its query heads to the KV heads they use). The plan is marked
/// replicateWhenNotDivisible: when tp does not divide num_attention_heads or intermediate_size,
/// the whole text encoder is replicated on every rank of the tp group (ShardingPlan::resolve).
/// `prefix` as in qwen3ParameterTable.
ShardingPlan qwen3ShardingPlan(const Qwen3Config& c, const std::string& prefix = "model.");

/// Bytes of one decoder layer one rank holds at tensor-parallel degree `tp` (>= 1) under
/// qwen3ShardingPlan (whole when the plan replicates), in a compute dtype of `elementBytes`
/// bytes: what the host-streamed text-encoder placement holds on the device at a time
/// (Qwen3Model::largestLayerBytes without the layer's small int64 head map).
uint64_t qwen3LayerBytesPerRank(const Qwen3Config& c, int tp, int64_t elementBytes,
                                const std::string& prefix = "model.");

}  // namespace dit
