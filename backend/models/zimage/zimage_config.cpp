#include "backend/models/zimage/zimage_config.h"

#include <nlohmann/json.hpp>

#include "backend/io/config_json.h"

namespace dit {

ZImageTransformerConfig parseZImageTransformerConfig(const nlohmann::json& j,
                                                     const std::string& f) {
  ZImageTransformerConfig c;
  std::vector<int> patch{c.patch_size}, fpatch{c.f_patch_size};
  getConfigValue(j, "all_patch_size", patch, f, {1, 16});
  getConfigValue(j, "all_f_patch_size", fpatch, f, {1, 16});
  if (patch.size() != 1 || fpatch.size() != 1)
    throw ModelFileError(f,
                         "all_patch_size and all_f_patch_size must hold one entry each (one "
                         "patch size), got " +
                             std::to_string(patch.size()) + " and " +
                             std::to_string(fpatch.size()));
  c.patch_size = patch[0];
  c.f_patch_size = fpatch[0];
  if (c.f_patch_size != 1)
    throw ModelFileError(f, "all_f_patch_size " + std::to_string(c.f_patch_size) +
                                " is not supported (images only: 1)");
  getConfigValue(j, "in_channels", c.in_channels, f, {1, 4096});
  getConfigValue(j, "dim", c.dim, f, {1, 65536});
  getConfigValue(j, "n_layers", c.n_layers, f, {0, 1024});
  getConfigValue(j, "n_refiner_layers", c.n_refiner_layers, f, {0, 1024});
  getConfigValue(j, "n_heads", c.n_heads, f, {1, 4096});
  getConfigValue(j, "n_kv_heads", c.n_kv_heads, f, {1, 4096});
  getConfigValue(j, "norm_eps", c.norm_eps, f, {1e-12, 1e-1});
  getConfigValue(j, "qk_norm", c.qk_norm, f);
  getConfigValue(j, "cap_feat_dim", c.cap_feat_dim, f, {1, 1 << 20});
  getConfigValue(j, "rope_theta", c.rope_theta, f, {1, 1e9});
  getConfigValue(j, "t_scale", c.t_scale, f, {1e-6, 1e9});
  getConfigValue(j, "axes_dims", c.axes_dims, f, {0, 4096});
  getConfigValue(j, "axes_lens", c.axes_lens, f, {1, 1 << 24});
  if (j.contains("siglip_feat_dim") && !j["siglip_feat_dim"].is_null())
    throw ModelFileError(f,
                         "siglip_feat_dim is set: image conditioning (Z-Image-Omni) is not "
                         "supported");
  if (!c.qk_norm)
    throw ModelFileError(f, "qk_norm false is not supported (Z-Image models normalise q and k)");
  if (c.n_layers == 0) throw ModelFileError(f, "n_layers is 0: no main layers");
  if (c.dim % c.n_heads != 0)
    throw ModelFileError(f, "dim " + std::to_string(c.dim) + " is not divisible by n_heads " +
                                std::to_string(c.n_heads));
  if (c.axes_dims.empty() || c.axes_dims.size() > 8 || c.axes_lens.size() != c.axes_dims.size())
    throw ModelFileError(f,
                         "axes_dims and axes_lens must hold the same number (1 to 8) of sizes, "
                         "got " +
                             std::to_string(c.axes_dims.size()) + " and " +
                             std::to_string(c.axes_lens.size()));
  if (c.axes_dims.size() != 3)
    throw ModelFileError(
        f, "axes_dims must hold 3 sizes (F, H, W), got " + std::to_string(c.axes_dims.size()));
  int sum = 0;
  for (int a : c.axes_dims) {
    if (a % 2 != 0)
      throw ModelFileError(f,
                           "axes_dims sizes must be even (rotary pairs), got " + std::to_string(a));
    sum += a;
  }
  if (sum != c.headDim())
    throw ModelFileError(f, "axes_dims sum " + std::to_string(sum) + " differs from the head dim " +
                                std::to_string(c.headDim()) + " (dim / n_heads)");
  if (c.ffnHidden() < 1) throw ModelFileError(f, "dim gives an empty feed-forward");
  return c;
}

}  // namespace dit
