// diffusers AutoencoderKL config (encoder and decoder), read from vae/config.json. Torch-free.
// Defaults are diffusers' constructor defaults, used only when a key is absent.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace dit {

struct AutoencoderKLConfig {
  int in_channels = 3;
  int out_channels = 3;
  int latent_channels = 4;
  std::vector<int> block_out_channels{64};
  int layers_per_block = 1;
  int norm_num_groups = 32;
  std::string act_fn = "silu";
  double scaling_factor = 0.18215;
  double shift_factor = 0.0;
  bool use_post_quant_conv = true;
  bool use_quant_conv = true;  ///< encoder side: 1x1 conv on the 2 * latent_channels moments
  bool mid_block_add_attention = true;
  /// config.sample_size (its first entry when a list): diffusers' default tile_sample_min_size.
  /// Absent: the class's constructor default, 32 for AutoencoderKL, 1024 for AutoencoderKLFlux2.
  int sample_size = 32;
  /// 2^(len(block_out_channels)-1), as FluxPipeline computes vae_scale_factor.
  int vaeScaleFactor() const { return 1 << (static_cast<int>(block_out_channels.size()) - 1); }
};

/// diffusers' tiling state of AutoencoderKL / AutoencoderKLFlux2 (enable_tiling() and the
/// attributes set in __init__): when `enabled` and the latent's height or width exceeds
/// tile_latent_min_size, decode() runs tiled_decode. Sizes in pixels (sample) and latent cells.
struct VaeTiling {
  bool enabled = false;
  /// Decoded tile size in pixels; 0 = config.sample_size (diffusers' default).
  int tile_sample_min_size = 0;
  /// Latent tile size; 0 = int(tile_sample_min_size / vae_scale_factor) (diffusers computes it
  /// from sample_size the same way).
  int tile_latent_min_size = 0;
  /// Fraction of a tile shared with its neighbour; diffusers' 0.25.
  double tile_overlap_factor = 0.25;
};

/// Parses an AutoencoderKL config read from `file`. Throws ModelFileError naming the file: a top
/// level that is not a JSON object, a "_class_name" other than AutoencoderKL /
/// AutoencoderKLFlux2 (naming the class it declares), a key of the wrong type, an empty
/// block_out_channels.
AutoencoderKLConfig parseAutoencoderKLConfig(const nlohmann::json& j, const std::string& file);

}  // namespace dit
