#include "backend/models/flux2/transformer_flux2.h"

#include <ATen/ATen.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <tuple>

#include "backend/io/weight_loader.h"
#include "backend/io/weight_source.h"
#include "backend/models/flux/flux_blocks.h"
#include "backend/models/flux2/flux2_plan.h"
#include "parallel/context_parallel.h"
#include "parallel/context_parallel_plan.h"
#include "parallel/process_group.h"
#include "parallel/strategy.h"  // joinIssues

namespace dit {

namespace {

using flux::LinearPtr;

// nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6).
at::Tensor layerNorm(const at::Tensor& x) { return at::layer_norm(x, {x.size(-1)}, {}, {}, 1e-6); }

// (1 + scale) * LayerNorm(x) + shift with [B, 1, C] modulation (Flux2Modulation unsqueezes).
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return (1 + scale) * layerNorm(x) + shift;
}

// diffusers Flux2Modulation: linear(silu(temb)) [B, 3 sets C] -> unsqueeze(1) -> 3 * sets chunks
// (shift, scale, gate per set), each [B, 1, C].
struct Flux2Modulation {
  LinearPtr linear;
  int sets = 0;
  std::vector<at::Tensor> operator()(const at::Tensor& silu_temb) const {
    return linear->forward(silu_temb).unsqueeze(1).chunk(3 * sets, -1);
  }
};

// diffusers Flux2FeedForward: linear_in [2M, C] -> Flux2SwiGLU (silu(first half) * second half)
// -> linear_out [C, M]. Under tp the PackedColwise linear_in gives each rank its rows of both
// halves, so the local halves still pair up.
struct Flux2FeedForward {
  LinearPtr linear_in, linear_out;
  at::Tensor operator()(const at::Tensor& x) const {
    auto h = linear_in->forward(x).chunk(2, -1);
    return linear_out->forward(at::silu(h[0]) * h[1]);
  }
};

// diffusers Flux2TransformerBlock (double stream) with Flux2Attention (added kv; the math of
// FluxAttention without biases).
struct Flux2TransformerBlock {
  flux::FluxAttention attn;
  Flux2FeedForward ff, ff_context;

  Flux2TransformerBlock(WeightLoader& w, const std::string& p, int64_t C, int64_t M, int64_t hd)
      : attn(w, p + ".attn", C, hd, /*added_kv=*/true, 0, /*bias=*/false),
        ff{w.linear(p + ".ff.linear_in", C, 2 * M, false),
           w.linear(p + ".ff.linear_out", M, C, false)},
        ff_context{w.linear(p + ".ff_context.linear_in", C, 2 * M, false),
                   w.linear(p + ".ff_context.linear_out", M, C, false)} {}

  // mi/mt: image/text modulation chunks (shift, scale, gate) x 2. Returns {encoder, hidden}.
  std::pair<at::Tensor, at::Tensor> operator()(at::Tensor hs, at::Tensor enc,
                                               const std::vector<at::Tensor>& mi,
                                               const std::vector<at::Tensor>& mt,
                                               const at::Tensor& cos, const at::Tensor& sin,
                                               const flux::AttentionBackend& backend) const {
    const at::Tensor n = modulate(hs, mi[0], mi[1]);
    const at::Tensor nc = modulate(enc, mt[0], mt[1]);
    auto [attn_output, context_attn_output] = attn(n, nc, cos, sin, backend);
    hs = hs + mi[2] * attn_output;
    hs = hs + mi[5] * ff(modulate(hs, mi[3], mi[4]));
    enc = enc + mt[2] * context_attn_output;
    enc = enc + mt[5] * ff_context(modulate(enc, mt[3], mt[4]));
    if (enc.scalar_type() == at::kHalf) enc = enc.clamp(-65504, 65504);
    return {enc, hs};
  }
};

// diffusers Flux2SingleTransformerBlock with Flux2ParallelSelfAttention: one GEMM for q, k, v,
// gate, value (attn.to_qkv_mlp_proj), attention || SwiGLU, one GEMM for cat(attention, mlp)
// (attn.to_out), gated residual.
struct Flux2SingleTransformerBlock {
  LinearPtr to_qkv_mlp_proj, to_out;
  flux::FluxAttention attn;  // norm_q / norm_k and the attention of projected q, k, v
  int64_t cLocal = 0, mLocal = 0;

