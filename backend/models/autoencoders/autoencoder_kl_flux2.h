// diffusers AutoencoderKLFlux2 (models/autoencoders/autoencoder_kl_flux2.py) with the latent
// handling of Flux2Pipeline / Flux2KleinPipeline (pipelines/flux2/pipeline_flux2*.py): the
// AutoencoderKL encoder/decoder (quant and post-quant convs) plus a BatchNorm's running
// statistics over the 2x2-patchified latent channels (bn.running_mean / bn.running_var
// [4 * latent_channels], no affine weights) that normalise the latents the transformer sees.
// Shapes: C = latent_channels, h x w = the patchified latent grid (image / (2 * vae_scale_factor)).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "backend/models/autoencoders/autoencoder_kl.h"
#include "backend/models/autoencoders/autoencoder_kl_config.h"

namespace dit {

class WeightSource;
class ProcessGroup;

/// Flux2Pipeline._patchify_latents: [B, C, 2h, 2w] -> [B, 4C, h, w], channel c * 4 + dy * 2 + dx.
at::Tensor patchifyLatents(const at::Tensor& x);
/// Flux2Pipeline._unpatchify_latents: the inverse, [B, 4C, h, w] -> [B, C, 2h, 2w].
at::Tensor unpatchifyLatents(const at::Tensor& x);
/// Flux2Pipeline._pack_latents: [B, 4C, h, w] -> [B, h * w, 4C] (token = y * w + x).
at::Tensor packFlux2Latents(const at::Tensor& x);
/// The inverse of packFlux2Latents for a row-major h x w grid (what _unpack_latents_with_ids does
/// with the pipeline's own ids): [B, h * w, 4C] -> [B, 4C, h, w].
at::Tensor unpackFlux2Latents(const at::Tensor& packed, int64_t h, int64_t w);

class AutoencoderKLFlux2 {
 public:
  /// Loads the AutoencoderKL part and bn.running_mean / bn.running_var ([4 * latent_channels]);
  /// `batch_norm_eps` from vae/config.json. Throws ModelFileError (missing tensors, shapes).
  AutoencoderKLFlux2(const AutoencoderKLConfig& cfg, double batch_norm_eps, WeightSource& w);
  ~AutoencoderKLFlux2();

  /// The pipeline's decode path: packed latents [B, h * w, 4C] (as the denoising loop leaves
  /// them) -> unpack -> x * sqrt(running_var + eps) + running_mean -> unpatchify -> vae.decode ->
  /// sample [B, 3, 2h * vsf, 2w * vsf] (about [-1, 1]; the pipeline maps it to (x / 2 + 0.5)
  /// clamped to [0, 1]). With tiling on (setTiling) the decode is AutoencoderKLFlux2's
  /// tiled_decode; `group` (optional, collective then) shares its tiles out as
  /// AutoencoderKL::decode(z, group).
  at::Tensor decodePacked(const at::Tensor& packed, int64_t h, int64_t w,
                          ProcessGroup* group = nullptr) const;
  /// diffusers' enable_tiling() and tile sizes (AutoencoderKL::setTiling).
  void setTiling(const VaeTiling& tiling) { vae_->setTiling(tiling); }
  /// The conditioning-image path (_encode_vae_image): image [B, 3, H, W] in [-1, 1] -> posterior
  /// mean -> patchify -> (x - running_mean) / sqrt(running_var + eps): [B, 4C, H / 2vsf, W / 2vsf].
  at::Tensor encodeNormalized(const at::Tensor& image) const;
  /// x * sqrt(running_var + eps) + running_mean over dim 1 of [B, 4C, h, w].
  at::Tensor denormalize(const at::Tensor& patchified) const;

  const AutoencoderKL& autoencoder() const { return *vae_; }
  int vaeScaleFactor() const { return vae_->config().vaeScaleFactor(); }

 private:
  std::unique_ptr<AutoencoderKL> vae_;
  at::Tensor mean_, std_;  ///< [1, 4C, 1, 1] in the VAE's dtype
};

}  // namespace dit
