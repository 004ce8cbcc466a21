#include "backend/models/autoencoders/autoencoder_kl.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend/io/weight_source.h"
#include "backend/nn/conv2d.h"
#include "parallel/attention.h"
#include "parallel/process_group.h"

namespace dit {
namespace {

struct Conv {
  at::Tensor w, b;
  int64_t pad = 1;
  at::Tensor operator()(const at::Tensor& x) const {
    const int64_t stride[2] = {1, 1}, padding[2] = {pad, pad};
    return nn::conv2d(x, w, b, at::IntArrayRef(stride), at::IntArrayRef(padding));
  }
};
struct GroupNorm {
  at::Tensor w, b;
  int groups = 32;
  at::Tensor operator()(const at::Tensor& x) const { return at::group_norm(x, groups, w, b, 1e-6); }
};
struct Resnet {
  GroupNorm n1, n2;
  Conv c1, c2, shortcut;
  bool hasShortcut = false;
};
struct Attn {
  GroupNorm gn;
  Linear q, k, v, o;
};
struct DownBlock {
  std::vector<Resnet> resnets;
  bool downsample = false;
  Conv down;  // Downsample2D conv: stride 2, padding 0 after an asymmetric (0, 1, 0, 1) pad
};
struct UpBlock {
  std::vector<Resnet> resnets;
  bool upsample = false;
  Conv up;
};

Conv loadConv(WeightSource& w, const std::string& p, int64_t in, int64_t out, int k) {
  return Conv{w.get(p + ".weight", {out, in, k, k}), w.get(p + ".bias", {out}), k / 2};
}
GroupNorm loadGN(WeightSource& w, const std::string& p, int64_t c, int groups) {
  return GroupNorm{w.get(p + ".weight", {c}), w.get(p + ".bias", {c}), groups};
}
Resnet loadResnet(WeightSource& w, const std::string& p, int64_t in, int64_t out, int groups) {
  Resnet r;
  r.n1 = loadGN(w, p + ".norm1", in, groups);
  r.c1 = loadConv(w, p + ".conv1", in, out, 3);
  r.n2 = loadGN(w, p + ".norm2", out, groups);
  r.c2 = loadConv(w, p + ".conv2", out, out, 3);
  if (in != out) {
    r.shortcut = loadConv(w, p + ".conv_shortcut", in, out, 1);
    r.hasShortcut = true;
  }
  return r;
}

at::Tensor act(const std::string& a, const at::Tensor& x) {
  if (a == "silu" || a == "swish") return at::silu(x);
  if (a == "relu") return at::relu(x);
  if (a == "gelu") return at::gelu(x);
  throw std::invalid_argument("unsupported VAE act_fn '" + a + "'");
}

}  // namespace

struct AutoencoderKL::Impl {
  AutoencoderKLConfig cfg;
  VaeTiling tiling;
  Conv postQuant, convIn, convOut;
  bool hasPostQuant = false, hasAttn = false;
  Resnet mid0, mid1;
  Attn attn;
  std::vector<UpBlock> ups;
  GroupNorm normOut;
  // Encoder.
  bool hasEncoder = false, hasQuant = false;
  Conv encIn, encOut, quant;
  std::vector<DownBlock> downs;
  Resnet encMid0, encMid1;
  Attn encAttn;
  GroupNorm encNormOut;