  Flux2SingleTransformerBlock(WeightLoader& w, const std::string& p, int64_t C, int64_t M,
                              int64_t hd)
      : to_qkv_mlp_proj(w.linear(p + ".attn.to_qkv_mlp_proj", C, 3 * C + 2 * M, false)),
        to_out(w.linear(p + ".attn.to_out", C + M, C, false)),
        attn(w, p + ".attn", C, hd, /*added_kv=*/false, C / w.tpSize() / hd),
        cLocal(C / w.tpSize()),
        mLocal(M / w.tpSize()) {}

  at::Tensor operator()(const at::Tensor& x, const std::vector<at::Tensor>& m,
                        const at::Tensor& cos, const at::Tensor& sin,
                        const flux::AttentionBackend& backend) const {
    const at::Tensor n = modulate(x, m[0], m[1]);
    const at::Tensor h = to_qkv_mlp_proj->forward(n);
    // Local rows: [q, k, v] (cLocal each), then [gate, value] (mLocal each).
    at::Tensor q = h.narrow(-1, 0, cLocal), k = h.narrow(-1, cLocal, cLocal),
               v = h.narrow(-1, 2 * cLocal, cLocal);
    at::Tensor gate = h.narrow(-1, 3 * cLocal, mLocal),
               value = h.narrow(-1, 3 * cLocal + mLocal, mLocal);
    at::Tensor a = attn.attendProjected(q, k, v, cos, sin, backend);
    at::Tensor out = to_out->forward(at::cat({a, at::silu(gate) * value}, -1));
    at::Tensor y = x + m[2] * out;
    if (y.scalar_type() == at::kHalf) y = y.clamp(-65504, 65504);
    return y;
  }
};

struct MLPEmbed {
  LinearPtr linear_1, linear_2;
  at::Tensor operator()(const at::Tensor& x) const {
    return linear_2->forward(at::silu(linear_1->forward(x)));
  }
};

// [1, S, n] -> [S, n]; [S, n] unchanged (Flux2Transformer2DModel.forward drops the batch dim).
at::Tensor ids2d(const at::Tensor& ids, const char* name) {
  if (ids.dim() == 3 && ids.size(0) == 1) return ids.select(0, 0);
  if (ids.dim() != 2)
    throw std::invalid_argument(std::string("Flux2Transformer2DModel::forward: ") + name +
                                " must be [S, axes] or [1, S, axes]");
  return ids;
}

}  // namespace

struct Flux2Transformer2DModel::Impl {
  Flux2TransformerConfig cfg;
  TransformerParallelism par;
  std::shared_ptr<const ShardingPlan> plan;
  ContextParallelPlan cpPlan = flux2ContextParallelPlan();
  LinearPtr x_embedder, context_embedder, proj_out;
  MLPEmbed timestep_embedder, guidance_embedder;
  Flux2Modulation mod_img, mod_txt, mod_single;
  flux::FluxPosEmbed pos_embed;
  std::vector<Flux2TransformerBlock> transformer_blocks;
  std::vector<Flux2SingleTransformerBlock> single_transformer_blocks;
  flux::AdaLayerNormContinuous norm_out;
  std::vector<LoadedParameter> parameters;
  tensor_parallel::LoraTargets lora;
  TransformerHooks* hooks = nullptr;
  at::ScalarType dtype = at::kFloat;
};

