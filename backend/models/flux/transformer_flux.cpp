#include "backend/models/flux/transformer_flux.h"

#include <ATen/ATen.h>

#include <cmath>
#include <tuple>

#include "backend/io/weight_source.h"
#include "backend/models/flux/flux_blocks.h"
#include "backend/models/flux/flux_plan.h"
#include "parallel/attention.h"
#include "parallel/context_parallel.h"
#include "parallel/process_group.h"
#include "parallel/strategy.h"

namespace dit {

int FluxParallelism::tpRank() const { return tp ? tp->rank() : 0; }
int FluxParallelism::tpSize() const { return tp ? tp->size() : 1; }

const std::vector<TensorParallelRule>& fluxTensorParallelPlan() {
  using R = TensorParallelRule;
  static const std::vector<R> plan = {
      {"attn.to_q", R::Colwise, false},        {"attn.to_k", R::Colwise, false},
      {"attn.to_v", R::Colwise, false},        {"attn.add_q_proj", R::Colwise, false},
      {"attn.add_k_proj", R::Colwise, false},  {"attn.add_v_proj", R::Colwise, false},
      {"ff.net.0.proj", R::Colwise, false},    {"ff_context.net.0.proj", R::Colwise, false},
      {"attn.to_out.0", R::Rowwise, false},    {"attn.to_add_out", R::Rowwise, false},
      {"ff.net.2", R::Rowwise, false},         {"ff_context.net.2", R::Rowwise, false},
      {"attn.to_q", R::Colwise, true},         {"attn.to_k", R::Colwise, true},
      {"attn.to_v", R::Colwise, true},         {"proj_mlp", R::Colwise, true},
      {"proj_out", R::PackedRowwise, true},
  };
  return plan;
}

std::string checkFluxTensorParallel(const FluxTransformerConfig& c, int tp) {
  // One set of rules and messages for the worker, the CLI, the GUI and the model itself.
  Strategy s;
  s.world = s.tp_degree = tp;
  const ModelDims m = fluxModelDims(c, 8);  // the VAE scale does not enter the model rules
  auto issues = validateDegrees(s);
  if (issues.empty()) issues = validateForModel(s, m);
  return joinIssues(issues);
}

void TransformerHooks::beforeBlock(const char*, int, const at::Tensor&, const at::Tensor&) {}
void TransformerHooks::afterBlock(const char*, int, const at::Tensor&, const at::Tensor&) {}

namespace {

// diffusers TimestepEmbedding / PixArtAlphaTextProjection(act silu): linear_2(silu(linear_1(x))).
struct MLPEmbed {
  Linear linear_1, linear_2;
  at::Tensor operator()(const at::Tensor& x) const { return linear_2(at::silu(linear_1(x))); }
};

MLPEmbed loadMLPEmbed(WeightSource& w, const std::string& prefix, int64_t in, int64_t out) {
  return {loadLinear(w, prefix + ".linear_1", in, out), loadLinear(w, prefix + ".linear_2", out, out)};
}

// get_timestep_embedding(t, 256, flip_sin_to_cos=True, downscale_freq_shift=0) (diffusers
// Timesteps(256, True, 0)): [B] -> float32 [B, 256].
at::Tensor timestepProj(const at::Tensor& t, int64_t dim = 256) {
  const int64_t half = dim / 2;
  auto fo = at::TensorOptions().dtype(at::kFloat).device(t.device());
  at::Tensor ex = at::arange(0, half, fo) * (-std::log(10000.0)) / static_cast<double>(half);
  at::Tensor e = t.to(at::kFloat).unsqueeze(1) * at::exp(ex).unsqueeze(0);
  return at::cat({at::cos(e), at::sin(e)}, -1);
}

}  // namespace

struct FluxTransformer2DModel::Impl {
  FluxTransformerConfig cfg;
  FluxParallelism par;
  int tp = 1, tpRank = 0;
  Linear x_embedder, context_embedder, proj_out;
  // time_text_embed: CombinedTimestep(Guidance)TextProjEmbeddings.
  MLPEmbed timestep_embedder, guidance_embedder, text_embedder;
  bool hasGuidance = false;
  flux::FluxPosEmbed pos_embed;
  std::vector<flux::FluxTransformerBlock> transformer_blocks;
  std::vector<flux::FluxSingleTransformerBlock> single_transformer_blocks;
  flux::AdaLayerNormContinuous norm_out;
  TransformerHooks* hooks = nullptr;

