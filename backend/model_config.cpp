#include "backend/model_config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace dit {
namespace fs = std::filesystem;
using nlohmann::json;

static json readJson(const std::string& file) {
  if (!fs::exists(file)) throw ModelFileError(file, "file is missing");
  std::ifstream in(file);
  if (!in) throw ModelFileError(file, "cannot open file");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw ModelFileError(file, std::string("not valid JSON: ") + e.what());
  }
}

template <typename T>
static void get(const json& j, const char* key, T& out, const std::string& file) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    out = it->get<T>();
  } catch (const json::exception&) {
    throw ModelFileError(file, std::string("config key '") + key + "' has the wrong type: " + it->dump());
  }
}

static FluxTransformerConfig parseFlux(const json& j, const std::string& f) {
  FluxTransformerConfig c;
  get(j, "patch_size", c.patch_size, f);
  get(j, "in_channels", c.in_channels, f);
  c.out_channels = c.in_channels;
  get(j, "out_channels", c.out_channels, f);
  get(j, "num_layers", c.num_layers, f);
  get(j, "num_single_layers", c.num_single_layers, f);
  get(j, "attention_head_dim", c.attention_head_dim, f);
  get(j, "num_attention_heads", c.num_attention_heads, f);
  get(j, "joint_attention_dim", c.joint_attention_dim, f);
  get(j, "pooled_projection_dim", c.pooled_projection_dim, f);
  get(j, "guidance_embeds", c.guidance_embeds, f);
  get(j, "axes_dims_rope", c.axes_dims_rope, f);
  int sum = 0;
  for (int a : c.axes_dims_rope) sum += a;
  if (sum != c.attention_head_dim)
    throw ModelFileError(f, "axes_dims_rope sum " + std::to_string(sum) +
                                " differs from attention_head_dim " +
                                std::to_string(c.attention_head_dim));
  if (c.patch_size != 1) throw ModelFileError(f, "patch_size other than 1 is not supported");
  return c;
}

FluxTransformerConfig parseFluxTransformerConfig(const std::string& path) {
  return parseFlux(readJson(path), path);
}

