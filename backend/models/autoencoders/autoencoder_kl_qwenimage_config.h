// diffusers AutoencoderKLQwenImage config (models/autoencoders/autoencoder_kl_qwenimage.py
// __init__), read from vae/config.json. Torch-free (the GUI and the memory model read it).
// Defaults are diffusers' constructor defaults, used only when a key is absent.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace dit {

struct AutoencoderKLQwenImageConfig {
  int base_dim = 96;
  int z_dim = 16;
  std::vector<int> dim_mult{1, 2, 4, 4};
  int num_res_blocks = 2;
  /// One flag per down stage (len(dim_mult) - 1); the decoder's temperal_upsample is the reverse.
  std::vector<bool> temperal_downsample{false, true, true};
  int input_channels = 3;
  /// Per-channel latent statistics (z_dim values each): the pipeline's latents are
  /// (mean_latent - latents_mean) / latents_std.
  std::vector<double> latents_mean, latents_std;
  /// 2^len(temperal_downsample), as QwenImagePipeline computes vae_scale_factor.
  int vaeScaleFactor() const { return 1 << static_cast<int>(temperal_downsample.size()); }
};

/// Parses an AutoencoderKLQwenImage config read from `file`. Throws ModelFileError naming the file
/// and the key: wrong types or ranges, len(temperal_downsample) != len(dim_mult) - 1,
/// latents_mean / latents_std without z_dim values or with a std <= 0, attn_scales not empty
/// (attention in the encoder's down path is not implemented), dropout other than 0; a top level
/// that is not a JSON object, a "_class_name" other than AutoencoderKLQwenImage.
AutoencoderKLQwenImageConfig parseAutoencoderKLQwenImageConfig(const nlohmann::json& j,
                                                               const std::string& file);

}  // namespace dit