  at::Tensor resnet(const Resnet& r, const at::Tensor& x) const {
    at::Tensor h = r.c1(act(cfg.act_fn, r.n1(x)));
    h = r.c2(act(cfg.act_fn, r.n2(h)));
    return (r.hasShortcut ? r.shortcut(x) : x) + h;  // output_scale_factor 1
  }
  at::Tensor attention(const at::Tensor& x) const { return attention(attn, x); }
  at::Tensor attention(const Attn& attn, const at::Tensor& x) const {
    const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    at::Tensor h = attn.gn(x).view({B, C, H * W}).transpose(1, 2);  // [B, HW, C], one head
    // One head of size C over the H*W positions; localAttention works through the queries in
    // chunks, so the score matrix never has to exist whole (it is (H*W)^2 at the mid block).
    at::Tensor q = attn.q(h).unsqueeze(1), k = attn.k(h).unsqueeze(1), v = attn.v(h).unsqueeze(1);
    at::Tensor o = attn.o(localAttention(q, k, v).squeeze(1));
    return o.transpose(1, 2).reshape({B, C, H, W}) + x;  // residual_connection, rescale 1
  }
};

AutoencoderKL::AutoencoderKL(const AutoencoderKLConfig& cfg, WeightSource& w) : d_(new Impl) {
  d_->cfg = cfg;
  const auto& boc = cfg.block_out_channels;
  const int g = cfg.norm_num_groups, lc = cfg.latent_channels;
  if (cfg.use_post_quant_conv) {
    d_->postQuant = loadConv(w, "post_quant_conv", lc, lc, 1);
    d_->hasPostQuant = true;
  }
  const int64_t top = boc.back();
  d_->convIn = loadConv(w, "decoder.conv_in", lc, top, 3);
  d_->mid0 = loadResnet(w, "decoder.mid_block.resnets.0", top, top, g);
  if (cfg.mid_block_add_attention) {
    const std::string a = "decoder.mid_block.attentions.0";
    d_->attn.gn = loadGN(w, a + ".group_norm", top, g);
    d_->attn.q = loadLinear(w, a + ".to_q", top, top);
    d_->attn.k = loadLinear(w, a + ".to_k", top, top);
    d_->attn.v = loadLinear(w, a + ".to_v", top, top);
    d_->attn.o = loadLinear(w, a + ".to_out.0", top, top);
    d_->hasAttn = true;
  }
  d_->mid1 = loadResnet(w, "decoder.mid_block.resnets.1", top, top, g);
  int64_t out = top;
  const int n = static_cast<int>(boc.size());
  for (int i = 0; i < n; ++i) {
    const int64_t prev = out;
    out = boc[n - 1 - i];
    UpBlock ub;
    for (int j = 0; j <= cfg.layers_per_block; ++j)
      ub.resnets.push_back(
          loadResnet(w, "decoder.up_blocks." + std::to_string(i) + ".resnets." + std::to_string(j),
                     j == 0 ? prev : out, out, g));
    if (i != n - 1) {
      ub.upsample = true;
      ub.up =
          loadConv(w, "decoder.up_blocks." + std::to_string(i) + ".upsamplers.0.conv", out, out, 3);
    }
    d_->ups.push_back(std::move(ub));
  }
  d_->normOut = loadGN(w, "decoder.conv_norm_out", boc.front(), g);
  d_->convOut = loadConv(w, "decoder.conv_out", boc.front(), cfg.out_channels, 3);
  if (w.contains("encoder.conv_in.weight")) loadEncoder(w);
}

void AutoencoderKL::loadEncoder(WeightSource& w) {
  auto& D = *d_;
  const auto& cfg = D.cfg;
  const auto& boc = cfg.block_out_channels;
  const int g = cfg.norm_num_groups, lc = cfg.latent_channels;
  D.encIn = loadConv(w, "encoder.conv_in", cfg.in_channels, boc.front(), 3);
  int64_t out = boc.front();
  const int n = static_cast<int>(boc.size());
  for (int i = 0; i < n; ++i) {
    const int64_t in = out;
    out = boc[i];
    const std::string p = "encoder.down_blocks." + std::to_string(i);
    DownBlock db;
    for (int j = 0; j < cfg.layers_per_block; ++j)
      db.resnets.push_back(
          loadResnet(w, p + ".resnets." + std::to_string(j), j == 0 ? in : out, out, g));
    if (i != n - 1) {
      db.downsample = true;
      db.down = loadConv(w, p + ".downsamplers.0.conv", out, out, 3);
      db.down.pad = 0;
    }
    D.downs.push_back(std::move(db));
  }
  const int64_t top = boc.back();
  D.encMid0 = loadResnet(w, "encoder.mid_block.resnets.0", top, top, g);
  if (cfg.mid_block_add_attention) {
    const std::string a = "encoder.mid_block.attentions.0";
    D.encAttn.gn = loadGN(w, a + ".group_norm", top, g);
    D.encAttn.q = loadLinear(w, a + ".to_q", top, top);
    D.encAttn.k = loadLinear(w, a + ".to_k", top, top);
    D.encAttn.v = loadLinear(w, a + ".to_v", top, top);
    D.encAttn.o = loadLinear(w, a + ".to_out.0", top, top);
  }
  D.encMid1 = loadResnet(w, "encoder.mid_block.resnets.1", top, top, g);
  D.encNormOut = loadGN(w, "encoder.conv_norm_out", top, g);
  D.encOut = loadConv(w, "encoder.conv_out", top, 2 * lc, 3);
  if (cfg.use_quant_conv) {
    D.quant = loadConv(w, "quant_conv", 2 * lc, 2 * lc, 1);
    D.hasQuant = true;
  }
  D.hasEncoder = true;
}

bool AutoencoderKL::hasEncoder() const { return d_->hasEncoder; }

DiagonalGaussianDistribution AutoencoderKL::encode(const at::Tensor& x0) const {
  const auto& D = *d_;
  if (!D.hasEncoder)
    throw std::invalid_argument(
        "this VAE checkpoint has no encoder weights (encoder.*), which image-to-image and "
        "inpainting need");
  const int vsf = D.cfg.vaeScaleFactor();
  if (x0.dim() != 4 || x0.size(1) != D.cfg.in_channels || x0.size(2) % vsf != 0 ||
      x0.size(3) % vsf != 0)
    throw std::invalid_argument("AutoencoderKL.encode: expected [B, " +
                                std::to_string(D.cfg.in_channels) +
                                ", H, W] with H and W multiples of " + std::to_string(vsf));
  if (D.tiling.enabled) {
    const VaeTileGrid g = tileGrid(1, 1);
    if (x0.size(2) > g.tile_sample || x0.size(3) > g.tile_sample) return tiledEncode(x0);
  }
  return posterior(encodeMoments(x0));
}

DiagonalGaussianDistribution AutoencoderKL::tiledEncode(const at::Tensor& x0) const {
  const auto& D = *d_;
  if (!D.hasEncoder)
    throw std::invalid_argument("this VAE checkpoint has no encoder weights (encoder.*)");
  if (x0.dim() != 4 || x0.size(1) != D.cfg.in_channels)
    throw std::invalid_argument("AutoencoderKL.tiledEncode: expected [B, " +
                                std::to_string(D.cfg.in_channels) + ", H, W]");
  // diffusers _tiled_encode: tiles of tile_sample pixels every int(tile_sample * (1 - overlap)),
  // blended over int(tile_latent * overlap) latent cells, cropped to tile_latent - that.
  VaeTileGrid g = tileGrid(1, 1);
  const double ov = D.tiling.tile_overlap_factor;
  const int64_t stride = static_cast<int64_t>(static_cast<double>(g.tile_sample) * (1.0 - ov));
  g.blend_extent = static_cast<int64_t>(static_cast<double>(g.tile_latent) * ov);
  g.row_limit = g.tile_latent - g.blend_extent;
  if (stride < 1 || g.row_limit < 1)
    throw std::invalid_argument(
        "VAE tiling: the tile sizes leave an encode stride or crop below 1");
  g.row_starts.clear();
  g.col_starts.clear();
  for (int64_t i = 0; i < x0.size(2); i += stride) g.row_starts.push_back(i);
  for (int64_t j = 0; j < x0.size(3); j += stride) g.col_starts.push_back(j);
  std::vector<at::Tensor> tiles;
  for (int64_t i : g.row_starts)
    for (int64_t j : g.col_starts)
      tiles.push_back(encodeMoments(x0.narrow(2, i, std::min(g.tile_sample, x0.size(2) - i))
                                        .narrow(3, j, std::min(g.tile_sample, x0.size(3) - j))));
  return posterior(blendVaeTiles(g, tiles));
}

at::Tensor AutoencoderKL::encodeMoments(const at::Tensor& x0) const {
  const auto& D = *d_;
  at::Tensor x = D.encIn(x0.to(D.encIn.w.device(), D.encIn.w.scalar_type()));
  for (const auto& db : D.downs) {
    for (const auto& r : db.resnets) x = D.resnet(r, x);
    if (db.downsample) {
      // Downsample2D(use_conv, padding=0): F.pad(x, (0, 1, 0, 1)), then a stride-2 conv.
      const int64_t pad[4] = {0, 1, 0, 1};
      x = at::constant_pad_nd(x, at::IntArrayRef(pad), 0);
      const int64_t stride[2] = {2, 2}, padding[2] = {0, 0};
      x = nn::conv2d(x, db.down.w, db.down.b, at::IntArrayRef(stride), at::IntArrayRef(padding));
    }
  }
  x = D.resnet(D.encMid0, x);
  if (D.cfg.mid_block_add_attention) x = D.attention(D.encAttn, x);
  x = D.resnet(D.encMid1, x);
  x = D.encOut(act(D.cfg.act_fn, D.encNormOut(x)));
  if (D.hasQuant) x = D.quant(x);
  return x;
}

DiagonalGaussianDistribution AutoencoderKL::posterior(const at::Tensor& x) const {
  DiagonalGaussianDistribution p;
  const int64_t lc = d_->cfg.latent_channels;
  p.mean = x.narrow(1, 0, lc);
  p.logvar = x.narrow(1, lc, lc).clamp(-30.0, 20.0);
  p.std = at::exp(0.5 * p.logvar);
  return p;
}

at::Tensor DiagonalGaussianDistribution::sample(at::Generator& generator,
                                                at::Tensor* eps_out) const {
  at::Tensor eps = at::randn(mean.sizes(), generator, at::TensorOptions().dtype(at::kFloat));
  if (eps_out) *eps_out = eps;
  return mean + std * eps.to(mean.device(), mean.scalar_type());
}

AutoencoderKL::~AutoencoderKL() = default;
const AutoencoderKLConfig& AutoencoderKL::config() const { return d_->cfg; }

at::Tensor AutoencoderKL::decodeUntiled(const at::Tensor& z0) const {
  const auto& D = *d_;
  at::Tensor z = z0.to(D.convIn.w.scalar_type());
  if (D.hasPostQuant) z = D.postQuant(z);
  at::Tensor x = D.convIn(z);
  x = D.resnet(D.mid0, x);
  if (D.hasAttn) x = D.attention(x);
  x = D.resnet(D.mid1, x);
  for (const auto& ub : D.ups) {
    for (const auto& r : ub.resnets) x = D.resnet(r, x);
    if (ub.upsample) {
      // Upsample2D: nearest x2 (computed in float32 for bf16 as diffusers does), then conv.
      const auto dt = x.scalar_type();
      at::Tensor xf = dt == at::kBFloat16 ? x.to(at::kFloat) : x;
      const int64_t size[2] = {xf.size(2) * 2, xf.size(3) * 2};
      xf = at::upsample_nearest2d(xf, at::IntArrayRef(size), c10::nullopt, c10::nullopt);
      x = ub.up(xf.to(dt));
    }
  }
  x = act(D.cfg.act_fn, D.normOut(x));
  return D.convOut(x);
}

VaeTileGrid makeVaeTileGrid(const AutoencoderKLConfig& cfg, const VaeTiling& t, int64_t height,
                            int64_t width) {
  if (!(t.tile_overlap_factor >= 0.0 && t.tile_overlap_factor < 1.0))
    throw std::invalid_argument("VAE tiling: tile_overlap_factor must be in [0, 1), got " +
                                std::to_string(t.tile_overlap_factor));
  if (t.tile_sample_min_size < 0 || t.tile_latent_min_size < 0)
    throw std::invalid_argument("VAE tiling: tile sizes must be >= 0 (0 = the config's)");
  if (height < 1 || width < 1)
    throw std::invalid_argument("VAE tiling: empty latent " + std::to_string(height) + " x " +
                                std::to_string(width));
  VaeTileGrid g;
  g.vae_scale_factor = cfg.vaeScaleFactor();
  g.tile_sample = t.tile_sample_min_size > 0 ? t.tile_sample_min_size : cfg.sample_size;
  // diffusers: int(sample_size / 2 ** (len(block_out_channels) - 1)).
  g.tile_latent = t.tile_latent_min_size > 0
                      ? t.tile_latent_min_size
                      : static_cast<int64_t>(static_cast<double>(g.tile_sample) /
                                             static_cast<double>(g.vae_scale_factor));
  g.stride =
      static_cast<int64_t>(static_cast<double>(g.tile_latent) * (1.0 - t.tile_overlap_factor));
  g.blend_extent = static_cast<int64_t>(static_cast<double>(g.tile_sample) * t.tile_overlap_factor);
  g.row_limit = g.tile_sample - g.blend_extent;
  if (g.tile_latent < 1 || g.stride < 1 || g.row_limit < 1)
    throw std::invalid_argument("VAE tiling: tile_sample_min_size " +
                                std::to_string(g.tile_sample) + ", tile_latent_min_size " +
                                std::to_string(g.tile_latent) + " and overlap " +
                                std::to_string(t.tile_overlap_factor) +
                                " leave a latent stride or a crop below 1 (use larger tiles)");
  for (int64_t i = 0; i < height; i += g.stride) g.row_starts.push_back(i);
  for (int64_t j = 0; j < width; j += g.stride) g.col_starts.push_back(j);
  return g;
}

namespace {

// diffusers blend_v / blend_h: b's first e rows (columns) of dim `dim` become
// a[-e + y] * (1 - y / e) + b[y] * (y / e), row by row with Python-float weights, in place.
void blendInPlace(const at::Tensor& a, at::Tensor& b, int64_t blendExtent, int64_t dim) {
  const int64_t e = std::min({a.size(dim), b.size(dim), blendExtent});
  for (int64_t y = 0; y < e; ++y) {
    const double wb = static_cast<double>(y) / static_cast<double>(e);
    at::Tensor row = b.select(dim, y);
    row.copy_(a.select(dim, a.size(dim) - e + y) * (1.0 - wb) + row * wb);
  }
}

}  // namespace

namespace {

// diffusers tiled_decode's blend loop, one tile at a time in row-major order: tile k is blended
// in place with the already blended tile above (kept from the previous row) and the one to its
// left (blend_v, then blend_h), cropped to row_limit, and a finished row is concatenated into a
// strip. Holds two rows of tiles and the strips, never the whole grid: a rank that blends what
// others decoded can take each tile as it comes. The arithmetic is diffusers' order exactly.
class TileBlender {
 public:
  explicit TileBlender(const VaeTileGrid& g)
      : g_(g), above_(static_cast<size_t>(g.cols())), row_(static_cast<size_t>(g.cols())) {}

