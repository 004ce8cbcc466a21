#include "backend/models/flux2/flux2_family.h"

#include <algorithm>
#include <memory>
#include <string>

#include "backend/io/model_folder.h"
#include "backend/models/autoencoders/autoencoder_kl_config.h"
#include "backend/models/family_facts.h"
#include "backend/models/family_request.h"
#include "backend/models/flux2/flux2_plan.h"
#include "backend/models/text_encoders/qwen3_plan.h"
#include "backend/models/vae_decode_memory.h"
#include "backend/pipelines/flux2/flux2_pipeline_config.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

namespace {

// The Qwen3 / Mistral layers the pipeline runs (up to the largest of text_encoder_out_layers; the
// final norm only when all are run) from qwen3ShardingPlan: the figure Qwen3Model::weightBytes
// reports after a sharded load; the whole encoder when tp does not divide its heads or
// intermediate_size. Shared by a folder's memory facts and the known real-size models'.
FamilyMemoryFacts flux2TextEncoderFacts(const Qwen3Config& te, const std::vector<int>& outLayers,
                                        bool mistral, int tp, int64_t elementBytes) {
  const int64_t eb = std::max<int64_t>(1, elementBytes);
  const int layers = outLayers.empty() ? te.num_hidden_layers
                                       : *std::max_element(outLayers.begin(), outLayers.end());
  // Mistral3's language model: the same decoder tables under "model.language_model.".
  const std::string prefix = mistral ? "model.language_model." : "model.";
  const ParameterTable table =
      qwen3ParameterTable(te, layers, layers == te.num_hidden_layers, "F32", eb, prefix);
  std::string reason;
  const ShardingPlan plan = qwen3ShardingPlan(te, prefix).resolve(table, tp, &reason);
  FamilyMemoryFacts r;
  if (!reason.empty()) r.note = "text encoder replicated on every tp rank: " + reason;
  r.text_encoder_bytes = plan.bytesPerRank(table, std::max(1, tp), eb);
  r.text_encoder_layer_bytes = qwen3LayerBytesPerRank(te, tp, eb, prefix);
  return r;
}

// The published text encoders' text configs (config.json / text_config).
Qwen3Config qwen3Text(int hidden, int intermediate, int layers) {
  Qwen3Config c;  // Qwen3: 32 heads x 128, 8 KV heads, q/k norm, vocab 151936
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.num_key_value_heads = 8;
  return c;
}

}  // namespace

