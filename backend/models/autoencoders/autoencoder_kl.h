// AutoencoderKL (diffusers models/autoencoders/autoencoder_kl.py): the decoder (vae.py Decoder,
// resnet.py ResnetBlock2D, attention_processor AttnProcessor, Upsample2D nearest x2) and the
// encoder (vae.py Encoder with DownEncoderBlock2D / Downsample2D, the posterior
// DiagonalGaussianDistribution) used by image-to-image and inpainting.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "backend/models/autoencoders/autoencoder_kl_config.h"

namespace dit {

class WeightSource;
class ProcessGroup;

/// The tile layout of diffusers' AutoencoderKL.tiled_decode for a latent of height x width: tiles
/// of tile_latent x tile_latent latent cells starting every `stride` cells (the last ones are cut
/// by the latent's edge), each decoded to up to tile_sample pixels a side, blended over
/// blend_extent pixels with the tile above and the tile to the left, then cropped to row_limit.
struct VaeTileGrid {
  int64_t tile_latent = 0;   ///< tile_latent_min_size
  int64_t tile_sample = 0;   ///< tile_sample_min_size
  int64_t stride = 0;        ///< overlap_size = int(tile_latent * (1 - overlap))
  int64_t blend_extent = 0;  ///< int(tile_sample * overlap)
  int64_t row_limit = 0;     ///< tile_sample - blend_extent
  int64_t vae_scale_factor = 1;
  std::vector<int64_t> row_starts, col_starts;  ///< latent offsets: range(0, h, stride)
  int64_t rows() const { return static_cast<int64_t>(row_starts.size()); }
  int64_t cols() const { return static_cast<int64_t>(col_starts.size()); }
  /// rows() * cols(); tile k is row k / cols(), column k % cols().
  int64_t count() const { return rows() * cols(); }
};

/// The tile grid for a latent of `height` x `width` cells with the sizes of `tiling` (0 entries
/// resolved from `cfg`, as diffusers' __init__ does). Throws std::invalid_argument when the sizes
/// leave a stride or tile below 1 (diffusers would loop forever) or the overlap is outside [0, 1).
VaeTileGrid makeVaeTileGrid(const AutoencoderKLConfig& cfg, const VaeTiling& tiling, int64_t height,
                            int64_t width);

/// diffusers tiled_decode's second half: blends `tiles` (tile k = decoded tile k of `grid`,
/// [B, C, <= tile_sample, <= tile_sample], all one dtype and device) with blend_v / blend_h in
/// diffusers' order (each tile blended in place with the already blended tile above, then the
/// already blended tile to its left), crops each to row_limit and concatenates:
/// [B, C, sum of row crops, sum of column crops] (= latent size * vae_scale_factor). The tiles
/// are modified in place. Throws std::invalid_argument when tiles.size() != grid.count().
at::Tensor blendVaeTiles(const VaeTileGrid& grid, std::vector<at::Tensor>& tiles);

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
  /// With tiling() enabled and h or w above its latent tile size, this is tiledDecode(z), as
  /// diffusers' _decode after enable_tiling(); otherwise the one-piece decode.
  at::Tensor decode(const at::Tensor& z) const;
  /// diffusers AutoencoderKL.tiled_decode (also AutoencoderKLFlux2's): z [B, latent_channels, h,
  /// w] -> [B, out_channels, h * vsf, w * vsf] in the VAE's dtype, whatever the size (diffusers
  /// calls it only above the tile size). Each tile goes through post_quant_conv (when the config
  /// has it) and the decoder on its own; see VaeTileGrid and blendVaeTiles. The sizes are
  /// tiling()'s (enabled or not). Throws std::invalid_argument as makeVaeTileGrid.
  at::Tensor tiledDecode(const at::Tensor& z) const;
  /// tiledDecode with the tiles shared out over `group`: rank r decodes tiles
  /// [r * n / size, (r + 1) * n / size) of the n = grid.count() tiles and sends them to rank 0,
  /// which blends each as it comes (its own as it decodes them, then rank 1's, ...: it holds two
  /// rows of tiles, not all n) and broadcasts the image; every rank returns it. Equal
  /// bit for bit to tiledDecode on one rank when every rank computes alike (same device kind
  /// and thread count). Collective over `group` (all ranks pass the same z shape and dtype).
  at::Tensor tiledDecode(const at::Tensor& z, ProcessGroup& group) const;
  /// decode() with the tile decision of diffusers' _decode, the tiles spread over `group` when
  /// it has more than one rank (tiledDecode(z, group)); otherwise decode(z).
  at::Tensor decode(const at::Tensor& z, ProcessGroup* group) const;
  /// One tile of tiledDecode: post_quant_conv (if any) and the decoder on
  /// z[:, :, i : i + tile_latent, j : j + tile_latent] for tile `index` of `grid`.
  at::Tensor decodeTile(const at::Tensor& z, const VaeTileGrid& grid, int64_t index) const;
  /// diffusers' enable_tiling() / disable_tiling() and the tile_* attributes. Not thread-safe
  /// against a concurrent decode. Throws std::invalid_argument (as makeVaeTileGrid) when
  /// `tiling` is enabled with sizes that cannot tile, so a bad size fails at load, not after
  /// denoising.
  void setTiling(const VaeTiling& tiling);
  const VaeTiling& tiling() const;
  /// makeVaeTileGrid(config(), tiling(), height, width).
  VaeTileGrid tileGrid(int64_t height, int64_t width) const;
  /// AutoencoderKL.encode(x).latent_dist: x [B, in_channels, H, W] in [-1, 1] (H, W multiples of
  /// vae_scale_factor) -> the posterior over [B, latent_channels, H / vsf, W / vsf]; the encoder
  /// outputs 2 * latent_channels channels (double_z), split into mean and logvar. Throws
  /// std::invalid_argument when the checkpoint has no encoder or the input shape does not fit.
  /// With tiling() enabled and H or W above its tile_sample_min_size this is tiledEncode(x), as
  /// diffusers' _encode after enable_tiling().
  DiagonalGaussianDistribution encode(const at::Tensor& x) const;
  /// diffusers AutoencoderKL._tiled_encode: x [B, in_channels, H, W] cut into tiles of
  /// tile_sample_min_size pixels every int(tile_sample_min_size * (1 - overlap)), each through
  /// the encoder (and quant_conv) on its own, the moments blended over
  /// int(tile_latent_min_size * overlap) cells (blendVaeTiles) and cropped to
  /// tile_latent_min_size minus that, then the posterior as encode(). Throws
  /// std::invalid_argument without encoder weights, for a wrong input rank / channel count or
  /// sizes that cannot tile.
  DiagonalGaussianDistribution tiledEncode(const at::Tensor& x) const;
  /// Whether encoder weights were loaded (encode() is available).
  bool hasEncoder() const;
  const AutoencoderKLConfig& config() const;

 private:
  void loadEncoder(WeightSource& w);
  at::Tensor decodeUntiled(const at::Tensor& z) const;
  at::Tensor encodeMoments(const at::Tensor& x) const;  ///< encoder (+ quant_conv): 2C channels
  DiagonalGaussianDistribution posterior(const at::Tensor& moments) const;
  struct Impl;
  std::unique_ptr<Impl> d_;
};

}  // namespace dit
