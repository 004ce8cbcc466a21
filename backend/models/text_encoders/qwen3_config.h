// transformers Qwen3Config (models/qwen3/configuration_qwen3.py), read from
// text_encoder/config.json (FLUX.2 [klein]'s text encoder, a Qwen3ForCausalLM checkpoint), and
// the text half of Qwen2_5_VLConfig (models/qwen2_5_vl/configuration_qwen2_5_vl.py: Qwen-Image's
// text encoder, a Qwen2 decoder) as the same struct with its switches set. Torch-free.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

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
  bool attention_bias = false;  ///< Qwen3: biases on q_proj, k_proj, v_proj AND o_proj
  std::string hidden_act = "silu";
  // Switches of the Qwen2 decoder (Qwen2.5-VL's language model); Qwen3's values by default.
  /// RMSNorm of each query / key head (self_attn.q_norm / k_norm): Qwen3 yes, Qwen2 no.
  bool qk_norm = true;
  /// Qwen2: q_proj, k_proj, v_proj with biases, o_proj without.
  bool qkv_bias = false;
  /// Qwen2.5-VL's get_rope_index on text: position ids = cumsum(attention_mask) - 1 with padding
  /// positions set to 1 (Qwen3: 0..L-1 whatever the mask).
  bool positions_from_mask = false;
  /// Qwen2.5-VL rope_scaling.mrope_section (sums to head_dim / 2). For text all three sections
  /// get the same position, so the rotation is plain 1-D RoPE; kept for validation and facts.
  std::vector<int> mrope_section;
  /// A query row with no allowed key (a LEFT-padding row under the causal AND key-padding mask)
  /// gets attention output 0, as transformers' default SDPA attention gives it (torch >= 2.5);
  /// false: eager's additive finfo.min mask, i.e. uniform attention over all keys. Only left
  /// padding has such rows (Mistral: parseMistralTextConfig sets it).
  bool masked_rows_zero = false;
  bool hasQkvBias() const { return attention_bias || qkv_bias; }
};

/// Parses and validates a Qwen3Config read from `file`: every key's JSON type, ranges
/// (hidden_size 1..65536, layers 1..512, heads 1..1024, num_attention_heads divisible by
/// num_key_value_heads, head_dim even 2..1024, rms_norm_eps in (0, 1], rope_theta > 0),
/// hidden_act "silu", rope type "default" (rope_scaling null), no sliding window. Throws
/// ModelFileError naming the file and the key; also when `j` is not a JSON object, or its
/// "model_type" declares another architecture than "qwen3" (naming what it declares).
Qwen3Config parseQwen3Config(const nlohmann::json& j, const std::string& file);

/// Parses the text half of a Qwen2_5_VLConfig read from `file` (Qwen-Image's text_encoder): the
/// text keys at the top level (transformers <= 4.5x) or under "text_config" (later versions),
/// head_dim = hidden_size / num_attention_heads, qk_norm false, qkv_bias true,
/// positions_from_mask true; rope_scaling must be {type or rope_type "mrope" (or "default"),
/// mrope_section summing to head_dim / 2}. The vision_config is not read (the text-to-image
/// pipeline never runs the vision tower). Throws ModelFileError naming the file and the key (the
/// ranges of parseQwen3Config); also when `j` is not a JSON object, or its "model_type" is not
/// "qwen2_5_vl" (or "qwen2_5_vl_text").
Qwen3Config parseQwen2_5_VLTextConfig(const nlohmann::json& j, const std::string& file);

/// Parses the text half of a Mistral3Config read from `file` (FLUX.2 [dev]'s text_encoder, a
/// Mistral3ForConditionalGeneration: the keys under "text_config", model_type "mistral"), or a
/// plain MistralConfig (model_type "mistral"): the Mistral decoder as this struct with qk_norm
/// false, no biases, positions 0..L-1, masked_rows_zero true (SDPA), head_dim explicit (null or
/// absent: hidden_size / num_attention_heads), rope_theta from rope_theta or
/// rope_parameters.rope_theta. The vision_config is not read. Throws ModelFileError naming the
/// file and the key: the ranges of parseQwen3Config, hidden_act other than "silu", a
/// sliding_window that is set, a "model_type" other than "mistral3" / "mistral", a text_config
/// that is not an object.
Qwen3Config parseMistralTextConfig(const nlohmann::json& j, const std::string& file);

/// readConfigJson(file) + parseQwen3Config.
Qwen3Config loadQwen3Config(const std::string& file);

}  // namespace dit
