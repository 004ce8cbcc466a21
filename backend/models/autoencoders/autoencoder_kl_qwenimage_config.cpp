#include "backend/models/autoencoders/autoencoder_kl_qwenimage_config.h"

#include <nlohmann/json.hpp>

#include "backend/io/config_json.h"

namespace dit {

AutoencoderKLQwenImageConfig parseAutoencoderKLQwenImageConfig(const nlohmann::json& j,
                                                               const std::string& f) {
  requireConfigObject(j, f);
  requireDeclaredAs(j, "_class_name", {"AutoencoderKLQwenImage"}, f);
  AutoencoderKLQwenImageConfig c;
  getConfigValue(j, "base_dim", c.base_dim, f, {1, 4096});
  getConfigValue(j, "z_dim", c.z_dim, f, {1, 1024});
  getConfigValue(j, "dim_mult", c.dim_mult, f, {1, 64});
  getConfigValue(j, "num_res_blocks", c.num_res_blocks, f, {0, 16});
  getConfigValue(j, "input_channels", c.input_channels, f, {1, 64});
  if (auto it = j.find("temperal_downsample"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) throw ModelFileError(f, "config key 'temperal_downsample' must be a list");
    c.temperal_downsample.clear();
    for (const auto& e : *it) {
      if (!e.is_boolean())
        throw ModelFileError(f, "config key 'temperal_downsample' must hold true/false values");
      c.temperal_downsample.push_back(e.get<bool>());
    }
  }
  std::vector<double> attn;
  getConfigValue(j, "attn_scales", attn, f);
  if (!attn.empty())
    throw ModelFileError(f,
                         "config key 'attn_scales' is not empty: attention blocks in the "
                         "encoder's down path are not implemented");
  double dropout = 0;
  getConfigValue(j, "dropout", dropout, f, {0, 0});
  if (c.dim_mult.empty() || c.dim_mult.size() > 8)
    throw ModelFileError(f, "config key 'dim_mult' must hold 1 to 8 values");
  if (c.temperal_downsample.size() + 1 != c.dim_mult.size())
    throw ModelFileError(f, "config key 'temperal_downsample' has " +
                                std::to_string(c.temperal_downsample.size()) +
                                " values; dim_mult has " + std::to_string(c.dim_mult.size()) +
                                " stages, so it needs " + std::to_string(c.dim_mult.size() - 1));
  if (c.dim_mult.back() * c.base_dim % 2 != 0)
    throw ModelFileError(f, "base_dim x dim_mult must be even (the upsamplers halve channels)");
  c.latents_mean.assign(static_cast<size_t>(c.z_dim), 0.0);
  c.latents_std.assign(static_cast<size_t>(c.z_dim), 1.0);
  getConfigValue(j, "latents_mean", c.latents_mean, f, {-1e6, 1e6});
  getConfigValue(j, "latents_std", c.latents_std, f, {1e-12, 1e6});
  if (c.latents_mean.size() != static_cast<size_t>(c.z_dim) ||
      c.latents_std.size() != static_cast<size_t>(c.z_dim))
    throw ModelFileError(f, "config keys 'latents_mean' and 'latents_std' must hold z_dim (" +
                                std::to_string(c.z_dim) + ") values each");
  return c;
}

}  // namespace dit
