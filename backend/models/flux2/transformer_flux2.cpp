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
  spec.embed = [this, m](const TransformerInputs& in, DiTState& s) {
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
  };
  spec.stages.push_back({"transformer_blocks", cfg.num_layers, nullptr, [m](int i, DiTState& s) {
                           std::tie(s.encoder_hidden_states, s.hidden_states) =
                               m->transformer_blocks[static_cast<size_t>(i)](
                                   s.hidden_states, s.encoder_hidden_states,
                                   s.modulation.at(kModImg), s.modulation.at(kModTxt), s.rope_cos,
                                   s.rope_sin, s.attention, s.attention_cache);
                         }});
  spec.stages.push_back({"single_transformer_blocks", cfg.num_single_layers,
                         [](DiTState& s) { s.joinStreams(); },
                         [m](int i, DiTState& s) {
                           s.hidden_states = m->single_transformer_blocks[static_cast<size_t>(i)](
                               s.hidden_states, s.modulation.at(kModSingle), s.rope_cos, s.rope_sin,
                               s.attention, s.attention_cache);
                         }});
  spec.finalize = [m](const DiTState& s) {
    return m->proj_out->forward(m->norm_out(s.imageStream(), s.silu_temb));
  };
  spec.flops = [c = cfg](int64_t img, int64_t txt) { return flops(c, img, txt); };
  finishLoading(std::move(spec));
}

Flux2Transformer2DModel::~Flux2Transformer2DModel() = default;
const Flux2TransformerConfig& Flux2Transformer2DModel::config() const { return d_->cfg; }

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
