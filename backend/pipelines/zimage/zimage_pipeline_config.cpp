#include "backend/pipelines/zimage/zimage_pipeline_config.h"

#include <nlohmann/json.hpp>
#include <string>

#include "backend/io/config_json.h"
#include "backend/models/zimage/zimage_plan.h"

namespace dit {

ZImagePipelineConfig parseZImagePipelineConfig(const std::string& path,
                                               const std::string& /*transformerClass*/) {
  ZImagePipelineConfig m;
  {
    const std::string f = path + "/transformer/config.json";
    const nlohmann::json j = readConfigJson(f);
    m.transformer = parseZImageTransformerConfig(j, f);
    m.dims = zimageModelDims(m.transformer, 8);  // the VAE's scale factor is set below
  }
  {
    const std::string f = path + "/text_encoder/config.json";
    m.text_encoder = parseQwen3Config(readConfigJson(f), f);
    if (m.text_encoder.hidden_size != m.transformer.cap_feat_dim)
      throw ModelFileError(f, "hidden_size " + std::to_string(m.text_encoder.hidden_size) +
                                  " differs from the transformer's cap_feat_dim " +
                                  std::to_string(m.transformer.cap_feat_dim));
  }
  {
    const std::string f = path + "/vae/config.json";
    m.vae = parseAutoencoderKLConfig(readConfigJson(f), f);
    if (m.vae.latent_channels != m.transformer.in_channels)
      throw ModelFileError(f, "latent_channels " + std::to_string(m.vae.latent_channels) +
                                  " differs from the transformer's in_channels " +
                                  std::to_string(m.transformer.in_channels));
  }
  {
    const std::string f = path + "/scheduler/scheduler_config.json";
    m.scheduler = parseSchedulerConfig(readConfigJson(f), f);
  }
  m.dims.vae_scale_factor = m.vae.vaeScaleFactor();
  m.dims.default_sample_size = 1024 / m.dims.vae_scale_factor;  // height = height or 1024
  m.max_sequence_length = 512;
  m.max_sequence_length_rule = "ZImagePipeline";
  return m;
}

}  // namespace dit
