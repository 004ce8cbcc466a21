#include "backend/models/flux/flux_plan.h"

namespace dit {

ModelDims fluxModelDims(const FluxTransformerConfig& c) {
  ModelDims d;
  d.num_attention_heads = c.num_attention_heads;
  d.attention_head_dim = c.attention_head_dim;
  d.mlp_ratio_hidden = c.mlpHidden();
  d.joint_attention_dim = c.joint_attention_dim;
  return d;
}

TransformerFamily fluxTransformerFamily() {
  TransformerFamily f;
  f.class_name = "FluxTransformer2DModel";
  f.dims = [](const nlohmann::json& config, const std::string& file) {
    return fluxModelDims(parseFluxTransformerConfig(config, file));
  };
  return f;
}

}  // namespace dit