  /// Adds tile k (k = 0, 1, ... in order; [B, C, <= tile_sample, <= tile_sample]); modifies it
  /// in place.
  void add(int64_t k, at::Tensor tile) {
    if (k != next_)
      throw std::logic_error("TileBlender: tile " + std::to_string(k) + " given, " +
                             std::to_string(next_) + " expected");
    const int64_t i = k / g_.cols(), j = k % g_.cols();
    if (i > 0) blendInPlace(above_[static_cast<size_t>(j)], tile, g_.blend_extent, 2);
    if (j > 0) blendInPlace(row_[static_cast<size_t>(j - 1)], tile, g_.blend_extent, 3);
    pieces_.push_back(tile.narrow(2, 0, std::min(g_.row_limit, tile.size(2)))
                          .narrow(3, 0, std::min(g_.row_limit, tile.size(3))));
    row_[static_cast<size_t>(j)] = std::move(tile);
    if (j == g_.cols() - 1) {  // the row is done: its strip, and it becomes the row above
      strips_.push_back(at::cat(pieces_, 3));
      pieces_.clear();
      std::swap(above_, row_);
      for (at::Tensor& t : row_) t = at::Tensor();
    }
    ++next_;
  }
  /// The blended image [B, C, sum of row crops, sum of column crops] once every tile was added.
  at::Tensor result() {
    if (next_ != g_.count())
      throw std::logic_error("TileBlender: " + std::to_string(next_) + " of " +
                             std::to_string(g_.count()) + " tiles added");
    above_.clear();
    at::Tensor image = at::cat(strips_, 2);
    strips_.clear();
    return image;
  }

