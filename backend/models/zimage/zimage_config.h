// diffusers ZImageTransformer2DModel config (models/transformers/transformer_z_image.py __init__),
// read from transformer/config.json. Torch-free: strategy validation, the GUI and byte counts read
// it too. Defaults are diffusers' constructor defaults (Z-Image-Turbo's sizes), used only when a
// key is absent.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace dit {

struct ZImageTransformerConfig {
  int patch_size = 2;    ///< all_patch_size (one entry)
  int f_patch_size = 1;  ///< all_f_patch_size (one entry; 1 = one frame)
  int in_channels = 16;  ///< latent channels (out_channels is the same)
  int dim = 3840;
  int n_layers = 30;         ///< main (single-stream, modulated) layers
  int n_refiner_layers = 2;  ///< noise_refiner and context_refiner each
  int n_heads = 30;
  int n_kv_heads = 30;      ///< read, unused by the model (as in diffusers)
  double norm_eps = 1e-5;   ///< the block RMSNorms and cap_embedder's RMSNorm
  bool qk_norm = true;      ///< RMSNorm on q and k (eps 1e-5)
  int cap_feat_dim = 2560;  ///< caption features (the Qwen3 text encoder's hidden size)
  double rope_theta = 256.0;
  double t_scale = 1000.0;
  std::vector<int> axes_dims{32, 48, 48};      ///< RoPE sizes per axis (F, H, W)
  std::vector<int> axes_lens{1024, 512, 512};  ///< RoPE table rows per axis (positions < lens)

  int headDim() const { return dim / n_heads; }
  /// FeedForward hidden_dim = int(dim / 3 * 8).
  int ffnHidden() const { return static_cast<int>(dim / 3.0 * 8.0); }
  /// min(dim, ADALN_EMBED_DIM 256): the width of adaln_input (t_embedder's output).
  int adalnDim() const { return dim < 256 ? dim : 256; }
  /// Features of one patch token: patch_size^2 x f_patch_size x in_channels.
  int patchFeatures() const { return patch_size * patch_size * f_patch_size * in_channels; }
  /// The x_embedder / final_layer key of the patch sizes: "2-1".
  std::string patchKey() const {
    return std::to_string(patch_size) + "-" + std::to_string(f_patch_size);
  }
};

/// diffusers' SEQ_MULTI_OF: the caption and the image sequences are padded to a multiple of this
/// many tokens with the learned cap_pad_token / x_pad_token.
constexpr int kZImageSeqMultiOf = 32;

/// Parses a ZImageTransformer2DModel config object read from `file` (named in errors). Throws
/// ModelFileError: a key of the wrong type or out of range; all_patch_size / all_f_patch_size other
/// than one entry each (or f_patch_size other than 1: images only); qk_norm false; a
/// siglip_feat_dim (Z-Image-Omni's image conditioning: not supported); dim not divisible by
/// n_heads; sum(axes_dims) != head dim; odd axes_dims; axes_lens of another length.
ZImageTransformerConfig parseZImageTransformerConfig(const nlohmann::json& j,
                                                     const std::string& file);

}  // namespace dit
