#include "backend/models/flux2/transformer_flux2.h"

#include <ATen/ATen.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <tuple>

#include "backend/io/weight_loader.h"
#include "backend/io/weight_source.h"
#include "backend/models/flux2/flux2_blocks.h"
#include "backend/models/flux2/flux2_plan.h"
#include "backend/nn/adaln.h"
#include "backend/nn/embeddings.h"

namespace dit {

struct Flux2Transformer2DModel::Impl {
  Flux2TransformerConfig cfg;
  nn::LinearPtr x_embedder, context_embedder, proj_out;
  nn::MLPEmbed timestep_embedder, guidance_embedder;  // time_guidance_embed
  nn::Modulation mod_img, mod_txt, mod_single;
  nn::RotaryPosEmbed pos_embed;  // diffusers Flux2PosEmbed
  std::vector<flux2::Flux2TransformerBlock> transformer_blocks;
  std::vector<flux2::Flux2SingleTransformerBlock> single_transformer_blocks;
  nn::AdaLayerNormContinuous norm_out;
  // The KV modes (Flux2KVCache): the installed cache and this forward's mode, decided in prepare
  // (before the context-parallel split, the same on every rank); the reference tokens cut from
  // hidden_states / img_ids there, and their stream while an extracting forward runs.
  enum class KVMode { Off, Extract, Cached };
  Flux2KVCache* kv = nullptr;
  KVMode kv_mode = KVMode::Off;
  at::Tensor ref_in, ref_ids;
  std::unique_ptr<flux2::Flux2ReferenceStream> ref;
};

namespace {

const char* const kModImg = "double_stream_modulation_img";
const char* const kModTxt = "double_stream_modulation_txt";
const char* const kModSingle = "single_stream_modulation";

const Flux2TransformerConfig& checkedConfig(const Flux2TransformerConfig& cfg) {
  if (std::fabs(cfg.eps - 1e-6) > 1e-12)
    throw std::invalid_argument("Flux2Transformer2DModel: eps " + std::to_string(cfg.eps) +
                                " is not supported (the norms use diffusers' default 1e-6)");
  return cfg;
}

}  // namespace

Flux2KVCache::Flux2KVCache(int64_t num_ref_tokens, bool recompute)
    : numRef_(num_ref_tokens), recompute_(recompute) {
  if (num_ref_tokens < 1)
    throw std::invalid_argument("Flux2KVCache: num_ref_tokens must be >= 1 (got " +
                                std::to_string(num_ref_tokens) + ")");
}

Flux2KVCache::~Flux2KVCache() = default;

bool Flux2KVCache::filled() const {
  if (double_.empty() && single_.empty()) return false;
  for (const auto& l : double_)
    if (!l.k.defined()) return false;
  for (const auto& l : single_)
    if (!l.k.defined()) return false;
  return true;
}

int64_t Flux2KVCache::bytes() const {
  int64_t b = 0;
  for (const auto* layers : {&double_, &single_})
    for (const auto& l : *layers)
      for (const auto* t : {&l.k, &l.v})
        if (t->defined()) b += static_cast<int64_t>(t->numel() * t->element_size());
  return b;
}

void Flux2KVCache::clear() {
  double_.clear();
  single_.clear();
  imgTokens_ = 0;
  batch_ = 0;
}

Flux2Transformer2DModel::Flux2Transformer2DModel(const Flux2TransformerConfig& cfg,
                                                 WeightSource& source, TransformerParallelism par)
    : DiTModel(source, par,
               std::make_shared<const ShardingPlan>(flux2ShardingPlan(checkedConfig(cfg))),
               flux2ParameterTable(cfg), "flux2ParameterTable"),
      d_(new Impl) {
  auto& D = *d_;
  D.cfg = cfg;
  WeightLoader& w = loader();
  const int64_t C = cfg.innerDim(), M = cfg.mlpHidden(), hd = cfg.attention_head_dim;
  const int64_t tg = cfg.timestep_guidance_channels;
  D.x_embedder = w.linear("x_embedder", cfg.in_channels, C, false);
  D.context_embedder = w.linear("context_embedder", cfg.joint_attention_dim, C, false);
  D.timestep_embedder = nn::MLPEmbed(w, "time_guidance_embed.timestep_embedder", tg, C, false);
  if (cfg.guidance_embeds)
    D.guidance_embedder = nn::MLPEmbed(w, "time_guidance_embed.guidance_embedder", tg, C, false);
  D.mod_img = nn::Modulation(w, kModImg, C, 2);
  D.mod_txt = nn::Modulation(w, kModTxt, C, 2);
  D.mod_single = nn::Modulation(w, kModSingle, C, 1);
  D.pos_embed = nn::RotaryPosEmbed(cfg.axes_dims_rope, cfg.rope_theta);
  D.transformer_blocks.reserve(static_cast<size_t>(cfg.num_layers));
  for (int i = 0; i < cfg.num_layers; ++i)
    D.transformer_blocks.emplace_back(w, "transformer_blocks." + std::to_string(i), C, M, hd);
  D.single_transformer_blocks.reserve(static_cast<size_t>(cfg.num_single_layers));
  for (int i = 0; i < cfg.num_single_layers; ++i)
    D.single_transformer_blocks.emplace_back(w, "single_transformer_blocks." + std::to_string(i), C,
                                             M, hd);
  D.norm_out = nn::AdaLayerNormContinuous(w, "norm_out", C, /*bias=*/false);
  D.proj_out = w.linear("proj_out", C, cfg.out_channels, false);

  DiTSpec spec;
  spec.class_name = "Flux2Transformer2DModel";
  using K = DiTInput::Kind;
  spec.inputs = {{"hidden_states"},
                 {"encoder_hidden_states"},
                 {"timestep"},
                 {"img_ids", true, K::PositionIds},
                 {"txt_ids", true, K::PositionIds},
                 {"guidance", false}};
  spec.cp_plan = flux2ContextParallelPlan();
  const Impl* m = d_.get();
  Impl* mk = d_.get();  // the KV mode's per-forward state
  spec.prepare = [mk](TransformerInputs& in) { prepareKV(*mk, in); };
  spec.embed = [this, m, mk](const TransformerInputs& in, DiTState& s) {
    const auto g = in.find("guidance");
    const at::Tensor temb =
        timeEmbedding(in.at("timestep"), g == in.end() ? at::Tensor() : g->second);
    s.silu_temb = at::silu(temb);
    s.modulation[kModImg] = m->mod_img(s.silu_temb);
    s.modulation[kModTxt] = m->mod_txt(s.silu_temb);
    s.modulation[kModSingle] = m->mod_single(s.silu_temb);
    s.hidden_states = m->x_embedder->forward(in.at("hidden_states"));
    s.encoder_hidden_states = m->context_embedder->forward(in.at("encoder_hidden_states"));
    std::tie(s.rope_cos, s.rope_sin) =
        m->pos_embed(at::cat({in.at("txt_ids"), in.at("img_ids")}, 0));
    if (mk->kv_mode == Impl::KVMode::Extract) {
      // The references' stream: modulated with the fixed timestep 0 (diffusers'
      // ref_fixed_timestep), their own rotary tables.
      auto ref = std::make_unique<flux2::Flux2ReferenceStream>();
      ref->hidden = m->x_embedder->forward(mk->ref_in);
      const at::Tensor rtemb = at::silu(timeEmbedding(at::zeros_like(in.at("timestep")),
                                                      g == in.end() ? at::Tensor() : g->second));
      ref->mod_img = m->mod_img(rtemb);
      ref->mod_single = m->mod_single(rtemb);
      std::tie(ref->cos, ref->sin) = m->pos_embed(mk->ref_ids);
      mk->ref = std::move(ref);
      mk->ref_in = at::Tensor();
      mk->ref_ids = at::Tensor();
    }
  };
  spec.stages.push_back(
      {"transformer_blocks", cfg.num_layers, nullptr, [m, mk](int i, DiTState& s) {
         const auto& block = m->transformer_blocks[static_cast<size_t>(i)];
         if (mk->kv_mode != Impl::KVMode::Off) {
           std::tie(s.encoder_hidden_states, s.hidden_states) = block.forwardKV(
               s.hidden_states, s.encoder_hidden_states, s.modulation.at(kModImg),
               s.modulation.at(kModTxt), s.rope_cos, s.rope_sin, s.attention, s.attention_cache,
               mk->kv->double_[static_cast<size_t>(i)], mk->ref.get());
           return;
         }
         std::tie(s.encoder_hidden_states, s.hidden_states) = block(
             s.hidden_states, s.encoder_hidden_states, s.modulation.at(kModImg),
             s.modulation.at(kModTxt), s.rope_cos, s.rope_sin, s.attention, s.attention_cache);
       }});
  spec.stages.push_back(
      {"single_transformer_blocks", cfg.num_single_layers, [](DiTState& s) { s.joinStreams(); },
       [m, mk](int i, DiTState& s) {
         const auto& block = m->single_transformer_blocks[static_cast<size_t>(i)];
         if (mk->kv_mode != Impl::KVMode::Off) {
           s.hidden_states = block.forwardKV(
               s.hidden_states, s.modulation.at(kModSingle), s.rope_cos, s.rope_sin, s.attention,
               s.attention_cache, mk->kv->single_[static_cast<size_t>(i)], mk->ref.get());
           return;
         }
         s.hidden_states = block(s.hidden_states, s.modulation.at(kModSingle), s.rope_cos,
                                 s.rope_sin, s.attention, s.attention_cache);
       }});
  spec.finalize = [m, mk](const DiTState& s) {
    mk->ref.reset();  // the references' stream ends with the blocks
    return m->proj_out->forward(m->norm_out(s.imageStream(), s.silu_temb));
  };
  spec.flops = [c = cfg](int64_t img, int64_t txt) { return flops(c, img, txt); };
  finishLoading(std::move(spec));
}

// The KV mode of one forward (Flux2KVCache's comment): cuts the reference tokens off the whole
// inputs before the context-parallel split (every rank keeps all of them).
void Flux2Transformer2DModel::prepareKV(Impl& D, TransformerInputs& in) {
  D.kv_mode = Impl::KVMode::Off;
  D.ref_in = at::Tensor();
  D.ref_ids = at::Tensor();
  D.ref.reset();
  Flux2KVCache* kv = D.kv;
  if (!kv) return;
  const std::string who = "Flux2Transformer2DModel::forward (KV cache): ";
  at::Tensor& hs = in.at("hidden_states");
  at::Tensor& ids = in.at("img_ids");
  const int64_t n = kv->numRefTokens(), S = hs.size(1);
  if (ids.size(0) != S)
    throw std::invalid_argument(who + "img_ids holds " + std::to_string(ids.size(0)) +
                                " positions for " + std::to_string(S) + " hidden_states tokens");
  if (!kv->filled() || kv->recompute()) {
    if (S <= n)
      throw std::invalid_argument(
          who + "an extracting forward needs the image tokens followed by " + std::to_string(n) +
          " reference tokens; hidden_states holds " + std::to_string(S));
    D.ref_in = hs.narrow(1, S - n, n);
    D.ref_ids = ids.narrow(0, S - n, n);
    hs = hs.narrow(1, 0, S - n);
    ids = ids.narrow(0, 0, S - n);
    kv->clear();
    kv->imgTokens_ = S - n;
    kv->batch_ = hs.size(0);
    kv->double_.resize(D.transformer_blocks.size());
    kv->single_.resize(D.single_transformer_blocks.size());
    D.kv_mode = Impl::KVMode::Extract;
    return;
  }
  if (hs.size(0) != kv->batch_)
    throw std::invalid_argument(who + "batch " + std::to_string(hs.size(0)) +
                                " differs from the extracting forward's " +
                                std::to_string(kv->batch_));
  if (S == kv->imgTokens_ + n) {
    hs = hs.narrow(1, 0, kv->imgTokens_);
    ids = ids.narrow(0, 0, kv->imgTokens_);
  } else if (S != kv->imgTokens_) {
    throw std::invalid_argument(who + "a cached forward takes the " +
                                std::to_string(kv->imgTokens_) + " image tokens (optionally " +
                                "followed by the " + std::to_string(n) +
                                " reference tokens); hidden_states holds " + std::to_string(S));
  }
  D.kv_mode = Impl::KVMode::Cached;
}

Flux2Transformer2DModel::~Flux2Transformer2DModel() = default;
const Flux2TransformerConfig& Flux2Transformer2DModel::config() const { return d_->cfg; }
void Flux2Transformer2DModel::setKVCache(Flux2KVCache* cache) { d_->kv = cache; }
Flux2KVCache* Flux2Transformer2DModel::kvCache() const { return d_->kv; }

std::pair<at::Tensor, at::Tensor> Flux2Transformer2DModel::rotaryTables(
    const at::Tensor& txt_ids, const at::Tensor& img_ids) const {
  const std::string who = "Flux2Transformer2DModel::rotaryTables: ";
  return d_->pos_embed(
      at::cat({positionIds2d(txt_ids, who, "txt_ids"), positionIds2d(img_ids, who, "img_ids")}, 0));
}

at::Tensor Flux2Transformer2DModel::timeEmbedding(const at::Tensor& timestep,
                                                  const at::Tensor& guidance) const {
  const auto& D = *d_;
  const auto dt = computeDtype();
  const auto dev = device();
  const int64_t tg = D.cfg.timestep_guidance_channels;
  at::Tensor t = timestep.to(dev, dt) * 1000;
  at::Tensor temb = D.timestep_embedder(nn::timestepProjection(t, tg).to(dt));
  if (D.cfg.guidance_embeds) {
    if (!guidance.defined())
      throw std::invalid_argument(
          "Flux2Transformer2DModel: this transformer needs a guidance value (guidance_embeds)");
    at::Tensor g = guidance.to(dev, dt) * 1000;
    temb = temb + D.guidance_embedder(nn::timestepProjection(g, tg).to(dt));
  }
  return temb;
}

double Flux2Transformer2DModel::flops(const Flux2TransformerConfig& c, int64_t img, int64_t txt) {
  const double C = c.innerDim(), M = c.mlpHidden(), S = static_cast<double>(img + txt);
  const double attn = 4.0 * S * S * C;
  const double dbl = 2.0 * S * C * C * 4 + 2.0 * S * C * (2 * M) + 2.0 * S * M * C + attn;
  const double sgl = 2.0 * S * C * (3 * C + 2 * M) + 2.0 * S * (C + M) * C + attn;
  return c.num_layers * dbl + c.num_single_layers * sgl;
}

}  // namespace dit
