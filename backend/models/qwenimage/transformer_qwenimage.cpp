#include "backend/models/qwenimage/transformer_qwenimage.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backend/io/weight_loader.h"
#include "backend/io/weight_source.h"
#include "backend/models/qwenimage/qwenimage_plan.h"
#include "backend/nn/adaln.h"
#include "backend/nn/attention.h"
#include "backend/nn/embeddings.h"
#include "backend/nn/feed_forward.h"

namespace dit {

namespace {

/// diffusers QwenImageTransformerBlock.
struct QwenImageTransformerBlock {
  nn::LinearPtr img_mod, txt_mod;  // img_mod.1 / txt_mod.1: [6C, C] with bias
  nn::JointAttention attn;         // QwenDoubleStreamAttnProcessor2_0, biases, q/k RMSNorm
  nn::FeedForward img_mlp, txt_mlp;

  QwenImageTransformerBlock(WeightLoader& w, const std::string& p, int64_t C, int64_t M, int64_t hd)
      : img_mod(w.linear(p + ".img_mod.1", C, 6 * C, true)),
        txt_mod(w.linear(p + ".txt_mod.1", C, 6 * C, true)),
        attn(w, p + ".attn", C, hd, /*added_kv=*/true),
        img_mlp(w, p + ".img_mlp", C, M),
        txt_mlp(w, p + ".txt_mlp", C, M) {}

