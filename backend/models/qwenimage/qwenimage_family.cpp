#include "backend/models/qwenimage/qwenimage_family.h"

#include <algorithm>
#include <memory>
#include <string>

#include "backend/io/model_folder.h"
#include "backend/models/autoencoders/autoencoder_kl_qwenimage_config.h"
#include "backend/models/family_request.h"
#include "backend/models/qwenimage/qwenimage_plan.h"
#include "backend/models/text_encoders/qwen3_plan.h"
#include "backend/models/vae_decode_memory.h"
#include "backend/pipelines/qwenimage/qwenimage_pipeline_config.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

namespace {
// QwenImagePipeline.__call__'s true_cfg_scale: a knob of this family. Its default is diffusers'
// (4.0, unlike FluxPipeline's 1.0): a negative prompt alone turns true CFG on.
FieldSpec trueCfgScaleKnob() {
  return knobField("true_cfg_scale", FieldType::Float, 4.0, 0, 100, "",
                   "true CFG with the negative prompt when > 1 (a second pass per step)",
                   "true_cfg_scale");
}

// The whole Qwen2.5-VL language model (last hidden state: every layer and the final norm; lm_head
// and the vision tower are not loaded) under qwen3ShardingPlan: a folder's memory facts and the
// known real-size model's.
FamilyMemoryFacts qwenImageTextEncoderFacts(const Qwen3Config& te, int tp, int64_t elementBytes) {
  const int64_t eb = std::max<int64_t>(1, elementBytes);
  const ParameterTable table = qwen3ParameterTable(te, -1, true, "F32", eb);
  std::string reason;
  const ShardingPlan plan = qwen3ShardingPlan(te).resolve(table, tp, &reason);
  FamilyMemoryFacts r;
  if (!reason.empty()) r.note = "text encoder replicated on every tp rank: " + reason;
  r.text_encoder_bytes = plan.bytesPerRank(table, std::max(1, tp), eb);
  r.text_encoder_layer_bytes = qwen3LayerBytesPerRank(te, tp, eb);
  return r;
}
}  // namespace

FamilySpec qwenImageFamily() {
  FamilySpec f;
  f.key = "qwenimage";
  f.display_name = "Qwen-Image";
  f.pipeline_class = "QwenImagePipeline";
  f.transformer_class = "QwenImageTransformer2DModel";
  f.components = {"transformer", "text_encoder", "tokenizer", "vae", "scheduler"};
  // Text-to-image; step caching through the DiT driver's seam; LoRA in the diffusers/PEFT layout
  // (transformer.<module>.lora_A/B) on every loaded linear, fused q/k/v parts included. No
  // img2img / inpaint yet.
  f.caps.step_cache = true;
  f.caps.lora_formats = {"diffusers"};
  f.parse = [](const ModelFolder& folder) -> std::shared_ptr<const PipelineConfig> {
    return std::make_shared<QwenImagePipelineConfig>(
        parseQwenImagePipelineConfig(folder.path, folder.transformer_class));
  };
  f.dims = [](const nlohmann::json& config, const std::string& file) {
    return qwenImageModelDims(parseQwenImageTransformerConfig(config, file), 8);
  };
  f.memory = [](const ModelFolder& m, int tp, int64_t elementBytes) {
    const QwenImagePipelineConfig& c = qwenImageConfig(m);
    FamilyMemoryFacts r = qwenImageTextEncoderFacts(c.text_encoder, tp, elementBytes);
    r.vae_decoder_channels = c.vae.base_dim * c.vae.dim_mult.front();
    r.vae_decoder = vaeDecoderShape(c.vae);
    return r;
  };
  f.facts = [](const ModelFolder& m) {
    const QwenImagePipelineConfig& c = qwenImageConfig(m);
    const QwenImageTransformerConfig& t = c.transformer;
    return std::vector<ModelFact>{
        {"family", "family", "Qwen-Image"},
        {"blocks", "blocks", std::to_string(t.num_layers) + " double"},
        {"heads", "attention",
         std::to_string(t.num_attention_heads) + " heads x " +
             std::to_string(t.attention_head_dim) + " head dim (inner " +
             std::to_string(t.innerDim()) + ")"},
        {"text_encoders", "text encoder",
         "Qwen2.5-VL language model (" + std::to_string(c.text_encoder.num_hidden_layers) +
             " layers, last hidden state), joint_attention_dim " +
             std::to_string(t.joint_attention_dim)},
        {"guidance", "guidance",
         "true CFG when true_cfg_scale > 1 and a negative prompt is given (norm rescale); "
         "guidance is ignored"},
        {"latent_channels", "latent channels", std::to_string(c.vae.z_dim)},
    };
  };
  f.known_models = [] {
    // diffusers' defaults are Qwen-Image's: 60 dual-stream blocks, 24 heads x 128 (inner 3072),
    // joint_attention_dim 3584, in_channels 64, out_channels 16, axes_dims_rope (16, 56, 56).
    // Other components: the Qwen2.5-VL-7B language model without lm_head (7.07 B) and the
    // AutoencoderKLQwenImage (0.127 B).
    // Qwen2.5-VL-7B's text config: 28 layers, hidden 3584, 28 heads x 128 (4 KV heads), q/k/v
    // biases, no q/k norm, intermediate 18944, vocab 152064.
    Qwen3Config te;
    te.vocab_size = 152064;
    te.hidden_size = 3584;
    te.intermediate_size = 18944;
    te.num_hidden_layers = 28;
    te.num_attention_heads = 28;
    te.num_key_value_heads = 4;
    te.qk_norm = false;
    te.qkv_bias = true;
    const double vae = 0.127e9;
    return std::vector<KnownModel>{
        {"Qwen-Image", qwenImageModelDims(QwenImageTransformerConfig{}, 8), 7.07e9 + vae, 512,
         [te](int tp, int64_t eb) {
           FamilyMemoryFacts r = qwenImageTextEncoderFacts(te, tp, eb);
           r.vae_decoder_channels = 96;  // base_dim x dim_mult[0]
           // diffusers' AutoencoderKLQwenImage defaults are Qwen-Image's VAE.
           r.vae_decoder = vaeDecoderShape(AutoencoderKLQwenImageConfig{});
           return r;
         },
         vae}};
  };
  f.request = [family = f.display_name, pipeline = f.pipeline_class](const ModelFolder& m) {
    // QwenImagePipeline.__call__: sizes floored to 2 * (size // (vae_scale_factor * 2)).
    RequestSpec s = folderRequestBase(m, family, pipeline);
    s.default_steps = 50;
    s.size.rounding = SizeRule::Rounding::Floor;
    s.size.source = "QwenImagePipeline.prepare_latents";
    // guidance_scale is for guidance-distilled transformers (guidance_embeds), which this family
    // does not run: ignored as diffusers ignores it (with a warning).
    s.at("guidance").not_read =
        "QwenImagePipeline reads guidance_scale only for guidance-distilled transformers; its "
        "CFG is true_cfg_scale with a negative prompt";
    s.fields.push_back(trueCfgScaleKnob());
    s.at("negative_prompt").read = true;
    // uncond + s (cond - uncond), then each token rescaled to the conditional one's norm.
    s.guider.kind = GuiderSpec::Kind::TrueCfg;
    s.guider.scale_field = "true_cfg_scale";
    s.guider.threshold = 1.0;
    s.guider.rescale = GuiderSpec::Rescale::PerTokenNorm;
    s.guider.requirement = "a negative prompt and true_cfg_scale > 1";
    return s;
  };
  f.knobs = {trueCfgScaleKnob()};
  return f;
}

}  // namespace dit
