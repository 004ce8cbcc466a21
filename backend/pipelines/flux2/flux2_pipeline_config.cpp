#include "backend/pipelines/flux2/flux2_pipeline_config.h"

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>

#include "backend/io/config_json.h"
#include "backend/models/flux2/flux2_plan.h"

namespace dit {

Flux2PipelineConfig parseFlux2PipelineConfig(const std::string& path,
                                             const std::string& /*transformerClass*/) {
  Flux2PipelineConfig m;
  {
    const std::string f = path + "/model_index.json";
    const nlohmann::json mi = readConfigJson(f);
    getConfigValue(mi, "is_distilled", m.is_distilled, f);
    std::string cls;
    getConfigValue(mi, "_class_name", cls, f);
    m.mistral = cls == "Flux2Pipeline";
    // Flux2Pipeline.__call__'s text_encoder_out_layers default.
    if (m.mistral) m.text_encoder_out_layers = {10, 20, 30};
  }
  {
    const std::string f = path + "/transformer/config.json";
    const nlohmann::json j = readConfigJson(f);
    m.transformer = parseFlux2TransformerConfig(j, f);
    if (m.mistral && !m.transformer.guidance_embeds)
      throw ModelFileError(f,
                           "config key 'guidance_embeds' is false; FLUX.2 [dev] (Flux2Pipeline) "
                           "is guidance-distilled and needs the guidance embedding");
    m.dims = flux2ModelDims(m.transformer, 8);  // the VAE's scale factor is set below
  }
  {
    const std::string f = path + "/text_encoder/config.json";
    m.text_encoder = m.mistral ? parseMistralTextConfig(readConfigJson(f), f)
                               : parseQwen3Config(readConfigJson(f), f);
    const int maxLayer =
        *std::max_element(m.text_encoder_out_layers.begin(), m.text_encoder_out_layers.end());
    if (m.text_encoder.num_hidden_layers < maxLayer)
      throw ModelFileError(f, "num_hidden_layers " +
                                  std::to_string(m.text_encoder.num_hidden_layers) +
                                  " is below the layer " + std::to_string(maxLayer) +
                                  " whose hidden states " + m.displayName() + " stacks");
    const long long stacked =
        static_cast<long long>(m.text_encoder_out_layers.size()) * m.text_encoder.hidden_size;
    if (stacked != m.transformer.joint_attention_dim)
      throw ModelFileError(f, "hidden_size " + std::to_string(m.text_encoder.hidden_size) + " x " +
                                  std::to_string(m.text_encoder_out_layers.size()) +
                                  " stacked layers = " + std::to_string(stacked) +
                                  " differs from the transformer's joint_attention_dim " +
                                  std::to_string(m.transformer.joint_attention_dim));
  }
  {
    const std::string f = path + "/vae/config.json";
    const nlohmann::json j = readConfigJson(f);
    m.vae = parseAutoencoderKLConfig(j, f);
    getConfigValue(j, "batch_norm_eps", m.batch_norm_eps, f, {0, 1});
    if (m.vae.latent_channels * 4 != m.transformer.in_channels)
      throw ModelFileError(f, "latent_channels " + std::to_string(m.vae.latent_channels) +
                                  " x 4 (2x2 patches) differs from the transformer's "
                                  "in_channels " +
                                  std::to_string(m.transformer.in_channels));
  }
  {
    const std::string f = path + "/scheduler/scheduler_config.json";
    m.scheduler = parseSchedulerConfig(readConfigJson(f), f);
  }
  m.dims.vae_scale_factor = m.vae.vaeScaleFactor();
  m.max_sequence_length = 512;
  // Flux2KleinPipeline.check_inputs and Flux2Pipeline.check_inputs have no max_sequence_length
  // cap (FluxPipeline's 512 is T5's): the text encoder's positions bound it.
  m.max_sequence_length_limit = m.text_encoder.max_position_embeddings;
  m.max_sequence_length_rule = std::string(m.mistral ? "Flux2Pipeline" : "Flux2KleinPipeline") +
                               " (the text encoder's max_position_embeddings)";
  return m;
}

}  // namespace dit
