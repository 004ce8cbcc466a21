// What FluxPipeline (diffusers pipelines/flux/pipeline_flux.py) reads from its model folder:
// the configs of transformer, text_encoder (CLIP), text_encoder_2 (T5), vae, scheduler and the
// tokenizers' model_max_length. Torch-free (the GUI reads it).
#pragma once

#include "backend/io/model_folder.h"
#include "backend/models/autoencoders/autoencoder_kl_config.h"
#include "backend/models/flux/flux_config.h"
#include "backend/models/text_encoders/text_encoder_configs.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"

namespace dit {

struct FluxPipelineConfig : PipelineConfig {
  FluxTransformerConfig transformer;
  CLIPTextConfig text_encoder;
  T5Config text_encoder_2;
  AutoencoderKLConfig vae;
  SchedulerConfig scheduler;
  int tokenizer_max_length = 77;  ///< tokenizer/tokenizer_config.json model_max_length
  int t5_max_length = 512;        ///< tokenizer_2 model_max_length (FluxPipeline default 512)
};

/// Parses every component config of a FluxPipeline folder (dims: fluxModelDims of its transformer
/// config). Throws ModelFileError naming the file. `transformerClass` is the folder's transformer
/// class, which ModelFolder::open has already matched to this family (the family table is not
/// consulted here).
FluxPipelineConfig parseFluxPipelineConfig(const std::string& folder,
                                           const std::string& transformerClass);

/// The configs of a model opened from its sources (ModelFolder::open(ModelSources)): folders'
/// config.json, single files' hyper-parameters from their tensor shapes (checkpoint_layouts.h)
/// completed by --config (else the model folder's configs, else FLUX.1's published scheduler and
/// VAE scaling for the detected variant); tokenizer limits from the tokenizer folders. Throws
/// ModelFileError naming the file.
FluxPipelineConfig parseFluxPipelineSources(const ModelFolder& m);

/// Shorthand for m.configAs<FluxPipelineConfig>() (throws std::invalid_argument for another
/// family).
inline const FluxPipelineConfig& fluxConfig(const ModelFolder& m) {
  return m.configAs<FluxPipelineConfig>();
}

}  // namespace dit
