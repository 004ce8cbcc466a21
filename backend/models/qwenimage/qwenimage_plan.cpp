#include "backend/models/qwenimage/qwenimage_plan.h"

#include <memory>

namespace dit {

ParameterTable qwenImageParameterTable(const QwenImageTransformerConfig& c,
                                       const std::string& dtype, int64_t elementBytes) {
  ParameterTable t;
  auto param = [&](const std::string& name, std::vector<int64_t> shape) {
    t.add({name, std::move(shape), dtype, elementBytes});
  };
  auto linear = [&](const std::string& p, int64_t in, int64_t out) {
    param(p + ".weight", {out, in});
    param(p + ".bias", {out});
  };
  const int64_t C = c.innerDim(), M = c.mlpHidden(), hd = c.attention_head_dim;
  linear("img_in", c.in_channels, C);
  param("txt_norm.weight", {c.joint_attention_dim});
  linear("txt_in", c.joint_attention_dim, C);
  linear("time_text_embed.timestep_embedder.linear_1", 256, C);
  linear("time_text_embed.timestep_embedder.linear_2", C, C);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "transformer_blocks." + std::to_string(i) + ".";
    linear(p + "img_mod.1", C, 6 * C);
    linear(p + "txt_mod.1", C, 6 * C);
    for (const char* n : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj",
                          "attn.add_k_proj", "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out"})
      linear(p + n, C, C);
    for (const char* n : {"attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"})
      param(p + n + ".weight", {hd});
    for (const char* mlp : {"img_mlp", "txt_mlp"}) {
      linear(p + mlp + ".net.0.proj", C, M);
      linear(p + mlp + ".net.2", M, C);
    }
  }
  linear("norm_out.linear", C, 2 * C);
  linear("proj_out", C, c.projOut());
  return t;
}

ShardingPlan qwenImageShardingPlan(const QwenImageTransformerConfig& c) {
  using S = ParallelStyle;
  ShardingPlan plan;
  for (const char* n : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                        "attn.add_v_proj", "img_mlp.net.0.proj", "txt_mlp.net.0.proj"})
    plan.add({std::string("transformer_blocks.*.") + n, S::Colwise, {}});
  for (const char* n : {"attn.to_out.0", "attn.to_add_out", "img_mlp.net.2", "txt_mlp.net.2"})
    plan.add({std::string("transformer_blocks.*.") + n, S::Rowwise, {}});
  plan.requireDivisible("num_attention_heads", c.num_attention_heads,
                        "each tensor-parallel rank owns a whole number of heads", "tp_heads");
  return plan;
}

ContextParallelPlan qwenImageContextParallelPlan() {
  ContextParallelPlan p;
  p.inputs = {{"hidden_states", 1, 3},
              {"encoder_hidden_states", 1, 3},
              {"img_ids", 0, 2},
              {"txt_ids", 0, 2}};
  p.output = {1, "hidden_states", 3};
  p.joint_sequence = {"encoder_hidden_states", "hidden_states"};
  return p;
}

ModelDims qwenImageModelDims(const QwenImageTransformerConfig& c, int vaeScaleFactor) {
  ModelDims m;
  m.num_attention_heads = c.num_attention_heads;
  m.attention_head_dim = c.attention_head_dim;
  m.vae_scale_factor = vaeScaleFactor;
  m.mlp_hidden_dim = c.mlpHidden();
  m.tensor_parallel_plan = std::make_shared<const ShardingPlan>(qwenImageShardingPlan(c));
  m.parameters = std::make_shared<const ParameterTable>(qwenImageParameterTable(c));
  m.context_parallel_plan =
      std::make_shared<const ContextParallelPlan>(qwenImageContextParallelPlan());
  return m;
}

}  // namespace dit
