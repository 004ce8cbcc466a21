#include "backend/models/flux2/flux2_runtime.h"

#include <ATen/ATen.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl_flux2.h"
#include "backend/models/flux2/transformer_flux2.h"
#include "backend/models/text_encoders/modeling_qwen3.h"
#include "backend/pipelines/flux2/pipeline_flux2.h"

namespace dit {

FamilyRuntime flux2KleinRuntime() {
  FamilyRuntime r;
  r.pipeline_class = "Flux2KleinPipeline";
  r.loadPipeline = [](const ModelFolder& model,
                      const PipelineOptions& opts) -> std::unique_ptr<DiffusionPipeline> {
    return std::make_unique<Flux2KleinPipeline>(model, opts, loadFlux2PromptEncoder(model, opts));
  };
  r.loadTransformer =
      [](const nlohmann::json& config, const std::string& file, WeightSource& w,
         const TransformerParallelism& par) -> std::unique_ptr<DiffusionTransformer> {
    return std::make_unique<Flux2Transformer2DModel>(parseFlux2TransformerConfig(config, file), w,
                                                     par);
  };
  r.exampleInputs = [](const nlohmann::json& config, const std::string& file, const BenchShape& sh,
                       uint64_t seed, bool negative) {
    const Flux2TransformerConfig c = parseFlux2TransformerConfig(config, file);
    auto gen = at::detail::createCPUGenerator(seed);
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    const int64_t B = sh.batch, H = sh.image_h, W = sh.image_w, L = sh.text_tokens;
    at::Tensor hs = at::randn({B, H * W, c.in_channels}, gen, f32);
    at::Tensor encPos = at::randn({B, L, c.joint_attention_dim}, gen, f32);
    at::Tensor encNeg = at::randn({B, L, c.joint_attention_dim}, gen, f32);
    // Flux2KleinPipeline: 4-axis ids (T, H, W, L); image (0, row, col, 0), text (0, 0, 0, l).
    TransformerInputs in{{"hidden_states", hs},
                         {"encoder_hidden_states", negative ? encNeg : encPos},
                         {"timestep", at::full({B}, 0.75, f32)},
                         {"img_ids", Flux2KleinPipeline::latentIds(H, W)},
                         {"txt_ids", Flux2KleinPipeline::textIds(L)}};
    if (c.guidance_embeds) in["guidance"] = at::full({B}, 3.5, f32);
    return in;
  };
  r.traffic = [](const nlohmann::json& config, const std::string& file, const Strategy& s, int rank,
                 const BenchShape& sh, uint64_t es) {
    // flux2ShardingPlan: attn.to_out.0 + ff.linear_out (image stream), attn.to_add_out +
    // ff_context.linear_out (text stream) per double block; the fused attn.to_out per single
    // block.
    const Flux2TransformerConfig c = parseFlux2TransformerConfig(config, file);
    DualStreamTrafficShape m;
    m.num_layers = c.num_layers;
    m.num_single_layers = c.num_single_layers;
    m.rowwise_per_stream = 2;
    m.rowwise_per_single = 1;
    m.heads = c.num_attention_heads;
    m.head_dim = c.attention_head_dim;
    m.out_channels = c.out_channels;
    return dualStreamTraffic(m, s, rank, sh, es);
  };
  r.buildComponent = [](const ModelFolder& m, const std::string& component,
                        WeightSource& w) -> std::string {
    const Flux2PipelineConfig& c = flux2Config(m);
    if (component == "text_encoder") {
      Qwen3Model model(c.text_encoder, w);
      return "model";
    }
    if (component == "vae") {
      AutoencoderKLFlux2 model(c.vae, c.batch_norm_eps, w);
      return "diffusion_pytorch_model";
    }
    if (component == "tokenizer" || component == "scheduler") return "";
    throw std::invalid_argument("Flux2KleinPipeline has no component '" + component + "' to build");
  };
  return r;
}

}  // namespace dit
