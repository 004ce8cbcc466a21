#include "backend/models/autoencoders/autoencoder_kl.h"

#include <ATen/ATen.h>

#include <cmath>

#include "backend/io/weight_source.h"
#include "backend/nn/conv2d.h"
#include "parallel/attention.h"

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
  DiagonalGaussianDistribution p;
  const int64_t lc = D.cfg.latent_channels;
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

at::Tensor AutoencoderKL::decode(const at::Tensor& z0) const {
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

}  // namespace dit
