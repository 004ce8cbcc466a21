// AutoencoderKL (diffusers models/autoencoders/autoencoder_kl.py): the decoder (vae.py Decoder,
// resnet.py ResnetBlock2D, attention_processor AttnProcessor, Upsample2D nearest x2) and the
// encoder (vae.py Encoder with DownEncoderBlock2D / Downsample2D, the posterior
// DiagonalGaussianDistribution) used by image-to-image and inpainting.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <memory>

#include "backend/models/autoencoders/autoencoder_kl_config.h"

namespace dit {

class WeightSource;

/// diffusers DiagonalGaussianDistribution (vae.py): the encoder's posterior. mean and logvar are
/// [B, latent_channels, h, w] in the VAE's dtype; logvar is already clamped to [-30, 20];
/// std = exp(0.5 * logvar).
struct DiagonalGaussianDistribution {
  at::Tensor mean, logvar, std;
  /// mean + std * eps with eps = torch.randn(mean.shape, generator, float32 on the CPU) cast to
  /// the VAE's dtype and device (diffusers' sample(generator) with a CPU generator): one draw,
  /// advancing `generator`. If `eps_out` is given it receives eps (float32, CPU).
  at::Tensor sample(at::Generator& generator, at::Tensor* eps_out = nullptr) const;
};

class AutoencoderKL {
 public:
  /// Loads post_quant_conv (if configured) and decoder.* weights, and the encoder (encoder.*,
  /// quant_conv if configured) when the checkpoint has encoder.conv_in.weight (diffusers
  /// checkpoints do; hasEncoder() says). Throws ModelFileError.
  AutoencoderKL(const AutoencoderKLConfig& cfg, WeightSource& w);
  ~AutoencoderKL();
  /// z [B, latent_channels, h, w] (already scaled back: latents / scaling_factor + shift_factor)
  /// -> sample [B, out_channels, h * vae_scale_factor, w * vae_scale_factor], range about [-1, 1].
  at::Tensor decode(const at::Tensor& z) const;
  /// AutoencoderKL.encode(x).latent_dist: x [B, in_channels, H, W] in [-1, 1] (H, W multiples of
  /// vae_scale_factor) -> the posterior over [B, latent_channels, H / vsf, W / vsf]; the encoder
  /// outputs 2 * latent_channels channels (double_z), split into mean and logvar. Throws
  /// std::invalid_argument when the checkpoint has no encoder or the input shape does not fit.
  DiagonalGaussianDistribution encode(const at::Tensor& x) const;
  /// Whether encoder weights were loaded (encode() is available).
  bool hasEncoder() const;
  const AutoencoderKLConfig& config() const;

 private:
  void loadEncoder(WeightSource& w);
  struct Impl;
  std::unique_ptr<Impl> d_;
};

}  // namespace dit
