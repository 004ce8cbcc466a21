// diffusers Flux2Transformer2DModel config (models/transformers/transformer_flux2.py __init__),
// read from transformer/config.json. Torch-free: strategy validation, the GUI and byte counts read
// it too. Defaults are diffusers' constructor defaults, used only when a key is absent.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace dit {

struct Flux2TransformerConfig {
  int patch_size = 1;
  int in_channels = 128;
  int out_channels = 128;  ///< null in the file -> in_channels
  int num_layers = 8;      ///< double-stream blocks (Flux2TransformerBlock)
  int num_single_layers = 48;
  int attention_head_dim = 128;
  int num_attention_heads = 48;
  int joint_attention_dim = 15360;  ///< text features: 3 stacked Qwen3/Mistral hidden states
  int timestep_guidance_channels = 256;
  double mlp_ratio = 3.0;
  std::vector<int> axes_dims_rope{32, 32, 32, 32};  ///< (T, H, W, L)
  double rope_theta = 2000;
  double eps = 1e-6;            ///< LayerNorm and RMSNorm epsilon
  bool guidance_embeds = true;  ///< klein (step/guidance-distilled or base) has none
  int innerDim() const { return num_attention_heads * attention_head_dim; }
  /// int(inner_dim * mlp_ratio), as Flux2FeedForward / Flux2ParallelSelfAttention compute it.
  int mlpHidden() const { return static_cast<int>(innerDim() * mlp_ratio); }
};

/// Parses a Flux2Transformer2DModel config object read from `file` (named in errors). Throws
/// ModelFileError: a key of the wrong type or out of range, no blocks, sum(axes_dims_rope) !=
/// attention_head_dim, odd rotary sizes, patch_size other than 1.
Flux2TransformerConfig parseFlux2TransformerConfig(const nlohmann::json& j,
                                                   const std::string& file);

}  // namespace dit
