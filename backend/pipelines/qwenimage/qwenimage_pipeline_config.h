// What QwenImagePipeline (diffusers pipelines/qwenimage/pipeline_qwenimage.py) reads from its model
// folder: the configs of transformer (QwenImageTransformer2DModel), text_encoder
// (Qwen2_5_VLForConditionalGeneration: its language model's text config), vae
// (AutoencoderKLQwenImage), scheduler, and the tokenizer folder. Torch-free (the GUI reads it).
#pragma once

#include "backend/io/model_folder.h"
#include "backend/models/autoencoders/autoencoder_kl_qwenimage_config.h"
#include "backend/models/qwenimage/qwenimage_config.h"
#include "backend/models/text_encoders/qwen3_config.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"

namespace dit {

struct QwenImagePipelineConfig : PipelineConfig {
  QwenImageTransformerConfig transformer;
  Qwen3Config text_encoder;  ///< the Qwen2 decoder switches (parseQwen2_5_VLTextConfig)
  AutoencoderKLQwenImageConfig vae;
  SchedulerConfig scheduler;
  /// QwenImagePipeline.prompt_template_encode_start_idx: template tokens dropped after encoding.
  int prompt_template_encode_start_idx = 34;
  /// QwenImagePipeline.tokenizer_max_length: ids kept = this + the dropped prefix (1058).
  int tokenizer_max_length = 1024;
};

/// Parses every component config of a QwenImagePipeline folder. Throws ModelFileError naming the
/// file (wrong types, ranges; a text encoder whose hidden_size differs from the transformer's
/// joint_attention_dim; a VAE whose z_dim x patch_size^2 differs from in_channels or whose z_dim
/// differs from out_channels). `transformerClass` is the folder's transformer class, which
/// ModelFolder::open has already matched to this family (the family table is not consulted here).
QwenImagePipelineConfig parseQwenImagePipelineConfig(const std::string& folder,
                                                     const std::string& transformerClass);

/// Shorthand for m.configAs<QwenImagePipelineConfig>().
inline const QwenImagePipelineConfig& qwenImageConfig(const ModelFolder& m) {
  return m.configAs<QwenImagePipelineConfig>();
}

}  // namespace dit
