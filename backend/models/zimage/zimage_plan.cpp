#include "backend/models/zimage/zimage_plan.h"

#include <memory>
#include <vector>

namespace dit {

namespace {
const char* const kStages[] = {"noise_refiner", "context_refiner", "layers"};
}  // namespace

ParameterTable zimageParameterTable(const ZImageTransformerConfig& c, const std::string& dtype,
                                    int64_t elementBytes) {
  ParameterTable t;
  auto param = [&](const std::string& name, std::vector<int64_t> shape) {
    t.add({name, std::move(shape), dtype, elementBytes});
  };
  auto linear = [&](const std::string& p, int64_t in, int64_t out, bool bias) {
    param(p + ".weight", {out, in});
    if (bias) param(p + ".bias", {out});
  };
  const int64_t C = c.dim, M = c.ffnHidden(), hd = c.headDim(), A = c.adalnDim();
  const int64_t P = c.patchFeatures();
  const std::string key = c.patchKey();
  linear("all_x_embedder." + key, P, C, true);
  linear("all_final_layer." + key + ".linear", C, P, true);
  linear("all_final_layer." + key + ".adaLN_modulation.1", A, C, true);
  param("cap_embedder.0.weight", {c.cap_feat_dim});
  linear("cap_embedder.1", c.cap_feat_dim, C, true);
  param("cap_pad_token", {1, C});
  param("x_pad_token", {1, C});
  linear("t_embedder.mlp.0", 256, 1024, true);
  linear("t_embedder.mlp.2", 1024, A, true);
  for (const char* stage : kStages) {
    const bool modulated = std::string(stage) != "context_refiner";
    const int n = std::string(stage) == "layers" ? c.n_layers : c.n_refiner_layers;
    for (int i = 0; i < n; ++i) {
      const std::string p = std::string(stage) + "." + std::to_string(i) + ".";
      if (modulated) linear(p + "adaLN_modulation.0", A, 4 * C, true);
      for (const char* l :
           {"attention.to_q", "attention.to_k", "attention.to_v", "attention.to_out.0"})
        linear(p + l, C, C, false);
      param(p + "attention.norm_q.weight", {hd});
      param(p + "attention.norm_k.weight", {hd});
      for (const char* n2 : {"attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"})
        param(p + n2 + ".weight", {C});
      linear(p + "feed_forward.w1", C, M, false);
      linear(p + "feed_forward.w3", C, M, false);
      linear(p + "feed_forward.w2", M, C, false);
    }
  }
  return t;
}

ShardingPlan zimageShardingPlan(const ZImageTransformerConfig& c) {
  using S = ParallelStyle;
  ShardingPlan plan;
  for (const char* stage : kStages) {
    const int n = std::string(stage) == "layers" ? c.n_layers : c.n_refiner_layers;
    if (n == 0) continue;  // no stale rules for an empty stage
    const std::string p = std::string(stage) + ".*.";
    for (const char* l : {"attention.to_q", "attention.to_k", "attention.to_v", "feed_forward.w1",
                          "feed_forward.w3"})
      plan.add({p + l, S::Colwise, {}});
    for (const char* l : {"attention.to_out.0", "feed_forward.w2"})
      plan.add({p + l, S::Rowwise, {}});
  }
  plan.requireDivisible("n_heads", c.n_heads,
                        "each tensor-parallel rank owns a whole number of heads", "tp_heads");
  return plan;
}

ContextParallelPlan zimageContextParallelPlan() {
  ContextParallelPlan p;
  p.inputs = {{"hidden_states", 1, 3}, {"encoder_hidden_states", 1, 3},
              {"img_ids", 0, 2},       {"txt_ids", 0, 2},
              {"x_pad_mask", 0, 1},    {"cap_pad_mask", 0, 1}};
  p.output = {1, "hidden_states", 3};
  p.joint_sequence = {"encoder_hidden_states", "hidden_states"};
  return p;
}

ModelDims zimageModelDims(const ZImageTransformerConfig& c, int vaeScaleFactor) {
  ModelDims m;
  m.num_attention_heads = c.n_heads;
  m.attention_head_dim = c.headDim();
  m.vae_scale_factor = vaeScaleFactor;
  // ZImagePipeline's default image: 1024 x 1024 pixels.
  m.default_sample_size = vaeScaleFactor > 0 ? 1024 / vaeScaleFactor : 128;
  m.mlp_hidden_dim = c.ffnHidden();
  m.sequence_multiple = kZImageSeqMultiOf;
  m.tensor_parallel_plan = std::make_shared<const ShardingPlan>(zimageShardingPlan(c));
  m.parameters = std::make_shared<const ParameterTable>(zimageParameterTable(c));
  m.context_parallel_plan =
      std::make_shared<const ContextParallelPlan>(zimageContextParallelPlan());
  return m;
}

}  // namespace dit
