#include "backend/models/flux/flux_runtime.h"

#include <ATen/ATen.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl.h"
#include "backend/models/dual_stream_runtime.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/models/text_encoders/modeling_clip.h"
#include "backend/models/text_encoders/modeling_t5.h"
#include "backend/pipelines/flux/pipeline_flux.h"

namespace dit {

FamilyRuntime fluxRuntime() {
  FamilyRuntime r;
  r.pipeline_class = "FluxPipeline";
  r.loadPipeline = [](const ModelFolder& model,
                      const PipelineOptions& opts) -> std::unique_ptr<DiffusionPipeline> {
    return std::make_unique<FluxPipeline>(model, opts);
  };
  r.loadTransformer =
      [](const nlohmann::json& config, const std::string& file, WeightSource& w,
         const TransformerParallelism& par) -> std::unique_ptr<DiffusionTransformer> {
    return std::make_unique<FluxTransformer2DModel>(parseFluxTransformerConfig(config, file), w,
                                                    par);
  };
  r.exampleInputs = [](const nlohmann::json& config, const std::string& file, const BenchShape& sh,
                       uint64_t seed, bool negative) {
    const FluxTransformerConfig c = parseFluxTransformerConfig(config, file);
    auto gen = at::detail::createCPUGenerator(seed);
    TransformerInputs in = dualStreamExampleInputs(gen, sh, c.in_channels, c.joint_attention_dim,
                                                   c.guidance_embeds, negative);
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    const int64_t B = sh.batch, H = sh.image_h, W = sh.image_w, L = sh.text_tokens;
    in["pooled_projections"] = at::randn({B, c.pooled_projection_dim}, gen, f32);
    // FluxPipeline._prepare_latent_image_ids: (0, row, col); text ids are zeros.
    at::Tensor rows = at::arange(H, f32).unsqueeze(1).expand({H, W});
    at::Tensor cols = at::arange(W, f32).unsqueeze(0).expand({H, W});
    in["img_ids"] = at::stack({at::zeros({H, W}, f32), rows, cols}, -1).reshape({H * W, 3});
    in["txt_ids"] = at::zeros({L, 3}, f32);
    return in;
  };
  r.traffic = [](const nlohmann::json& config, const std::string& file, const Strategy& s, int rank,
                 const BenchShape& sh, uint64_t es) {
    // fluxShardingPlan: attn.to_out.0 + ff.net.2 (image stream), attn.to_add_out +
    // ff_context.net.2 (text stream) per double block; proj_out per single block; the gathered
    // AdaLN modulations norm1.linear + norm1_context.linear (6 C each) and norm.linear (3 C).
    const FluxTransformerConfig c = parseFluxTransformerConfig(config, file);
    DualStreamTrafficShape m = dualStreamTrafficShape(c, 2, 1);
    m.gathered_per_double = 12 * c.innerDim();
    m.gathered_per_single = 3 * c.innerDim();
    return dualStreamTraffic(m, s, rank, sh, es);
  };
  r.buildComponent = [](const ModelFolder& m, const std::string& component,
                        WeightSource& w) -> std::string {
    const FluxPipelineConfig& c = fluxConfig(m);
    if (component == "text_encoder") {
      CLIPTextModel model(c.text_encoder, w);
      return "model";
    }
    if (component == "text_encoder_2") {
      T5EncoderModel model(c.text_encoder_2, w);
      return "model";
    }
    if (component == "vae") {
      AutoencoderKL model(c.vae, w);
      return "diffusion_pytorch_model";
    }
    if (component == "tokenizer" || component == "tokenizer_2" || component == "scheduler")
      return "";
    throw std::invalid_argument("FluxPipeline has no component '" + component + "' to build");
  };
  return r;
}

}  // namespace dit
