// AutoencoderKL decoder (diffusers models/autoencoders/autoencoder_kl.py + vae.py Decoder,
// resnet.py ResnetBlock2D, attention_processor AttnProcessor, Upsample2D nearest x2).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "backend/models/autoencoders/autoencoder_kl_config.h"

namespace dit {

class WeightSource;

class AutoencoderKL {
 public:
  /// Loads post_quant_conv (if configured) and decoder.* weights. Throws ModelFileError.
  AutoencoderKL(const AutoencoderKLConfig& cfg, WeightSource& w);
  ~AutoencoderKL();
  /// z [B, latent_channels, h, w] (already scaled back: latents / scaling_factor + shift_factor)
  /// -> sample [B, out_channels, h * vae_scale_factor, w * vae_scale_factor], range about [-1, 1].
  at::Tensor decode(const at::Tensor& z) const;
  const AutoencoderKLConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

}  // namespace dit
