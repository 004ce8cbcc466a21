// Configs of the text encoders (transformers CLIPTextConfig, T5Config), read from
// text_encoder*/config.json. Torch-free. Defaults are transformers' constructor defaults, used
// only when a key is absent.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace dit {

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

/// Parses a CLIPTextConfig (or a CLIPConfig's "text_config") read from `file`. Throws
/// ModelFileError naming the file: a key of the wrong type, a top level that is not a JSON
/// object, a "model_type" other than "clip_text_model" / "clip" (naming what it declares).
CLIPTextConfig parseCLIPTextConfig(const nlohmann::json& j, const std::string& file);
/// Parses a T5Config read from `file`; feed_forward_proj "gated-gelu" -> is_gated_act with
/// dense_act_fn "gelu_new" as transformers does. Throws ModelFileError as above ("model_type"
/// must be "t5" when present).
T5Config parseT5Config(const nlohmann::json& j, const std::string& file);

}  // namespace dit