 private:
  const VaeTileGrid& g_;
  std::vector<at::Tensor> above_, row_, pieces_, strips_;
  int64_t next_ = 0;
};

}  // namespace

at::Tensor blendVaeTiles(const VaeTileGrid& g, std::vector<at::Tensor>& tiles) {
  if (static_cast<int64_t>(tiles.size()) != g.count())
    throw std::invalid_argument("blendVaeTiles: " + std::to_string(tiles.size()) +
                                " tiles for a grid of " + std::to_string(g.count()));
  TileBlender blend(g);
  // The blender keeps handles to the tiles it blends; the caller's tensors share their storage,
  // so they are blended in place as documented.
  for (int64_t k = 0; k < g.count(); ++k) blend.add(k, tiles[static_cast<size_t>(k)]);
  return blend.result();
}

void AutoencoderKL::setTiling(const VaeTiling& tiling) {
  if (tiling.enabled) (void)makeVaeTileGrid(d_->cfg, tiling, 1, 1);  // sizes checked up front
  d_->tiling = tiling;
}
const VaeTiling& AutoencoderKL::tiling() const { return d_->tiling; }
VaeTileGrid AutoencoderKL::tileGrid(int64_t height, int64_t width) const {
  return makeVaeTileGrid(d_->cfg, d_->tiling, height, width);
}

at::Tensor AutoencoderKL::decodeTile(const at::Tensor& z, const VaeTileGrid& g,
                                     int64_t index) const {
  if (index < 0 || index >= g.count())
    throw std::invalid_argument("decodeTile: tile " + std::to_string(index) + " of " +
                                std::to_string(g.count()));
  const int64_t i = g.row_starts[static_cast<size_t>(index / g.cols())];
  const int64_t j = g.col_starts[static_cast<size_t>(index % g.cols())];
  const at::Tensor tile = z.narrow(2, i, std::min(g.tile_latent, z.size(2) - i))
                              .narrow(3, j, std::min(g.tile_latent, z.size(3) - j));
  return decodeUntiled(tile);
}

at::Tensor AutoencoderKL::tiledDecode(const at::Tensor& z) const {
  if (z.dim() != 4) throw std::invalid_argument("AutoencoderKL.tiledDecode: expected [B, C, h, w]");
  const VaeTileGrid g = tileGrid(z.size(2), z.size(3));
  std::vector<at::Tensor> tiles;
  tiles.reserve(static_cast<size_t>(g.count()));
  for (int64_t k = 0; k < g.count(); ++k) tiles.push_back(decodeTile(z, g, k));
  return blendVaeTiles(g, tiles);
}

at::Tensor AutoencoderKL::tiledDecode(const at::Tensor& z, ProcessGroup& group) const {
  if (z.dim() != 4) throw std::invalid_argument("AutoencoderKL.tiledDecode: expected [B, C, h, w]");
  const VaeTileGrid g = tileGrid(z.size(2), z.size(3));
  const int size = group.size(), rank = group.rank();
  const int64_t n = g.count();
  auto first = [&](int r) { return static_cast<int64_t>(r) * n / size; };
  const auto& w = d_->convIn.w;
  const auto opts = w.options();
  const int64_t B = z.size(0), C = d_->cfg.out_channels, vsf = g.vae_scale_factor;
  auto tileShape = [&](int64_t k) {
    const int64_t i = g.row_starts[static_cast<size_t>(k / g.cols())];
    const int64_t j = g.col_starts[static_cast<size_t>(k % g.cols())];
    return std::vector<int64_t>{B, C, std::min(g.tile_latent, z.size(2) - i) * vsf,
                                std::min(g.tile_latent, z.size(3) - j) * vsf};
  };
  at::Tensor image;
  if (rank == 0) {
    // Rank 0 blends each tile as it comes (its own as it decodes them, then each rank's in
    // order): it holds two rows of tiles and the image, never the whole grid.
    TileBlender blend(g);
    for (int64_t k = first(0); k < first(1); ++k) blend.add(k, decodeTile(z, g, k).contiguous());
    for (int r = 1; r < size; ++r)
      for (int64_t k = first(r); k < first(r + 1); ++k) {
        at::Tensor t = at::empty(tileShape(k), opts);
        group.recv(t, r)->wait();
        blend.add(k, std::move(t));
      }
    image = blend.result().contiguous();
  } else {
    // The other ranks decode their share, then send it in order when rank 0 asks.
    std::vector<at::Tensor> mine;
    for (int64_t k = first(rank); k < first(rank + 1); ++k)
      mine.push_back(decodeTile(z, g, k).contiguous());
    for (const at::Tensor& t : mine) group.send(t, 0)->wait();
    mine.clear();
    image = at::empty({B, C, z.size(2) * vsf, z.size(3) * vsf}, opts);
  }
  group.broadcast(image, 0)->wait();
  return image;
}

at::Tensor AutoencoderKL::decode(const at::Tensor& z) const { return decode(z, nullptr); }

at::Tensor AutoencoderKL::decode(const at::Tensor& z, ProcessGroup* group) const {
  const auto& t = d_->tiling;
  if (t.enabled && z.dim() == 4) {
    const VaeTileGrid g = tileGrid(z.size(2), z.size(3));
    if (z.size(2) > g.tile_latent || z.size(3) > g.tile_latent)
      return group && group->size() > 1 ? tiledDecode(z, *group) : tiledDecode(z);
  }
  return decodeUntiled(z);
}

}  // namespace dit
