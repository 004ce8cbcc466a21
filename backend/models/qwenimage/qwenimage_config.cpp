#include "backend/models/qwenimage/qwenimage_config.h"

#include <nlohmann/json.hpp>

#include "backend/io/config_json.h"

namespace dit {

QwenImageTransformerConfig parseQwenImageTransformerConfig(const nlohmann::json& j,
                                                           const std::string& f) {
  if (!j.is_object()) throw ModelFileError(f, "config is not a JSON object");
  QwenImageTransformerConfig c;
  getConfigValue(j, "patch_size", c.patch_size, f, {1, 16});
  getConfigValue(j, "in_channels", c.in_channels, f, {1, 65536});
  if (auto it = j.find("out_channels"); it != j.end() && it->is_null())
    c.out_channels = c.in_channels;
  getConfigValue(j, "out_channels", c.out_channels, f, {1, 65536});
  getConfigValue(j, "num_layers", c.num_layers, f, {1, 1024});
  getConfigValue(j, "attention_head_dim", c.attention_head_dim, f, {2, 4096});
  getConfigValue(j, "num_attention_heads", c.num_attention_heads, f, {1, 4096});
  getConfigValue(j, "joint_attention_dim", c.joint_attention_dim, f, {1, 1 << 20});
  getConfigValue(j, "axes_dims_rope", c.axes_dims_rope, f, {2, 4096});
  for (const char* k :
       {"guidance_embeds", "zero_cond_t", "use_additional_t_cond", "use_layer3d_rope"}) {
    bool on = false;
    getConfigValue(j, k, on, f);
    if (on)
      throw ModelFileError(f, std::string("config key '") + k +
                                  "' is true: this QwenImageTransformer2DModel variant (edit / "
                                  "layered models) is not supported");
  }
  if (static_cast<long long>(c.num_attention_heads) * c.attention_head_dim > 65536)
    throw ModelFileError(f, "num_attention_heads x attention_head_dim exceeds 65536");
  if (c.axes_dims_rope.size() != 3)
    throw ModelFileError(f, "axes_dims_rope must hold 3 sizes (frame, height, width), has " +
                                std::to_string(c.axes_dims_rope.size()));
  int sum = 0;
  for (int a : c.axes_dims_rope) {
    if (a % 2 != 0)
      throw ModelFileError(f, "axes_dims_rope sizes must be even, got " + std::to_string(a));
    sum += a;
  }
  if (sum != c.attention_head_dim)
    throw ModelFileError(f, "axes_dims_rope sum " + std::to_string(sum) +
                                " differs from attention_head_dim " +
                                std::to_string(c.attention_head_dim));
  return c;
}

}  // namespace dit
