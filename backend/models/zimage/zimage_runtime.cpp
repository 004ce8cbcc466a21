#include "backend/models/zimage/zimage_runtime.h"

#include <ATen/ATen.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl.h"
#include "backend/models/text_encoders/modeling_qwen3.h"
#include "backend/models/zimage/transformer_zimage.h"
#include "backend/pipelines/prompt_encoding.h"
#include "backend/pipelines/zimage/pipeline_zimage.h"

namespace dit {

FamilyRuntime zimageRuntime() {
  FamilyRuntime r;
  r.pipeline_class = "ZImagePipeline";
  r.loadPipeline = [](const ModelFolder& model,
                      const PipelineOptions& opts) -> std::unique_ptr<DiffusionPipeline> {
    // Own-rank: only the encoding rank of each group holds the text side.
    return std::make_unique<ZImagePipeline>(
        model, opts,
        encodesPrompts(opts) ? std::make_unique<ZImagePromptEncoder>(model, opts) : nullptr);
  };
  r.loadTransformer =
      [](const nlohmann::json& config, const std::string& file, WeightSource& w,
         const TransformerParallelism& par) -> std::unique_ptr<DiffusionTransformer> {
    return std::make_unique<ZImageTransformer2DModel>(parseZImageTransformerConfig(config, file), w,
                                                      par);
  };
  r.exampleInputs = [](const nlohmann::json& config, const std::string& file, const BenchShape& sh,
                       uint64_t seed, bool negative) {
    const ZImageTransformerConfig c = parseZImageTransformerConfig(config, file);
    auto gen = at::detail::createCPUGenerator(seed);
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    const int64_t B = sh.batch, p = c.patch_size, L = sh.text_tokens;
    // The latents in ZImagePipeline's layout [B, C, h, w] (the transformer patchifies them).
    at::Tensor x = at::randn({B, c.in_channels, sh.image_h * p, sh.image_w * p}, gen, f32);
    at::Tensor pos = at::randn({B, L, c.cap_feat_dim}, gen, f32);
    at::Tensor neg = at::randn({B, L, c.cap_feat_dim}, gen, f32);
    return TransformerInputs{{"hidden_states", x},
                             {"encoder_hidden_states", negative ? neg : pos},
                             {"timestep", at::full({B}, 0.75, f32)}};
  };
  r.traffic = [](const nlohmann::json& config, const std::string& file, const Strategy& s, int rank,
                 const BenchShape& sh, uint64_t es) {
    // zimageShardingPlan: attention.to_out.0 and feed_forward.w2 RowwiseParallel in every block.
    // A noise_refiner block (image stream) and the context_refiner block of the same index (text
    // stream) send what one dual-stream block does (two rowwise outputs per stream, attention
    // volume over both streams); the main layers are single-stream blocks with two rowwise
    // outputs. Every sequence is counted padded to 32 rows, as the model sends it.
    const ZImageTransformerConfig c = parseZImageTransformerConfig(config, file);
    auto padded = [](int64_t n) {
      return (n + kZImageSeqMultiOf - 1) / kZImageSeqMultiOf * kZImageSeqMultiOf;
    };
    BenchShape p = sh;  // the padded image tokens as one row of the grid
    p.image_h = 1;
    p.image_w = padded(sh.imageTokens());
    p.text_tokens = padded(sh.text_tokens);
    DualStreamTrafficShape m;
    m.num_layers = c.n_refiner_layers;
    m.num_single_layers = c.n_layers;
    m.rowwise_per_stream = 2;
    m.rowwise_per_single = 2;
    m.heads = c.n_heads;
    m.head_dim = c.headDim();
    m.out_channels = c.patchFeatures();
    return dualStreamTraffic(m, s, rank, p, es);
  };
  r.buildComponent = [](const ModelFolder& m, const std::string& component,
                        WeightSource& w) -> std::string {
    const ZImagePipelineConfig& c = zimageConfig(m);
    if (component == "text_encoder") {
      Qwen3Model model(c.text_encoder, w);
      return "model";
    }
    if (component == "vae") {
      AutoencoderKL model(c.vae, w);
      return "diffusion_pytorch_model";
    }
    if (component == "tokenizer" || component == "scheduler") return "";
    throw std::invalid_argument("ZImagePipeline has no component '" + component + "' to build");
  };
  return r;
}

}  // namespace dit