  // hs [B, S_img, C], enc [B, S_txt, C] -> {enc, hs}.
  std::pair<at::Tensor, at::Tensor> operator()(const at::Tensor& hs_in, const at::Tensor& enc_in,
                                               const at::Tensor& silu_temb, const at::Tensor& cos,
                                               const at::Tensor& sin,
                                               const nn::AttentionBackend& attention,
                                               const nn::AttentionCacheSeam* seam) const {
    // mod.chunk(2) -> (mod1, mod2), each .chunk(3) -> (shift, scale, gate).
    const auto mi = img_mod->forward(silu_temb).chunk(6, -1);
    const auto mt = txt_mod->forward(silu_temb).chunk(6, -1);
    const at::Tensor n = nn::layerNormModulate(hs_in, mi[1], mi[0]);
    const at::Tensor nc = nn::layerNormModulate(enc_in, mt[1], mt[0]);
    at::Tensor img_attn, txt_attn;
    if (nn::cachePredicts(seam)) {
      auto p = nn::cachePrediction(*seam);
      img_attn = p.at(0).to(hs_in.scalar_type());
      txt_attn = p.at(1).to(enc_in.scalar_type());
    } else {
      std::tie(img_attn, txt_attn) = attn(n, nc, cos, sin, attention);
      if (seam) nn::cacheRecord(seam, {img_attn, txt_attn});
    }
    at::Tensor hs = at::addcmul(hs_in, mi[2].unsqueeze(1), img_attn);
    at::Tensor enc = at::addcmul(enc_in, mt[2].unsqueeze(1), txt_attn);
    hs = at::addcmul(hs, mi[5].unsqueeze(1), img_mlp(nn::layerNormModulate(hs, mi[4], mi[3])));
    enc = at::addcmul(enc, mt[5].unsqueeze(1), txt_mlp(nn::layerNormModulate(enc, mt[4], mt[3])));
    if (enc.scalar_type() == at::kHalf) enc = enc.clamp(-65504, 65504);
    if (hs.scalar_type() == at::kHalf) hs = hs.clamp(-65504, 65504);
    return {enc, hs};
  }
};

std::array<int64_t, 3> imageShape(const at::Tensor& t) {
  if (!t.defined() || t.numel() < 3 || t.size(-1) != 3 || t.dim() > 2)
    throw std::invalid_argument(
        "QwenImageTransformer2DModel::forward: img_shapes must be int64 [3], [1, 3] or [B, 3] "
        "(frames, height, width of the token grid)");
  const at::Tensor r = t.reshape({-1, 3}).select(0, 0).to(at::kLong).cpu();
  std::array<int64_t, 3> s{r[0].item<int64_t>(), r[1].item<int64_t>(), r[2].item<int64_t>()};
  if (s[0] < 1 || s[1] < 1 || s[2] < 1)
    throw std::invalid_argument("QwenImageTransformer2DModel::forward: img_shapes (" +
                                std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " +
                                std::to_string(s[2]) + ") must be positive");
  return s;
}

}  // namespace

struct QwenImageTransformer2DModel::Impl {
  QwenImageTransformerConfig cfg;
  nn::LinearPtr img_in, txt_in, proj_out;
  at::Tensor txt_norm;
  nn::MLPEmbed timestep_embedder;
  std::vector<QwenImageTransformerBlock> blocks;
  nn::AdaLayerNormContinuous norm_out;
  StepCache* cache = nullptr;
};

QwenImageTransformer2DModel::QwenImageTransformer2DModel(const QwenImageTransformerConfig& cfg,
                                                         WeightSource& source,
                                                         TransformerParallelism par)
    : DiTModel(source, par, std::make_shared<const ShardingPlan>(qwenImageShardingPlan(cfg)),
               qwenImageParameterTable(cfg), "qwenImageParameterTable"),
      d_(new Impl) {
  auto& D = *d_;
  D.cfg = cfg;
  WeightLoader& w = loader();
  const int64_t C = cfg.innerDim(), M = cfg.mlpHidden(), hd = cfg.attention_head_dim;
  D.img_in = w.linear("img_in", cfg.in_channels, C, true);
  D.txt_norm = w.param("txt_norm.weight", {cfg.joint_attention_dim});
  D.txt_in = w.linear("txt_in", cfg.joint_attention_dim, C, true);
  D.timestep_embedder = nn::MLPEmbed(w, "time_text_embed.timestep_embedder", 256, C, true);
  D.blocks.reserve(static_cast<size_t>(cfg.num_layers));
  for (int i = 0; i < cfg.num_layers; ++i)
    D.blocks.emplace_back(w, "transformer_blocks." + std::to_string(i), C, M, hd);
  D.norm_out = nn::AdaLayerNormContinuous(w, "norm_out", C, /*bias=*/true);
  D.proj_out = w.linear("proj_out", C, cfg.projOut(), true);

  DiTSpec spec;
  spec.class_name = "QwenImageTransformer2DModel";
  using K = DiTInput::Kind;
  spec.inputs = {{"hidden_states"},
                 {"encoder_hidden_states"},
                 {"timestep"},
                 {"img_ids", true, K::PositionIds},
                 {"txt_ids", true, K::PositionIds}};
  spec.cp_plan = qwenImageContextParallelPlan();
  const Impl* m = d_.get();
  spec.embed = [this, m](const TransformerInputs& in, DiTState& s) {
    s.silu_temb = at::silu(timeEmbedding(in.at("timestep")));
    s.hidden_states = m->img_in->forward(in.at("hidden_states"));
    s.encoder_hidden_states =
        m->txt_in->forward(nn::rmsNorm(in.at("encoder_hidden_states"), m->txt_norm));
    // Rotary factors over cat(text, image), each value repeated for its interleaved pair.
    auto [c, sn] = rotaryFactors(at::cat({in.at("txt_ids"), in.at("img_ids")}, 0));
    s.rope_cos = c.repeat_interleave(2, 1);
    s.rope_sin = sn.repeat_interleave(2, 1);
  };
  spec.stages.push_back({"transformer_blocks", cfg.num_layers, nullptr, [m](int i, DiTState& s) {
                           std::tie(s.encoder_hidden_states, s.hidden_states) =
                               m->blocks[static_cast<size_t>(i)](
                                   s.hidden_states, s.encoder_hidden_states, s.silu_temb,
                                   s.rope_cos, s.rope_sin, s.attention, s.attention_cache);
                         }});
  spec.finalize = [m](const DiTState& s) {
    return m->proj_out->forward(m->norm_out(s.imageStream(), s.silu_temb));
  };
  spec.flops = [c = cfg](int64_t img, int64_t txt) { return flops(c, img, txt); };
  finishLoading(std::move(spec));
}

QwenImageTransformer2DModel::~QwenImageTransformer2DModel() = default;
const QwenImageTransformerConfig& QwenImageTransformer2DModel::config() const { return d_->cfg; }

void QwenImageTransformer2DModel::setStepCache(StepCache* cache) {
  d_->cache = cache;
  DiTModel::setStepCache(cache);
}

at::Tensor QwenImageTransformer2DModel::imageIds(int64_t frames, int64_t h, int64_t w) {
  at::Tensor ids = at::zeros({frames, h, w, 3}, at::kFloat);
  ids.select(3, 0).add_(at::arange(frames, at::kFloat).view({frames, 1, 1}));
  ids.select(3, 1).add_(at::arange(h, at::kFloat).view({1, h, 1}) - (h - h / 2));
  ids.select(3, 2).add_(at::arange(w, at::kFloat).view({1, 1, w}) - (w - w / 2));
  return ids.reshape({frames * h * w, 3});
}

at::Tensor QwenImageTransformer2DModel::textIds(int64_t L, int64_t h, int64_t w) {
  const int64_t maxVid = std::max(h / 2, w / 2);
  return (at::arange(L, at::kFloat) + static_cast<double>(maxVid))
      .unsqueeze(1)
      .expand({L, 3})
      .contiguous();
}

std::pair<at::Tensor, at::Tensor> QwenImageTransformer2DModel::rotaryFactors(
    const at::Tensor& ids) const {
  // QwenEmbedRope.rope_params: outer(index, 1 / theta^(arange(0, d, 2) / d)) in float32, then
  // polar(1, angle).
  const at::Tensor pos = ids.to(at::kFloat);
  const auto fo = at::TensorOptions().dtype(at::kFloat).device(ids.device());
  std::vector<at::Tensor> cs, ss;
  for (size_t a = 0; a < d_->cfg.axes_dims_rope.size(); ++a) {
    const int64_t dim = d_->cfg.axes_dims_rope[a];
    const at::Tensor inv =
        1.0 / at::pow(10000.0, at::arange(0, dim, 2, fo) / static_cast<double>(dim));
    const at::Tensor ang = pos.select(1, static_cast<int64_t>(a)).unsqueeze(1) * inv.unsqueeze(0);
    cs.push_back(ang.cos());
    ss.push_back(ang.sin());
  }
  return {at::cat(cs, 1), at::cat(ss, 1)};
}

at::Tensor QwenImageTransformer2DModel::timeEmbedding(const at::Tensor& timestep) const {
  const auto dt = computeDtype();
  const auto dev = device();
  // Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0, scale=1000):
  // emb = 1000 * (t * exp(-ln(10000) * i / 128)), [cos, sin].
  const auto fo = at::TensorOptions().dtype(at::kFloat).device(dev);
  const at::Tensor ex = at::arange(0, 128, fo) * (-std::log(10000.0)) / 128.0;
  const at::Tensor t = timestep.to(dev, dt).to(at::kFloat);
  const at::Tensor e = (t.unsqueeze(1) * at::exp(ex).unsqueeze(0)) * 1000.0;
  const at::Tensor proj = at::cat({at::cos(e), at::sin(e)}, -1);
  return d_->timestep_embedder(proj.to(dt));
}

at::Tensor QwenImageTransformer2DModel::forward(const TransformerInputs& in) const {
  const std::string who = "QwenImageTransformer2DModel::forward: ";
  static const char* const kAccepted[] = {"hidden_states", "encoder_hidden_states",
                                          "encoder_hidden_states_mask", "timestep", "img_shapes"};
  for (const auto& [name, t] : in) {
    bool known = false;
    for (const char* a : kAccepted) known = known || name == a;
    if (!known)
      throw std::invalid_argument(who + "unknown input '" + name +
                                  "'; accepted inputs: hidden_states, encoder_hidden_states, "
                                  "encoder_hidden_states_mask, timestep, img_shapes");
  }
  auto need = [&](const char* name) -> const at::Tensor& {
    auto it = in.find(name);
    if (it == in.end() || !it->second.defined())
      throw std::invalid_argument(who + "input '" + name + "' is missing");
    return it->second;
  };
  const at::Tensor& hs = need("hidden_states");
  const at::Tensor& enc = need("encoder_hidden_states");
  const at::Tensor& ts = need("timestep");
  const auto shape = imageShape(need("img_shapes"));
  if (hs.dim() != 3 || enc.dim() != 3 || enc.size(0) != hs.size(0))
    throw std::invalid_argument(who +
                                "hidden_states [B, S_img, C] and encoder_hidden_states "
                                "[B, S_txt, D] must be 3-D with the same batch");
  if (shape[0] * shape[1] * shape[2] != hs.size(1))
    throw std::invalid_argument(who + "img_shapes (" + std::to_string(shape[0]) + ", " +
                                std::to_string(shape[1]) + ", " + std::to_string(shape[2]) +
                                ") gives " + std::to_string(shape[0] * shape[1] * shape[2]) +
                                " image tokens, hidden_states has " + std::to_string(hs.size(1)));
  const int64_t B = hs.size(0), L = enc.size(1);
  const at::Tensor imgIds = imageIds(shape[0], shape[1], shape[2]);
  const at::Tensor txtIds = textIds(L, shape[1], shape[2]);
  at::Tensor mask;
  if (auto it = in.find("encoder_hidden_states_mask"); it != in.end() && it->second.defined()) {
    mask = it->second;
    if (mask.dim() != 2 || mask.size(0) != B || mask.size(1) != L)
      throw std::invalid_argument(who + "encoder_hidden_states_mask " +
                                  std::string(c10::str(mask.sizes())) + " must be [B, S_txt] = [" +
                                  std::to_string(B) + ", " + std::to_string(L) + "]");
    mask = mask.ne(0).cpu();
    if (mask.all().item<bool>()) mask = at::Tensor();  // all ones: as no mask
  }
  if (!mask.defined())
    return DiTModel::forward({{"hidden_states", hs},
                              {"encoder_hidden_states", enc},
                              {"timestep", ts},
                              {"img_ids", imgIds},
                              {"txt_ids", txtIds}});
  if (d_->cache)
    throw std::invalid_argument(who +
                                "a padded text batch (encoder_hidden_states_mask with "
                                "zeros) cannot run with step caching");
  // Key-masked attention: a masked row is never a key, so each item runs with its real rows.
  std::vector<at::Tensor> outs;
  for (int64_t b = 0; b < B; ++b) {
    const at::Tensor rows = mask[b].nonzero().squeeze(1);
    const at::Tensor tb = ts.dim() > 0 && ts.size(0) == B ? ts.narrow(0, b, 1) : ts;
    outs.push_back(DiTModel::forward(
        {{"hidden_states", hs.narrow(0, b, 1)},
         {"encoder_hidden_states", enc.narrow(0, b, 1).index_select(1, rows.to(enc.device()))},
         {"timestep", tb},
         {"img_ids", imgIds},
         {"txt_ids", txtIds.index_select(0, rows)}}));
  }
  return at::cat(outs, 0);
}

double QwenImageTransformer2DModel::flops(const QwenImageTransformerConfig& c, int64_t img,
                                          int64_t txt) {
  const double C = c.innerDim(), M = c.mlpHidden(), S = static_cast<double>(img + txt);
  const double perBlock = 2.0 * S * 4 * C * C + 2.0 * S * 2 * C * M + 4.0 * S * S * C;
  return c.num_layers * perBlock + 2.0 * img * C * c.projOut();
}

}  // namespace dit
