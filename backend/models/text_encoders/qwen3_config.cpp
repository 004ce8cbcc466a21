#include "backend/models/text_encoders/qwen3_config.h"

#include "backend/io/config_json.h"

namespace dit {

namespace {

// The keys Qwen3Config and Qwen2_5_VLConfig's text half share; rope_scaling is the caller's.
Qwen3Config parseCommon(const nlohmann::json& j, const std::string& f) {
  requireConfigObject(j, f);
  Qwen3Config c;
  getConfigValue(j, "vocab_size", c.vocab_size, f, {1, 1 << 24});
  getConfigValue(j, "hidden_size", c.hidden_size, f, {1, 65536});
  getConfigValue(j, "intermediate_size", c.intermediate_size, f, {1, 1 << 20});
  getConfigValue(j, "num_hidden_layers", c.num_hidden_layers, f, {1, 512});
  getConfigValue(j, "num_attention_heads", c.num_attention_heads, f, {1, 1024});
  c.num_key_value_heads = c.num_attention_heads;  // transformers: None -> num_attention_heads
  getConfigValue(j, "num_key_value_heads", c.num_key_value_heads, f, {1, 1024});
  c.head_dim = c.hidden_size / c.num_attention_heads;  // transformers default when absent
  getConfigValue(j, "head_dim", c.head_dim, f, {2, 1024});
  getConfigValue(j, "max_position_embeddings", c.max_position_embeddings, f, {1, 1 << 24});
  getConfigValue(j, "rms_norm_eps", c.rms_norm_eps, f, {1e-12, 1});
  getConfigValue(j, "rope_theta", c.rope_theta, f, {1e-3, 1e12});
  getConfigValue(j, "attention_bias", c.attention_bias, f);
  getConfigValue(j, "hidden_act", c.hidden_act, f);
  if (c.hidden_act != "silu")
    throw ModelFileError(
        f, "config key 'hidden_act' must be \"silu\" for Qwen3, got \"" + c.hidden_act + "\"");
  if (c.head_dim % 2 != 0)
    throw ModelFileError(
        f, "config key 'head_dim' must be even (RoPE), got " + std::to_string(c.head_dim));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    throw ModelFileError(f, "config key 'num_attention_heads' (" +
                                std::to_string(c.num_attention_heads) +
                                ") must be a multiple of 'num_key_value_heads' (" +
                                std::to_string(c.num_key_value_heads) + ")");
  // transformers v5: rope_parameters {rope_type, rope_theta}; v4: rope_theta + rope_scaling.
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) throw ModelFileError(f, "config key 'rope_parameters' is not an object");
    std::string type = "default";
    getConfigValue(*it, "rope_type", type, f);
    if (type != "default")
      throw ModelFileError(f, "config key 'rope_parameters.rope_type' \"" + type +
                                  "\" is not supported (only \"default\")");
    getConfigValue(*it, "rope_theta", c.rope_theta, f, {1e-3, 1e12});
  }
  bool sliding = false;
  getConfigValue(j, "use_sliding_window", sliding, f);
  if (sliding)
    throw ModelFileError(f,
                         "config key 'use_sliding_window' is true; sliding-window attention "
                         "is not supported");
  return c;
}

}  // namespace

Qwen3Config parseQwen3Config(const nlohmann::json& j, const std::string& f) {
  requireConfigObject(j, f);
  requireDeclaredAs(j, "model_type", {"qwen3"}, f);  // not Qwen2.5-VL's config read as Qwen3
  Qwen3Config c = parseCommon(j, f);
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null())
    throw ModelFileError(f, "config key 'rope_scaling' is set; only the default RoPE is supported");
  return c;
}

