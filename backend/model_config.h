// Configs of a diffusers FLUX.1 model folder (model_index.json + each component's config.json).
// Torch-free: the GUI reads model sizes through this too. Hyper-parameters always come from the
// files; the defaults below are diffusers' / transformers' constructor defaults used only when a
// key is absent.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/safetensors.h"  // ModelFileError

namespace dit {

/// diffusers FluxTransformer2DModel config.
struct FluxTransformerConfig {
  int patch_size = 1;
  int in_channels = 64;
  int out_channels = 64;  ///< null in the file -> in_channels
  int num_layers = 19;
  int num_single_layers = 38;
  int attention_head_dim = 128;
  int num_attention_heads = 24;
  int joint_attention_dim = 4096;
  int pooled_projection_dim = 768;
  bool guidance_embeds = false;
  std::vector<int> axes_dims_rope{16, 56, 56};
  int innerDim() const { return num_attention_heads * attention_head_dim; }
  int mlpHidden() const { return innerDim() * 4; }  ///< mlp_ratio 4.0 in diffusers
};

/// transformers CLIPTextConfig (text part).
struct CLIPTextConfig {
  int vocab_size = 49408;
  int hidden_size = 512;
  int intermediate_size = 2048;
  int num_hidden_layers = 12;
  int num_attention_heads = 8;
  int max_position_embeddings = 77;
  std::string hidden_act = "quick_gelu";
  double layer_norm_eps = 1e-5;
  int64_t eos_token_id = 2;
  int projection_dim = 512;
};

/// transformers T5Config (encoder part).
struct T5Config {
  int vocab_size = 32128;
  int d_model = 512;
  int d_kv = 64;
  int d_ff = 2048;
  int num_layers = 6;
  int num_heads = 8;
  int relative_attention_num_buckets = 32;
  int relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  bool is_gated_act = false;
  std::string dense_act_fn = "relu";  ///< "relu", "gelu_new", "gelu", "silu"
};

/// diffusers AutoencoderKL config (decoder part).
struct AutoencoderKLConfig {
  int in_channels = 3;
  int out_channels = 3;
  int latent_channels = 4;
  std::vector<int> block_out_channels{64};
  int layers_per_block = 1;
  int norm_num_groups = 32;
  std::string act_fn = "silu";
  double scaling_factor = 0.18215;
  double shift_factor = 0.0;
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;
  /// 2^(len(block_out_channels)-1), as FluxPipeline computes vae_scale_factor.
  int vaeScaleFactor() const { return 1 << (static_cast<int>(block_out_channels.size()) - 1); }
};

/// diffusers FlowMatchEulerDiscreteScheduler config.
struct SchedulerConfig {
  int num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5, max_shift = 1.15;
  int base_image_seq_len = 256, max_image_seq_len = 4096;
  std::string time_shift_type = "exponential";
};

/// A diffusers FluxPipeline folder. open() checks model_index.json and that every component folder
/// the pipeline needs exists with its config, and parses the configs.
struct ModelFolder {
  std::string path;
  std::string pipeline_class;
  FluxTransformerConfig transformer;
  CLIPTextConfig text_encoder;
  T5Config text_encoder_2;
  AutoencoderKLConfig vae;
  SchedulerConfig scheduler;
  int tokenizer_max_length = 77;      ///< tokenizer/tokenizer_config.json model_max_length
  int t5_max_length = 512;            ///< tokenizer_2 model_max_length (FluxPipeline default 512)

  /// Throws ModelFileError naming the missing/corrupt file: folder missing, model_index.json
  /// missing or not JSON, a component folder or its config.json missing, a config value of the
  /// wrong type.
  static ModelFolder open(const std::string& path);
  std::string component(const std::string& name) const { return path + "/" + name; }
  /// Total bytes of the transformer weights on disk (sum over shards).
  uint64_t transformerParameterCount() const;
};

/// Parses only transformer/config.json-like files (for --random-weights models defined by config).
FluxTransformerConfig parseFluxTransformerConfig(const std::string& configJsonPath);

/// The embedded default model shipped with DiT Studio: $DITSTUDIO_MODEL_DIR, else
/// <dir of the running executable>/../share/ditstudio/models/tiny-flux. Returns the path (may not
/// exist; ModelFolder::open reports that).
std::string defaultModelDir();

}  // namespace dit
