#include "backend/models/autoencoders/autoencoder_kl_qwenimage.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/io/weight_source.h"
#include "backend/nn/conv2d.h"
#include "parallel/attention.h"

namespace dit {
namespace {

// A QwenImageCausalConv3d (or nn.Conv2d) applied to one frame: the last temporal tap.
struct Conv {
  at::Tensor w, b;
  int64_t pad = 1, stride = 1;
  at::Tensor operator()(const at::Tensor& x) const {
    const int64_t s[2] = {stride, stride}, p[2] = {pad, pad};
    return nn::conv2d(x, w, b, at::IntArrayRef(s), at::IntArrayRef(p));
  }
};

Conv loadConv3d(WeightSource& w, const std::string& p, int64_t in, int64_t out, int64_t k) {
  Conv c;
  c.w = w.get(p + ".weight", {out, in, k, k, k}).select(2, k - 1).contiguous();
  c.b = w.get(p + ".bias", {out});
  c.pad = k / 2;
  return c;
}

Conv loadConv2d(WeightSource& w, const std::string& p, int64_t in, int64_t out, int64_t k,
                int64_t pad, int64_t stride = 1) {
  return Conv{w.get(p + ".weight", {out, in, k, k}), w.get(p + ".bias", {out}), pad, stride};
}

// QwenImageRMS_norm: F.normalize(x, dim=1) * sqrt(C) * gamma (+ bias 0).
struct RmsNorm {
  at::Tensor gamma;  // [C, 1, 1]
  double scale = 1;
  at::Tensor operator()(const at::Tensor& x) const {
    const bool up = x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble;
    const at::Tensor xf = up ? x.to(at::kFloat) : x;
    const at::Tensor n = xf / xf.norm(2, {1}, true).clamp_min(1e-12);
    return n.to(x.scalar_type()) * scale * gamma;
  }
};

RmsNorm loadNorm(WeightSource& w, const std::string& p, int64_t c, bool images) {
  RmsNorm n;
  n.gamma =
      images ? w.get(p + ".gamma", {c, 1, 1}) : w.get(p + ".gamma", {c, 1, 1, 1}).view({c, 1, 1});
  n.scale = std::sqrt(static_cast<double>(c));
  return n;
}

struct Resnet {
  RmsNorm norm1, norm2;
  Conv conv1, conv2, shortcut;
  bool hasShortcut = false;
  at::Tensor operator()(const at::Tensor& x) const {
    const at::Tensor h = hasShortcut ? shortcut(x) : x;
    at::Tensor y = conv1(at::silu(norm1(x)));
    y = conv2(at::silu(norm2(y)));
    return y + h;
  }
};

Resnet loadResnet(WeightSource& w, const std::string& p, int64_t in, int64_t out) {
  Resnet r;
  r.norm1 = loadNorm(w, p + ".norm1", in, false);
  r.conv1 = loadConv3d(w, p + ".conv1", in, out, 3);
  r.norm2 = loadNorm(w, p + ".norm2", out, false);
  r.conv2 = loadConv3d(w, p + ".conv2", out, out, 3);
  if (in != out) {
    r.shortcut = loadConv3d(w, p + ".conv_shortcut", in, out, 1);
    r.hasShortcut = true;
  }
  return r;
}

// QwenImageAttentionBlock: one head over the positions of the frame.
struct Attention {
  RmsNorm norm;
  Conv to_qkv, proj;
  at::Tensor operator()(const at::Tensor& x) const {
    const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    at::Tensor qkv = to_qkv(norm(x)).reshape({B, 1, 3 * C, H * W}).permute({0, 1, 3, 2});
    auto parts = qkv.contiguous().chunk(3, -1);
    at::Tensor o = localAttention(parts[0].contiguous(), parts[1].contiguous(),
                                  parts[2].contiguous());  // [B, 1, HW, C]
    o = o.reshape({B, H * W, C}).permute({0, 2, 1}).reshape({B, C, H, W});
    return proj(o) + x;
  }
};

Attention loadAttention(WeightSource& w, const std::string& p, int64_t c) {
  Attention a;
  a.norm = loadNorm(w, p + ".norm", c, true);
  a.to_qkv = loadConv2d(w, p + ".to_qkv", c, 3 * c, 1, 0);
  a.proj = loadConv2d(w, p + ".proj", c, c, 1, 0);
  return a;
}

struct MidBlock {
  Resnet r0, r1;
  Attention attn;
  at::Tensor operator()(const at::Tensor& x) const { return r1(attn(r0(x))); }
};

MidBlock loadMid(WeightSource& w, const std::string& p, int64_t c) {
  MidBlock m;
  m.r0 = loadResnet(w, p + ".resnets.0", c, c);
  m.attn = loadAttention(w, p + ".attentions.0", c);
  m.r1 = loadResnet(w, p + ".resnets.1", c, c);
  return m;
}

// One entry of the encoder's flat down_blocks list, or one up block of the decoder.
struct Stage {
  std::vector<Resnet> resnets;
  bool resample = false;
  Conv conv;  // upsample: 3x3 to dim / 2 after nearest x2; downsample: 3x3 stride 2 after a pad
};

at::Tensor upsampleNearest2x(const at::Tensor& x) {
  // QwenImageUpsample(scale 2, "nearest-exact") in float32: at an integer factor the
  // nearest-exact source index floor((i + 0.5) / 2) equals nearest's floor(i / 2).
  const int64_t size[2] = {x.size(2) * 2, x.size(3) * 2};
  return at::upsample_nearest2d(x.to(at::kFloat), at::IntArrayRef(size), c10::nullopt, c10::nullopt)
      .to(x.scalar_type());
}

at::Tensor frameOf(const at::Tensor& x5, int64_t channels, const char* who) {
  if (x5.dim() != 5 || x5.size(1) != channels || x5.size(2) != 1)
    throw std::invalid_argument(std::string("AutoencoderKLQwenImage::") + who + ": expected [B, " +
                                std::to_string(channels) + ", 1, H, W] (one frame), got " +
                                std::string(c10::str(x5.sizes())) +
                                (x5.dim() == 5 && x5.size(2) != 1
                                     ? " (video: more than one frame is not implemented)"
                                     : ""));
  return x5.select(2, 0);
}

}  // namespace

struct AutoencoderKLQwenImage::Impl {
  AutoencoderKLQwenImageConfig cfg;
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(at::kCPU);
  // decoder
  Conv postQuant, decIn, decOut;
  MidBlock decMid;
  std::vector<Stage> ups;
  RmsNorm decNorm;
  // encoder
  bool hasEncoder = false;
  Conv encIn, encOut, quant;
  std::vector<Stage> downs;
  MidBlock encMid;
  RmsNorm encNorm;
};

AutoencoderKLQwenImage::AutoencoderKLQwenImage(const AutoencoderKLQwenImageConfig& cfg,
                                               WeightSource& w)
    : d_(new Impl) {
  auto& D = *d_;
  D.cfg = cfg;
  D.dtype = w.dtype();
  const int64_t z = cfg.z_dim, base = cfg.base_dim;
  const size_t nLevels = cfg.dim_mult.size();
  // Decoder: dims = base x [dim_mult[-1]] + reversed(dim_mult).
  std::vector<int64_t> dd{base * cfg.dim_mult.back()};
  for (size_t i = nLevels; i-- > 0;) dd.push_back(base * cfg.dim_mult[i]);
  D.postQuant = loadConv3d(w, "post_quant_conv", z, z, 1);
  D.decIn = loadConv3d(w, "decoder.conv_in", z, dd[0], 3);
  D.decMid = loadMid(w, "decoder.mid_block", dd[0]);
  for (size_t i = 0; i < nLevels; ++i) {
    const std::string p = "decoder.up_blocks." + std::to_string(i);
    int64_t in = i > 0 ? dd[i] / 2 : dd[i];
    const int64_t out = dd[i + 1];
    Stage s;
    for (int r = 0; r <= cfg.num_res_blocks; ++r) {
      s.resnets.push_back(loadResnet(w, p + ".resnets." + std::to_string(r), in, out));
      in = out;
    }
    if (i + 1 != nLevels) {
      s.resample = true;
      s.conv = loadConv2d(w, p + ".upsamplers.0.resample.1", out, out / 2, 3, 1);
      // temperal_upsample = reversed temperal_downsample: upsample3d has a time_conv, unused on
      // the first (only) frame.
      if (cfg.temperal_downsample[nLevels - 2 - i])
        (void)w.get(p + ".upsamplers.0.time_conv.weight", {out * 2, out, 3, 1, 1}),
            (void)w.get(p + ".upsamplers.0.time_conv.bias", {out * 2});
    }
    D.ups.push_back(std::move(s));
  }
  D.decNorm = loadNorm(w, "decoder.norm_out", dd.back(), false);
  D.decOut = loadConv3d(w, "decoder.conv_out", dd.back(), cfg.input_channels, 3);
  D.device = D.decOut.w.device();

  // Encoder (when present): dims = base x ([1] + dim_mult), a flat down_blocks list.
  if (w.getOptional("encoder.conv_in.weight", {base, cfg.input_channels, 3, 3, 3}).defined()) {
    D.hasEncoder = true;
    std::vector<int64_t> ed{base};
    for (int m : cfg.dim_mult) ed.push_back(base * m);
    D.encIn = loadConv3d(w, "encoder.conv_in", cfg.input_channels, base, 3);
    int idx = 0;
    for (size_t i = 0; i < nLevels; ++i) {
      int64_t in = ed[i];
      const int64_t out = ed[i + 1];
      for (int r = 0; r < cfg.num_res_blocks; ++r) {
        Stage s;
        s.resnets.push_back(loadResnet(w, "encoder.down_blocks." + std::to_string(idx++), in, out));
        D.downs.push_back(std::move(s));
        in = out;
      }
      if (i + 1 != nLevels) {
        const std::string p = "encoder.down_blocks." + std::to_string(idx++);
        Stage s;
        s.resample = true;
        s.conv = loadConv2d(w, p + ".resample.1", out, out, 3, 0, 2);
        if (cfg.temperal_downsample[i])
          (void)w.get(p + ".time_conv.weight", {out, out, 3, 1, 1}),
              (void)w.get(p + ".time_conv.bias", {out});
        D.downs.push_back(std::move(s));
      }
    }
    D.encMid = loadMid(w, "encoder.mid_block", ed.back());
    D.encNorm = loadNorm(w, "encoder.norm_out", ed.back(), false);
    D.encOut = loadConv3d(w, "encoder.conv_out", ed.back(), 2 * z, 3);
    D.quant = loadConv3d(w, "quant_conv", 2 * z, 2 * z, 1);
  }
}

AutoencoderKLQwenImage::~AutoencoderKLQwenImage() = default;
bool AutoencoderKLQwenImage::hasEncoder() const { return d_->hasEncoder; }
const AutoencoderKLQwenImageConfig& AutoencoderKLQwenImage::config() const { return d_->cfg; }

at::Tensor AutoencoderKLQwenImage::decode(const at::Tensor& z5) const {
  const auto& D = *d_;
  at::Tensor x = frameOf(z5, D.cfg.z_dim, "decode").to(D.device, D.dtype);
  x = D.postQuant(x);
  x = D.decIn(x);
  x = D.decMid(x);
  for (const Stage& s : D.ups) {
    for (const Resnet& r : s.resnets) x = r(x);
    if (s.resample) x = s.conv(upsampleNearest2x(x));
  }
  x = D.decOut(at::silu(D.decNorm(x)));
  return x.clamp(-1.0, 1.0).unsqueeze(2);
}

DiagonalGaussianDistribution AutoencoderKLQwenImage::encode(const at::Tensor& x5) const {
  const auto& D = *d_;
  if (!D.hasEncoder)
    throw std::invalid_argument(
        "AutoencoderKLQwenImage::encode: the checkpoint has no encoder weights "
        "(encoder.conv_in.weight)");
  at::Tensor x = frameOf(x5, D.cfg.input_channels, "encode").to(D.device, D.dtype);
  const int64_t vsf = D.cfg.vaeScaleFactor();
  if (x.size(2) % vsf != 0 || x.size(3) % vsf != 0)
    throw std::invalid_argument(
        "AutoencoderKLQwenImage::encode: height and width must be "
        "multiples of " +
        std::to_string(vsf) + ", got " + std::to_string(x.size(2)) + "x" +
        std::to_string(x.size(3)));
  x = D.encIn(x);
  for (const Stage& s : D.downs) {
    for (const Resnet& r : s.resnets) x = r(x);
    if (s.resample) x = s.conv(at::constant_pad_nd(x, {0, 1, 0, 1}, 0));
  }
  x = D.encMid(x);
  x = D.encOut(at::silu(D.encNorm(x)));
  x = D.quant(x).unsqueeze(2);
  DiagonalGaussianDistribution p;
  auto mv = x.chunk(2, 1);
  p.mean = mv[0];
  p.logvar = mv[1].clamp(-30.0, 20.0);
  p.std = at::exp(0.5 * p.logvar);
  return p;
}

}  // namespace dit
