#include "backend/models/flux/flux_family.h"

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/io/model_folder.h"
#include "backend/io/safetensors.h"
#include "backend/models/checkpoint_layouts.h"
#include "backend/models/family_facts.h"
#include "backend/models/family_request.h"
#include "backend/models/flux/flux_bfl_config.h"
#include "backend/models/flux/flux_plan.h"
#include "backend/models/vae_decode_memory.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"

namespace dit {

namespace {

// FluxKontextPipeline's own __call__ arguments (declared by every FLUX.1 folder's request, read
// only by FluxKontextPipeline folders).
// FluxPipeline.__call__'s true_cfg_scale (FluxKontextPipeline's too): a knob of this family.
FieldSpec trueCfgScaleKnob() {
  return knobField("true_cfg_scale", FieldType::Float, 1.0, 0, 100, "",
                   "true CFG with the negative prompt when > 1 (a second pass per step)",
                   "true_cfg_scale");
}

std::vector<FieldSpec> kontextKnobs() {
  FieldSpec maxArea;
  maxArea.name = "max_area";
  maxArea.type = FieldType::Int;
  maxArea.default_value = 1024 * 1024;
  maxArea.min = 64;
  maxArea.max = 16384.0 * 16384.0;
  maxArea.unit = " pixels";
  maxArea.help = "the output's area: the requested size is rescaled to it at the same aspect";
  maxArea.diffusers_arg = "max_area";
  maxArea.knob = true;
  FieldSpec autoResize;
  autoResize.name = "auto_resize";
  autoResize.type = FieldType::Int;
  autoResize.default_value = 1;
  autoResize.min = 0;
  autoResize.max = 1;
  autoResize.help =
      "1: resize the reference to the nearest of the 17 preferred Kontext resolutions; 0: keep "
      "its size (floored to the multiple)";
  autoResize.diffusers_arg = "_auto_resize";
  autoResize.knob = true;
  return {maxArea, autoResize};
}

}  // namespace

FamilySpec fluxFamily() {
  FamilySpec f;
  f.key = "flux1";
  f.display_name = "FLUX.1";
  f.pipeline_class = "FluxPipeline";
  // FLUX.1 Kontext: the same components and transformer, FluxKontextPipeline's __call__ (one
  // reference image; the output rescaled to max_area).
  f.pipeline_variants = {"FluxKontextPipeline"};
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
    r.vae_decoder = vaeDecoderShape(c.vae);
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
  f.request = [family = f.display_name](const ModelFolder& m) {
    // FluxPipeline.__call__ (FluxImg2ImgPipeline / FluxInpaintPipeline with an init image).
    const FluxPipelineConfig& c = fluxConfig(m);
    RequestSpec s = folderRequestBase(m, family, m.pipeline_class);
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
    s.fields.push_back(trueCfgScaleKnob());
    s.at("negative_prompt").read = true;
    s.guider.kind = GuiderSpec::Kind::TrueCfg;
    s.guider.scale_field = "true_cfg_scale";
    s.guider.threshold = 1.0;
    s.guider.requirement = "a negative prompt and true_cfg_scale > 1";
    for (const FieldSpec& k : kontextKnobs()) s.fields.push_back(k);
    FieldSpec& maxArea = s.at("max_area");
    FieldSpec& autoResize = s.at("auto_resize");
    if (m.pipeline_class == "FluxKontextPipeline") {
      // FluxKontextPipeline.__call__: height/width default to 128 x vae_scale_factor, then the
      // output is ALWAYS rescaled to max_area at that aspect and floored to the multiple (with a
      // warning); one reference image, floored to the multiple or (_auto_resize, the default)
      // the nearest PREFERRED_KONTEXT_RESOLUTIONS entry, resized with LANCZOS, encoded
      // (posterior mode, shift and scale), packed with position ids (1, row, col). No
      // image-to-image or inpainting (those are FluxKontextInpaintPipeline's).
      s.size.rounding = SizeRule::Rounding::Floor;
      s.size.max_area_field = "max_area";
      s.size.source = "FluxKontextPipeline.__call__";
      s.inputs.init_image = s.inputs.mask = false;
      for (const char* name : {"init_image", "strength", "mask_image"})
        s.at(name).not_read =
            "FluxKontextPipeline takes no init image or mask (its image is the reference to "
            "edit: reference_images)";
      ReferenceRule& r = s.references;
      r.max_count = 1;
      r.fit = ReferenceRule::Fit::Resize;
      r.preferred_sizes = {{672, 1568}, {688, 1504}, {720, 1456}, {752, 1392},  {800, 1328},
                           {832, 1248}, {880, 1184}, {944, 1104}, {1024, 1024}, {1104, 944},
                           {1184, 880}, {1248, 832}, {1328, 800}, {1392, 752},  {1456, 720},
                           {1504, 688}, {1568, 672}};
      r.auto_resize_field = "auto_resize";
      r.ids = "(1, row, col): the first axis 1, the same grid origin as the output";
      r.source = "FluxKontextPipeline";
      FieldSpec& refs = s.at("reference_images");
      refs.read = true;
      refs.help = "the image to edit (one)";
    } else {
      maxArea.read = autoResize.read = false;
      maxArea.not_read = autoResize.not_read =
          "only FLUX.1 Kontext (FluxKontextPipeline) reads it; this folder is " + m.pipeline_class;
    }
    return s;
  };
  f.knobs = kontextKnobs();
  f.knobs.insert(f.knobs.begin(), trueCfgScaleKnob());
  return f;
}

}  // namespace dit
