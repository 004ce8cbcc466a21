// diffusers QwenImageTransformer2DModel config (models/transformers/transformer_qwenimage.py
// __init__), read from transformer/config.json. Torch-free: strategy validation, the GUI and byte
// counts read it too. Defaults are diffusers' constructor defaults (Qwen-Image 20 B), used only
// when a key is absent.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace dit {

struct QwenImageTransformerConfig {
  int patch_size = 2;
  int in_channels = 64;
  int out_channels = 16;  ///< null in the file -> in_channels
  int num_layers = 60;    ///< dual-stream QwenImageTransformerBlocks
  int attention_head_dim = 128;
  int num_attention_heads = 24;
  int joint_attention_dim = 3584;               ///< Qwen2.5-VL-7B hidden size
  std::vector<int> axes_dims_rope{16, 56, 56};  ///< (frame, height, width), theta 10000
  int innerDim() const { return num_attention_heads * attention_head_dim; }
  /// FeedForward(dim, activation "gelu-approximate"): mult 4.
  int mlpHidden() const { return 4 * innerDim(); }
  /// proj_out's output features: patch_size^2 x out_channels.
  int projOut() const { return patch_size * patch_size * out_channels; }
};

/// Parses a QwenImageTransformer2DModel config object read from `file` (named in errors). Throws
/// ModelFileError: a key of the wrong type or out of range, sum(axes_dims_rope) !=
/// attention_head_dim or an odd / not three-axis rope, and the variants this implementation does
/// not run (guidance_embeds, zero_cond_t, use_additional_t_cond, use_layer3d_rope: the edit and
/// layered models), each named.
QwenImageTransformerConfig parseQwenImageTransformerConfig(const nlohmann::json& j,
                                                           const std::string& file);

}  // namespace dit
