#include "backend/models/qwenimage/qwenimage_runtime.h"

#include <ATen/ATen.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl_qwenimage.h"
#include "backend/models/qwenimage/transformer_qwenimage.h"
#include "backend/models/text_encoders/modeling_qwen3.h"
#include "backend/pipelines/qwenimage/pipeline_qwenimage.h"

namespace dit {

FamilyRuntime qwenImageRuntime() {
  FamilyRuntime r;
  r.pipeline_class = "QwenImagePipeline";
  r.loadPipeline = [](const ModelFolder& model,
                      const PipelineOptions& opts) -> std::unique_ptr<DiffusionPipeline> {
    return std::make_unique<QwenImagePipeline>(model, opts);
  };
  r.loadTransformer =
      [](const nlohmann::json& config, const std::string& file, WeightSource& w,
         const TransformerParallelism& par) -> std::unique_ptr<DiffusionTransformer> {
    return std::make_unique<QwenImageTransformer2DModel>(
        parseQwenImageTransformerConfig(config, file), w, par);
  };
  r.exampleInputs = [](const nlohmann::json& config, const std::string& file, const BenchShape& sh,
                       uint64_t seed, bool negative) {
    const QwenImageTransformerConfig c = parseQwenImageTransformerConfig(config, file);
    auto gen = at::detail::createCPUGenerator(seed);
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    const int64_t B = sh.batch, H = sh.image_h, W = sh.image_w, L = sh.text_tokens;
    at::Tensor hs = at::randn({B, H * W, c.in_channels}, gen, f32);
    at::Tensor encPos = at::randn({B, L, c.joint_attention_dim}, gen, f32);
    at::Tensor encNeg = at::randn({B, L, c.joint_attention_dim}, gen, f32);
    return TransformerInputs{
        {"hidden_states", hs},
        {"encoder_hidden_states", negative ? encNeg : encPos},
        {"timestep", at::full({B}, 0.75, f32)},
        {"img_shapes", at::tensor(std::vector<int64_t>{1, H, W}, at::kLong).view({1, 3})}};
  };
  r.traffic = [](const nlohmann::json& config, const std::string& file, const Strategy& s, int rank,
                 const BenchShape& sh, uint64_t es) {
    // qwenImageShardingPlan: attn.to_out.0 + img_mlp.net.2 (image stream), attn.to_add_out +
    // txt_mlp.net.2 (text stream) per block; no single-stream blocks.
    const QwenImageTransformerConfig c = parseQwenImageTransformerConfig(config, file);
    DualStreamTrafficShape m;
    m.num_layers = c.num_layers;
    m.num_single_layers = 0;
    m.rowwise_per_stream = 2;
    m.rowwise_per_single = 0;
    m.heads = c.num_attention_heads;
    m.head_dim = c.attention_head_dim;
    m.out_channels = c.projOut();
    return dualStreamTraffic(m, s, rank, sh, es);
  };
  r.buildComponent = [](const ModelFolder& m, const std::string& component,
                        WeightSource& w) -> std::string {
    const QwenImagePipelineConfig& c = qwenImageConfig(m);
    if (component == "text_encoder") {
      Qwen3Model model(c.text_encoder, w);
      return "model";
    }
    if (component == "vae") {
      AutoencoderKLQwenImage model(c.vae, w);
      return "diffusion_pytorch_model";
    }
    if (component == "tokenizer" || component == "scheduler") return "";
    throw std::invalid_argument("QwenImagePipeline has no component '" + component + "' to build");
  };
  return r;
}

}  // namespace dit
