#include "backend/models/flux/flux_config.h"

#include "backend/io/config_json.h"

namespace dit {

FluxTransformerConfig parseFluxTransformerConfig(const nlohmann::json& j, const std::string& f) {
  FluxTransformerConfig c;
  getConfigValue(j, "patch_size", c.patch_size, f, {1, 1});
  getConfigValue(j, "in_channels", c.in_channels, f, {1, 65536});
  c.out_channels = c.in_channels;
  getConfigValue(j, "out_channels", c.out_channels, f, {1, 65536});
  getConfigValue(j, "num_layers", c.num_layers, f, {0, 1024});
  getConfigValue(j, "num_single_layers", c.num_single_layers, f, {0, 1024});
  getConfigValue(j, "attention_head_dim", c.attention_head_dim, f, {1, 4096});
  getConfigValue(j, "num_attention_heads", c.num_attention_heads, f, {1, 4096});
  getConfigValue(j, "joint_attention_dim", c.joint_attention_dim, f, {1, 65536});
  getConfigValue(j, "pooled_projection_dim", c.pooled_projection_dim, f, {1, 65536});
  getConfigValue(j, "guidance_embeds", c.guidance_embeds, f);
  getConfigValue(j, "axes_dims_rope", c.axes_dims_rope, f, {0, 4096});
  getConfigValue(j, "sample_size", c.sample_size, f, {1, 4096});
  // The schema: every size a positive integer the model code supports (checked with the ranges
  // above, before any tensor is made); then the relations between them.
  if (c.num_layers + c.num_single_layers == 0)
    throw ModelFileError(f, "num_layers and num_single_layers are both 0: no transformer blocks");
  if (static_cast<long long>(c.num_attention_heads) * c.attention_head_dim > 65536)
    throw ModelFileError(f, "num_attention_heads x attention_head_dim = " +
                                std::to_string(static_cast<long long>(c.num_attention_heads) *
                                               c.attention_head_dim) +
                                " exceeds 65536");
  if (c.axes_dims_rope.size() != 3)
    throw ModelFileError(
        f, "axes_dims_rope must hold 3 sizes, has " + std::to_string(c.axes_dims_rope.size()));
  int sum = 0;
  for (int a : c.axes_dims_rope) {
    if (a % 2 != 0)
      throw ModelFileError(
          f, "axes_dims_rope sizes must be even (rotary pairs), got " + std::to_string(a));
    sum += a;
  }
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
