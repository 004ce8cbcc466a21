#include "backend/models/autoencoders/autoencoder_kl_config.h"

#include "backend/io/config_json.h"

namespace dit {

AutoencoderKLConfig parseAutoencoderKLConfig(const nlohmann::json& j, const std::string& f) {
  requireConfigObject(j, f);
  // AutoencoderKLFlux2 is AutoencoderKL plus batch-norm statistics (read by its pipeline).
  requireDeclaredAs(j, "_class_name", {"AutoencoderKL", "AutoencoderKLFlux2"}, f);
  AutoencoderKLConfig c;
  getConfigValue(j, "in_channels", c.in_channels, f, {1, 64});
  getConfigValue(j, "out_channels", c.out_channels, f, {1, 64});
  getConfigValue(j, "latent_channels", c.latent_channels, f, {1, 1024});
  getConfigValue(j, "block_out_channels", c.block_out_channels, f, {1, 65536});
  getConfigValue(j, "layers_per_block", c.layers_per_block, f, {1, 64});
  getConfigValue(j, "norm_num_groups", c.norm_num_groups, f, {1, 65536});
  getConfigValue(j, "act_fn", c.act_fn, f);
  getConfigValue(j, "scaling_factor", c.scaling_factor, f, {1e-6, 1e6});
  getConfigValue(j, "shift_factor", c.shift_factor, f, {-1e6, 1e6});
  getConfigValue(j, "use_post_quant_conv", c.use_post_quant_conv, f);
  getConfigValue(j, "use_quant_conv", c.use_quant_conv, f);
  getConfigValue(j, "mid_block_add_attention", c.mid_block_add_attention, f);
  // sample_size: an int or a list (diffusers takes the first entry for the latent tile size).
  if (j.value("_class_name", std::string()) == "AutoencoderKLFlux2") c.sample_size = 1024;
  if (j.contains("sample_size") && j["sample_size"].is_array()) {
    std::vector<int> sizes;
    getConfigValue(j, "sample_size", sizes, f, {1, 1 << 20});
    if (!sizes.empty()) c.sample_size = sizes.front();
  } else {
    getConfigValue(j, "sample_size", c.sample_size, f, {1, 1 << 20});
  }
  if (c.block_out_channels.empty()) throw ModelFileError(f, "block_out_channels is empty");
  if (c.block_out_channels.size() > 8)
    throw ModelFileError(f, "block_out_channels has " +
                                std::to_string(c.block_out_channels.size()) +
                                " entries; at most 8 (vae_scale_factor 128)");
  // GroupNorm(norm_num_groups, channels) needs the groups to divide every channel count: checked
  // here, not after denoising inside LibTorch.
  for (int ch : c.block_out_channels)
    if (ch % c.norm_num_groups != 0)
      throw ModelFileError(f, "norm_num_groups " + std::to_string(c.norm_num_groups) +
                                  " does not divide block_out_channels entry " +
                                  std::to_string(ch) + " (GroupNorm needs whole groups)");
  if (c.act_fn != "silu" && c.act_fn != "swish" && c.act_fn != "relu" && c.act_fn != "gelu")
    throw ModelFileError(f, "act_fn '" + c.act_fn + "' is not supported (silu, swish, relu, gelu)");
  return c;
}

}  // namespace dit
