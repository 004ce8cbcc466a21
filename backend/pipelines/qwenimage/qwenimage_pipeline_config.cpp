#include "backend/pipelines/qwenimage/qwenimage_pipeline_config.h"

#include <nlohmann/json.hpp>

#include "backend/io/config_json.h"
#include "backend/models/qwenimage/qwenimage_plan.h"

namespace dit {

QwenImagePipelineConfig parseQwenImagePipelineConfig(const std::string& path,
                                                     const std::string& /*transformerClass*/) {
  QwenImagePipelineConfig m;
  {
    const std::string f = path + "/transformer/config.json";
    const nlohmann::json j = readConfigJson(f);
    m.transformer = parseQwenImageTransformerConfig(j, f);
    m.dims = qwenImageModelDims(m.transformer, 8);  // the VAE's scale factor is set below
  }
  {
    const std::string f = path + "/text_encoder/config.json";
    m.text_encoder = parseQwen2_5_VLTextConfig(readConfigJson(f), f);
    if (m.text_encoder.hidden_size != m.transformer.joint_attention_dim)
      throw ModelFileError(f, "hidden_size " + std::to_string(m.text_encoder.hidden_size) +
                                  " differs from the transformer's joint_attention_dim " +
                                  std::to_string(m.transformer.joint_attention_dim));
  }
  {
    const std::string f = path + "/vae/config.json";
    m.vae = parseAutoencoderKLQwenImageConfig(readConfigJson(f), f);
    const int p2 = m.transformer.patch_size * m.transformer.patch_size;
    if (m.vae.z_dim * p2 != m.transformer.in_channels || m.vae.z_dim != m.transformer.out_channels)
      throw ModelFileError(f, "z_dim " + std::to_string(m.vae.z_dim) +
                                  " does not fit the transformer (in_channels " +
                                  std::to_string(m.transformer.in_channels) + " = z_dim x " +
                                  std::to_string(p2) + " patches, out_channels " +
                                  std::to_string(m.transformer.out_channels) + " = z_dim)");
  }
  {
    const std::string f = path + "/scheduler/scheduler_config.json";
    m.scheduler = parseSchedulerConfig(readConfigJson(f), f);
  }
  m.dims.vae_scale_factor = m.vae.vaeScaleFactor();
  m.max_sequence_length = 512;
  m.max_sequence_length_limit = m.tokenizer_max_length;
  m.max_sequence_length_rule = "QwenImagePipeline (its tokenizer_max_length)";
  return m;
}

}  // namespace dit
