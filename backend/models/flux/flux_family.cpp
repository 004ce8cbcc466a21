#include "backend/models/flux/flux_family.h"

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/io/model_folder.h"
#include "backend/io/safetensors.h"
#include "backend/models/checkpoint_layouts.h"
#include "backend/models/family_facts.h"
#include "backend/models/family_request.h"
#include "backend/models/flux/flux_plan.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"

namespace dit {

FamilySpec fluxFamily() {
  FamilySpec f;
  f.key = "flux1";
  f.display_name = "FLUX.1";
  f.pipeline_class = "FluxPipeline";
  f.transformer_class = "FluxTransformer2DModel";
  f.checkpoint_family = "flux";
  f.components = {"transformer", "text_encoder", "text_encoder_2", "tokenizer",
                  "tokenizer_2", "vae",          "scheduler"};
  f.caps.img2img = true;
  f.caps.inpaint = true;
  f.caps.step_cache = true;
  f.caps.single_file = true;
  f.caps.lora_formats = {"diffusers", "kohya", "bfl"};
  f.parse = [](const ModelFolder& folder) -> std::shared_ptr<const PipelineConfig> {
    if (!folder.components.empty())
      return std::make_shared<FluxPipelineConfig>(parseFluxPipelineSources(folder));
    return std::make_shared<FluxPipelineConfig>(
        parseFluxPipelineConfig(folder.path, folder.transformer_class));
  };
  f.dims = [](const nlohmann::json& config, const std::string& file) {
    return fluxModelDims(parseFluxTransformerConfig(config, file), 8);
  };
  f.memory = [](const ModelFolder& m, int /*tp*/, int64_t elementBytes) {
    // CLIP and T5 whole on every rank (no plan shards them).
    FamilyMemoryFacts r;
    for (const char* te : {"text_encoder", "text_encoder_2"})
      if (m.components.count(te) || std::filesystem::exists(m.component(te)))
        r.text_encoder_bytes +=
            m.componentParameterCount(te, "model") * static_cast<uint64_t>(elementBytes);
    const FluxPipelineConfig& c = fluxConfig(m);
    if (!c.vae.block_out_channels.empty())
      r.vae_decoder_channels = c.vae.block_out_channels.front();
    return r;
  };
  f.facts = [](const ModelFolder& m) {
    const FluxPipelineConfig& c = fluxConfig(m);
    const FluxTransformerConfig& t = c.transformer;
    return std::vector<ModelFact>{
        {"family", "family", "FLUX.1"},
        dualStreamBlocksFact(t),
        attentionHeadsFact(t),
        {"text_encoders", "text encoders",
         "CLIP (" + std::to_string(c.text_encoder.num_hidden_layers) + " layers) + T5 (" +
             std::to_string(c.text_encoder_2.num_layers) + " layers), joint_attention_dim " +
             std::to_string(t.joint_attention_dim)},
        {"guidance", "guidance",
         t.guidance_embeds ? "distilled guidance embedding (--guidance); true CFG with a negative "
                             "prompt (--true-cfg-scale)"
                           : "no guidance embedding (schnell-style); true CFG with a negative "
                             "prompt (--true-cfg-scale)"},
        latentChannelsFact(t.in_channels),
    };
  };
  f.single_file_transformer_config = [](const std::string& file, const std::string& reference) {
    // Hyper-parameters from the tensor shapes; the reference config only supplies what the
    // shapes cannot (the RoPE axes when the head dim is not FLUX.1's 128).
    const CheckpointComponent c = inspectCheckpoint(file).require("transformer", "--model");
    SafetensorsReader r(file);
    FluxTransformerConfig ref;
    if (!reference.empty()) ref = parseFluxTransformerConfig(reference);
    const FluxTransformerConfig cfg =
        fluxConfigFromBfl(r, c.prefix, reference.empty() ? nullptr : &ref);
    return nlohmann::json{{"_class_name", "FluxTransformer2DModel"},
                          {"in_channels", cfg.in_channels},
                          {"out_channels", cfg.out_channels},
                          {"num_layers", cfg.num_layers},
                          {"num_single_layers", cfg.num_single_layers},
                          {"attention_head_dim", cfg.attention_head_dim},
                          {"num_attention_heads", cfg.num_attention_heads},
                          {"joint_attention_dim", cfg.joint_attention_dim},
                          {"pooled_projection_dim", cfg.pooled_projection_dim},
                          {"guidance_embeds", cfg.guidance_embeds},
                          {"axes_dims_rope", cfg.axes_dims_rope}};
  };
  f.known_models = [] {
    FluxTransformerConfig dev;  // diffusers' defaults are FLUX.1-dev's sizes
    dev.guidance_embeds = true;
    // CLIP-L 0.123 B + T5-XXL encoder 4.76 B + VAE 0.084 B
    return std::vector<KnownModel>{{"FLUX.1 [dev]", fluxModelDims(dev, 8), 4.9e9, 512}};
  };
  f.request = [family = f.display_name, pipeline = f.pipeline_class](const ModelFolder& m) {
    // FluxPipeline.__call__ (FluxImg2ImgPipeline / FluxInpaintPipeline with an init image).
    const FluxPipelineConfig& c = fluxConfig(m);
    RequestSpec s = folderRequestBase(m, family, pipeline);
    s.default_steps = 28;
    s.size.rounding = SizeRule::Rounding::Refuse;  // check_inputs: "must be divisible by"
    s.size.init_image = SizeRule::FromInitImage::DefaultsToImage;
    s.size.source = "FluxPipeline.check_inputs";
    FieldSpec& g = s.at("guidance");
    if (c.transformer.guidance_embeds) {
      g.read = true;
      g.help = "distilled guidance embedding (no second pass)";
    } else {
      g.not_read = "this FLUX.1 transformer has no guidance embedding (schnell-style)";
    }
    FieldSpec& t = s.at("true_cfg_scale");
    t.read = true;
    t.help = "true CFG with the negative prompt when > 1 (a second pass per step)";
    s.at("negative_prompt").read = true;
    s.guider.kind = GuiderSpec::Kind::TrueCfg;
    s.guider.scale_field = "true_cfg_scale";
    s.guider.threshold = 1.0;
    s.guider.requirement = "a negative prompt and true_cfg_scale > 1";
    return s;
  };
  return f;
}

}  // namespace dit
