// AutoencoderKLQwenImage (diffusers models/autoencoders/autoencoder_kl_qwenimage.py): the Wan-style
// causal 3-D VAE of Qwen-Image, used on ONE frame as QwenImagePipeline uses it. On a single frame
// every QwenImageCausalConv3d (causal padding: 2 x pad_t zero frames in front) reduces to a 2-D
// convolution with the LAST temporal tap of its kernel, and the first-chunk feature cache makes
// upsample3d / downsample3d skip their time_conv (diffusers caches "Rep" / the frame and runs no
// temporal convolution on chunk 0), so the decoder and encoder here are their 2-D equivalents,
// computed exactly as diffusers computes frame 0:
//  - QwenImageRMS_norm: F.normalize over channels (eps 1e-12) x sqrt(C) x gamma (float32 for
//    reduced-precision inputs);
//  - QwenImageResidualBlock: shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))))));
//  - QwenImageAttentionBlock (mid blocks): one head over the h x w positions, 1x1 to_qkv / proj;
//  - QwenImageResample: nearest-exact x2 + 3x3 conv to dim / 2 (upsample2d/3d), or a (0, 1, 0, 1)
//    zero pad + 3x3 stride-2 conv (downsample2d/3d);
//  - decode clamps to [-1, 1]; encode returns the posterior (quant_conv, chunk into mean and
//    logvar clamped to [-30, 20]).
// time_conv weights are read (the checkpoint has them) but unused on one frame. Shapes keep
// diffusers' 5-D layout [B, C, T = 1, H, W]; more frames are refused.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "backend/models/autoencoders/autoencoder_kl.h"  // DiagonalGaussianDistribution
#include "backend/models/autoencoders/autoencoder_kl_qwenimage_config.h"

namespace dit {

class WeightSource;

class AutoencoderKLQwenImage {
 public:
  /// Loads decoder.*, post_quant_conv and, when the checkpoint has encoder.conv_in.weight,
  /// encoder.* and quant_conv (hasEncoder()). Device and dtype are the WeightSource's. Throws
  /// ModelFileError for missing / mismatching tensors.
  AutoencoderKLQwenImage(const AutoencoderKLQwenImageConfig& cfg, WeightSource& w);
  ~AutoencoderKLQwenImage();
  AutoencoderKLQwenImage(const AutoencoderKLQwenImage&) = delete;
  AutoencoderKLQwenImage& operator=(const AutoencoderKLQwenImage&) = delete;

  /// vae.decode(z).sample: z [B, z_dim, 1, h, w] (already de-normalised: latents * std + mean)
  /// -> [B, input_channels, 1, h * vsf, w * vsf] clamped to [-1, 1], in the VAE's dtype on its
  /// device. Throws std::invalid_argument for another rank, channel count or T != 1.
  at::Tensor decode(const at::Tensor& z) const;
  /// vae.encode(x).latent_dist: x [B, input_channels, 1, H, W] in [-1, 1], H and W multiples of
  /// vae_scale_factor -> the posterior over [B, z_dim, 1, H / vsf, W / vsf] (no latents_mean /
  /// latents_std applied). Throws std::invalid_argument for a bad shape or a checkpoint without
  /// encoder weights.
  DiagonalGaussianDistribution encode(const at::Tensor& x) const;
  bool hasEncoder() const;
  const AutoencoderKLQwenImageConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

}  // namespace dit
