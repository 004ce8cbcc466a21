#include "backend/models/zimage/transformer_zimage.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backend/io/weight_loader.h"
#include "backend/io/weight_source.h"
#include "backend/models/zimage/zimage_plan.h"
#include "backend/nn/attention.h"
#include "backend/nn/embeddings.h"
#include "backend/nn/fused_ops.h"
#include "backend/nn/qk_norm_rope.h"

namespace dit {

namespace {

using nn::FusedLinearPtr;
using nn::LinearPtr;
using nn::Modulation;

constexpr double kQkNormEps = 1e-5;  // ZImageTransformerBlock's Attention(eps=1e-5), fixed

int64_t padded(int64_t n) {
  return (n + kZImageSeqMultiOf - 1) / kZImageSeqMultiOf * kZImageSeqMultiOf;
}

// RoPE(RMSNorm(x)) of the head vectors x [B, S, H, D] with the q/k norm weight w: the fused CPU
// pass where it applies (stored head-major for the attention), else the ATen ops.
at::Tensor normRope(const at::Tensor& x, const at::Tensor& w, const at::Tensor& cos,
                    const at::Tensor& sin) {
  if (nn::rmsNormRopeCpuApplies(x, w)) {
    at::Tensor out =
        at::empty({x.size(0), x.size(2), x.size(1), x.size(3)}, x.options()).transpose(1, 2);
    nn::rmsNormRopeCpuOut(x, w, kQkNormEps, cos, sin, out);
    return out;
  }
  return nn::applyRotaryEmb(nn::rmsNorm(x, w, kQkNormEps), cos, sin);
}

}  // namespace

namespace zimage {

/// diffusers ZImageTransformerBlock (modulated: noise_refiner and layers; unmodulated:
/// context_refiner) with its Attention + ZSingleStreamAttnProcessor and FeedForward.
class ZImageTransformerBlock {
 public:
  ZImageTransformerBlock(WeightLoader& w, const std::string& p, const ZImageTransformerConfig& c,
                         bool modulated)
      : eps_(c.norm_eps), headDim_(c.headDim()) {
    const int64_t C = c.dim, M = c.ffnHidden();
    qkv_ = w.fusedColumn(
        p + ".attention.qkv",
        {{p + ".attention.to_q", C}, {p + ".attention.to_k", C}, {p + ".attention.to_v", C}}, C,
        false);
    headsLocal_ = qkv_->parts()[0].outLocal / headDim_;
    to_out_ = w.linear(p + ".attention.to_out.0", C, C, false);
    norm_q_ = w.param(p + ".attention.norm_q.weight", {headDim_});
    norm_k_ = w.param(p + ".attention.norm_k.weight", {headDim_});
    attention_norm1_ = w.param(p + ".attention_norm1.weight", {C});
    attention_norm2_ = w.param(p + ".attention_norm2.weight", {C});
    ffn_norm1_ = w.param(p + ".ffn_norm1.weight", {C});
    ffn_norm2_ = w.param(p + ".ffn_norm2.weight", {C});
    w13_ = w.fusedColumn(p + ".feed_forward.w13",
                         {{p + ".feed_forward.w1", M}, {p + ".feed_forward.w3", M}}, C, false);
    w2_ = w.linear(p + ".feed_forward.w2", M, C, false);
    if (modulated) adaLN_ = w.linear(p + ".adaLN_modulation.0", c.adalnDim(), 4 * C, true);
  }

  /// adaln_input [B, A] -> {attention: scale = 1 + scale_msa, gate = tanh(gate_msa); feed-forward:
  /// 1 + scale_mlp, tanh(gate_mlp)}, each [B, 1, C] (shift undefined).
  std::vector<Modulation::Params> modulation(const at::Tensor& adaln) const {
    const auto m = adaLN_->forward(adaln).unsqueeze(1).chunk(4, 2);
    return {{at::Tensor(), 1.0 + m[0], m[1].tanh()}, {at::Tensor(), 1.0 + m[2], m[3].tanh()}};
  }

