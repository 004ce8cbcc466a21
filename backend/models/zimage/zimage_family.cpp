#include "backend/models/zimage/zimage_family.h"

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/io/model_folder.h"
#include "backend/models/family_request.h"
#include "backend/models/text_encoders/qwen3_plan.h"
#include "backend/models/vae_decode_memory.h"
#include "backend/models/zimage/zimage_plan.h"
#include "backend/pipelines/zimage/zimage_pipeline_config.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

FamilySpec zimageFamily() {
  FamilySpec f;
  f.key = "zimage";
  f.display_name = "Z-Image";
  f.pipeline_class = "ZImagePipeline";
  f.transformer_class = "ZImageTransformer2DModel";
  f.components = {"transformer", "text_encoder", "tokenizer", "vae", "scheduler"};
  // Text-to-image (no image-to-image / inpainting pipeline yet), step caching through the DiT
  // driver's seam, LoRA in the diffusers/PEFT key layout (module paths are the checkpoint's),
  // diffusers folders only.
  f.caps = FamilyCapabilities{};
  f.caps.step_cache = true;
  f.caps.lora_formats = {"diffusers"};
  f.parse = [](const ModelFolder& folder) -> std::shared_ptr<const PipelineConfig> {
    return std::make_shared<ZImagePipelineConfig>(
        parseZImagePipelineConfig(folder.path, folder.transformer_class));
  };
  f.dims = [](const nlohmann::json& config, const std::string& file) {
    return zimageModelDims(parseZImageTransformerConfig(config, file), 8);
  };
  f.memory = [](const ModelFolder& m, int tp, int64_t elementBytes) {
    // The Qwen3 layers the pipeline runs (up to hidden_states[-2], no final norm) from
    // qwen3ShardingPlan: the figure Qwen3Model::weightBytes reports after a sharded load; the
    // whole encoder when tp does not divide its heads or intermediate_size.
    const ZImagePipelineConfig& c = zimageConfig(m);
    const int64_t eb = std::max<int64_t>(1, elementBytes);
    const ParameterTable table =
        qwen3ParameterTable(c.text_encoder, c.textEncoderLayer(), false, "F32", eb);
    std::string reason;
    const ShardingPlan plan = qwen3ShardingPlan(c.text_encoder).resolve(table, tp, &reason);
    FamilyMemoryFacts r;
    if (!reason.empty()) r.note = "text encoder replicated on every tp rank: " + reason;
    r.text_encoder_bytes = plan.bytesPerRank(table, std::max(1, tp), eb);
    r.text_encoder_layer_bytes = qwen3LayerBytesPerRank(c.text_encoder, tp, eb);
    if (!c.vae.block_out_channels.empty())
      r.vae_decoder_channels = c.vae.block_out_channels.front();
    r.vae_decoder = vaeDecoderShape(c.vae);
    return r;
  };
  f.facts = [](const ModelFolder& m) {
    const ZImagePipelineConfig& c = zimageConfig(m);
    const ZImageTransformerConfig& t = c.transformer;
    return std::vector<ModelFact>{
        {"family", "family", "Z-Image"},
        {"blocks", "blocks",
         std::to_string(t.n_refiner_layers) + " noise-refiner + " +
             std::to_string(t.n_refiner_layers) + " context-refiner + " +
             std::to_string(t.n_layers) + " single-stream"},
        {"heads", "attention",
         std::to_string(t.n_heads) + " heads x " + std::to_string(t.headDim()) +
             " head dim (inner " + std::to_string(t.dim) + ")"},
        {"text_encoders", "text encoder",
         "Qwen3 (" + std::to_string(c.text_encoder.num_hidden_layers) +
             " layers; hidden_states[-2] of the real tokens), cap_feat_dim " +
             std::to_string(t.cap_feat_dim)},
        {"guidance", "guidance",
         "real CFG when guidance > 0 (pos + g (pos - neg), negative prompt \"\" unless given; "
         "cfg_truncation, cfg_normalization); 0 = off (Turbo)"},
        {"latent_channels", "latent channels", std::to_string(t.in_channels)},
    };
  };
  f.known_models = [] {
    // diffusers ZImageTransformer2DModel's defaults are Z-Image-Turbo's transformer (6.15 B):
    // dim 3840, 30 heads x 128, 30 layers + 2 + 2 refiners, cap_feat_dim 2560, 16 latent
    // channels. Text encoder Qwen3-4B (4.02 B) + the FLUX.1 AutoencoderKL (84 M).
    return std::vector<KnownModel>{
        {"Z-Image-Turbo", zimageModelDims(ZImageTransformerConfig{}, 8), 4.02e9 + 0.084e9, 512}};
  };
  f.default_settings = [](const ModelFolder&) {
    // Z-Image-Turbo's published use: 9 steps (8 transformer forwards of the distilled schedule
    // plus one), guidance_scale 0.0 (no CFG), 1024 x 1024.
    return std::string(R"({"steps":9,"guidance":0.0,"width":1024,"height":1024})");
  };
  // ZImagePipeline's own CFG knobs (its __call__ arguments of the same names).
  const FieldSpec truncation = knobField(
      "cfg_truncation", FieldType::Float, 1.0, 0, 100, "",
      "steps whose normalised time (1000 - t) / 1000 is above it run without CFG; > 1 (and the "
      "default 1) = every step",
      "cfg_truncation");
  const FieldSpec normalization = knobField(
      "cfg_normalization", FieldType::Float, 0.0, 0, 100, "",
      "> 0 clips the guided prediction's L2 norm to this x the conditional one's; 0 = off",
      "cfg_normalization");
  // The scheduler's static shift (FlowMatchEulerDiscreteScheduler's `shift`, 3.0 in Z-Image's
  // scheduler_config.json): sigma -> shift sigma / (1 + (shift - 1) sigma) over the schedule,
  // larger = more steps at high noise. diffusers: FlowMatchEulerDiscreteScheduler.from_config(
  // pipe.scheduler.config, shift=S); ComfyUI: ModelSamplingAuraFlow's shift.
  FieldSpec shift = knobField(
      "shift", FieldType::Float, 3.0, 0, 100, "",
      "the scheduler's static time shift (sigma -> s sigma / (1 + (s - 1) sigma)); larger = "
      "more of the steps at high noise",
      "scheduler.shift");
  shift.min_exclusive = true;
  f.knobs = {truncation, normalization, shift};
  f.request = [family = f.display_name, pipeline = f.pipeline_class,
               f_shift = shift](const ModelFolder& m) {
    // ZImagePipeline.__call__: height = height or 1024, "must be divisible by" (refused).
    RequestSpec s = folderRequestBase(m, family, pipeline);
    s.default_steps = 50;
    s.size.rounding = SizeRule::Rounding::Refuse;
    s.size.source = "ZImagePipeline.__call__";
    FieldSpec& g = s.at("guidance");
    g.read = true;
    g.help = "CFG scale, on when > 0 (a second pass per step)";
    s.at("negative_prompt").read = true;
    // diffusers' true_cfg_scale is not an argument of this pipeline: declared as not read, so
    // that a request carrying it (a FLUX.1 preset) is told so instead of refused.
    s.fields.push_back(
        notReadKnob(knobField("true_cfg_scale", FieldType::Float, 1.0, 0, 100, "", "true CFG scale",
                              "true_cfg_scale"),
                    "ZImagePipeline has no true_cfg_scale (its CFG scale is guidance)"));
    // The shift knob's default is this folder's scheduler shift; a dynamic-shifting scheduler
    // (mu from the image size) has no static shift to set.
    {
      const SchedulerConfig& sc = zimageConfig(m).scheduler;
      FieldSpec sh = f_shift;
      sh.default_value = sc.shift;
      if (sc.use_dynamic_shifting) {
        sh.read = false;
        sh.not_read =
            "this folder's scheduler uses dynamic shifting (use_dynamic_shifting: true): its shift "
            "comes from the image size";
      }
      s.fields.push_back(sh);
    }
    // do_classifier_free_guidance: guidance_scale > 0; pred = pos + g (pos - neg) in float32,
    // then cfg_truncation / cfg_normalization.
    s.guider.kind = GuiderSpec::Kind::ClassicCfg;
    s.guider.scale_field = "guidance";
    s.guider.threshold = 0.0;
    s.guider.formula = GuiderSpec::Formula::CondPlus;
    s.guider.rescale = GuiderSpec::Rescale::GlobalNormClip;
    s.guider.truncation_field = "cfg_truncation";
    s.guider.normalization_field = "cfg_normalization";
    s.guider.requirement = "guidance > 0";
    return s;
  };
  return f;
}

}  // namespace dit