FamilySpec flux2KleinFamily() {
  FamilySpec f;
  f.key = "flux2-klein";
  f.display_name = "FLUX.2 [klein]";
  f.pipeline_class = "Flux2KleinPipeline";
  // The -kv checkpoints: the same components, reference K/V computed at step 0 and reused.
  // FLUX.2 [dev] (Flux2Pipeline): the same transformer class (with the guidance embedding) and
  // VAE, a Mistral3 text encoder (Flux2PipelineConfig::mistral), no CFG.
  f.pipeline_variants = {"Flux2KleinKVPipeline", "Flux2Pipeline"};
  f.transformer_class = "Flux2Transformer2DModel";
  f.components = {"transformer", "text_encoder", "tokenizer", "vae", "scheduler"};
  // Image-to-image and inpainting through the shared loop (Flux2KleinInpaintPipeline), step
  // caching through the DiT driver's seam.
  f.caps.img2img = true;
  f.caps.inpaint = true;
  f.caps.step_cache = true;
  f.caps.lora_formats = {"diffusers"};
  f.parse = [](const ModelFolder& folder) -> std::shared_ptr<const PipelineConfig> {
    return std::make_shared<Flux2PipelineConfig>(
        parseFlux2PipelineConfig(folder.path, folder.transformer_class));
  };
  f.dims = [](const nlohmann::json& config, const std::string& file) {
    return flux2ModelDims(parseFlux2TransformerConfig(config, file), 8);
  };
  f.memory = [](const ModelFolder& m, int tp, int64_t elementBytes) {
    const Flux2PipelineConfig& c = flux2Config(m);
    FamilyMemoryFacts r = flux2TextEncoderFacts(c.text_encoder, c.text_encoder_out_layers,
                                                c.mistral, tp, elementBytes);
    if (!c.vae.block_out_channels.empty())
      r.vae_decoder_channels = c.vae.block_out_channels.front();
    r.vae_decoder = vaeDecoderShape(c.vae);
    return r;
  };
  f.facts = [](const ModelFolder& m) {
    const Flux2PipelineConfig& c = flux2Config(m);
    const Flux2TransformerConfig& t = c.transformer;
    std::string outLayers;
    for (int l : c.text_encoder_out_layers)
      outLayers += (outLayers.empty() ? "" : ", ") + std::to_string(l);
    if (c.mistral)
      return std::vector<ModelFact>{
          {"family", "family", "FLUX.2 [dev]"},
          dualStreamBlocksFact(t),
          attentionHeadsFact(t),
          {"text_encoders", "text encoder",
           "Mistral3 (" + std::to_string(c.text_encoder.num_hidden_layers) +
               " layers; hidden states " + outLayers + "), joint_attention_dim " +
               std::to_string(t.joint_attention_dim)},
          {"guidance", "guidance", "distilled guidance embedding (guidance); no CFG"},
          latentChannelsFact(t.in_channels),
      };
    return std::vector<ModelFact>{
        {"family", "family", c.is_distilled ? "FLUX.2 [klein], distilled" : "FLUX.2 [klein]"},
        dualStreamBlocksFact(t),
        attentionHeadsFact(t),
        {"text_encoders", "text encoder",
         "Qwen3 (" + std::to_string(c.text_encoder.num_hidden_layers) + " layers; hidden states " +
             outLayers + "), joint_attention_dim " + std::to_string(t.joint_attention_dim)},
        {"guidance", "guidance",
         c.is_distilled ? "distilled: guidance is ignored, no CFG"
                        : "classic CFG when guidance > 1 (negative prompt \"\" unless given)"},
        latentChannelsFact(t.in_channels),
    };
  };
  f.known_models = [] {
    auto klein = [](int layers, int single, int heads, int joint) {
      Flux2TransformerConfig c;  // diffusers' defaults (FLUX.2 [dev]) for the rest
      c.num_layers = layers;
      c.num_single_layers = single;
      c.num_attention_heads = heads;
      c.joint_attention_dim = joint;
      c.guidance_embeds = false;
      return flux2ModelDims(c, 8);
    };
    // Text encoders (Qwen3-4B 4.0 B, Qwen3-8B 8.2 B, Mistral-Small-3.1-24B 24 B) + the
    // AutoencoderKLFlux2 (84 M). The encoders as the pipeline loads them (the layers up to the
    // largest of text_encoder_out_layers, sharded under the transformer's tp group).
    Qwen3Config mistral = qwen3Text(5120, 32768, 40);  // Mistral-Small-3.1-24B's text_config
    mistral.vocab_size = 131072;
    mistral.qk_norm = false;
    const double vae = 0.084e9;
    // AutoencoderKLFlux2's defaults (FLUX.2's VAE): block_out_channels (128, 256, 512, 512),
    // layers_per_block 2, 32 latent channels.
    AutoencoderKLConfig vaeConfig;
    vaeConfig.latent_channels = 32;
    vaeConfig.block_out_channels = {128, 256, 512, 512};
    vaeConfig.layers_per_block = 2;
    const VaeDecoderShape vaeShape = vaeDecoderShape(vaeConfig);
    auto encoder = [vaeShape](Qwen3Config te, std::vector<int> outLayers, bool isMistral) {
      return [te, outLayers, isMistral, vaeShape](int tp, int64_t eb) {
        FamilyMemoryFacts r = flux2TextEncoderFacts(te, outLayers, isMistral, tp, eb);
        r.vae_decoder = vaeShape;
        return r;
      };
    };
    return std::vector<KnownModel>{{"FLUX.2 [klein] 4B", klein(5, 20, 24, 7680), 4.0e9 + vae, 512,
                                    encoder(qwen3Text(2560, 9728, 36), {9, 18, 27}, false), vae},
                                   {"FLUX.2 [klein] 9B", klein(8, 24, 32, 12288), 8.2e9 + vae, 512,
                                    encoder(qwen3Text(4096, 12288, 36), {9, 18, 27}, false), vae},
                                   {"FLUX.2 [dev]", flux2ModelDims(Flux2TransformerConfig{}, 8),
                                    24.0e9 + vae, 512, encoder(mistral, {10, 20, 30}, true), vae}};
  };
  f.request = [family = f.display_name](const ModelFolder& m) {
    // Flux2KleinPipeline.__call__ (Flux2KleinInpaintPipeline with an init image).
    const Flux2PipelineConfig& c = flux2Config(m);
    RequestSpec s = folderRequestBase(m, c.mistral ? c.displayName() : family, m.pipeline_class);
    s.default_steps = 50;
    // prepare_latents: 2 * (size // (vae_scale_factor * 2)) latent pixels (floored, with a
    // warning); with an init image the output is the image's size, its area capped at 1024^2.
    s.size.rounding = SizeRule::Rounding::Floor;
    s.size.init_image = SizeRule::FromInitImage::Always;
    s.size.init_image_max_area = 1024 * 1024;
    s.size.source = m.pipeline_class == "Flux2Pipeline" ? "Flux2Pipeline.prepare_latents"
                                                        : "Flux2KleinPipeline.prepare_latents";
    FieldSpec& g = s.at("guidance");
    if (c.mistral) {
      // Flux2Pipeline.__call__: guidance-distilled, guidance_scale feeds the transformer's
      // guidance embedding; one transformer call per step, no negative prompt. (diffusers'
      // default guidance_scale is 4.0, klein's too; the request's common default 3.5 applies.)
      g.read = true;
      g.help = "distilled guidance embedding (no second pass)";
      s.at("negative_prompt").read = false;
      s.at("negative_prompt").not_read =
          "Flux2Pipeline is guidance-distilled: it runs no CFG and takes no negative prompt";
      s.guider = GuiderSpec{};
      s.guider.requirement = "a FLUX.2 model that runs CFG (FLUX.2 [dev] is guidance-distilled)";
      // diffusers has no image-to-image / inpainting pipeline for FLUX.2 [dev]: the shared loop
      // runs Flux2KleinInpaintPipeline's steps with this transformer (and its guidance).
      s.at("init_image").help =
          "image-to-image as Flux2KleinInpaintPipeline does it (diffusers has no FLUX.2 [dev] "
          "image-to-image pipeline): the image to start from";
    } else if (c.is_distilled) {
      // A step-wise distilled model never runs CFG: guidance_scale is ignored (diffusers warns).
      g.not_read =
          "this FLUX.2 [klein] model is step-wise distilled (model_index.json "
          "is_distilled): it runs no CFG and ignores guidance_scale";
      s.at("negative_prompt").not_read = g.not_read;
      s.guider.kind = GuiderSpec::Kind::None;
      s.guider.requirement =
          "a FLUX.2 [klein] model that is not step-wise distilled (this one is: is_distilled)";
    } else {
      // do_classifier_free_guidance: guidance_scale > 1; the negative is "" or the given one.
      g.read = true;
      g.help = "CFG scale, on when > 1 (a second pass per step)";
      s.at("negative_prompt").read = true;
      s.guider.kind = GuiderSpec::Kind::ClassicCfg;
      s.guider.scale_field = "guidance";
      s.guider.threshold = 1.0;
      s.guider.requirement = "guidance > 1 on a model that is not distilled";
    }
    if (m.pipeline_class == "Flux2KleinKVPipeline") {
      // Flux2KleinKVPipeline.__call__ takes no guidance_scale (and defaults to 4 steps): one
      // branch, the references' K/V computed at step 0 and reused.
      g.read = false;
      g.not_read = "Flux2KleinKVPipeline runs no CFG (its __call__ takes no guidance_scale)";
      s.at("negative_prompt").read = false;
      s.at("negative_prompt").not_read = g.not_read;
      s.guider = GuiderSpec{};
      s.guider.requirement =
          "a FLUX.2 [klein] folder of Flux2KleinPipeline (KV folders run no CFG)";
      s.default_steps = 4;
    }
    // diffusers' true_cfg_scale is not an argument of this pipeline: declared as not read, so
    // that a request carrying it (a FLUX.1 preset) is told so instead of refused.
    s.fields.push_back(notReadKnob(
        knobField("true_cfg_scale", FieldType::Float, 1.0, 0, 100, "", "true CFG scale",
                  "true_cfg_scale"),
        c.mistral ? "Flux2Pipeline has no true_cfg_scale (guidance-distilled: guidance feeds its "
                    "guidance embedding)"
                  : "Flux2KleinPipeline has no true_cfg_scale (its CFG scale is guidance)"));
    // Flux2KleinPipeline(image=[...]): each reference checked (Flux2ImageProcessor.
    // check_image_input), scaled to 1024^2 area when larger, centre-cropped to the multiple,
    // encoded (posterior mode, BatchNorm-normalised), packed with T = 10 + 10 i; the output size
    // defaults to the first reference's. diffusers sets no count limit; ours is 6: at 1024^2 each
    // reference adds 4096 tokens to every call, so 6 make the image stream 7x a plain 1024^2
    // generation (28672 tokens); docs/editing.md gives the memory estimate's figures for it.
    ReferenceRule& r = s.references;
    r.max_count = 6;
    r.min_side = 64;
    r.max_aspect = 8;
    r.max_area = 1024 * 1024;
    r.fit = ReferenceRule::Fit::CenterCrop;
    r.output_size_from_first = true;
    r.ids = "(10 + 10 i, row, col, 0) for reference i (0-based), rows and columns from 0 inside it";
    r.source = m.pipeline_class + " (Flux2ImageProcessor)";
    FieldSpec& refs = s.at("reference_images");
    refs.read = true;
    refs.help = "reference images in order (up to 6); the output size defaults to the first's";
    return s;
  };
  return f;
}

}  // namespace dit