  /// x [B, S, C] (this rank's tokens of the stream the block attends over), rotary cos/sin
  /// float32 [S, D]; `mod` empty for an unmodulated block. Returns the updated x.
  at::Tensor operator()(at::Tensor x, const std::vector<Modulation::Params>& mod,
                        const at::Tensor& cos, const at::Tensor& sin,
                        const nn::AttentionBackend& backend,
                        const nn::AttentionCacheSeam* seam) const {
    const bool m = !mod.empty();
    const at::Tensor scaleMsa = m ? mod[0].scale : at::Tensor(),
                     gateMsa = m ? mod[0].gate : at::Tensor();
    const at::Tensor scaleMlp = m ? mod[1].scale : at::Tensor(),
                     gateMlp = m ? mod[1].gate : at::Tensor();
    at::Tensor a;
    if (nn::cachePredicts(seam)) {
      a = nn::cachePrediction(*seam).at(0).to(x.scalar_type());
    } else {
      a = attention(normMul(x, attention_norm1_, scaleMsa), cos, sin, backend);
      if (seam) nn::cacheRecord(seam, {a});
    }
    x = normResidual(x, a, attention_norm2_, gateMsa);
    const auto g = w13_->forwardParts(normMul(x, ffn_norm1_, scaleMlp));
    const at::Tensor f =
        w2_->forward(nn::fusedRowsApply(g[0]) ? nn::siluMulCpu(g[0], g[1]) : at::silu(g[0]) * g[1]);
    return normResidual(x, f, ffn_norm2_, gateMlp);
  }

 private:
  // rmsNorm(x, w) * scale (scale undefined: none). float32 on the CPU: one pass
  // (nn::rmsNormMulCpu) instead of square, mean, rsqrt and two products.
  at::Tensor normMul(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale) const {
    if (x.dim() == 3 && nn::fusedRowsApply(x) && nn::fusedRowsApply(w) &&
        (!scale.defined() || nn::fusedRowsApply(scale)))
      return nn::rmsNormMulCpu(x, w, eps_, scale);
    const at::Tensor h = nn::rmsNorm(x, w, eps_);
    return scale.defined() ? h * scale : h;
  }
  // x + gate * rmsNorm(y, w) (gate undefined: x + rmsNorm(y, w)), one pass where normMul's is.
  at::Tensor normResidual(const at::Tensor& x, const at::Tensor& y, const at::Tensor& w,
                          const at::Tensor& gate) const {
    if (y.dim() == 3 && nn::fusedRowsApply(y) && nn::fusedRowsApply(x) && nn::fusedRowsApply(w) &&
        (!gate.defined() || nn::fusedRowsApply(gate)))
      return nn::rmsNormResidualCpu(x, y, w, eps_, gate);
    const at::Tensor n = nn::rmsNorm(y, w, eps_);
    return gate.defined() ? x + gate * n : x + n;
  }

  at::Tensor attention(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const nn::AttentionBackend& backend) const {
    const auto dt = x.scalar_type();
    const auto p = qkv_->forwardParts(x);
    auto heads = [this](const at::Tensor& t) {
      return t.reshape({t.size(0), t.size(1), headsLocal_, headDim_});
    };
    const at::Tensor q = normRope(heads(p[0]), norm_q_, cos, sin);
    const at::Tensor k = normRope(heads(p[1]), norm_k_, cos, sin);
    return to_out_->forward(backend(q, k, heads(p[2])).to(dt));
  }

  double eps_;
  int64_t headDim_, headsLocal_ = 0;
  FusedLinearPtr qkv_, w13_;
  LinearPtr to_out_, w2_, adaLN_;
  at::Tensor norm_q_, norm_k_, attention_norm1_, attention_norm2_, ffn_norm1_, ffn_norm2_;
};

}  // namespace zimage

struct ZImageTransformer2DModel::Impl {
  ZImageTransformerConfig cfg;
  LinearPtr x_embedder, final_linear, final_adaLN, cap_linear, t_mlp0, t_mlp2;
  at::Tensor cap_norm, x_pad_token, cap_pad_token;
  std::vector<zimage::ZImageTransformerBlock> noise_refiner, context_refiner, layers;
};

ZImageTransformer2DModel::ZImageTransformer2DModel(const ZImageTransformerConfig& cfg,
                                                   WeightSource& source, TransformerParallelism par)
    : DiTModel(source, par, std::make_shared<const ShardingPlan>(zimageShardingPlan(cfg)),
               zimageParameterTable(cfg), "zimageParameterTable"),
      d_(new Impl) {
  auto& D = *d_;
  D.cfg = cfg;
  WeightLoader& w = loader();
  const int64_t C = cfg.dim, P = cfg.patchFeatures(), A = cfg.adalnDim();
  const std::string key = cfg.patchKey();
  D.x_embedder = w.linear("all_x_embedder." + key, P, C, true);
  D.final_linear = w.linear("all_final_layer." + key + ".linear", C, P, true);
  D.final_adaLN = w.linear("all_final_layer." + key + ".adaLN_modulation.1", A, C, true);
  D.cap_norm = w.param("cap_embedder.0.weight", {cfg.cap_feat_dim});
  D.cap_linear = w.linear("cap_embedder.1", cfg.cap_feat_dim, C, true);
  D.cap_pad_token = w.param("cap_pad_token", {1, C});
  D.x_pad_token = w.param("x_pad_token", {1, C});
  D.t_mlp0 = w.linear("t_embedder.mlp.0", 256, 1024, true);
  D.t_mlp2 = w.linear("t_embedder.mlp.2", 1024, A, true);
  auto blocks = [&](std::vector<zimage::ZImageTransformerBlock>& v, const char* stage, int n,
                    bool modulated) {
    v.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i)
      v.emplace_back(w, std::string(stage) + "." + std::to_string(i), cfg, modulated);
  };
  blocks(D.noise_refiner, "noise_refiner", cfg.n_refiner_layers, true);
  blocks(D.context_refiner, "context_refiner", cfg.n_refiner_layers, false);
  blocks(D.layers, "layers", cfg.n_layers, true);

