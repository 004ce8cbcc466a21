#include "backend/pipelines/flux/flux_pipeline_config.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "backend/io/config_json.h"
#include "backend/models/checkpoint_layouts.h"
#include "backend/models/flux/flux_bfl_config.h"
#include "backend/models/flux/flux_plan.h"

namespace dit {

FluxPipelineConfig parseFluxPipelineConfig(const std::string& path,
                                           const std::string& /*transformerClass*/) {
  FluxPipelineConfig m;
  {
    const std::string f = path + "/transformer/config.json";
    const nlohmann::json j = readConfigJson(f);
    m.transformer = parseFluxTransformerConfig(j, f);
    m.dims = fluxModelDims(m.transformer, 8);  // the VAE's scale factor is set below
  }
  {
    const std::string f = path + "/text_encoder/config.json";
    m.text_encoder = parseCLIPTextConfig(readConfigJson(f), f);
  }
  {
    const std::string f = path + "/text_encoder_2/config.json";
    m.text_encoder_2 = parseT5Config(readConfigJson(f), f);
  }
  {
    const std::string f = path + "/vae/config.json";
    m.vae = parseAutoencoderKLConfig(readConfigJson(f), f);
  }
  {
    const std::string f = path + "/scheduler/scheduler_config.json";
    m.scheduler = parseSchedulerConfig(readConfigJson(f), f);
  }
  m.dims.vae_scale_factor = m.vae.vaeScaleFactor();
  for (const char* tk : {"tokenizer", "tokenizer_2"}) {
    const std::string f = path + "/" + tk + "/tokenizer_config.json";
    if (!std::filesystem::exists(f)) continue;
    const nlohmann::json j = readConfigJson(f);
    int v = 0;
    getConfigValue(j, "model_max_length", v, f);
    if (v > 0 && v < 100000)
      (std::string(tk) == "tokenizer" ? m.tokenizer_max_length : m.t5_max_length) = v;
  }
  m.max_sequence_length = std::min(512, m.t5_max_length);
  return m;
}

namespace {
// FLUX.1's published scheduler configs (black-forest-labs/FLUX.1-dev, FLUX.1-schnell
// scheduler/scheduler_config.json).
SchedulerConfig fluxSchedulerDefaults(bool schnell) {
  SchedulerConfig c;
  c.num_train_timesteps = 1000;
  c.shift = schnell ? 1.0 : 3.0;
  c.use_dynamic_shifting = !schnell;
  c.base_shift = 0.5;
  c.max_shift = 1.15;
  c.base_image_seq_len = 256;
  c.max_image_seq_len = 4096;
  return c;
}
}  // namespace

FluxPipelineConfig parseFluxPipelineSources(const ModelFolder& m) {
  // Reference configs: --config, else the model folder's own, else none (FLUX.1 defaults).
  std::unique_ptr<FluxPipelineConfig> ref;
  if (!m.sources.config.empty())
    ref = std::make_unique<FluxPipelineConfig>(
        parseFluxPipelineConfig(m.sources.config, "FluxTransformer2DModel"));
  else if (!m.components.at("transformer").single_file)
    ref =
        std::make_unique<FluxPipelineConfig>(parseFluxPipelineConfig(m.path, m.transformer_class));
  FluxPipelineConfig c = ref ? *ref : FluxPipelineConfig{};
  auto src = [&](const std::string& n) -> const ComponentSource& { return m.components.at(n); };
  {
    const ComponentSource& t = src("transformer");
    if (t.single_file) {
      if (t.layout != "bfl")
        throw ModelFileError(t.path,
                             "a transformer with diffusers names in a single file needs "
                             "its config.json: give its folder instead");
      SafetensorsReader r(t.path);
      c.transformer = fluxConfigFromBfl(r, t.prefix, ref ? &ref->transformer : nullptr);
    } else {
      const std::string f = t.path + "/config.json";
      c.transformer = parseFluxTransformerConfig(readConfigJson(f), f);
    }
  }
  {
    const ComponentSource& v = src("vae");
    if (v.single_file) {
      if (v.layout != "ldm")
        throw ModelFileError(v.path,
                             "a VAE with diffusers names in a single file needs its "
                             "config.json: give its folder instead");
      SafetensorsReader r(v.path);
      c.vae = vaeConfigFromLdm(r, v.prefix, ref ? &ref->vae : nullptr);
    } else {
      const std::string f = v.path + "/config.json";
      c.vae = parseAutoencoderKLConfig(readConfigJson(f), f);
    }
  }
  {
    const ComponentSource& e = src("text_encoder");
    if (e.single_file) {
      SafetensorsReader r(e.path);
      auto l = componentLayout(r, CheckpointComponent{"text_encoder", e.prefix, e.layout, {}, 0});
      c.text_encoder = clipConfigFromShapes(*l, r, ref ? &ref->text_encoder : nullptr);
    } else {
      const std::string f = e.path + "/config.json";
      c.text_encoder = parseCLIPTextConfig(readConfigJson(f), f);
    }
  }
  {
    const ComponentSource& e = src("text_encoder_2");
    if (e.single_file) {
      SafetensorsReader r(e.path);
      auto l = componentLayout(r, CheckpointComponent{"text_encoder_2", e.prefix, e.layout, {}, 0});
      c.text_encoder_2 = t5ConfigFromShapes(*l, r, ref ? &ref->text_encoder_2 : nullptr);
    } else {
      const std::string f = e.path + "/config.json";
      c.text_encoder_2 = parseT5Config(readConfigJson(f), f);
    }
  }
  if (m.components.count("scheduler")) {
    const std::string f = src("scheduler").path + "/scheduler_config.json";
    c.scheduler = parseSchedulerConfig(readConfigJson(f), f);
  } else if (!ref) {
    c.scheduler = fluxSchedulerDefaults(m.variant == "flux-schnell");
  }
  c.tokenizer_max_length = 77;
  c.t5_max_length = 512;
  for (const char* tk : {"tokenizer", "tokenizer_2"}) {
    const std::string f = src(tk).path + "/tokenizer_config.json";
    if (!std::filesystem::exists(f)) continue;
    const nlohmann::json j = readConfigJson(f);
    int v = 0;
    getConfigValue(j, "model_max_length", v, f);
    if (v > 0 && v < 100000)
      (std::string(tk) == "tokenizer" ? c.tokenizer_max_length : c.t5_max_length) = v;
  }
  c.dims = fluxModelDims(c.transformer, c.vae.vaeScaleFactor());
  c.max_sequence_length = std::min(512, c.t5_max_length);
  return c;
}

}  // namespace dit