  // Loaders by plan role (ColwiseParallel / RowwiseParallel / PackedRowwiseParallel); shard-on-load.
  flux::FluxAttention::Loaders loaders(WeightSource& w) {
    flux::FluxAttention::Loaders L;
    L.col = [this, &w](const std::string& p, int64_t in, int64_t out) {
      if (tp == 1) return loadLinear(w, p, in, out);
      return Linear{w.shard(p + ".weight", {out, in}, 0, tpRank, tp), w.shard(p + ".bias", {out}, 0, tpRank, tp)};
    };
    L.row = [this, &w](const std::string& p, int64_t in, int64_t out) {
      if (tp == 1) return flux::RowwiseLinear{loadLinear(w, p, in, out), nullptr};
      return flux::RowwiseLinear{Linear{w.shard(p + ".weight", {out, in}, 1, tpRank, tp), w.get(p + ".bias", {out})},
                                 par.tp};
    };
    L.packedRow = [this, &w](const std::string& p, const std::vector<int64_t>& blocks, int64_t out) {
      int64_t in = 0;
      for (auto b : blocks) in += b;
      if (tp == 1) return flux::RowwiseLinear{loadLinear(w, p, in, out), nullptr};
      return flux::RowwiseLinear{
          Linear{w.packedShard(p + ".weight", {out, in}, 1, blocks, tpRank, tp), w.get(p + ".bias", {out})}, par.tp};
    };
    return L;
  }
};

FluxTransformer2DModel::FluxTransformer2DModel(const FluxTransformerConfig& cfg, WeightSource& w,
                                               FluxParallelism par)
    : d_(new Impl) {
  auto& D = *d_;
  D.cfg = cfg;
  D.par = par;
  D.tp = par.tpSize();
  D.tpRank = par.tpRank();
  if (auto msg = checkFluxTensorParallel(cfg, D.tp); !msg.empty()) throw std::invalid_argument(msg);
  const int64_t headsLocal = cfg.num_attention_heads / D.tp;
  const int64_t C = cfg.innerDim(), M = cfg.mlpHidden(), hd = cfg.attention_head_dim;
  D.x_embedder = loadLinear(w, "x_embedder", cfg.in_channels, C);
  D.context_embedder = loadLinear(w, "context_embedder", cfg.joint_attention_dim, C);
  D.timestep_embedder = loadMLPEmbed(w, "time_text_embed.timestep_embedder", 256, C);
  D.hasGuidance = cfg.guidance_embeds;
  if (D.hasGuidance) D.guidance_embedder = loadMLPEmbed(w, "time_text_embed.guidance_embedder", 256, C);
  D.text_embedder = {loadLinear(w, "time_text_embed.text_embedder.linear_1", cfg.pooled_projection_dim, C),
                     loadLinear(w, "time_text_embed.text_embedder.linear_2", C, C)};
  D.pos_embed = flux::FluxPosEmbed(cfg.axes_dims_rope);
  const auto L = D.loaders(w);
  D.transformer_blocks.reserve(static_cast<size_t>(cfg.num_layers));
  for (int i = 0; i < cfg.num_layers; ++i)
    D.transformer_blocks.emplace_back(w, "transformer_blocks." + std::to_string(i), C, M, hd, headsLocal, L);
  D.single_transformer_blocks.reserve(static_cast<size_t>(cfg.num_single_layers));
  for (int i = 0; i < cfg.num_single_layers; ++i)
    D.single_transformer_blocks.emplace_back(w, "single_transformer_blocks." + std::to_string(i), C, M, hd,
                                             headsLocal, L);
  D.norm_out = flux::AdaLayerNormContinuous(w, "norm_out", C);
  D.proj_out = loadLinear(w, "proj_out", C, cfg.out_channels);
}

FluxTransformer2DModel::~FluxTransformer2DModel() = default;
const FluxTransformerConfig& FluxTransformer2DModel::config() const { return d_->cfg; }
void FluxTransformer2DModel::setHooks(TransformerHooks* hooks) { d_->hooks = hooks; }

at::Tensor FluxTransformer2DModel::forward(const at::Tensor& hidden_states,
                                           const at::Tensor& encoder_hidden_states,
                                           const at::Tensor& pooled, const at::Tensor& timestep,
                                           const at::Tensor& img_ids, const at::Tensor& txt_ids,
                                           const at::Tensor& guidance) const {
  const auto& D = *d_;
  const auto dt = D.x_embedder.weight.scalar_type();
  const auto dev = D.x_embedder.weight.device();
  const int64_t Simg = hidden_states.size(1), Stxt = encoder_hidden_states.size(1);

  // Context parallel: this rank's slice of the text and of the image tokens.
  flux::AttentionBackend attention{D.par.cp, {Stxt + Simg}};
  std::vector<int64_t> imgSizes{Simg};
  at::Tensor hs = hidden_states.to(dev, dt), enc = encoder_hidden_states.to(dev, dt);
  at::Tensor tIds = txt_ids.to(dev), iIds = img_ids.to(dev);
  if (D.par.cp) {
    const auto txtSizes = D.par.cp->partition(Stxt);
    imgSizes = D.par.cp->partition(Simg);
    attention.localLens.clear();
    for (size_t r = 0; r < txtSizes.size(); ++r) attention.localLens.push_back(txtSizes[r] + imgSizes[r]);
    auto [ts, tl] = D.par.cp->localRange(Stxt);
    auto [is, il] = D.par.cp->localRange(Simg);
    enc = enc.narrow(1, ts, tl);
    tIds = tIds.narrow(0, ts, tl);
    hs = hs.narrow(1, is, il);
    iIds = iIds.narrow(0, is, il);
  }
  const int64_t txtLocal = enc.size(1);

  // Conditioning: CombinedTimestep(Guidance)TextProjEmbeddings.
  at::Tensor t = timestep.to(dev, dt) * 1000;
  at::Tensor temb = D.timestep_embedder(timestepProj(t).to(dt));
  if (D.hasGuidance) {
    if (!guidance.defined()) throw std::invalid_argument("this transformer needs a guidance value (guidance_embeds)");
    at::Tensor g = guidance.to(dev, dt) * 1000;
    temb = temb + D.guidance_embedder(timestepProj(g).to(dt));
  }
  temb = temb + D.text_embedder(pooled.to(dev, dt));
  // Every AdaLayerNorm applies silu to temb first; computed once here.
  const at::Tensor silu_temb = at::silu(temb);

  hs = D.x_embedder(hs);
  enc = D.context_embedder(enc);

  const auto [cos, sin] = D.pos_embed(at::cat({tIds, iIds}, 0));

  for (size_t i = 0; i < D.transformer_blocks.size(); ++i) {
    if (D.hooks) D.hooks->beforeBlock("transformer_blocks", static_cast<int>(i), hs, enc);
    std::tie(enc, hs) = D.transformer_blocks[i](hs, enc, silu_temb, cos, sin, attention);
    if (D.hooks) D.hooks->afterBlock("transformer_blocks", static_cast<int>(i), hs, enc);
  }
  at::Tensor x = at::cat({enc, hs}, 1);
  for (size_t i = 0; i < D.single_transformer_blocks.size(); ++i) {
    if (D.hooks) D.hooks->beforeBlock("single_transformer_blocks", static_cast<int>(i), x, {});
    x = D.single_transformer_blocks[i](x, silu_temb, cos, sin, attention);
    if (D.hooks) D.hooks->afterBlock("single_transformer_blocks", static_cast<int>(i), x, {});
  }
  hs = x.narrow(1, txtLocal, x.size(1) - txtLocal);
  at::Tensor out = D.proj_out(D.norm_out(hs, silu_temb));
  if (D.par.cp) out = D.par.cp->gatherSequence(out.contiguous(), imgSizes);
  return out;
}

double FluxTransformer2DModel::flops(const FluxTransformerConfig& c, int64_t img, int64_t txt) {
  const double C = c.innerDim(), M = c.mlpHidden(), S = static_cast<double>(img + txt);
  const double attn = 4.0 * S * S * C;
  const double dbl = 2.0 * S * C * C * 4 + 2.0 * S * C * M * 2 + attn;  // qkv+out, ff up+down
  const double sgl = 2.0 * S * C * C * 3 + 2.0 * S * C * M + 2.0 * S * (C + M) * C + attn;
  return c.num_layers * dbl + c.num_single_layers * sgl;
}

}  // namespace dit
