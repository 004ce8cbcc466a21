#include "backend/models/flux2/flux2_runtime.h"

#include <ATen/ATen.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl_flux2.h"
#include "backend/models/dual_stream_runtime.h"
#include "backend/models/flux2/transformer_flux2.h"
#include "backend/models/text_encoders/modeling_qwen3.h"
#include "backend/pipelines/flux2/pipeline_flux2.h"
#include "backend/pipelines/flux2/pipeline_flux2_kv.h"

namespace dit {

FamilyRuntime flux2KleinRuntime() {
  FamilyRuntime r;
  r.pipeline_class = "Flux2KleinPipeline";
  r.loadPipeline = [](const ModelFolder& model,
                      const PipelineOptions& opts) -> std::unique_ptr<DiffusionPipeline> {
    // The -kv checkpoints (Flux2KleinKVPipeline): the references' K/V computed once.
    if (model.pipeline_class == "Flux2KleinKVPipeline")
      return std::make_unique<Flux2KleinKVPipeline>(model, opts,
                                                    loadFlux2PromptEncoder(model, opts));
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
    TransformerInputs in = dualStreamExampleInputs(gen, sh, c.in_channels, c.joint_attention_dim,
                                                   c.guidance_embeds, negative);
    // Flux2KleinPipeline: 4-axis ids (T, H, W, L); image (0, row, col, 0), text (0, 0, 0, l).
    in["img_ids"] = Flux2KleinPipeline::latentIds(sh.image_h, sh.image_w);
    in["txt_ids"] = Flux2KleinPipeline::textIds(sh.text_tokens);
    return in;
  };
  r.traffic = [](const nlohmann::json& config, const std::string& file, const Strategy& s, int rank,
                 const BenchShape& sh, uint64_t es) {
    // flux2ShardingPlan: attn.to_out.0 + ff.linear_out (image stream), attn.to_add_out +
    // ff_context.linear_out (text stream) per double block; the fused attn.to_out per single
    // block.
    const Flux2TransformerConfig c = parseFlux2TransformerConfig(config, file);
    return dualStreamTraffic(dualStreamTrafficShape(c, 2, 1), s, rank, sh, es);
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
