#include "backend/models/autoencoders/autoencoder_kl_flux2.h"

#include <ATen/ATen.h>

#include "backend/io/weight_source.h"

namespace dit {

at::Tensor patchifyLatents(const at::Tensor& x) {
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  return x.reshape({B, C, H / 2, 2, W / 2, 2})
      .permute({0, 1, 3, 5, 2, 4})
      .reshape({B, C * 4, H / 2, W / 2});
}

at::Tensor unpatchifyLatents(const at::Tensor& x) {
  const int64_t B = x.size(0), C4 = x.size(1), h = x.size(2), w = x.size(3);
  return x.reshape({B, C4 / 4, 2, 2, h, w})
      .permute({0, 1, 4, 2, 5, 3})
      .reshape({B, C4 / 4, h * 2, w * 2});
}

at::Tensor packFlux2Latents(const at::Tensor& x) {
  return x.reshape({x.size(0), x.size(1), x.size(2) * x.size(3)}).permute({0, 2, 1});
}

at::Tensor unpackFlux2Latents(const at::Tensor& packed, int64_t h, int64_t w) {
  return packed.permute({0, 2, 1}).reshape({packed.size(0), packed.size(2), h, w});
}

AutoencoderKLFlux2::AutoencoderKLFlux2(const AutoencoderKLConfig& cfg, double eps, WeightSource& w)
    : vae_(std::make_unique<AutoencoderKL>(cfg, w)) {
  const int64_t n = 4 * static_cast<int64_t>(cfg.latent_channels);
  const at::Tensor mean = w.get("bn.running_mean", {n});
  const at::Tensor var = w.get("bn.running_var", {n});
  // float64 -> the VAE dtype, as torch computes sqrt(var + eps) on the float32 buffers.
  mean_ = mean.reshape({1, n, 1, 1});
  std_ = at::sqrt(var.reshape({1, n, 1, 1}) + eps);
}

AutoencoderKLFlux2::~AutoencoderKLFlux2() = default;

at::Tensor AutoencoderKLFlux2::denormalize(const at::Tensor& x) const {
  return x * std_.to(x.scalar_type()) + mean_.to(x.scalar_type());
}

at::Tensor AutoencoderKLFlux2::decodePacked(const at::Tensor& packed, int64_t h, int64_t w,
                                            ProcessGroup* group) const {
  const at::Tensor z = unpatchifyLatents(denormalize(unpackFlux2Latents(packed, h, w)));
  return vae_->decode(z, group);
}

at::Tensor AutoencoderKLFlux2::encodeNormalized(const at::Tensor& image) const {
  const at::Tensor m = patchifyLatents(vae_->encode(image).mean);
  return (m - mean_.to(m.scalar_type())) / std_.to(m.scalar_type());
}

}  // namespace dit
