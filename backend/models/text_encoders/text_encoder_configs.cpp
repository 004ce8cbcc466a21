#include "backend/models/text_encoders/text_encoder_configs.h"

#include "backend/io/config_json.h"

namespace dit {

CLIPTextConfig parseCLIPTextConfig(const nlohmann::json& file_json, const std::string& f) {
  requireConfigObject(file_json, f);
  requireDeclaredAs(file_json, "model_type", {"clip_text_model", "clip"}, f);
  const nlohmann::json& j =
      file_json.contains("text_config") ? file_json["text_config"] : file_json;
  CLIPTextConfig c;
  getConfigValue(j, "vocab_size", c.vocab_size, f, {1, 1 << 24});
  getConfigValue(j, "hidden_size", c.hidden_size, f, {1, 65536});
  getConfigValue(j, "intermediate_size", c.intermediate_size, f, {1, 1 << 20});
  getConfigValue(j, "num_hidden_layers", c.num_hidden_layers, f, {1, 1024});
  getConfigValue(j, "num_attention_heads", c.num_attention_heads, f, {1, 4096});
  getConfigValue(j, "max_position_embeddings", c.max_position_embeddings, f, {1, 1 << 20});
  getConfigValue(j, "hidden_act", c.hidden_act, f);
  getConfigValue(j, "layer_norm_eps", c.layer_norm_eps, f, {0, 1});
  getConfigValue(j, "eos_token_id", c.eos_token_id, f);
  getConfigValue(j, "projection_dim", c.projection_dim, f, {1, 65536});
  return c;
}

T5Config parseT5Config(const nlohmann::json& j, const std::string& f) {
  requireConfigObject(j, f);
  requireDeclaredAs(j, "model_type", {"t5"}, f);
  T5Config c;
  getConfigValue(j, "vocab_size", c.vocab_size, f, {1, 1 << 24});
  getConfigValue(j, "d_model", c.d_model, f, {1, 65536});
  getConfigValue(j, "d_kv", c.d_kv, f, {1, 4096});
  getConfigValue(j, "d_ff", c.d_ff, f, {1, 1 << 20});
  getConfigValue(j, "num_layers", c.num_layers, f, {1, 1024});
  getConfigValue(j, "num_heads", c.num_heads, f, {1, 4096});
  getConfigValue(j, "relative_attention_num_buckets", c.relative_attention_num_buckets, f,
                 {1, 4096});
  getConfigValue(j, "relative_attention_max_distance", c.relative_attention_max_distance, f,
                 {1, 1 << 20});
  getConfigValue(j, "layer_norm_epsilon", c.layer_norm_epsilon, f, {0, 1});
  std::string ffp = "relu";
  getConfigValue(j, "feed_forward_proj", ffp, f);
  // transformers T5Config: "gated-gelu" -> is_gated_act, dense_act_fn "gelu_new".
  c.is_gated_act = ffp.rfind("gated-", 0) == 0;
  c.dense_act_fn = c.is_gated_act ? ffp.substr(6) : ffp;
  if (c.dense_act_fn == "gelu") c.dense_act_fn = "gelu_new";
  getConfigValue(j, "is_gated_act", c.is_gated_act, f);
  getConfigValue(j, "dense_act_fn", c.dense_act_fn, f);
  return c;
}

}  // namespace dit
