#include "backend/models/text_encoders/qwen3_plan.h"

namespace dit {

ParameterTable qwen3ParameterTable(const Qwen3Config& c, int layers, bool withFinalNorm,
                                   const std::string& dtype, int64_t elementBytes,
                                   const std::string& prefix) {
  const int64_t H = c.hidden_size, D = c.head_dim, M = c.intermediate_size;
  const int64_t q = int64_t{c.num_attention_heads} * D, kv = int64_t{c.num_key_value_heads} * D;
  if (layers < 0) layers = c.num_hidden_layers;
  ParameterTable t;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    t.add({prefix + name, std::move(shape), dtype, elementBytes});
  };
  add("embed_tokens.weight", {c.vocab_size, H});
  for (int i = 0; i < layers; ++i) {
    const std::string l = "layers." + std::to_string(i) + ".";
    add(l + "input_layernorm.weight", {H});
    add(l + "self_attn.q_proj.weight", {q, H});
    if (c.hasQkvBias()) add(l + "self_attn.q_proj.bias", {q});
    add(l + "self_attn.k_proj.weight", {kv, H});
    if (c.hasQkvBias()) add(l + "self_attn.k_proj.bias", {kv});
    add(l + "self_attn.v_proj.weight", {kv, H});
    if (c.hasQkvBias()) add(l + "self_attn.v_proj.bias", {kv});
    add(l + "self_attn.o_proj.weight", {H, q});
    if (c.attention_bias) add(l + "self_attn.o_proj.bias", {H});
    if (c.qk_norm) {
      add(l + "self_attn.q_norm.weight", {D});
      add(l + "self_attn.k_norm.weight", {D});
    }
    add(l + "post_attention_layernorm.weight", {H});
    add(l + "mlp.gate_proj.weight", {M, H});
    add(l + "mlp.up_proj.weight", {M, H});
    add(l + "mlp.down_proj.weight", {H, M});
  }
  if (withFinalNorm) add("norm.weight", {H});
  return t;
}

ShardingPlan qwen3ShardingPlan(const Qwen3Config& c, const std::string& prefix) {
  using S = ParallelStyle;
  ShardingPlan plan;
  const std::string l = prefix + "layers.*.";
  plan.add({l + "self_attn.q_proj", S::Colwise, {}});
  // GQA: k/v are split by whole KV heads, or replicated when tp does not divide them.
  plan.add({l + "self_attn.k_proj", S::Colwise, {}, c.num_key_value_heads});
  plan.add({l + "self_attn.v_proj", S::Colwise, {}, c.num_key_value_heads});
  plan.add({l + "self_attn.o_proj", S::Rowwise, {}});
  plan.add({l + "mlp.gate_proj", S::Colwise, {}});
  plan.add({l + "mlp.up_proj", S::Colwise, {}});
  plan.add({l + "mlp.down_proj", S::Rowwise, {}});
  plan.requireDivisible("num_attention_heads", c.num_attention_heads,
                        "each tensor-parallel rank owns a whole number of query heads", "tp_heads");
  plan.replicateWhenNotDivisible(true);
  return plan;
}

uint64_t qwen3LayerBytesPerRank(const Qwen3Config& c, int tp, int64_t elementBytes,
                                const std::string& prefix) {
  if (c.num_hidden_layers < 1) return 0;
  const int64_t eb = elementBytes < 1 ? 1 : elementBytes;
  const int t = tp < 1 ? 1 : tp;
  // One layer with the embedding minus the embedding alone, through the same resolved plan.
  const ParameterTable one = qwen3ParameterTable(c, 1, false, "F32", eb, prefix);
  const ParameterTable none = qwen3ParameterTable(c, 0, false, "F32", eb, prefix);
  std::string reason;
  const ShardingPlan plan = qwen3ShardingPlan(c, prefix).resolve(one, t, &reason);
  return plan.bytesPerRank(one, t, eb) - plan.bytesPerRank(none, t, eb);
}

}  // namespace dit
