// diffusers FluxTransformer2DModel config (models/transformers/transformer_flux.py __init__),
// read from transformer/config.json. Torch-free: the GUI, the strategy validation and the
// benchmark's byte counts read it too. Defaults are diffusers' constructor defaults, used only
// when a key is absent.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace dit {

struct FluxTransformerConfig {
  int patch_size = 1;
  int in_channels = 64;
  int out_channels = 64;  ///< null in the file -> in_channels
  int num_layers = 19;
  int num_single_layers = 38;
  int attention_head_dim = 128;
  int num_attention_heads = 24;
  int joint_attention_dim = 4096;
  int pooled_projection_dim = 768;
  bool guidance_embeds = false;
  std::vector<int> axes_dims_rope{16, 56, 56};
  /// Latent pixels per side of the default image: `sample_size` when the config declares it
  /// (SD3Transformer2DModel's key, which StableDiffusion3Pipeline takes as its
  /// default_sample_size; diffusers' FluxTransformer2DModel ignores it), else FluxPipeline's
  /// default_sample_size, 128. The embedded demo model, trained at 64x64, declares 16.
  int sample_size = 128;
  int innerDim() const { return num_attention_heads * attention_head_dim; }
  int mlpHidden() const { return innerDim() * 4; }  ///< mlp_ratio 4.0 in diffusers
};

/// Parses a FluxTransformer2DModel config object read from `file` (named in errors).
/// Throws ModelFileError: a key of the wrong type, sum(axes_dims_rope) != attention_head_dim,
/// patch_size other than 1.
FluxTransformerConfig parseFluxTransformerConfig(const nlohmann::json& j, const std::string& file);
/// Same, reading the file (for --random-weights models defined by a config alone).
FluxTransformerConfig parseFluxTransformerConfig(const std::string& configJsonPath);

}  // namespace dit
