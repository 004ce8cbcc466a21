#include "backend/models/flux/transformer_flux.h"

#include <ATen/ATen.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <tuple>

#include "backend/io/weight_source.h"
#include "backend/models/cache/step_cache.h"
#include "backend/models/flux/flux_blocks.h"
#include "backend/models/flux/flux_lora.h"
#include "backend/models/flux/flux_plan.h"
#include "parallel/attention.h"
#include "parallel/context_parallel.h"
#include "parallel/context_parallel_plan.h"
#include "parallel/process_group.h"
#include "parallel/strategy.h"  // joinIssues

namespace dit {

namespace {

// diffusers TimestepEmbedding / PixArtAlphaTextProjection(act silu): linear_2(silu(linear_1(x))).
struct MLPEmbed {
  flux::LinearPtr linear_1, linear_2;
  at::Tensor operator()(const at::Tensor& x) const {
    return linear_2->forward(at::silu(linear_1->forward(x)));
  }
};

MLPEmbed loadMLPEmbed(WeightLoader& w, const std::string& prefix, int64_t in, int64_t out) {
  return {w.linear(prefix + ".linear_1", in, out), w.linear(prefix + ".linear_2", out, out)};
}

}  // namespace

struct FluxTransformer2DModel::Impl {
  FluxTransformerConfig cfg;
  FluxParallelism par;
  std::shared_ptr<const ShardingPlan> plan;
  ContextParallelPlan cpPlan = fluxContextParallelPlan();
  flux::LinearPtr x_embedder, context_embedder, proj_out;
  // time_text_embed: CombinedTimestep(Guidance)TextProjEmbeddings.
  MLPEmbed timestep_embedder, guidance_embedder, text_embedder;
  bool hasGuidance = false;
  flux::FluxPosEmbed pos_embed;
  std::vector<flux::FluxTransformerBlock> transformer_blocks;
  std::vector<flux::FluxSingleTransformerBlock> single_transformer_blocks;
  flux::AdaLayerNormContinuous norm_out;
  std::vector<LoadedParameter> parameters;
  tensor_parallel::LoraTargets lora;
  TransformerHooks* hooks = nullptr;
  at::ScalarType dtype = at::kFloat;  ///< compute dtype (the weight source's)
  StepCache* cache = nullptr;
};

FluxTransformer2DModel::FluxTransformer2DModel(const FluxTransformerConfig& cfg,
                                               WeightSource& source, FluxParallelism par,
                                               std::shared_ptr<const ShardingPlan> plan)
    : d_(new Impl) {
  auto& D = *d_;
  D.cfg = cfg;
  D.par = par;
  D.plan = plan ? std::move(plan) : std::make_shared<const ShardingPlan>(fluxShardingPlan(cfg));
  // Validate the plan against the declared parameters before reading any weight.
  const ParameterTable declared = fluxParameterTable(cfg);
  if (auto issues = D.plan->validate(declared, par.tpSize()); !issues.empty())
    throw std::invalid_argument(joinIssues(issues));
  WeightLoader w(source, D.plan, par.tp);
  D.dtype = source.dtype();
  const int64_t C = cfg.innerDim(), M = cfg.mlpHidden(), hd = cfg.attention_head_dim;
  D.x_embedder = w.linear("x_embedder", cfg.in_channels, C);
  D.context_embedder = w.linear("context_embedder", cfg.joint_attention_dim, C);
  D.timestep_embedder = loadMLPEmbed(w, "time_text_embed.timestep_embedder", 256, C);
  D.hasGuidance = cfg.guidance_embeds;
  if (D.hasGuidance)
    D.guidance_embedder = loadMLPEmbed(w, "time_text_embed.guidance_embedder", 256, C);
  D.text_embedder = {
      w.linear("time_text_embed.text_embedder.linear_1", cfg.pooled_projection_dim, C),
      w.linear("time_text_embed.text_embedder.linear_2", C, C)};
  D.pos_embed = flux::FluxPosEmbed(cfg.axes_dims_rope);
  D.transformer_blocks.reserve(static_cast<size_t>(cfg.num_layers));
  for (int i = 0; i < cfg.num_layers; ++i)
    D.transformer_blocks.emplace_back(w, "transformer_blocks." + std::to_string(i), C, M, hd);
  D.single_transformer_blocks.reserve(static_cast<size_t>(cfg.num_single_layers));
  for (int i = 0; i < cfg.num_single_layers; ++i)
    D.single_transformer_blocks.emplace_back(w, "single_transformer_blocks." + std::to_string(i), C,
                                             M, hd);
  D.norm_out = flux::AdaLayerNormContinuous(w, "norm_out", C);
  D.proj_out = w.linear("proj_out", C, cfg.out_channels);
  // The model loaded exactly what it declares (names and global shapes): the plan, the byte
  // counts and the loader talk about the same parameters.
  for (const auto& p : w.parameters()) {
    const ParameterInfo* d = declared.find(p.info.name);
    if (!d || d->shape != p.info.shape)
      throw std::logic_error("FluxTransformer2DModel loaded " + p.info.name +
                             (d ? " with a shape other than declared"
                                : ", which fluxParameterTable does not declare"));
  }
  if (w.parameters().size() != declared.size())
    throw std::logic_error(
        "FluxTransformer2DModel loaded " + std::to_string(w.parameters().size()) +
        " parameters, fluxParameterTable declares " + std::to_string(declared.size()));
  D.parameters = w.parameters();
  D.lora = tensor_parallel::LoraTargets(w.layers());
}

FluxTransformer2DModel::~FluxTransformer2DModel() = default;
const FluxTransformerConfig& FluxTransformer2DModel::config() const { return d_->cfg; }
const std::vector<LoadedParameter>& FluxTransformer2DModel::parameters() const {
  return d_->parameters;
}
const ShardingPlan& FluxTransformer2DModel::shardingPlan() const { return *d_->plan; }
void FluxTransformer2DModel::setHooks(TransformerHooks* hooks) { d_->hooks = hooks; }
void FluxTransformer2DModel::setStepCache(StepCache* cache) { d_->cache = cache; }

at::Tensor FluxTransformer2DModel::forward(const at::Tensor& hidden_states,
                                           const at::Tensor& encoder_hidden_states,
                                           const at::Tensor& pooled, const at::Tensor& timestep,
                                           const at::Tensor& img_ids, const at::Tensor& txt_ids,
                                           const at::Tensor& guidance) const {
  const auto& D = *d_;
  const auto dt = D.dtype;  // the compute dtype (an FP8 checkpoint's weights are kByte codes)
  const auto dev = D.x_embedder->weight().device();

  // Context parallel: the declared plan splits the sequence inputs; this rank keeps its slices.
  ContextParallelRunner cp(D.par.cp, D.cpPlan);
  auto local = cp.split({{"hidden_states", hidden_states.to(dev, dt)},
                         {"encoder_hidden_states", encoder_hidden_states.to(dev, dt)},
                         {"img_ids", img_ids.to(dev)},
                         {"txt_ids", txt_ids.to(dev)}});
  at::Tensor hs = local.at("hidden_states"), enc = local.at("encoder_hidden_states");
  const at::Tensor tIds = local.at("txt_ids"), iIds = local.at("img_ids");
  flux::AttentionBackend attention{D.par.cp, {}};
  if (D.par.cp) attention.localLens = cp.localLens();
  const int64_t txtLocal = enc.size(1);

  StepCache* const sc = D.cache;
  if (sc) sc->beginForward();
  // TaylorSeer lite, predicted step: every block returns zeros without running and proj_out is
  // the Taylor extrapolation (norm_out's result would be discarded), so only that remains.
  if (sc && sc->lite() && !sc->taylorComputes())
    return cp.gather(sc->predict("proj_out").at(0).to(dt));

  // Conditioning: CombinedTimestep(Guidance)TextProjEmbeddings.
  at::Tensor t = timestep.to(dev, dt) * 1000;
  at::Tensor temb = D.timestep_embedder(flux::timestepProjection(t).to(dt));
  if (D.hasGuidance) {
    if (!guidance.defined())
      throw std::invalid_argument("this transformer needs a guidance value (guidance_embeds)");
    at::Tensor g = guidance.to(dev, dt) * 1000;
    temb = temb + D.guidance_embedder(flux::timestepProjection(g).to(dt));
  }
  temb = temb + D.text_embedder(pooled.to(dev, dt));
  // Every AdaLayerNorm applies silu to temb first; computed once here.
  const at::Tensor silu_temb = at::silu(temb);

  hs = D.x_embedder->forward(hs);
  enc = D.context_embedder->forward(enc);

  const auto [cos, sin] = D.pos_embed(at::cat({tIds, iIds}, 0));

  // TaylorSeer (default mode) hooks every block's attention module.
  const bool taylorAttn = sc && sc->taylorSeer() && !sc->lite();
  flux::AttentionCacheSeam seam;
  seam.cache = sc;
  auto seamFor = [&](const char* kind, size_t i) -> const flux::AttentionCacheSeam* {
    if (!taylorAttn) return nullptr;
    seam.module = std::string(kind) + "." + std::to_string(i) + ".attn";
    return &seam;
  };
  // First Block Cache: transformer_blocks.0 is the head block.
  const bool fbc = sc && sc->firstBlock() && !D.transformer_blocks.empty();
  bool skipRemaining = false;
  at::Tensor headImage, headText;
  for (size_t i = 0; i < D.transformer_blocks.size() && !skipRemaining; ++i) {
    if (D.hooks) D.hooks->beforeBlock("transformer_blocks", static_cast<int>(i), hs, enc);
    const at::Tensor hsIn = hs;
    std::tie(enc, hs) = D.transformer_blocks[i](hs, enc, silu_temb, cos, sin, attention,
                                                seamFor("transformer_blocks", i));
    if (D.hooks) D.hooks->afterBlock("transformer_blocks", static_cast<int>(i), hs, enc);
    if (fbc && i == 0) {
      if (sc->shouldComputeRemaining(hs - hsIn)) {
        headImage = hs;
        headText = enc;
      } else {
        // Reuse the remaining blocks' residuals (the text stream's result is unused after).
        hs = hs + sc->imageResidual();
        enc = enc + sc->textResidual();
        skipRemaining = true;
      }
    }
  }
  if (!skipRemaining) {
    at::Tensor x = at::cat({enc, hs}, 1);
    for (size_t i = 0; i < D.single_transformer_blocks.size(); ++i) {
      if (D.hooks) D.hooks->beforeBlock("single_transformer_blocks", static_cast<int>(i), x, {});
      x = D.single_transformer_blocks[i](x, silu_temb, cos, sin, attention,
                                         seamFor("single_transformer_blocks", i));
      if (D.hooks) D.hooks->afterBlock("single_transformer_blocks", static_cast<int>(i), x, {});
    }
    hs = x.narrow(1, txtLocal, x.size(1) - txtLocal);
    if (fbc) sc->storeTailResiduals(hs - headImage, x.narrow(1, 0, txtLocal) - headText);
  }
  at::Tensor out = D.proj_out->forward(D.norm_out(hs, silu_temb));
  if (sc && sc->lite()) sc->update("proj_out", {out});
  return cp.gather(out);
}

double FluxTransformer2DModel::flops(const FluxTransformerConfig& c, int64_t img, int64_t txt) {
  const double C = c.innerDim(), M = c.mlpHidden(), S = static_cast<double>(img + txt);
  const double attn = 4.0 * S * S * C;
  const double dbl = 2.0 * S * C * C * 4 + 2.0 * S * C * M * 2 + attn;  // qkv+out, ff up+down
  const double sgl = 2.0 * S * C * C * 3 + 2.0 * S * C * M + 2.0 * S * (C + M) * C + attn;
  return c.num_layers * dbl + c.num_single_layers * sgl;
}

at::Tensor FluxTransformer2DModel::forward(const TransformerInputs& in) const {
  static const char* kRequired[] = {
      "hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "img_ids",
      "txt_ids"};
  std::string accepted;
  for (const char* n : kRequired) accepted += std::string(n) + ", ";
  accepted += "guidance";
  for (const auto& [name, t] : in) {
    bool known = name == "guidance";
    for (const char* n : kRequired) known = known || name == n;
    if (!known)
      throw std::invalid_argument("FluxTransformer2DModel::forward: unknown input '" + name +
                                  "'; accepted inputs: " + accepted);
  }
  auto get = [&](const char* name) {
    auto it = in.find(name);
    if (it == in.end() || !it->second.defined())
      throw std::invalid_argument(std::string("FluxTransformer2DModel::forward: input '") + name +
                                  "' is missing");
    return it->second;
  };
  auto g = in.find("guidance");
  return forward(get("hidden_states"), get("encoder_hidden_states"), get("pooled_projections"),
                 get("timestep"), get("img_ids"), get("txt_ids"),
                 g == in.end() ? at::Tensor() : g->second);
}

tensor_parallel::LoraTargets& FluxTransformer2DModel::loraTargets() { return d_->lora; }
KohyaLoraMapping FluxTransformer2DModel::kohyaLoraMapping() const { return fluxKohyaTargets; }

double FluxTransformer2DModel::forwardFlops(int64_t imageTokens, int64_t textTokens) const {
  return flops(config(), imageTokens, textTokens);
}

}  // namespace dit