ModelFolder ModelFolder::open(const std::string& path) {
  ModelFolder m;
  m.path = path;
  if (!fs::is_directory(path)) throw ModelFileError(path, "model folder does not exist");
  const std::string idx = path + "/model_index.json";
  json mi = readJson(idx);
  get(mi, "_class_name", m.pipeline_class, idx);
  for (const char* comp : {"transformer", "text_encoder", "text_encoder_2", "tokenizer",
                           "tokenizer_2", "vae", "scheduler"}) {
    if (mi.contains(comp) && mi[comp].is_array() && !mi[comp].empty() && mi[comp][0].is_null())
      throw ModelFileError(idx, std::string("component '") + comp + "' is null; FluxPipeline needs it");
    if (!fs::is_directory(path + "/" + comp))
      throw ModelFileError(path + "/" + comp, "component folder is missing");
  }
  {
    const std::string f = path + "/transformer/config.json";
    m.transformer = parseFlux(readJson(f), f);
  }
  {
    const std::string f = path + "/text_encoder/config.json";
    json j = readJson(f);
    if (j.contains("text_config")) j = j["text_config"];
    auto& c = m.text_encoder;
    get(j, "vocab_size", c.vocab_size, f);
    get(j, "hidden_size", c.hidden_size, f);
    get(j, "intermediate_size", c.intermediate_size, f);
    get(j, "num_hidden_layers", c.num_hidden_layers, f);
    get(j, "num_attention_heads", c.num_attention_heads, f);
    get(j, "max_position_embeddings", c.max_position_embeddings, f);
    get(j, "hidden_act", c.hidden_act, f);
    get(j, "layer_norm_eps", c.layer_norm_eps, f);
    get(j, "eos_token_id", c.eos_token_id, f);
    get(j, "projection_dim", c.projection_dim, f);
  }
  {
    const std::string f = path + "/text_encoder_2/config.json";
    json j = readJson(f);
    auto& c = m.text_encoder_2;
    get(j, "vocab_size", c.vocab_size, f);
    get(j, "d_model", c.d_model, f);
    get(j, "d_kv", c.d_kv, f);
    get(j, "d_ff", c.d_ff, f);
    get(j, "num_layers", c.num_layers, f);
    get(j, "num_heads", c.num_heads, f);
    get(j, "relative_attention_num_buckets", c.relative_attention_num_buckets, f);
    get(j, "relative_attention_max_distance", c.relative_attention_max_distance, f);
    get(j, "layer_norm_epsilon", c.layer_norm_epsilon, f);
    std::string ffp = "relu";
    get(j, "feed_forward_proj", ffp, f);
    // transformers T5Config: "gated-gelu" -> is_gated_act, dense_act_fn "gelu_new".
    c.is_gated_act = ffp.rfind("gated-", 0) == 0;
    c.dense_act_fn = c.is_gated_act ? ffp.substr(6) : ffp;
    if (c.dense_act_fn == "gelu") c.dense_act_fn = "gelu_new";
    get(j, "is_gated_act", c.is_gated_act, f);
    get(j, "dense_act_fn", c.dense_act_fn, f);
  }
  {
    const std::string f = path + "/vae/config.json";
    json j = readJson(f);
    auto& c = m.vae;
    get(j, "in_channels", c.in_channels, f);
    get(j, "out_channels", c.out_channels, f);
    get(j, "latent_channels", c.latent_channels, f);
    get(j, "block_out_channels", c.block_out_channels, f);
    get(j, "layers_per_block", c.layers_per_block, f);
    get(j, "norm_num_groups", c.norm_num_groups, f);
    get(j, "act_fn", c.act_fn, f);
    get(j, "scaling_factor", c.scaling_factor, f);
    get(j, "shift_factor", c.shift_factor, f);
    get(j, "use_post_quant_conv", c.use_post_quant_conv, f);
    get(j, "mid_block_add_attention", c.mid_block_add_attention, f);
    if (c.block_out_channels.empty()) throw ModelFileError(f, "block_out_channels is empty");
  }
  {
    const std::string f = path + "/scheduler/scheduler_config.json";
    json j = readJson(f);
    auto& c = m.scheduler;
    get(j, "num_train_timesteps", c.num_train_timesteps, f);
    get(j, "shift", c.shift, f);
    get(j, "use_dynamic_shifting", c.use_dynamic_shifting, f);
    get(j, "base_shift", c.base_shift, f);
    get(j, "max_shift", c.max_shift, f);
    get(j, "base_image_seq_len", c.base_image_seq_len, f);
    get(j, "max_image_seq_len", c.max_image_seq_len, f);
    get(j, "time_shift_type", c.time_shift_type, f);
    if (c.time_shift_type != "exponential" && c.time_shift_type != "linear")
      throw ModelFileError(f, "unsupported time_shift_type '" + c.time_shift_type + "'");
  }
  for (const char* tk : {"tokenizer", "tokenizer_2"}) {
    const std::string f = path + "/" + tk + "/tokenizer_config.json";
    if (!fs::exists(f)) continue;
    json j = readJson(f);
    int v = 0;
    get(j, "model_max_length", v, f);
    if (v > 0 && v < 100000) (std::string(tk) == "tokenizer" ? m.tokenizer_max_length : m.t5_max_length) = v;
  }
  return m;
}

uint64_t ModelFolder::transformerParameterCount() const {
  auto st = SafetensorsCollection::openFolder(path + "/transformer", "diffusion_pytorch_model");
  uint64_t n = 0;
  for (auto& name : st.names()) n += static_cast<uint64_t>(st.info(name).numel());
  return n;
}

std::string defaultModelDir() {
  if (const char* e = std::getenv("DITSTUDIO_MODEL_DIR"); e && *e) return e;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "share/ditstudio/models/tiny-flux";
  return (exe.parent_path().parent_path() / "share/ditstudio/models/tiny-flux").lexically_normal().string();
}

}  // namespace dit
