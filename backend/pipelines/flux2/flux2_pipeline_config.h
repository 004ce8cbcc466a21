// What Flux2KleinPipeline (diffusers pipelines/flux2/pipeline_flux2_klein.py) reads from its
// model folder: model_index.json's is_distilled, the configs of transformer
// (Flux2Transformer2DModel), vae (AutoencoderKLFlux2: AutoencoderKL + batch_norm_eps),
// text_encoder (Qwen3ForCausalLM), scheduler, and the tokenizer folder. Torch-free (the GUI
// reads it).
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
  /// Flux2KleinPipeline's text_encoder_out_layers: hidden states stacked into prompt_embeds.
  std::vector<int> text_encoder_out_layers{9, 18, 27};
};

/// Parses every component config of a Flux2KleinPipeline folder. Throws ModelFileError naming
/// the file (wrong types, ranges; a transformer whose joint_attention_dim is not
/// len(text_encoder_out_layers) x the text encoder's hidden_size; a text encoder with fewer than
/// 27 layers). `transformerClass` is the folder's transformer class, which ModelFolder::open has
/// already matched to this family (the family table is not consulted here).
Flux2PipelineConfig parseFlux2PipelineConfig(const std::string& folder,
                                             const std::string& transformerClass);

/// Shorthand for m.configAs<Flux2PipelineConfig>().
inline const Flux2PipelineConfig& flux2Config(const ModelFolder& m) {
  return m.configAs<Flux2PipelineConfig>();
}

}  // namespace dit
