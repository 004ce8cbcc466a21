#include "backend/models/flux/flux_config.h"

#include "backend/io/config_json.h"

namespace dit {

FluxTransformerConfig parseFluxTransformerConfig(const nlohmann::json& j, const std::string& f) {
  FluxTransformerConfig c;
  getConfigValue(j, "patch_size", c.patch_size, f);
  getConfigValue(j, "in_channels", c.in_channels, f);
  c.out_channels = c.in_channels;
  getConfigValue(j, "out_channels", c.out_channels, f);
  getConfigValue(j, "num_layers", c.num_layers, f);
  getConfigValue(j, "num_single_layers", c.num_single_layers, f);
  getConfigValue(j, "attention_head_dim", c.attention_head_dim, f);
  getConfigValue(j, "num_attention_heads", c.num_attention_heads, f);
  getConfigValue(j, "joint_attention_dim", c.joint_attention_dim, f);
  getConfigValue(j, "pooled_projection_dim", c.pooled_projection_dim, f);
  getConfigValue(j, "guidance_embeds", c.guidance_embeds, f);
  getConfigValue(j, "axes_dims_rope", c.axes_dims_rope, f);
  int sum = 0;
  for (int a : c.axes_dims_rope) sum += a;
  if (sum != c.attention_head_dim)
    throw ModelFileError(f, "axes_dims_rope sum " + std::to_string(sum) +
                                " differs from attention_head_dim " +
                                std::to_string(c.attention_head_dim));
  if (c.patch_size != 1) throw ModelFileError(f, "patch_size other than 1 is not supported");
  return c;
}

FluxTransformerConfig parseFluxTransformerConfig(const std::string& path) {
  return parseFluxTransformerConfig(readConfigJson(path), path);
}

}  // namespace dit
