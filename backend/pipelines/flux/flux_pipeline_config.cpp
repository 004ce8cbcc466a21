#include "backend/pipelines/flux/flux_pipeline_config.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/io/config_json.h"
#include "backend/models/registry.h"

namespace dit {

FluxPipelineConfig parseFluxPipelineConfig(const std::string& path,
                                           const std::string& transformerClass) {
  FluxPipelineConfig m;
  {
    const std::string f = path + "/transformer/config.json";
    const nlohmann::json j = readConfigJson(f);
    m.transformer = parseFluxTransformerConfig(j, f);
    m.dims = transformerFamily(transformerClass, f).dims(j, f);
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

PipelineFamily fluxPipelineFamily() {
  PipelineFamily f;
  f.class_name = "FluxPipeline";
  f.components = {"transformer", "text_encoder", "text_encoder_2", "tokenizer",
                  "tokenizer_2", "vae",          "scheduler"};
  f.transformer_component = "transformer";
  f.parse = [](const ModelFolder& folder) -> std::shared_ptr<const PipelineConfig> {
    return std::make_shared<FluxPipelineConfig>(
        parseFluxPipelineConfig(folder.path, folder.transformer_class));
  };
  return f;
}

}  // namespace dit