  DiTSpec spec;
  spec.class_name = "ZImageTransformer2DModel";
  // The timestep stays float32 (ZImagePipeline passes it so; t_embedder takes t * t_scale in
  // float32): rounded to bfloat16, t * 1000 moves by up to 2, radians in the sinusoid's fast
  // channels.
  spec.inputs = {
      {"hidden_states"}, {"encoder_hidden_states"}, {"timestep", true, DiTInput::Kind::Float32}};
  spec.cp_plan = zimageContextParallelPlan();
  const Impl* m = d_.get();
  // Before the split: patchify (channel last), pad both sequences to 32 with zero rows (the
  // embedders' outputs there become the pad tokens), their masks and 3-axis position ids.
  spec.prepare = [m](TransformerInputs& in) {
    const ZImageTransformerConfig& c = m->cfg;
    const std::string who = "ZImageTransformer2DModel::forward: ";
    const at::Tensor x = in.at("hidden_states");
    const at::Tensor cap = in.at("encoder_hidden_states");
    const at::Tensor t = in.at("timestep");
    const int64_t p = c.patch_size;
    if (x.dim() != 4 || x.size(1) != c.in_channels || x.size(2) % p != 0 || x.size(3) % p != 0 ||
        x.size(2) == 0 || x.size(3) == 0)
      throw std::invalid_argument(who + "hidden_states must be [B, " +
                                  std::to_string(c.in_channels) +
                                  ", h, w] with h and w positive multiples of " +
                                  std::to_string(p) + ", got " + c10::str(x.sizes()));
    const int64_t B = x.size(0), ht = x.size(2) / p, wt = x.size(3) / p, N = ht * wt;
    if (cap.dim() != 3 || cap.size(0) != B || cap.size(1) < 1 || cap.size(2) != c.cap_feat_dim)
      throw std::invalid_argument(who + "encoder_hidden_states must be [B = " + std::to_string(B) +
                                  ", n >= 1, " + std::to_string(c.cap_feat_dim) + "], got " +
                                  c10::str(cap.sizes()));
    if (t.dim() != 1 || t.size(0) != B)
      throw std::invalid_argument(who + "timestep must be [B = " + std::to_string(B) + "], got " +
                                  c10::str(t.sizes()));
    const int64_t n = cap.size(1), nP = padded(n), NP = padded(N);
    // Positions index tables of axes_lens rows: caption up to nP, the image frame nP + 1.
    if (nP + 1 >= c.axes_lens[0] || ht > c.axes_lens[1] || wt > c.axes_lens[2])
      throw std::invalid_argument(
          who + "positions beyond axes_lens: " + std::to_string(n) + " caption rows (padded " +
          std::to_string(nP) + ") and a " + std::to_string(ht) + "x" + std::to_string(wt) +
          " token grid need axes_lens above [" + std::to_string(nP + 1) + ", " +
          std::to_string(ht - 1) + ", " + std::to_string(wt - 1) + "]");
    at::Tensor tokens = x.reshape({B, c.in_channels, ht, p, wt, p})
                            .permute({0, 2, 4, 3, 5, 1})
                            .reshape({B, N, c.patchFeatures()});
    if (NP > N)
      tokens = at::cat({tokens, at::zeros({B, NP - N, tokens.size(2)}, tokens.options())}, 1);
    at::Tensor caption = cap;
    if (nP > n) caption = at::cat({cap, at::zeros({B, nP - n, cap.size(2)}, cap.options())}, 1);
    auto [txtIds, imgIds] = positionIds(n, ht, wt);
    const auto dev = x.device();
    in["hidden_states"] = tokens.contiguous();
    in["encoder_hidden_states"] = caption.contiguous();
    in["img_ids"] = imgIds.to(dev);
    in["txt_ids"] = txtIds.to(dev);
    in["x_pad_mask"] = at::arange(NP, at::TensorOptions().dtype(at::kLong).device(dev)) >= N;
    in["cap_pad_mask"] = at::arange(nP, at::TensorOptions().dtype(at::kLong).device(dev)) >= n;
  };
  spec.embed = [this, m](const TransformerInputs& in, DiTState& s) {
    const at::Tensor adaln = adalnInput(in.at("timestep"));
    s.silu_temb = at::silu(adaln);  // the final layer's adaLN_modulation input
    auto mods = [&](const std::vector<zimage::ZImageTransformerBlock>& v, const char* stage) {
      for (size_t i = 0; i < v.size(); ++i)
        s.modulation[std::string(stage) + "." + std::to_string(i)] = v[i].modulation(adaln);
    };
    mods(m->noise_refiner, "noise_refiner");
    mods(m->layers, "layers");
    at::Tensor x = m->x_embedder->forward(in.at("hidden_states"));
    const at::Tensor xPad = in.at("x_pad_mask").reshape({1, -1, 1});
    s.hidden_states = at::where(xPad, m->x_pad_token.to(x.scalar_type()), x);
    at::Tensor cap = m->cap_linear->forward(
        nn::rmsNorm(in.at("encoder_hidden_states"), m->cap_norm, m->cfg.norm_eps));
    const at::Tensor capPad = in.at("cap_pad_mask").reshape({1, -1, 1});
    s.encoder_hidden_states = at::where(capPad, m->cap_pad_token.to(cap.scalar_type()), cap);
    std::tie(s.rope_cos, s.rope_sin) =
        rotaryTables(at::cat({in.at("txt_ids"), in.at("img_ids")}, 0));
  };
  // The refiners attend over their own stream; the rotary tables are over cat(caption, image).
  spec.stages.push_back(
      {"noise_refiner", cfg.n_refiner_layers, nullptr, [m](int i, DiTState& s) {
         const int64_t st = s.encoder_hidden_states.size(1), si = s.hidden_states.size(1);
         s.hidden_states = m->noise_refiner[static_cast<size_t>(i)](
             s.hidden_states, s.modulation.at("noise_refiner." + std::to_string(i)),
             s.rope_cos.narrow(0, st, si), s.rope_sin.narrow(0, st, si),
             s.attentionOver({"hidden_states"}), s.attention_cache);
       }});
  spec.stages.push_back({"context_refiner", cfg.n_refiner_layers, nullptr, [m](int i, DiTState& s) {
                           const int64_t st = s.encoder_hidden_states.size(1);
                           s.encoder_hidden_states = m->context_refiner[static_cast<size_t>(i)](
                               s.encoder_hidden_states, {}, s.rope_cos.narrow(0, 0, st),
                               s.rope_sin.narrow(0, 0, st),
                               s.attentionOver({"encoder_hidden_states"}), s.attention_cache);
                         }});
  // Main layers over the joint sequence (diffusers orders it image first; attention has no mask
  // nor causality, so cat(caption, image) with the matching tables gives the same rows).
  spec.stages.push_back({"layers", cfg.n_layers, [](DiTState& s) { s.joinStreams(); },
                         [m](int i, DiTState& s) {
                           s.hidden_states = m->layers[static_cast<size_t>(i)](
                               s.hidden_states, s.modulation.at("layers." + std::to_string(i)),
                               s.rope_cos, s.rope_sin, s.attention, s.attention_cache);
                         }});
  spec.finalize = [m](const DiTState& s) {
    // FinalLayer: linear(LayerNorm(x, eps 1e-6, no affine) * (1 + adaLN_modulation(c))).
    const at::Tensor x = s.imageStream();
    const at::Tensor scale = 1.0 + m->final_adaLN->forward(s.silu_temb);
    const at::Tensor n =
        at::layer_norm(x.to(at::kFloat), {x.size(2)}, {}, {}, 1e-6).to(x.scalar_type());
    return m->final_linear->forward(n * scale.unsqueeze(1));
  };
  // After the gather: the first N image rows, unpatchified to [B, C, h, w].
  spec.output = [m](const at::Tensor& out, const TransformerInputs& in) {
    const ZImageTransformerConfig& c = m->cfg;
    const at::Tensor& x = in.at("hidden_states");
    const int64_t p = c.patch_size, B = x.size(0), ht = x.size(2) / p, wt = x.size(3) / p;
    return out.narrow(1, 0, ht * wt)
        .reshape({B, ht, wt, p, p, c.in_channels})
        .permute({0, 5, 1, 3, 2, 4})
        .reshape({B, c.in_channels, ht * p, wt * p});
  };
  spec.flops = [c = cfg](int64_t img, int64_t txt) { return flops(c, img, txt); };
  finishLoading(std::move(spec));
}

