// What ZImagePipeline (diffusers pipelines/z_image/pipeline_z_image.py) reads from its model
// folder: the configs of transformer (ZImageTransformer2DModel), vae (AutoencoderKL, the FLUX.1
// one), text_encoder (Qwen3), scheduler (FlowMatchEulerDiscreteScheduler), and the tokenizer folder
// (Qwen2Tokenizer with the Qwen3 chat template). Torch-free (the GUI reads it).
#pragma once

#include "backend/io/model_folder.h"
#include "backend/models/autoencoders/autoencoder_kl_config.h"
#include "backend/models/text_encoders/qwen3_config.h"
#include "backend/models/zimage/zimage_config.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"

namespace dit {

struct ZImagePipelineConfig : PipelineConfig {
  ZImageTransformerConfig transformer;
  Qwen3Config text_encoder;
  AutoencoderKLConfig vae;
  SchedulerConfig scheduler;
  /// The text encoder's hidden_states index the pipeline uses: hidden_states[-2] =
  /// num_hidden_layers - 1 (the output of the second-to-last decoder layer).
  int textEncoderLayer() const { return text_encoder.num_hidden_layers - 1; }
};

/// Parses every component config of a ZImagePipeline folder; max_sequence_length 512 (the
/// request it takes: zimageFamily's RequestSpec). Throws ModelFileError naming the file (wrong
/// types, ranges; a transformer cap_feat_dim other than the text encoder's hidden_size; vae
/// latent_channels other than the transformer's in_channels). `transformerClass` is the folder's
/// transformer class, which ModelFolder::open has already matched to this family (the family table
/// is not consulted here).
ZImagePipelineConfig parseZImagePipelineConfig(const std::string& folder,
                                               const std::string& transformerClass);

/// Shorthand for m.configAs<ZImagePipelineConfig>().
inline const ZImagePipelineConfig& zimageConfig(const ModelFolder& m) {
  return m.configAs<ZImagePipelineConfig>();
}

}  // namespace dit
