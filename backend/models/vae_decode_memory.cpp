#include "backend/models/vae_decode_memory.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/models/autoencoders/autoencoder_kl_config.h"
#include "backend/models/autoencoders/autoencoder_kl_qwenimage_config.h"
#include "backend/models/family.h"

namespace dit {

namespace {

// Saturating arithmetic: impossible sizes give a huge figure, never a wrapped small one.
uint64_t mul(uint64_t a, uint64_t b) {
  if (a != 0 && b > UINT64_MAX / a) return UINT64_MAX;
  return a * b;
}
uint64_t add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

// The tensors alive while the decoder runs: their bytes and the peak of their sum.
class Live {
 public:
  struct T {
    uint64_t bytes = 0;
  };
  Live(uint64_t elementBytes, bool cpu) : eb_(elementBytes), cpu_(cpu) {}
  // A map of c channels over p pixels.
  T alloc(uint64_t c, uint64_t p) { return allocBytes(mul(mul(c, p), eb_)); }
  T allocBytes(uint64_t b) {
    cur_ = add(cur_, b);
    peak_ = std::max(peak_, cur_);
    return T{b};
  }
  void release(T& t) {
    if (t.bytes == 0) return;
    cur_ -= std::min(cur_, t.bytes);
    t = T{};
  }
  // A k x k convolution (stride 1, padding k / 2) of a cin-channel map over p pixels; returns
  // its output. On the CPU, what LibTorch 1.13's kernel allocates meanwhile
  // (at::native::ConvParams::use_mkldnn): oneDNN (an input of more than 20480 elements, or a
  // kernel above 3): the weights and the input reordered to its blocked layout (channels padded
  // to 16), the output computed blocked, then copied to the dense output (mkldnn_to_dense);
  // slow_conv2d otherwise: the im2col columns of a k > 1 kernel.
  T conv(uint64_t cin, uint64_t cout, uint64_t p, uint64_t k) {
    if (!cpu_) return alloc(cout, p);
    const auto pad = [](uint64_t c) { return (c + 15) / 16 * 16; };
    if (mul(cin, p) > 20480 || k > 3) {
      T w = allocBytes(mul(mul(pad(cin), pad(cout)), mul(k * k, eb_)));
      // Fewer than 16 input channels: the kernel reads the dense input as it is.
      T in = cin >= 16 ? alloc(pad(cin), p) : T{};
      T blocked = alloc(pad(cout), p);
      release(in);
      release(w);
      T out = alloc(cout, p);
      release(blocked);
      return out;
    }
    T cols = k > 1 ? alloc(mul(cin, k * k), p) : T{};
    T out = alloc(cout, p);
    release(cols);
    return out;
  }
  uint64_t peak() const { return peak_; }

