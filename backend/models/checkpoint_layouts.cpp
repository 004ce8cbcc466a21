#include "backend/models/checkpoint_layouts.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/io/file_guard.h"

namespace dit {

namespace {

bool startsWith(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool endsWith(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

std::string shapeStr(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// The number of blocks N of keys `<p><N>...` (N a decimal index): the indices must run 0..N-1
// without a gap, so the count is bounded by the number of keys and nothing is built from a lone
// huge index ('double_blocks.999999.x' would otherwise make a million blocks). Keys whose
// segment after `p` is not a decimal number are left to the caller. Throws ModelFileError naming
// `file` and the first key out of order.
int contiguousCount(const std::string& file, const std::string& p,
                    const std::vector<std::string>& keys) {
  std::map<int64_t, std::string> seen;  // index -> one key with it
  for (const auto& k : keys) {
    if (!startsWith(k, p)) continue;
    const size_t e = std::min(k.find('.', p.size()), k.size());
    const std::string digits = k.substr(p.size(), e - p.size());
    if (digits.empty() ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    if (digits.size() > 6 || (digits.size() > 1 && digits[0] == '0'))
      throw ModelFileError(file, "tensor '" + k + "' has block index '" + digits +
                                     "' (block indices are 0, 1, 2, ... without leading zeros, "
                                     "at most 999999)");
    seen.emplace(std::stoll(digits), k);
  }
  int64_t expect = 0;
  for (const auto& [i, k] : seen) {
    if (i != expect)
      throw ModelFileError(file, "tensor '" + k + "' has block index " + std::to_string(i) +
                                     " but no '" + p + std::to_string(expect) +
                                     ".*' tensor exists (block indices must run 0.." +
                                     std::to_string(seen.size() - 1) + " without gaps)");
    ++expect;
  }
  return static_cast<int>(seen.size());
}

// Number of `<prefix><group>.<N>.` blocks (indices contiguous from 0, see contiguousCount).
int countBlocks(const SafetensorsReader& r, const std::string& prefix, const std::string& group) {
  return contiguousCount(r.path(), prefix + group + ".", r.names());
}

const TensorInfo& need(const SafetensorsReader& r, const std::string& key, size_t dims) {
  if (!r.contains(key)) throw ModelFileError(r.path(), "tensor '" + key + "' is missing");
  const TensorInfo& i = r.info(key);
  if (i.shape.size() != dims)
    throw ModelFileError(r.path(), "tensor '" + key + "' has shape " + shapeStr(i.shape) +
                                       ", expected " + std::to_string(dims) + " dimensions");
  return i;
}

// Builder shared by the layouts: records mappings and which stored keys they consumed.
struct Builder {
  const SafetensorsReader& r;
  std::string prefix;
  KeyLayout out;
  std::set<std::string> used;
  bool scaled = false;  // the file declares scaled fp8: every F8 weight needs its scale

  Builder(const SafetensorsReader& rd, std::string p) : r(rd), prefix(std::move(p)) {
    out.file = r.path();
    scaled = r.contains(prefix + "scaled_fp8");
    if (scaled) used.insert(prefix + "scaled_fp8");
  }
  bool has(const std::string& k) const { return r.contains(prefix + k); }
  // The scale of stored weight `key` (ComfyUI `<module>.scale_weight` or `.weight_scale`, one
  // F32 / BF16 / F16 number), "" when none. The layer's other scaled-fp8 tensors are checked and
  // consumed here too: the activation scale (`.scale_input` / `.input_scale`: one finite number;
  // weight-only dequantization does not use it, as ComfyUI without fp8 matrix products) and
  // `.comfy_quant` (the layer's quantization config: its format must be the weight's fp8 type).
  std::string scaleFor(const std::string& key) {
    if (!endsWith(key, ".weight")) return {};
    const std::string base = key.substr(0, key.size() - 7);
    const TensorInfo& w = r.info(key);
    bool quantConfig = false;
    if (r.contains(base + ".comfy_quant")) {
      checkComfyQuant(base + ".comfy_quant", w);
      quantConfig = true;
    }
    for (const char* suffix : {".scale_input", ".input_scale"}) {
      const std::string s = base + suffix;
      if (!r.contains(s)) continue;
      const double v = scalar(s, "activation scale");
      if (!std::isfinite(v))
        throw ModelFileError(r.path(), "activation scale '" + s + "' is not a finite number");
      used.insert(s);
    }
    std::string found;
    for (const char* suffix : kWeightScaleSuffixes) {
      const std::string s = base + suffix;
      if (!r.contains(s)) continue;
      if (!found.empty())
        throw ModelFileError(
            r.path(), "weight '" + key + "' has two scales, '" + found + "' and '" + s + "'");
      (void)scalar(s, "scale");
      used.insert(s);
      found = s;
    }
    if (!found.empty()) return found;
    if ((scaled || quantConfig) && w.dtype == DType::F8_E4M3 && w.shape.size() == 2)
      throw ModelFileError(r.path(), "scaled fp8 checkpoint: weight '" + key +
                                         "' is stored as F8_E4M3 but its scale '" + base +
                                         ".scale_weight' is missing");
    return {};
  }
  // The value of one-element floating tensor `s` (F32, BF16, F16), or a ModelFileError naming it.
  double scalar(const std::string& s, const char* what) const {
    const TensorInfo& i = r.info(s);
    if (i.numel() != 1 ||
        (i.dtype != DType::F32 && i.dtype != DType::BF16 && i.dtype != DType::F16))
      throw ModelFileError(r.path(), std::string(what) + " '" + s +
                                         "' must be one F32, BF16 or F16 number, found " +
                                         dtypeName(i.dtype) + " " + shapeStr(i.shape));
    const uint8_t* p = r.data(i);
    if (i.dtype == DType::F32) {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    if (i.dtype == DType::BF16) {
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 31) return m ? std::nan("") : sign * HUGE_VAL;
    return sign * (e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25));
  }
  // `<layer>.comfy_quant`: U8 bytes of a JSON object whose "format" names the weight's type.
  void checkComfyQuant(const std::string& k, const TensorInfo& weight) {
    const TensorInfo& i = r.info(k);
    if (i.dtype != DType::U8 || i.shape.size() != 1 || i.numel() > 4096)
      throw ModelFileError(r.path(), "'" + k + "' must be the U8 bytes of a JSON object, found " +
                                         dtypeName(i.dtype) + " " + shapeStr(i.shape));
    const std::string text(reinterpret_cast<const char*>(r.data(i)),
                           static_cast<size_t>(i.numel()));
    const nlohmann::json j = parseModelJson(text, r.path(), "'" + k + "'");
    if (!j.is_object() || !j.contains("format") || !j["format"].is_string())
      throw ModelFileError(r.path(), "'" + k + "' has no \"format\" string");
    const std::string f = j["format"].get<std::string>();
    const std::string want = weight.dtype == DType::F8_E4M3   ? "float8_e4m3fn"
                             : weight.dtype == DType::F8_E5M2 ? "float8_e5m2"
                                                              : "";
    if (f != "float8_e4m3fn" && f != "float8_e5m2")
      throw ModelFileError(r.path(), "'" + k + "' asks for format '" + f.substr(0, 40) +
                                         "'; only the fp8 formats float8_e4m3fn and float8_e5m2 "
                                         "are supported");
    if (f != want)
      throw ModelFileError(r.path(), "'" + k + "' says '" + f + "' but the weight is stored as " +
                                         dtypeName(weight.dtype));
    used.insert(k);
  }
  // diffusers `name` = stored `key` whole (reshaped to `shape` when given).
  void whole(const std::string& name, const std::string& k, std::vector<int64_t> shape = {}) {
    const std::string key = prefix + k;
    if (!r.contains(key)) throw ModelFileError(r.path(), "tensor '" + key + "' is missing");
    const TensorInfo& i = r.info(key);
    MappedTensor m;
    m.segments.push_back({key, 0, i.shape.empty() ? 1 : i.shape[0]});
    m.shape = shape.empty() ? i.shape : shape;
    m.scaleKey = scaleFor(key);
    used.insert(key);
    out.tensors[name] = std::move(m);
  }
  // Both .weight and .bias.
  void linear(const std::string& name, const std::string& k) {
    whole(name + ".weight", k + ".weight");
    if (has(k + ".bias")) whole(name + ".bias", k + ".bias");
  }
  // diffusers `name` = rows [row0, row0 + rows) of stored `key`.
  void rows(const std::string& name, const std::string& k, int64_t row0, int64_t n) {
    const std::string key = prefix + k;
    if (!r.contains(key)) throw ModelFileError(r.path(), "tensor '" + key + "' is missing");
    const TensorInfo& i = r.info(key);
    if (i.shape.empty() || row0 + n > i.shape[0])
      throw ModelFileError(r.path(), "tensor '" + key + "' has shape " + shapeStr(i.shape) +
                                         ": cannot take rows [" + std::to_string(row0) + ", " +
                                         std::to_string(row0 + n) + ")");
    MappedTensor m;
    m.segments.push_back({key, row0, n});
    m.shape = i.shape;
    m.shape[0] = n;
    m.scaleKey = scaleFor(key);
    used.insert(key);
    out.tensors[name] = std::move(m);
  }
  // Fused linear `k` (weight and bias) split by rows into `parts` = {diffusers module, rows}.
  void split(const std::string& k, const std::vector<std::pair<std::string, int64_t>>& parts) {
    for (const char* s : {".weight", ".bias"}) {
      int64_t off = 0;
      for (const auto& [name, n] : parts) {
        rows(name + s, k + s, off, n);
        off += n;
      }
      const int64_t total = r.info(prefix + k + s).shape[0];
      if (off != total)
        throw ModelFileError(r.path(), "tensor '" + prefix + k + s + "' has " +
                                           std::to_string(total) + " rows, expected " +
                                           std::to_string(off) + " from the model width");
    }
  }
  // Every key under the prefix must have been consumed.
  void checkAllUsed(const std::vector<std::string>& otherPrefixes = {}) const {
    for (const auto& k : r.names()) {
      if (!startsWith(k, prefix) || used.count(k)) continue;
      bool other = false;
      for (const auto& o : otherPrefixes) other = other || startsWith(k, o);
      if (other) continue;
      throw ModelFileError(r.path(), "unknown tensor '" + k + "' in the " + out.description +
                                         ": the key layout is not the one expected");
    }
  }
};

}  // namespace

const CheckpointComponent* CheckpointInfo::find(const std::string& name) const {
  for (const auto& c : components)
    if (c.name == name) return &c;
  return nullptr;
}

const CheckpointComponent& CheckpointInfo::require(const std::string& name,
                                                   const std::string& flag) const {
  if (const CheckpointComponent* c = find(name)) return *c;
  static const std::map<std::string, std::pair<std::string, std::string>> what{
      {"transformer", {"a FLUX.1 transformer", "--model"}},
      {"vae", {"a VAE", "--vae"}},
      {"text_encoder", {"a CLIP text encoder", "--text-encoder"}},
      {"text_encoder_2", {"a T5 text encoder", "--text-encoder-2"}}};
  std::string holds;
  for (const auto& c : components) {
    auto it = what.find(c.name);
    holds += (holds.empty() ? "" : " and ") +
             (it == what.end() ? c.name
                               : it->second.first + " (give it with " + it->second.second + ")");
  }
  auto w = what.find(name);
  throw ModelFileError(file, "holds " + (holds.empty() ? std::string("nothing usable") : holds) +
                                 ", not " + (w == what.end() ? name : w->second.first) + " as " +
                                 flag + " needs");
}

std::string CheckpointInfo::describe() const {
  std::ostringstream s;
  s << (variant.empty() ? std::string("components") : variant)
    << (scaled_fp8 ? " (scaled fp8)" : "") << ":";
  for (size_t i = 0; i < components.size(); ++i) {
    const auto& c = components[i];
    s << (i ? ", " : " ") << c.name << " (" << c.layout;
    if (!c.prefix.empty()) s << " under '" << c.prefix << "'";
    s << ",";
    bool first = true;
    for (const auto& [d, n] : c.dtypes) {
      s << (first ? " " : " + ") << d << " x" << n;
      first = false;
    }
    s << ")";
  }
  return s.str();
}

CheckpointInfo inspectCheckpoint(const std::string& file) {
  SafetensorsReader r(file);  // throws for missing, truncated or malformed files
  CheckpointInfo info;
  info.file = file;
  // What the file says it is: GGUF's general.architecture (city96's FLUX.1 files: "flux"), the
  // Stability AI model spec's modelspec.architecture in a safetensors header ("flux-1-dev", ...).
  auto declared = [&](const char* key) -> std::string {
    const auto it = r.metadata().find(key);
    if (it == r.metadata().end()) return {};
    return it->second.size() > 120 ? it->second.substr(0, 117) + "..." : it->second;
  };
  if (const std::string a = declared("general.architecture"); !a.empty() && a != "flux")
    throw ModelFileError(file, "declares general.architecture \"" + a +
                                   "\" (GGUF metadata); DiT Studio reads FLUX.1 GGUF "
                                   "transformers (\"flux\")");
  const auto names = r.names();
  auto any = [&](const std::string& p) {
    for (const auto& k : names)
      if (startsWith(k, p)) return true;
    return false;
  };
  auto add = [&](const std::string& comp, const std::string& prefix, const std::string& layout) {
    CheckpointComponent c;
    c.name = comp;
    c.prefix = prefix;
    c.layout = layout;
    for (const auto& k : names) {
      if (!startsWith(k, prefix)) continue;
      const TensorInfo& i = r.info(k);
      c.dtypes[dtypeName(i.dtype)] += 1;
      c.bytes += i.nbytes();
    }
    info.components.push_back(std::move(c));
  };

  // Other families first: the clearest refusal.
  for (const std::string p : {"", "model.diffusion_model."}) {
    if (r.contains(p + "input_blocks.0.0.weight"))
      throw ModelFileError(file,
                           "this is a Stable Diffusion UNet checkpoint (key '" + p +
                               "input_blocks.0.0.weight'); DiT Studio runs FLUX.1 transformers");
    if (any(p + "joint_blocks."))
      throw ModelFileError(file, "this is a Stable Diffusion 3 (MMDiT) checkpoint (keys '" + p +
                                     "joint_blocks.*'); DiT Studio runs FLUX.1 transformers");
  }

  // FLUX.1 transformer, BFL layout (bare or ComfyUI model.diffusion_model.).
  for (const std::string p : {"", "model.diffusion_model."}) {
    if (!r.contains(p + "double_blocks.0.img_attn.norm.key_norm.scale")) {
      if (any(p + "double_blocks.") && any(p + "single_blocks."))
        throw ModelFileError(file, "keys '" + p +
                                       "double_blocks.*' without FLUX.1's "
                                       "'double_blocks.0.img_attn.norm.key_norm.scale': a "
                                       "different model family (FLUX.2 or another MMDiT), not "
                                       "supported");
      continue;
    }
    if (r.contains(p + "img_in.weight")) {
      const auto& s = r.info(p + "img_in.weight").shape;
      if (s.size() == 2 && s[1] == 384)
        throw ModelFileError(file,
                             "FLUX.1 Fill checkpoint (img_in takes 384 channels): not "
                             "supported yet");
      if (s.size() == 2 && s[1] == 128)
        throw ModelFileError(file,
                             "FLUX.1 Depth checkpoint (img_in takes 128 channels): not "
                             "supported yet");
    }
    info.family = "flux";
    info.variant = r.contains(p + "guidance_in.in_layer.bias") ? "flux-dev" : "flux-schnell";
    info.scaled_fp8 = r.contains(p + "scaled_fp8");
    for (const auto& k : names)
      if (startsWith(k, p) && (endsWith(k, ".scale_weight") || endsWith(k, ".weight_scale") ||
                               endsWith(k, ".comfy_quant")))
        info.scaled_fp8 = true;
    add("transformer", p, "bfl");
    break;
  }
  // A diffusers-named transformer file (diffusion_pytorch_model.safetensors copied alone).
  if (!info.find("transformer") && r.contains("transformer_blocks.0.attn.norm_k.weight") &&
      r.contains("x_embedder.weight")) {
    info.family = "flux";
    info.variant =
        r.contains("time_text_embed.guidance_embedder.linear_1.bias") ? "flux-dev" : "flux-schnell";
    add("transformer", "", "diffusers");
  }

  if (info.find("transformer")) {
    std::string spec = declared("modelspec.architecture");
    std::string lower = spec;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!spec.empty() && lower.find("flux") == std::string::npos)
      throw ModelFileError(file, "declares modelspec.architecture \"" + spec +
                                     "\" (safetensors metadata), not a FLUX.1 model");
  }
  // VAE: LDM layout bare, or under vae. / first_stage_model.; diffusers layout bare.
  for (const std::string p : {"", "vae.", "first_stage_model."}) {
    if (r.contains(p + "decoder.conv_in.weight") && any(p + "decoder.up.")) {
      add("vae", p, "ldm");
      break;
    }
    if (r.contains(p + "decoder.conv_in.weight") && any(p + "decoder.up_blocks.")) {
      add("vae", p, "diffusers");
      break;
    }
  }
  // Text encoders (ComfyUI all-in-one prefixes, or a bare transformers file).
  if (any("text_encoders.clip_l.transformer."))
    add("text_encoder", "text_encoders.clip_l.transformer.", "transformers");
  else if (info.components.empty() && (r.contains("text_model.embeddings.token_embedding.weight") ||
                                       r.contains("embeddings.token_embedding.weight")))
    add("text_encoder", "", "transformers");
  if (any("text_encoders.t5xxl.transformer."))
    add("text_encoder_2", "text_encoders.t5xxl.transformer.", "transformers");
  else if (info.components.empty() &&
           r.contains("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"))
    add("text_encoder_2", "", "transformers");

  if (info.components.empty()) {
    std::string first;
    for (size_t i = 0; i < names.size() && i < 4; ++i) first += (i ? "', '" : "'") + names[i];
    if (!first.empty()) first += "'";
    throw ModelFileError(file,
                         "unknown key layout: not a FLUX.1 transformer (BFL or diffusers names), "
                         "an LDM/diffusers VAE, a CLIP-L or T5 encoder, nor a ComfyUI all-in-one "
                         "checkpoint (first keys: " +
                             (first.empty() ? std::string("none") : first) + ")");
  }
  return info;
}

KeyLayout bflFluxTransformerLayout(const SafetensorsReader& r, const std::string& prefix) {
  Builder b(r, prefix);
  b.out.description =
      "BFL FLUX.1 transformer" + (prefix.empty() ? std::string() : " (prefix '" + prefix + "')");
  const int64_t D = need(r, prefix + "img_in.weight", 2).shape[0];
  const int64_t mlp = need(r, prefix + "double_blocks.0.img_mlp.0.weight", 2).shape[0];
  b.linear("x_embedder", "img_in");
  b.linear("context_embedder", "txt_in");
  b.linear("time_text_embed.timestep_embedder.linear_1", "time_in.in_layer");
  b.linear("time_text_embed.timestep_embedder.linear_2", "time_in.out_layer");
  b.linear("time_text_embed.text_embedder.linear_1", "vector_in.in_layer");
  b.linear("time_text_embed.text_embedder.linear_2", "vector_in.out_layer");
  if (b.has("guidance_in.in_layer.weight")) {
    b.linear("time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer");
    b.linear("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer");
  }
  const int nd = countBlocks(r, prefix, "double_blocks");
  const int ns = countBlocks(r, prefix, "single_blocks");
  for (int n = 0; n < nd; ++n) {
    const std::string s = "double_blocks." + std::to_string(n) + ".";
    const std::string t = "transformer_blocks." + std::to_string(n) + ".";
    b.linear(t + "norm1.linear", s + "img_mod.lin");
    b.linear(t + "norm1_context.linear", s + "txt_mod.lin");
    b.split(s + "img_attn.qkv", {{t + "attn.to_q", D}, {t + "attn.to_k", D}, {t + "attn.to_v", D}});
    b.split(s + "txt_attn.qkv",
            {{t + "attn.add_q_proj", D}, {t + "attn.add_k_proj", D}, {t + "attn.add_v_proj", D}});
    b.whole(t + "attn.norm_q.weight", s + "img_attn.norm.query_norm.scale");
    b.whole(t + "attn.norm_k.weight", s + "img_attn.norm.key_norm.scale");
    b.whole(t + "attn.norm_added_q.weight", s + "txt_attn.norm.query_norm.scale");
    b.whole(t + "attn.norm_added_k.weight", s + "txt_attn.norm.key_norm.scale");
    b.linear(t + "attn.to_out.0", s + "img_attn.proj");
    b.linear(t + "attn.to_add_out", s + "txt_attn.proj");
    b.linear(t + "ff.net.0.proj", s + "img_mlp.0");
    b.linear(t + "ff.net.2", s + "img_mlp.2");
    b.linear(t + "ff_context.net.0.proj", s + "txt_mlp.0");
    b.linear(t + "ff_context.net.2", s + "txt_mlp.2");
  }
  for (int m = 0; m < ns; ++m) {
    const std::string s = "single_blocks." + std::to_string(m) + ".";
    const std::string t = "single_transformer_blocks." + std::to_string(m) + ".";
    b.linear(t + "norm.linear", s + "modulation.lin");
    b.split(
        s + "linear1",
        {{t + "attn.to_q", D}, {t + "attn.to_k", D}, {t + "attn.to_v", D}, {t + "proj_mlp", mlp}});
    b.whole(t + "attn.norm_q.weight", s + "norm.query_norm.scale");
    b.whole(t + "attn.norm_k.weight", s + "norm.key_norm.scale");
    b.linear(t + "proj_out", s + "linear2");
  }
  b.linear("proj_out", "final_layer.linear");
  // BFL: shift, scale = chunk(2); diffusers AdaLayerNormContinuous: scale, shift = chunk(2).
  for (const char* sfx : {".weight", ".bias"}) {
    const std::string key = prefix + "final_layer.adaLN_modulation.1" + sfx;
    const TensorInfo& i = need(r, key, sfx[1] == 'w' ? 2 : 1);
    if (i.shape[0] != 2 * D)
      throw ModelFileError(r.path(), "tensor '" + key + "' has shape " + shapeStr(i.shape) +
                                         ", expected " + std::to_string(2 * D) + " rows");
    MappedTensor m;
    m.segments = {{key, D, D}, {key, 0, D}};
    m.shape = i.shape;
    m.scaleKey = b.scaleFor(key);
    b.used.insert(key);
    b.out.tensors[std::string("norm_out.linear") + sfx] = std::move(m);
  }
  // The other prefixes of an all-in-one file belong to other components.
  b.checkAllUsed(prefix.empty() ? std::vector<std::string>{"vae.", "text_encoders."}
                                : std::vector<std::string>{});
  return std::move(b.out);
}

KeyLayout ldmVaeLayout(const SafetensorsReader& r, const std::string& prefix) {
  Builder b(r, prefix);
  b.out.description =
      "LDM/BFL VAE" + (prefix.empty() ? std::string() : " (prefix '" + prefix + "')");
  const int L = countBlocks(r, prefix, "encoder.down");
  if (L == 0) throw ModelFileError(r.path(), "no 'encoder.down.*' tensors: not an LDM VAE");
  auto resnet = [&](const std::string& to, const std::string& from) {
    for (const char* m : {"norm1", "conv1", "norm2", "conv2"})
      b.linear(to + "." + m, from + "." + m);
    if (b.has(from + ".nin_shortcut.weight"))
      b.linear(to + ".conv_shortcut", from + ".nin_shortcut");
  };
  auto mid = [&](const std::string& side) {
    resnet(side + ".mid_block.resnets.0", side + ".mid.block_1");
    resnet(side + ".mid_block.resnets.1", side + ".mid.block_2");
    const std::string a = side + ".mid.attn_1.";
    if (!b.has(a + "q.weight")) return;
    const std::string t = side + ".mid_block.attentions.0.";
    b.linear(t + "group_norm", a + "norm");
    for (const auto& [to, from] : std::vector<std::pair<std::string, std::string>>{
             {"to_q", "q"}, {"to_k", "k"}, {"to_v", "v"}, {"to_out.0", "proj_out"}}) {
      const auto& s = need(r, prefix + a + from + ".weight", 4).shape;  // [C, C, 1, 1]
      b.whole(t + to + ".weight", a + from + ".weight", {s[0], s[1]});
      b.whole(t + to + ".bias", a + from + ".bias");
    }
  };
  for (const char* side : {"encoder", "decoder"}) {
    const std::string sd = side;
    b.linear(sd + ".conv_in", sd + ".conv_in");
    b.linear(sd + ".conv_out", sd + ".conv_out");
    b.linear(sd + ".conv_norm_out", sd + ".norm_out");
    mid(sd);
  }
  for (int i = 0; i < L; ++i) {
    const std::string d = "encoder.down." + std::to_string(i);
    const int nb = countBlocks(r, prefix, d + ".block");
    for (int j = 0; j < nb; ++j)
      resnet("encoder.down_blocks." + std::to_string(i) + ".resnets." + std::to_string(j),
             d + ".block." + std::to_string(j));
    if (b.has(d + ".downsample.conv.weight"))
      b.linear("encoder.down_blocks." + std::to_string(i) + ".downsamplers.0.conv",
               d + ".downsample.conv");
  }
  const int U = countBlocks(r, prefix, "decoder.up");
  for (int i = 0; i < U; ++i) {
    // LDM numbers decoder levels from the highest resolution, diffusers from the lowest.
    const std::string u = "decoder.up." + std::to_string(U - 1 - i);
    const int nb = countBlocks(r, prefix, u + ".block");
    for (int j = 0; j < nb; ++j)
      resnet("decoder.up_blocks." + std::to_string(i) + ".resnets." + std::to_string(j),
             u + ".block." + std::to_string(j));
    if (b.has(u + ".upsample.conv.weight"))
      b.linear("decoder.up_blocks." + std::to_string(i) + ".upsamplers.0.conv",
               u + ".upsample.conv");
  }
  for (const char* q : {"quant_conv", "post_quant_conv"})
    if (b.has(std::string(q) + ".weight")) b.linear(q, q);
  b.checkAllUsed();
  return std::move(b.out);
}

KeyLayout prefixLayout(const SafetensorsReader& r, const std::string& prefix,
                       const std::string& description) {
  KeyLayout l;
  l.file = r.path();
  l.description = description;
  for (const auto& k : r.names()) {
    if (!startsWith(k, prefix)) continue;
    const TensorInfo& i = r.info(k);
    MappedTensor m;
    m.segments.push_back({k, 0, i.shape.empty() ? 1 : i.shape[0]});
    m.shape = i.shape;
    const std::string name = k.substr(prefix.size());
    if (isFp8AuxiliaryKey(name)) continue;
    if (endsWith(k, ".weight"))
      for (const char* suffix : kWeightScaleSuffixes) {
        const std::string s = k.substr(0, k.size() - 7) + suffix;
        if (r.contains(s)) m.scaleKey = s;
      }
    l.tensors[name] = std::move(m);
  }
  return l;
}

std::shared_ptr<const KeyLayout> componentLayout(const SafetensorsReader& r,
                                                 const CheckpointComponent& c) {
  if (c.name == "transformer" && c.layout == "bfl")
    return std::make_shared<KeyLayout>(bflFluxTransformerLayout(r, c.prefix));
  if (c.name == "vae" && c.layout == "ldm")
    return std::make_shared<KeyLayout>(ldmVaeLayout(r, c.prefix));
  return std::make_shared<KeyLayout>(
      prefixLayout(r, c.prefix,
                   c.name + " (" + c.layout + " names" +
                       (c.prefix.empty() ? "" : ", prefix '" + c.prefix + "'") + ")"));
}

// ---------------------------------------------------------------------------------------------
// Configs from shapes

const TensorInfo& checkpointTensor(const SafetensorsReader& r, const std::string& key,
                                   size_t dims) {
  return need(r, key, dims);
}

int checkpointBlockCount(const SafetensorsReader& r, const std::string& prefix,
                         const std::string& group) {
  return countBlocks(r, prefix, group);
}

AutoencoderKLConfig vaeConfigFromLdm(const SafetensorsReader& r, const std::string& prefix,
                                     const AutoencoderKLConfig* reference) {
  AutoencoderKLConfig c;
  if (reference) {
    c = *reference;
  } else {
    c.norm_num_groups = 32;
    c.scaling_factor = 0.3611;  // FLUX.1 VAE (black-forest-labs/FLUX.1-dev vae/config.json)
    c.shift_factor = 0.1159;
    c.act_fn = "silu";
  }
  const int L = countBlocks(r, prefix, "encoder.down");
  c.block_out_channels.clear();
  for (int i = 0; i < L; ++i)
    c.block_out_channels.push_back(static_cast<int>(
        need(r, prefix + "encoder.down." + std::to_string(i) + ".block.0.conv1.weight", 4)
            .shape[0]));
  c.layers_per_block = countBlocks(r, prefix, "encoder.down.0.block");
  c.in_channels = static_cast<int>(need(r, prefix + "encoder.conv_in.weight", 4).shape[1]);
  c.out_channels = static_cast<int>(need(r, prefix + "decoder.conv_out.weight", 4).shape[0]);
  c.latent_channels = static_cast<int>(need(r, prefix + "decoder.conv_in.weight", 4).shape[1]);
  c.use_post_quant_conv = r.contains(prefix + "post_quant_conv.weight");
  c.mid_block_add_attention = r.contains(prefix + "decoder.mid.attn_1.q.weight");
  return c;
}

namespace {
const std::vector<int64_t>& shapeOf(const KeyLayout& l, const std::string& name) {
  auto it = l.tensors.find(name);
  if (it == l.tensors.end())
    throw ModelFileError(l.file, "tensor '" + name + "' is missing from the " + l.description);
  return it->second.shape;
}
int countIn(const KeyLayout& l, const std::string& p) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : l.tensors)
    if (startsWith(k, p)) keys.push_back(k);
  return contiguousCount(l.file, p, keys);
}
}  // namespace

CLIPTextConfig clipConfigFromShapes(const KeyLayout& l, const SafetensorsReader&,
                                    const CLIPTextConfig* reference) {
  CLIPTextConfig c;
  if (reference) c = *reference;
  const std::string p =
      l.tensors.count("text_model.embeddings.token_embedding.weight") ? "text_model." : "";
  const auto tok =
      shapeOf(l, p + "embeddings.token_embedding.weight");  // a copy: GCC 14 -Wdangling-reference
  c.vocab_size = static_cast<int>(tok[0]);
  c.hidden_size = static_cast<int>(tok[1]);
  c.max_position_embeddings =
      static_cast<int>(shapeOf(l, p + "embeddings.position_embedding.weight")[0]);
  c.intermediate_size = static_cast<int>(shapeOf(l, p + "encoder.layers.0.mlp.fc1.weight")[0]);
  c.num_hidden_layers = countIn(l, p + "encoder.layers.");
  if (!reference) {
    c.num_attention_heads = std::max(1, c.hidden_size / 64);  // CLIP-L: 768 / 64 = 12
    c.hidden_act = "quick_gelu";
    c.eos_token_id = 2;
    c.projection_dim = c.hidden_size;
  }
  return c;
}

T5Config t5ConfigFromShapes(const KeyLayout& l, const SafetensorsReader&,
                            const T5Config* reference) {
  T5Config c;
  if (reference) c = *reference;
  const std::string a = "encoder.block.0.layer.0.SelfAttention.";
  const auto rel = shapeOf(l, a + "relative_attention_bias.weight");
  c.relative_attention_num_buckets = static_cast<int>(rel[0]);
  c.num_heads = static_cast<int>(rel[1]);
  const auto q = shapeOf(l, a + "q.weight");
  c.d_model = static_cast<int>(q[1]);
  c.d_kv = static_cast<int>(q[0] / std::max<int64_t>(1, rel[1]));
  c.vocab_size = static_cast<int>(shapeOf(
      l, l.tensors.count("shared.weight") ? "shared.weight" : "encoder.embed_tokens.weight")[0]);
  c.num_layers = countIn(l, "encoder.block.");
  const std::string f = "encoder.block.0.layer.1.DenseReluDense.";
  c.is_gated_act = l.tensors.count(f + "wi_0.weight") != 0;
  c.d_ff = static_cast<int>(shapeOf(l, f + (c.is_gated_act ? "wi_0.weight" : "wi.weight"))[0]);
  if (!reference) c.dense_act_fn = c.is_gated_act ? "gelu_new" : "relu";
  return c;
}

}  // namespace dit
