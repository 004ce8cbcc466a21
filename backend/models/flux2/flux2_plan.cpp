#include "backend/models/flux2/flux2_plan.h"

#include <memory>

namespace dit {

ParameterTable flux2ParameterTable(const Flux2TransformerConfig& c, const std::string& dtype,
                                   int64_t elementBytes) {
  ParameterTable t;
  auto param = [&](const std::string& name, std::vector<int64_t> shape) {
    t.add({name, std::move(shape), dtype, elementBytes});
  };
  auto linear = [&](const std::string& p, int64_t in, int64_t out) {
    param(p + ".weight", {out, in});
  };
  const int64_t C = c.innerDim(), M = c.mlpHidden(), hd = c.attention_head_dim;
  const int64_t tg = c.timestep_guidance_channels;
  linear("x_embedder", c.in_channels, C);
  linear("context_embedder", c.joint_attention_dim, C);
  linear("time_guidance_embed.timestep_embedder.linear_1", tg, C);
  linear("time_guidance_embed.timestep_embedder.linear_2", C, C);
  if (c.guidance_embeds) {
    linear("time_guidance_embed.guidance_embedder.linear_1", tg, C);
    linear("time_guidance_embed.guidance_embedder.linear_2", C, C);
  }
  linear("double_stream_modulation_img.linear", C, 6 * C);
  linear("double_stream_modulation_txt.linear", C, 6 * C);
  linear("single_stream_modulation.linear", C, 3 * C);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "transformer_blocks." + std::to_string(i) + ".";
    for (const char* n : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj",
                          "attn.add_k_proj", "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out"})
      linear(p + n, C, C);
    for (const char* n : {"attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"})
      param(p + n + ".weight", {hd});
    for (const char* ff : {"ff", "ff_context"}) {
      linear(p + ff + ".linear_in", C, 2 * M);
      linear(p + ff + ".linear_out", M, C);
    }
  }
  for (int i = 0; i < c.num_single_layers; ++i) {
    const std::string p = "single_transformer_blocks." + std::to_string(i) + ".";
    linear(p + "attn.to_qkv_mlp_proj", C, 3 * C + 2 * M);
    linear(p + "attn.to_out", C + M, C);
    for (const char* n : {"attn.norm_q", "attn.norm_k"}) param(p + n + ".weight", {hd});
  }
  linear("norm_out.linear", C, 2 * C);
  linear("proj_out", C, static_cast<int64_t>(c.patch_size) * c.patch_size * c.out_channels);
  return t;
}

ShardingPlan flux2ShardingPlan(const Flux2TransformerConfig& c) {
  using S = ParallelStyle;
  const int64_t C = c.innerDim(), M = c.mlpHidden();
  ShardingPlan plan;
  if (c.num_layers > 0) {
    for (const char* n : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj",
                          "attn.add_k_proj", "attn.add_v_proj"})
      plan.add({std::string("transformer_blocks.*.") + n, S::Colwise, {}});
    for (const char* n : {"ff.linear_in", "ff_context.linear_in"})
      plan.add({std::string("transformer_blocks.*.") + n, S::PackedColwise, {M, M}});
    for (const char* n :
         {"attn.to_out.0", "attn.to_add_out", "ff.linear_out", "ff_context.linear_out"})
      plan.add({std::string("transformer_blocks.*.") + n, S::Rowwise, {}});
  }
  if (c.num_single_layers > 0) {
    plan.add(
        {"single_transformer_blocks.*.attn.to_qkv_mlp_proj", S::PackedColwise, {C, C, C, M, M}});
    plan.add({"single_transformer_blocks.*.attn.to_out", S::PackedRowwise, {C, M}});
  }
  plan.requireDivisible("num_attention_heads", c.num_attention_heads,
                        "each tensor-parallel rank owns a whole number of heads", "tp_heads");
  return plan;
}

ContextParallelPlan flux2ContextParallelPlan() {
  ContextParallelPlan p;
  p.inputs = {{"hidden_states", 1, 3},
              {"encoder_hidden_states", 1, 3},
              {"img_ids", 0, 2},
              {"txt_ids", 0, 2}};
  p.output = {1, "hidden_states", 3};
  p.joint_sequence = {"encoder_hidden_states", "hidden_states"};
  return p;
}

ModelDims flux2ModelDims(const Flux2TransformerConfig& c, int vaeScaleFactor) {
  ModelDims m;
  m.num_attention_heads = c.num_attention_heads;
  m.attention_head_dim = c.attention_head_dim;
  m.vae_scale_factor = vaeScaleFactor;
  m.mlp_hidden_dim = c.mlpHidden();
  m.tensor_parallel_plan = std::make_shared<const ShardingPlan>(flux2ShardingPlan(c));
  m.parameters = std::make_shared<const ParameterTable>(flux2ParameterTable(c));
  m.context_parallel_plan = std::make_shared<const ContextParallelPlan>(flux2ContextParallelPlan());
  return m;
}

}  // namespace dit