 private:
  uint64_t eb_;
  bool cpu_;
  uint64_t cur_ = 0, peak_ = 0;
};
using T = Live::T;

// norm then activation of a c-channel map: both outputs (the C++ temporaries of the expression
// `conv(act(norm(x)))`, alive while the convolution runs). AutoencoderKL: group_norm, silu.
// AutoencoderKLQwenImage's RMS norm: ||x|| over the channels (clamped: a second one-channel map),
// x / ||x||, * sqrt(C), * gamma, each a new map.
std::pair<T, T> normAct(Live& L, uint64_t c, uint64_t p, bool kl) {
  T n;
  if (kl) {
    n = L.alloc(c, p);
  } else {
    T norm = L.alloc(1, p), clamped = L.alloc(1, p);
    T div = L.alloc(c, p);
    L.release(clamped);
    L.release(norm);
    T scaled = L.alloc(c, p);
    n = L.alloc(c, p);
    L.release(scaled);
    L.release(div);
  }
  T a = L.alloc(c, p);
  return {n, a};
}

// A resnet block (cin -> cout over p pixels) on input x (alive; the caller releases it); returns
// its output. AutoencoderKL's ResnetBlock2D (AutoencoderKL::Impl::resnet): h =
// conv1(act(norm1(x))); h = conv2(act(norm2(h))); (shortcut(x) or x) + h. AutoencoderKLQwenImage's
// residual block: the shortcut first (h), then the same two convolutions, y + h.
T resnet(Live& L, uint64_t cin, uint64_t cout, uint64_t p, bool kl) {
  const bool shortcut = cin != cout;
  T sc = !kl && shortcut ? L.conv(cin, cout, p, 1) : T{};
  auto [n1, a1] = normAct(L, cin, p, kl);
  T h = L.conv(cin, cout, p, 3);
  L.release(a1);
  L.release(n1);
  auto [n2, a2] = normAct(L, cout, p, kl);
  T h2 = L.conv(cout, cout, p, 3);
  L.release(h);
  L.release(a2);
  L.release(n2);
  if (kl && shortcut) sc = L.conv(cin, cout, p, 1);
  T out = L.alloc(cout, p);
  L.release(sc);
  L.release(h2);
  return out;
}

// The mid block's single-head attention over p latent pixels of c channels on input x (alive);
// returns its output. The attention is cpuMathAttention's (its output and a block of scores of
// about 1 MiB, at least 32 query rows), never the whole p x p scores.
T midAttention(Live& L, uint64_t c, uint64_t p, bool kl, uint64_t eb) {
  const uint64_t scores = std::min(mul(mul(p, p), 4), std::max(uint64_t{1} << 20, mul(32 * 4, p)));
  if (kl) {
    // AutoencoderKL::Impl::attention: h = gn(x) (named), q/k/v = linear(h) (at::linear copies
    // the transposed view first), o = to_out(attention), reshape copy, + x.
    T h = L.alloc(c, p);
    T qkv[3];
    for (T& t : qkv) {
      T copy = L.alloc(c, p);
      t = L.alloc(c, p);
      L.release(copy);
    }
    T s = L.allocBytes(eb >= 4 ? scores : 0);
    T att = L.alloc(c, p);
    L.release(s);
    T o = L.alloc(c, p);
    L.release(att);
    T shaped = L.alloc(c, p);
    T out = L.alloc(c, p);
    L.release(shaped);
    L.release(o);
    for (T& t : qkv) L.release(t);
    L.release(h);
    return out;
  }
  // QwenImageAttentionBlock: to_qkv(norm(x)) (named), its contiguous copy (named: q, k, v are
  // views of it), each made contiguous for the attention, the output reshaped (a copy), proj,
  // + x.
  auto [n, unused] = normAct(L, c, p, false);
  L.release(unused);
  T qkv = L.conv(c, 3 * c, p, 1);
  L.release(n);
  T parts = L.alloc(3 * c, p);
  T q = L.alloc(c, p), k = L.alloc(c, p), v = L.alloc(c, p);
  T s = L.allocBytes(eb >= 4 ? scores : 0);
  T att = L.alloc(c, p);
  L.release(s);
  L.release(v);
  L.release(k);
  L.release(q);
  T o = L.alloc(c, p);
  L.release(att);
  T proj = L.conv(c, c, p, 1);
  T out = L.alloc(c, p);
  L.release(proj);
  L.release(o);
  L.release(parts);
  L.release(qkv);
  return out;
}

}  // namespace

VaeDecoderShape vaeDecoderShape(const AutoencoderKLConfig& c) {
  VaeDecoderShape s;
  s.autoencoder_kl = true;
  s.latent_channels = c.latent_channels;
  s.channels.assign(c.block_out_channels.rbegin(), c.block_out_channels.rend());
  s.resnets_per_block = c.layers_per_block + 1;
  s.mid_attention = c.mid_block_add_attention;
  return s;
}

VaeDecoderShape vaeDecoderShape(const AutoencoderKLQwenImageConfig& c) {
  VaeDecoderShape s;
  s.autoencoder_kl = false;
  s.latent_channels = c.z_dim;
  if (!c.dim_mult.empty()) {
    s.channels.push_back(c.base_dim * c.dim_mult.back());
    for (size_t i = c.dim_mult.size(); i-- > 0;) s.channels.push_back(c.base_dim * c.dim_mult[i]);
  }
  s.resnets_per_block = c.num_res_blocks + 1;
  s.mid_attention = true;
  return s;
}

VaeDecoderShape standardVaeDecoderShape(int c0) {
  AutoencoderKLConfig c;
  c.latent_channels = 16;
  c.block_out_channels = {c0, 2 * c0, 4 * c0, 4 * c0};
  c.layers_per_block = 2;
  return vaeDecoderShape(c);
}

uint64_t vaeDecodePeakBytes(const VaeDecoderShape& s, int64_t height, int64_t width,
                            int64_t elementBytes, bool cpu) {
  if (s.channels.empty() || height < 1 || width < 1) return 0;
  const bool kl = s.autoencoder_kl;
  // AutoencoderKL: one level per block_out_channels entry, an upsample between levels; the
  // Qwen-Image VAE: channels[0] is the mid block's, then one level per dim_mult entry.
  const size_t first = kl ? 0 : 1;
  const size_t levels = s.channels.size() - first;
  if (levels < 1 || levels > 16) return 0;
  const int64_t scale = int64_t{1} << (levels - 1);
  const uint64_t p0 = static_cast<uint64_t>(std::max<int64_t>(1, height / scale)) *
                      static_cast<uint64_t>(std::max<int64_t>(1, width / scale));
  const uint64_t eb = static_cast<uint64_t>(std::max<int64_t>(1, elementBytes));
  Live L(eb, cpu);
  const uint64_t lc = static_cast<uint64_t>(std::max(1, s.latent_channels));
  // The pipeline's latents stay alive while the VAE decodes (FlowMatchPipeline: the noise it
  // drew, its packed form, the denoised latents): three latent-sized tensors.
  T latents = L.alloc(3 * lc, p0);
  uint64_t c = static_cast<uint64_t>(s.channels[0]);
  // post_quant_conv (1x1, named: alive to the end) and conv_in.
  T z = L.conv(lc, lc, p0, 1);
  T x = L.conv(lc, c, p0, 3);
  // The mid block: resnet, attention, resnet (each replacing x).
  auto replace = [&](T next) {
    L.release(x);
    x = next;
  };
  replace(resnet(L, c, c, p0, kl));
  if (s.mid_attention) replace(midAttention(L, c, p0, kl, eb));
  replace(resnet(L, c, c, p0, kl));
  uint64_t p = p0;
  for (size_t i = 0; i < levels; ++i) {
    const uint64_t out = static_cast<uint64_t>(s.channels[first + i]);
    for (int j = 0; j < std::max(1, s.resnets_per_block); ++j) {
      replace(resnet(L, c, out, p, kl));
      c = out;
    }
    if (i + 1 < levels) {
      // Nearest x2 (named), then the upsampler's 3x3 conv replacing x (AutoencoderKLQwenImage:
      // to half the channels, its upsample a temporary).
      const uint64_t up = kl ? c : c / 2;
      T xf = L.alloc(c, 4 * p);
      replace(L.conv(c, up, 4 * p, 3));
      L.release(xf);
      p *= 4;
      c = up;
    }
  }
  // conv_norm_out and the activation (replacing x), then conv_out to 3 channels.
  auto [n, a] = normAct(L, c, p, kl);
  L.release(x);
  L.release(n);
  (void)L.conv(c, 3, p, 3);  // the image, returned
  L.release(a);
  L.release(z);
  L.release(latents);
  return L.peak();
}

}  // namespace dit
