// transformers Qwen3Config (models/qwen3/configuration_qwen3.py), read from
// text_encoder/config.json (FLUX.2 [klein]'s text encoder, a Qwen3ForCausalLM checkpoint).
// Torch-free.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace dit {

/// The keys of Qwen3Config the encoder stack uses. Defaults are transformers' constructor
/// defaults, used only when a key is absent.
struct Qwen3Config {
  int vocab_size = 151936;
  int hidden_size = 4096;
  int intermediate_size = 22016;
  int num_hidden_layers = 32;
  int num_attention_heads = 32;
  int num_key_value_heads = 32;
  int head_dim = 128;  ///< explicit in Qwen3 (not hidden_size / num_attention_heads)
  int max_position_embeddings = 32768;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;  ///< rope_theta, or rope_parameters.rope_theta (transformers v5)
  bool attention_bias = false;
  std::string hidden_act = "silu";
};

/// Parses and validates a Qwen3Config read from `file`: every key's JSON type, ranges
/// (hidden_size 1..65536, layers 1..512, heads 1..1024, num_attention_heads divisible by
/// num_key_value_heads, head_dim even 2..1024, rms_norm_eps in (0, 1], rope_theta > 0),
/// hidden_act "silu", rope type "default" (rope_scaling null), no sliding window. Throws
/// ModelFileError naming the file and the key.
Qwen3Config parseQwen3Config(const nlohmann::json& j, const std::string& file);

/// readConfigJson(file) + parseQwen3Config.
Qwen3Config loadQwen3Config(const std::string& file);

}  // namespace dit