ZImageTransformer2DModel::~ZImageTransformer2DModel() = default;
const ZImageTransformerConfig& ZImageTransformer2DModel::config() const { return d_->cfg; }

at::Tensor ZImageTransformer2DModel::adalnInput(const at::Tensor& t) const {
  const auto& D = *d_;
  const auto dt = computeDtype();
  // TimestepEmbedder: 256-channel [cos, sin] sinusoid of t * t_scale in float32, then the MLP in
  // the weights' dtype.
  const at::Tensor freq =
      nn::timestepProjection(t.to(device()).to(at::kFloat) * D.cfg.t_scale, 256).to(dt);
  return D.t_mlp2->forward(at::silu(D.t_mlp0->forward(freq)));
}

std::pair<at::Tensor, at::Tensor> ZImageTransformer2DModel::positionIds(int64_t n, int64_t ht,
                                                                        int64_t wt) {
  const int64_t nP = padded(n), N = ht * wt, NP = padded(N);
  at::Tensor txt = at::zeros({nP, 3}, at::kLong);
  txt.select(1, 0).copy_(at::arange(1, nP + 1, at::kLong));
  at::Tensor img = at::zeros({NP, 3}, at::kLong);
  at::Tensor grid = img.narrow(0, 0, N).view({ht, wt, 3});
  grid.select(2, 0).fill_(nP + 1);
  grid.select(2, 1).copy_(at::arange(ht, at::kLong).unsqueeze(1).expand({ht, wt}));
  grid.select(2, 2).copy_(at::arange(wt, at::kLong).unsqueeze(0).expand({ht, wt}));
  return {txt, img};
}