Flux2Transformer2DModel::Flux2Transformer2DModel(const Flux2TransformerConfig& cfg,
                                                 WeightSource& source, TransformerParallelism par)
    : d_(new Impl) {
  auto& D = *d_;
  if (std::fabs(cfg.eps - 1e-6) > 1e-12)
    throw std::invalid_argument("Flux2Transformer2DModel: eps " + std::to_string(cfg.eps) +
                                " is not supported (the norms use diffusers' default 1e-6)");
  D.cfg = cfg;
  D.par = par;
  D.plan = std::make_shared<const ShardingPlan>(flux2ShardingPlan(cfg));
  const ParameterTable declared = flux2ParameterTable(cfg);
  if (auto issues = D.plan->validate(declared, par.tpSize()); !issues.empty())
    throw std::invalid_argument(joinIssues(issues));
  WeightLoader w(source, D.plan, par.tp);
  D.dtype = source.dtype();
  const int64_t C = cfg.innerDim(), M = cfg.mlpHidden(), hd = cfg.attention_head_dim;
  const int64_t tg = cfg.timestep_guidance_channels;
  D.x_embedder = w.linear("x_embedder", cfg.in_channels, C, false);
  D.context_embedder = w.linear("context_embedder", cfg.joint_attention_dim, C, false);
  D.timestep_embedder = {w.linear("time_guidance_embed.timestep_embedder.linear_1", tg, C, false),
                         w.linear("time_guidance_embed.timestep_embedder.linear_2", C, C, false)};
  if (cfg.guidance_embeds)
    D.guidance_embedder = {w.linear("time_guidance_embed.guidance_embedder.linear_1", tg, C, false),
                           w.linear("time_guidance_embed.guidance_embedder.linear_2", C, C, false)};
  D.mod_img = {w.linear("double_stream_modulation_img.linear", C, 6 * C, false), 2};
  D.mod_txt = {w.linear("double_stream_modulation_txt.linear", C, 6 * C, false), 2};
  D.mod_single = {w.linear("single_stream_modulation.linear", C, 3 * C, false), 1};
  D.pos_embed = flux::FluxPosEmbed(cfg.axes_dims_rope, cfg.rope_theta);
  D.transformer_blocks.reserve(static_cast<size_t>(cfg.num_layers));
  for (int i = 0; i < cfg.num_layers; ++i)
    D.transformer_blocks.emplace_back(w, "transformer_blocks." + std::to_string(i), C, M, hd);
  D.single_transformer_blocks.reserve(static_cast<size_t>(cfg.num_single_layers));
  for (int i = 0; i < cfg.num_single_layers; ++i)
    D.single_transformer_blocks.emplace_back(w, "single_transformer_blocks." + std::to_string(i), C,
                                             M, hd);
  D.norm_out = flux::AdaLayerNormContinuous(w, "norm_out", C, /*bias=*/false);
  D.proj_out = w.linear("proj_out", C, cfg.out_channels, false);
  for (const auto& p : w.parameters()) {
    const ParameterInfo* d = declared.find(p.info.name);
    if (!d || d->shape != p.info.shape)
      throw std::logic_error("Flux2Transformer2DModel loaded " + p.info.name +
                             (d ? " with a shape other than declared"
                                : ", which flux2ParameterTable does not declare"));
  }
  if (w.parameters().size() != declared.size())
    throw std::logic_error(
        "Flux2Transformer2DModel loaded " + std::to_string(w.parameters().size()) +
        " parameters, flux2ParameterTable declares " + std::to_string(declared.size()));
  D.parameters = w.parameters();
  D.lora = tensor_parallel::LoraTargets(w.layers());
}

Flux2Transformer2DModel::~Flux2Transformer2DModel() = default;
const Flux2TransformerConfig& Flux2Transformer2DModel::config() const { return d_->cfg; }
const std::vector<LoadedParameter>& Flux2Transformer2DModel::parameters() const {
  return d_->parameters;
}
const ShardingPlan& Flux2Transformer2DModel::shardingPlan() const { return *d_->plan; }
void Flux2Transformer2DModel::setHooks(TransformerHooks* hooks) { d_->hooks = hooks; }
tensor_parallel::LoraTargets& Flux2Transformer2DModel::loraTargets() { return d_->lora; }

std::pair<at::Tensor, at::Tensor> Flux2Transformer2DModel::rotaryTables(
    const at::Tensor& txt_ids, const at::Tensor& img_ids) const {
  return d_->pos_embed(at::cat({ids2d(txt_ids, "txt_ids"), ids2d(img_ids, "img_ids")}, 0));
}

at::Tensor Flux2Transformer2DModel::timeEmbedding(const at::Tensor& timestep,
                                                  const at::Tensor& guidance) const {
  const auto& D = *d_;
  const auto dt = D.dtype;
  const auto dev = D.x_embedder->weight().device();
  const int64_t tg = D.cfg.timestep_guidance_channels;
  at::Tensor t = timestep.to(dev, dt) * 1000;
  at::Tensor temb = D.timestep_embedder(flux::timestepProjection(t, tg).to(dt));
  if (D.cfg.guidance_embeds) {
    if (!guidance.defined())
      throw std::invalid_argument(
          "Flux2Transformer2DModel: this transformer needs a guidance value (guidance_embeds)");
    at::Tensor g = guidance.to(dev, dt) * 1000;
    temb = temb + D.guidance_embedder(flux::timestepProjection(g, tg).to(dt));
  }
  return temb;
}

