#include "backend/models/flux/transformer_flux.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <tuple>

#include "backend/io/weight_source.h"
#include "backend/models/flux/flux_blocks.h"
#include "backend/models/flux/flux_lora.h"
#include "backend/models/flux/flux_plan.h"
#include "backend/nn/adaln.h"
#include "backend/nn/embeddings.h"
#include "parallel/tensor_parallel/layers.h"

namespace dit {

struct FluxTransformer2DModel::Impl {
  FluxTransformerConfig cfg;
  nn::LinearPtr x_embedder, context_embedder, proj_out;
  // time_text_embed: CombinedTimestep(Guidance)TextProjEmbeddings.
  nn::MLPEmbed timestep_embedder, guidance_embedder, text_embedder;
  nn::RotaryPosEmbed pos_embed;  // diffusers FluxPosEmbed (theta 10000)
  std::vector<flux::FluxTransformerBlock> transformer_blocks;
  std::vector<flux::FluxSingleTransformerBlock> single_transformer_blocks;
  nn::AdaLayerNormContinuous norm_out;
  // Under tensor parallelism with the modulation linears split and gathered (fluxShardingPlan):
  // every block's AdaLN linear in DiTState::adaln_emb order (block i's norm1 at 2i, norm1_context
  // at 2i + 1, single block j's norm at 2 num_layers + j), computed before the blocks with one
  // all-gather per forward instead of one per linear. Empty otherwise (each block computes its
  // own; nothing is computed for blocks that First Block Cache skips).
  std::vector<const tensor_parallel::Linear*> coalesced_modulation;
};

namespace {
std::shared_ptr<const ShardingPlan> planOrDefault(const FluxTransformerConfig& cfg,
                                                  std::shared_ptr<const ShardingPlan> plan) {
  return plan ? std::move(plan) : std::make_shared<const ShardingPlan>(fluxShardingPlan(cfg));
}
}  // namespace

FluxTransformer2DModel::FluxTransformer2DModel(const FluxTransformerConfig& cfg,
                                               WeightSource& source, FluxParallelism par,
                                               std::shared_ptr<const ShardingPlan> plan)
    : DiTModel(source, par, planOrDefault(cfg, std::move(plan)), fluxParameterTable(cfg),
               "fluxParameterTable"),
      d_(new Impl) {
  auto& D = *d_;
  D.cfg = cfg;
  WeightLoader& w = loader();
  const int64_t C = cfg.innerDim(), M = cfg.mlpHidden(), hd = cfg.attention_head_dim;
  D.x_embedder = w.linear("x_embedder", cfg.in_channels, C);
  D.context_embedder = w.linear("context_embedder", cfg.joint_attention_dim, C);
  D.timestep_embedder = nn::MLPEmbed(w, "time_text_embed.timestep_embedder", 256, C);
  if (cfg.guidance_embeds)
    D.guidance_embedder = nn::MLPEmbed(w, "time_text_embed.guidance_embedder", 256, C);
  D.text_embedder = nn::MLPEmbed(w, "time_text_embed.text_embedder", cfg.pooled_projection_dim, C);
  D.pos_embed = nn::RotaryPosEmbed(cfg.axes_dims_rope);
  D.transformer_blocks.reserve(static_cast<size_t>(cfg.num_layers));
  for (int i = 0; i < cfg.num_layers; ++i)
    D.transformer_blocks.emplace_back(w, "transformer_blocks." + std::to_string(i), C, M, hd);
  D.single_transformer_blocks.reserve(static_cast<size_t>(cfg.num_single_layers));
  for (int i = 0; i < cfg.num_single_layers; ++i)
    D.single_transformer_blocks.emplace_back(w, "single_transformer_blocks." + std::to_string(i), C,
                                             M, hd);
  D.norm_out = nn::AdaLayerNormContinuous(w, "norm_out", C);
  D.proj_out = w.linear("proj_out", C, cfg.out_channels);
  {
    std::vector<const tensor_parallel::Linear*> mods;
    bool gathers = false;
    auto add = [&](const nn::LinearPtr& l) {
      mods.push_back(l.get());
      const auto* c = dynamic_cast<const tensor_parallel::ColumnParallelLinear*>(l.get());
      gathers = gathers || (c && c->gathers());
    };
    for (const auto& b : D.transformer_blocks) {
      add(b.norm1.linear());
      add(b.norm1_context.linear());
    }
    for (const auto& b : D.single_transformer_blocks) add(b.norm.linear());
    if (gathers) D.coalesced_modulation = std::move(mods);
  }

  DiTSpec spec;
  spec.class_name = "FluxTransformer2DModel";
  using K = DiTInput::Kind;
  spec.inputs = {
      {"hidden_states"},  {"encoder_hidden_states"},         {"pooled_projections"},
      {"timestep"},       {"img_ids", true, K::PositionIds}, {"txt_ids", true, K::PositionIds},
      {"guidance", false}};
  spec.cp_plan = fluxContextParallelPlan();
  const Impl* m = d_.get();
  spec.embed = [m](const TransformerInputs& in, DiTState& s) {
    // Conditioning: CombinedTimestep(Guidance)TextProjEmbeddings.
    const auto dt = in.at("hidden_states").scalar_type();
    at::Tensor temb = m->timestep_embedder(nn::timestepProjection(in.at("timestep") * 1000).to(dt));
    if (m->cfg.guidance_embeds) {
      auto g = in.find("guidance");
      if (g == in.end())
        throw std::invalid_argument("this transformer needs a guidance value (guidance_embeds)");
      temb = temb + m->guidance_embedder(nn::timestepProjection(g->second * 1000).to(dt));
    }
    temb = temb + m->text_embedder(in.at("pooled_projections"));
    s.silu_temb = at::silu(temb);
    if (!m->coalesced_modulation.empty())
      s.adaln_emb = tensor_parallel::ColumnParallelLinear::forwardCoalesced(m->coalesced_modulation,
                                                                            s.silu_temb);
    s.hidden_states = m->x_embedder->forward(in.at("hidden_states"));
    s.encoder_hidden_states = m->context_embedder->forward(in.at("encoder_hidden_states"));
    std::tie(s.rope_cos, s.rope_sin) =
        m->pos_embed(at::cat({in.at("txt_ids"), in.at("img_ids")}, 0));
  };
  // The precomputed modulation of entry k, or undefined (the block computes its own).
  auto emb = [](const DiTState& s, size_t k) {
    return k < s.adaln_emb.size() ? s.adaln_emb[k] : at::Tensor();
  };
  spec.stages.push_back(
      {"transformer_blocks", cfg.num_layers, nullptr, [m, emb](int i, DiTState& s) {
         const auto k = 2 * static_cast<size_t>(i);
         std::tie(s.encoder_hidden_states, s.hidden_states) =
             m->transformer_blocks[static_cast<size_t>(i)](
                 s.hidden_states, s.encoder_hidden_states, s.silu_temb, s.rope_cos, s.rope_sin,
                 s.attention, s.attention_cache, emb(s, k), emb(s, k + 1));
       }});
  spec.stages.push_back({"single_transformer_blocks", cfg.num_single_layers,
                         [](DiTState& s) { s.joinStreams(); },
                         [m, emb, n = static_cast<size_t>(cfg.num_layers)](int i, DiTState& s) {
                           s.hidden_states = m->single_transformer_blocks[static_cast<size_t>(i)](
                               s.hidden_states, s.silu_temb, s.rope_cos, s.rope_sin, s.attention,
                               s.attention_cache, emb(s, 2 * n + static_cast<size_t>(i)));
                         }});
  spec.finalize = [m](const DiTState& s) {
    return m->proj_out->forward(m->norm_out(s.imageStream(), s.silu_temb));
  };
  spec.flops = [c = cfg](int64_t img, int64_t txt) { return flops(c, img, txt); };
  finishLoading(std::move(spec));
}

FluxTransformer2DModel::~FluxTransformer2DModel() = default;
const FluxTransformerConfig& FluxTransformer2DModel::config() const { return d_->cfg; }

at::Tensor FluxTransformer2DModel::forward(const at::Tensor& hidden_states,
                                           const at::Tensor& encoder_hidden_states,
                                           const at::Tensor& pooled, const at::Tensor& timestep,
                                           const at::Tensor& img_ids, const at::Tensor& txt_ids,
                                           const at::Tensor& guidance) const {
  TransformerInputs in{{"hidden_states", hidden_states},
                       {"encoder_hidden_states", encoder_hidden_states},
                       {"pooled_projections", pooled},
                       {"timestep", timestep},
                       {"img_ids", img_ids},
                       {"txt_ids", txt_ids}};
  if (guidance.defined()) in.emplace("guidance", guidance);
  return DiTModel::forward(in);
}

double FluxTransformer2DModel::flops(const FluxTransformerConfig& c, int64_t img, int64_t txt) {
  const double C = c.innerDim(), M = c.mlpHidden(), S = static_cast<double>(img + txt);
  const double attn = 4.0 * S * S * C;
  const double dbl = 2.0 * S * C * C * 4 + 2.0 * S * C * M * 2 + attn;  // qkv+out, ff up+down
  const double sgl = 2.0 * S * C * C * 3 + 2.0 * S * C * M + 2.0 * S * (C + M) * C + attn;
  return c.num_layers * dbl + c.num_single_layers * sgl;
}

KohyaLoraMapping FluxTransformer2DModel::kohyaLoraMapping() const { return fluxKohyaTargets; }

}  // namespace dit
