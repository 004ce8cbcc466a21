#include "backend/models/autoencoders/autoencoder_kl_config.h"

#include "backend/io/config_json.h"

namespace dit {

AutoencoderKLConfig parseAutoencoderKLConfig(const nlohmann::json& j, const std::string& f) {
  AutoencoderKLConfig c;
  getConfigValue(j, "in_channels", c.in_channels, f);
  getConfigValue(j, "out_channels", c.out_channels, f);
  getConfigValue(j, "latent_channels", c.latent_channels, f);
  getConfigValue(j, "block_out_channels", c.block_out_channels, f);
  getConfigValue(j, "layers_per_block", c.layers_per_block, f);
  getConfigValue(j, "norm_num_groups", c.norm_num_groups, f);
  getConfigValue(j, "act_fn", c.act_fn, f);
  getConfigValue(j, "scaling_factor", c.scaling_factor, f);
  getConfigValue(j, "shift_factor", c.shift_factor, f);
  getConfigValue(j, "use_post_quant_conv", c.use_post_quant_conv, f);
  getConfigValue(j, "use_quant_conv", c.use_quant_conv, f);
  getConfigValue(j, "mid_block_add_attention", c.mid_block_add_attention, f);
  if (c.block_out_channels.empty()) throw ModelFileError(f, "block_out_channels is empty");
  return c;
}

}  // namespace dit