at::Tensor Flux2Transformer2DModel::forward(const TransformerInputs& in) const {
  static const char* kRequired[] = {"hidden_states", "encoder_hidden_states", "timestep", "img_ids",
                                    "txt_ids"};
  for (const auto& [name, t] : in) {
    bool known = name == "guidance";
    for (const char* n : kRequired) known = known || name == n;
    if (!known)
      throw std::invalid_argument(
          "Flux2Transformer2DModel::forward: unknown input '" + name +
          "'; accepted inputs: hidden_states, encoder_hidden_states, timestep, img_ids, "
          "txt_ids, guidance");
  }
  auto get = [&](const char* name) {
    auto it = in.find(name);
    if (it == in.end() || !it->second.defined())
      throw std::invalid_argument(std::string("Flux2Transformer2DModel::forward: input '") + name +
                                  "' is missing");
    return it->second;
  };
  const auto g = in.find("guidance");
  const at::Tensor guidance = g == in.end() ? at::Tensor() : g->second;

  const auto& D = *d_;
  const auto dt = D.dtype;
  const auto dev = D.x_embedder->weight().device();
  ContextParallelRunner cp(D.par.cp, D.cpPlan);
  auto local = cp.split({{"hidden_states", get("hidden_states").to(dev, dt)},
                         {"encoder_hidden_states", get("encoder_hidden_states").to(dev, dt)},
                         {"img_ids", ids2d(get("img_ids"), "img_ids").to(dev)},
                         {"txt_ids", ids2d(get("txt_ids"), "txt_ids").to(dev)}});
  at::Tensor hs = local.at("hidden_states"), enc = local.at("encoder_hidden_states");
  flux::AttentionBackend attention{D.par.cp, {}};
  if (D.par.cp) attention.localLens = cp.localLens();
  const int64_t txtLocal = enc.size(1);

  const at::Tensor temb = timeEmbedding(get("timestep"), guidance);
  const at::Tensor silu_temb = at::silu(temb);
  const auto mi = D.mod_img(silu_temb), mt = D.mod_txt(silu_temb), ms = D.mod_single(silu_temb);

  hs = D.x_embedder->forward(hs);
  enc = D.context_embedder->forward(enc);
  const auto [cos, sin] = D.pos_embed(at::cat({local.at("txt_ids"), local.at("img_ids")}, 0));

  for (size_t i = 0; i < D.transformer_blocks.size(); ++i) {
    if (D.hooks) D.hooks->beforeBlock("transformer_blocks", static_cast<int>(i), hs, enc);
    std::tie(enc, hs) = D.transformer_blocks[i](hs, enc, mi, mt, cos, sin, attention);
    if (D.hooks) D.hooks->afterBlock("transformer_blocks", static_cast<int>(i), hs, enc);
  }
  at::Tensor x = at::cat({enc, hs}, 1);
  for (size_t i = 0; i < D.single_transformer_blocks.size(); ++i) {
    if (D.hooks) D.hooks->beforeBlock("single_transformer_blocks", static_cast<int>(i), x, {});
    x = D.single_transformer_blocks[i](x, ms, cos, sin, attention);
    if (D.hooks) D.hooks->afterBlock("single_transformer_blocks", static_cast<int>(i), x, {});
  }
  hs = x.narrow(1, txtLocal, x.size(1) - txtLocal);
  return cp.gather(D.proj_out->forward(D.norm_out(hs, silu_temb)));
}

double Flux2Transformer2DModel::flops(const Flux2TransformerConfig& c, int64_t img, int64_t txt) {
  const double C = c.innerDim(), M = c.mlpHidden(), S = static_cast<double>(img + txt);
  const double attn = 4.0 * S * S * C;
  const double dbl = 2.0 * S * C * C * 4 + 2.0 * S * C * (2 * M) + 2.0 * S * M * C + attn;
  const double sgl = 2.0 * S * C * (3 * C + 2 * M) + 2.0 * S * (C + M) * C + attn;
  return c.num_layers * dbl + c.num_single_layers * sgl;
}

double Flux2Transformer2DModel::forwardFlops(int64_t imageTokens, int64_t textTokens) const {
  return flops(config(), imageTokens, textTokens);
}

}  // namespace dit
