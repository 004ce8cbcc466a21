#include "backend/models/flux2/flux2_config.h"

#include "backend/io/config_json.h"

namespace dit {

Flux2TransformerConfig parseFlux2TransformerConfig(const nlohmann::json& j, const std::string& f) {
  Flux2TransformerConfig c;
  getConfigValue(j, "patch_size", c.patch_size, f, {1, 1});
  getConfigValue(j, "in_channels", c.in_channels, f, {1, 65536});
  c.out_channels = c.in_channels;
  getConfigValue(j, "out_channels", c.out_channels, f, {1, 65536});
  getConfigValue(j, "num_layers", c.num_layers, f, {0, 1024});
  getConfigValue(j, "num_single_layers", c.num_single_layers, f, {0, 1024});
  getConfigValue(j, "attention_head_dim", c.attention_head_dim, f, {2, 4096});
  getConfigValue(j, "num_attention_heads", c.num_attention_heads, f, {1, 4096});
  getConfigValue(j, "joint_attention_dim", c.joint_attention_dim, f, {1, 1 << 20});
  getConfigValue(j, "timestep_guidance_channels", c.timestep_guidance_channels, f, {2, 65536});
  getConfigValue(j, "mlp_ratio", c.mlp_ratio, f, {0.0625, 64});
  getConfigValue(j, "axes_dims_rope", c.axes_dims_rope, f, {0, 4096});
  getConfigValue(j, "rope_theta", c.rope_theta, f, {1, 1e9});
  getConfigValue(j, "eps", c.eps, f, {1e-12, 1e-1});
  getConfigValue(j, "guidance_embeds", c.guidance_embeds, f);
  if (c.num_layers + c.num_single_layers == 0)
    throw ModelFileError(f, "num_layers and num_single_layers are both 0: no transformer blocks");
  if (static_cast<long long>(c.num_attention_heads) * c.attention_head_dim > 65536)
    throw ModelFileError(f, "num_attention_heads x attention_head_dim = " +
                                std::to_string(static_cast<long long>(c.num_attention_heads) *
                                               c.attention_head_dim) +
                                " exceeds 65536");
  if (c.timestep_guidance_channels % 2 != 0)
    throw ModelFileError(f, "timestep_guidance_channels must be even (cos and sin halves), got " +
                                std::to_string(c.timestep_guidance_channels));
  if (c.mlpHidden() < 1) throw ModelFileError(f, "mlp_ratio gives an empty MLP");
  if (c.axes_dims_rope.empty() || c.axes_dims_rope.size() > 8)
    throw ModelFileError(
        f, "axes_dims_rope must hold 1 to 8 sizes, has " + std::to_string(c.axes_dims_rope.size()));
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
  return c;
}

}  // namespace dit
