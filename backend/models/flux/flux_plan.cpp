#include "backend/models/flux/flux_plan.h"

#include <memory>

namespace dit {

ParameterTable fluxParameterTable(const FluxTransformerConfig& c, const std::string& dtype,
                                  int64_t elementBytes) {
  ParameterTable t;
  auto param = [&](const std::string& name, std::vector<int64_t> shape) {
    t.add({name, std::move(shape), dtype, elementBytes});
  };
  auto linear = [&](const std::string& p, int64_t in, int64_t out) {
    param(p + ".weight", {out, in});
    param(p + ".bias", {out});
  };
  const int64_t C = c.innerDim(), M = c.mlpHidden(), hd = c.attention_head_dim;
  linear("x_embedder", c.in_channels, C);
  linear("context_embedder", c.joint_attention_dim, C);
  linear("time_text_embed.timestep_embedder.linear_1", 256, C);
  linear("time_text_embed.timestep_embedder.linear_2", C, C);
  if (c.guidance_embeds) {
    linear("time_text_embed.guidance_embedder.linear_1", 256, C);
    linear("time_text_embed.guidance_embedder.linear_2", C, C);
  }
  linear("time_text_embed.text_embedder.linear_1", c.pooled_projection_dim, C);
  linear("time_text_embed.text_embedder.linear_2", C, C);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "transformer_blocks." + std::to_string(i) + ".";
    linear(p + "norm1.linear", C, 6 * C);
    linear(p + "norm1_context.linear", C, 6 * C);
    for (const char* n : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj",
                          "attn.add_k_proj", "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out"})
      linear(p + n, C, C);
    for (const char* n : {"attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"})
      param(p + n + ".weight", {hd});
    linear(p + "ff.net.0.proj", C, M);
    linear(p + "ff.net.2", M, C);
    linear(p + "ff_context.net.0.proj", C, M);
    linear(p + "ff_context.net.2", M, C);
  }
  for (int i = 0; i < c.num_single_layers; ++i) {
    const std::string p = "single_transformer_blocks." + std::to_string(i) + ".";
    linear(p + "norm.linear", C, 3 * C);
    linear(p + "proj_mlp", C, M);
    linear(p + "proj_out", C + M, C);
    for (const char* n : {"attn.to_q", "attn.to_k", "attn.to_v"}) linear(p + n, C, C);
    for (const char* n : {"attn.norm_q", "attn.norm_k"}) param(p + n + ".weight", {hd});
  }
  linear("norm_out.linear", C, 2 * C);
  linear("proj_out", C, static_cast<int64_t>(c.patch_size) * c.patch_size * c.out_channels);
  return t;
}

ShardingPlan fluxShardingPlan(const FluxTransformerConfig& c) {
  using S = ParallelStyle;
  ShardingPlan plan;
  if (c.num_layers > 0) {
    for (const char* n :
         {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
          "attn.add_v_proj", "ff.net.0.proj", "ff_context.net.0.proj"})
      plan.add({std::string("transformer_blocks.*.") + n, S::Colwise, {}});
    for (const char* n : {"attn.to_out.0", "attn.to_add_out", "ff.net.2", "ff_context.net.2"})
      plan.add({std::string("transformer_blocks.*.") + n, S::Rowwise, {}});
    // AdaLayerNormZero's modulation (C -> 6C; about a fifth of FLUX.1-dev's weights): split by
    // output rows, the [B, 6C] result all-gathered, so each rank holds 1/tp of it.
    for (const char* n : {"norm1.linear", "norm1_context.linear"})
      plan.add({std::string("transformer_blocks.*.") + n, S::Colwise, {}, 0, true});
  }
  if (c.num_single_layers > 0) {
    for (const char* n : {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"})
      plan.add({std::string("single_transformer_blocks.*.") + n, S::Colwise, {}});
    // Input of proj_out is cat(attention output [inner_dim], mlp output [mlp_hidden]): two
    // independently sharded streams, so each block is split separately.
    plan.add(
        {"single_transformer_blocks.*.proj_out", S::PackedRowwise, {c.innerDim(), c.mlpHidden()}});
    // AdaLayerNormZeroSingle's modulation (C -> 3C), gathered as in the double-stream blocks.
    plan.add({"single_transformer_blocks.*.norm.linear", S::Colwise, {}, 0, true});
  }
  plan.requireDivisible("num_attention_heads", c.num_attention_heads,
                        "each tensor-parallel rank owns a whole number of heads", "tp_heads");
  return plan;
}

ContextParallelPlan fluxContextParallelPlan() {
  ContextParallelPlan p;
  p.inputs = {{"hidden_states", 1, 3},
              {"encoder_hidden_states", 1, 3},
              {"img_ids", 0, 2},
              {"txt_ids", 0, 2}};
  p.output = {1, "hidden_states", 3};
  p.joint_sequence = {"encoder_hidden_states", "hidden_states"};
  return p;
}

ModelDims fluxModelDims(const FluxTransformerConfig& c, int vaeScaleFactor) {
  ModelDims m;
  m.num_attention_heads = c.num_attention_heads;
  m.attention_head_dim = c.attention_head_dim;
  m.vae_scale_factor = vaeScaleFactor;
  m.default_sample_size = c.sample_size;
  m.mlp_hidden_dim = c.mlpHidden();
  m.tensor_parallel_plan = std::make_shared<const ShardingPlan>(fluxShardingPlan(c));
  m.parameters = std::make_shared<const ParameterTable>(fluxParameterTable(c));
  m.context_parallel_plan = std::make_shared<const ContextParallelPlan>(fluxContextParallelPlan());
  return m;
}

}  // namespace dit
