// What Flux2KleinPipeline (diffusers pipelines/flux2/pipeline_flux2_klein.py) and Flux2Pipeline
// (FLUX.2 [dev], pipeline_flux2.py) read from their model folder: model_index.json's
// _class_name and is_distilled, the configs of transformer (Flux2Transformer2DModel), vae
// (AutoencoderKLFlux2: AutoencoderKL + batch_norm_eps), text_encoder (klein: Qwen3ForCausalLM;
// dev: Mistral3ForConditionalGeneration's language model), scheduler, and the tokenizer folder.
// Torch-free (the GUI reads it).
#pragma once

#include "backend/io/model_folder.h"
#include "backend/models/autoencoders/autoencoder_kl_config.h"
#include "backend/models/flux2/flux2_config.h"
#include "backend/models/text_encoders/qwen3_config.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"

namespace dit {

struct Flux2PipelineConfig : PipelineConfig {
  Flux2TransformerConfig transformer;
  Qwen3Config text_encoder;
  AutoencoderKLConfig vae;
  double batch_norm_eps = 1e-4;  ///< vae/config.json batch_norm_eps
  SchedulerConfig scheduler;
  /// model_index.json is_distilled: a distilled model never runs CFG (guidance_scale is ignored).
  bool is_distilled = false;
  /// text_encoder_out_layers: hidden states stacked into prompt_embeds (klein (9, 18, 27),
  /// Flux2Pipeline (10, 20, 30)).
  std::vector<int> text_encoder_out_layers{9, 18, 27};
  /// Flux2Pipeline (FLUX.2 [dev]): the text encoder is Mistral3's language model
  /// (parseMistralTextConfig) with the tekken tokenizer and the Mistral chat template; the
  /// transformer has the guidance embedding and no CFG runs. false: FLUX.2 [klein] (Qwen3).
  bool mistral = false;
  /// "FLUX.2 [dev]" or "FLUX.2 [klein]" (messages, facts).
  const char* displayName() const { return mistral ? "FLUX.2 [dev]" : "FLUX.2 [klein]"; }
};

/// Parses every component config of a Flux2KleinPipeline or Flux2Pipeline folder (model_index.json
/// _class_name "Flux2Pipeline": the Mistral3 text encoder, layers (10, 20, 30)). Throws
/// ModelFileError naming the file (wrong types, ranges; a transformer whose joint_attention_dim
/// is not len(text_encoder_out_layers) x the text encoder's hidden_size; a text encoder with
/// fewer layers than the largest stacked index; a Flux2Pipeline transformer without
/// guidance_embeds). `transformerClass` is the folder's transformer class, which ModelFolder::open
/// has already matched to this family (the family table is not consulted here).
Flux2PipelineConfig parseFlux2PipelineConfig(const std::string& folder,
                                             const std::string& transformerClass);

/// Shorthand for m.configAs<Flux2PipelineConfig>().
inline const Flux2PipelineConfig& flux2Config(const ModelFolder& m) {
  return m.configAs<Flux2PipelineConfig>();
}

}  // namespace dit