Qwen3Config parseQwen2_5_VLTextConfig(const nlohmann::json& top, const std::string& f) {
  requireConfigObject(top, f);
  requireDeclaredAs(top, "model_type", {"qwen2_5_vl", "qwen2_5_vl_text"}, f);
  const auto tc = top.find("text_config");
  const bool nested = tc != top.end() && tc->is_object();
  const nlohmann::json& j = nested ? *tc : top;
  Qwen3Config c = parseCommon(j, f);
  // Qwen2 attention: head_dim is always hidden_size / num_attention_heads.
  if (c.hidden_size % c.num_attention_heads != 0 ||
      c.head_dim != c.hidden_size / c.num_attention_heads)
    throw ModelFileError(f, "config key 'hidden_size' (" + std::to_string(c.hidden_size) +
                                ") must be num_attention_heads (" +
                                std::to_string(c.num_attention_heads) + ") x head_dim (" +
                                std::to_string(c.head_dim) + ")");
  c.qk_norm = false;
  c.qkv_bias = true;
  c.attention_bias = false;
  c.positions_from_mask = true;
  const nlohmann::json* rs = nullptr;
  for (const nlohmann::json* o : {&j, &top})
    if (auto it = o->find("rope_scaling"); !rs && it != o->end() && !it->is_null()) rs = &*it;
  if (rs) {
    if (!rs->is_object()) throw ModelFileError(f, "config key 'rope_scaling' is not an object");
    std::string type = "default";
    getConfigValue(*rs, "rope_type", type, f);
    getConfigValue(*rs, "type", type, f);
    if (type != "mrope" && type != "default")
      throw ModelFileError(f, "config key 'rope_scaling.type' \"" + type +
                                  "\" is not supported (Qwen2.5-VL's \"mrope\" or \"default\")");
    getConfigValue(*rs, "mrope_section", c.mrope_section, f, {1, 4096});
    if (type == "mrope") {
      int sum = 0;
      for (int s : c.mrope_section) sum += s;
      if (c.mrope_section.empty() || 2 * sum != c.head_dim)
        throw ModelFileError(
            f, "config key 'rope_scaling.mrope_section' must sum to head_dim / 2 (" +
                   std::to_string(c.head_dim / 2) + "), sums to " + std::to_string(sum));
    }
  }
  return c;
}

Qwen3Config parseMistralTextConfig(const nlohmann::json& top, const std::string& f) {
  requireConfigObject(top, f);
  requireDeclaredAs(top, "model_type", {"mistral3", "mistral"}, f);
  const nlohmann::json* j = &top;
  if (auto tc = top.find("text_config"); tc != top.end() && !tc->is_null()) {
    if (!tc->is_object()) throw ModelFileError(f, "config key 'text_config' is not an object");
    requireDeclaredAs(*tc, "model_type", {"mistral"}, f);
    j = &*tc;
  } else if (top.value("model_type", std::string()) == "mistral3") {
    throw ModelFileError(f, "config key 'text_config' is missing (Mistral3's language model)");
  }
  // transformers MistralConfig defaults where the file leaves a key out.
  nlohmann::json d = *j;
  for (const auto& [k, v] : {std::pair<const char*, nlohmann::json>{"vocab_size", 32000},
                             {"hidden_size", 4096},
                             {"intermediate_size", 14336},
                             {"num_hidden_layers", 32},
                             {"num_attention_heads", 32},
                             {"num_key_value_heads", 8},
                             {"max_position_embeddings", 131072},
                             {"rms_norm_eps", 1e-6},
                             {"rope_theta", 10000.0}})
    if (!d.contains(k) || d[k].is_null()) d[k] = v;
  Qwen3Config c = parseCommon(d, f);
  if (auto it = j->find("sliding_window"); it != j->end() && !it->is_null())
    throw ModelFileError(f, "config key 'sliding_window' is set (" + it->dump() +
                                "); sliding-window attention is not supported");
  if (auto it = j->find("rope_scaling"); it != j->end() && !it->is_null())
    throw ModelFileError(f, "config key 'rope_scaling' is set; only the default RoPE is supported");
  c.qk_norm = false;
  c.qkv_bias = false;
  c.attention_bias = false;
  c.positions_from_mask = false;
  c.masked_rows_zero = true;
  return c;
}

Qwen3Config loadQwen3Config(const std::string& file) {
  return parseQwen3Config(readConfigJson(file), file);
}

}  // namespace dit