std::pair<at::Tensor, at::Tensor> ZImageTransformer2DModel::rotaryTables(
    const at::Tensor& ids) const {
  const auto& c = d_->cfg;
  // RopeEmbedder: per axis freqs = 1 / theta^(arange(0, d, 2) / d) and angles pos * freqs in
  // float64, rounded to float32; polar(1, angle) in float32. Each value repeated for its pair.
  const at::Tensor pos = ids.to(at::kDouble);
  std::vector<at::Tensor> angles;
  for (size_t i = 0; i < c.axes_dims.size(); ++i) {
    const int64_t d = c.axes_dims[i];
    const at::Tensor freqs =
        1.0 / at::pow(c.rope_theta, at::arange(0, d, 2, pos.options()) / static_cast<double>(d));
    angles.push_back(at::outer(pos.select(1, static_cast<int64_t>(i)), freqs).to(at::kFloat));
  }
  const at::Tensor a = at::cat(angles, 1).repeat_interleave(2, 1);
  return {a.cos().contiguous(), a.sin().contiguous()};
}

double ZImageTransformer2DModel::flops(const ZImageTransformerConfig& c, int64_t img, int64_t txt) {
  const double C = c.dim, M = c.ffnHidden();
  auto block = [&](double S) {
    return 2.0 * S * C * 3 * C + 2.0 * S * C * C + 2.0 * S * C * 2 * M + 2.0 * S * M * C +
           4.0 * S * S * C;
  };
  const double si = static_cast<double>(padded(img)), st = static_cast<double>(padded(txt));
  return c.n_refiner_layers * (block(si) + block(st)) + c.n_layers * block(si + st);
}

}  // namespace dit
