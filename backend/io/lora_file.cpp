#include "backend/io/lora_file.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <utility>

#include "backend/io/safetensors.h"

namespace dit {

namespace {

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool startsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::string shapeStr(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

bool isFloat(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64;
}

float halfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) return (sign ? -1.f : 1.f) * std::ldexp(static_cast<float>(man), -24);
  if (exp == 31) return man ? NAN : (sign ? -INFINITY : INFINITY);
  const uint32_t bits = sign | ((exp + 112) << 23) | (man << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The value of a scalar (or one-element) floating tensor in the mapped file.
double scalarValue(const SafetensorsReader& r, const TensorInfo& t) {
  const uint8_t* p = r.data(t);
  switch (t.dtype) {
    case DType::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::F64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return halfToFloat(h);
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    default:
      throw ModelFileError(r.path(), "alpha tensor '" + t.name + "' is " + dtypeName(t.dtype) +
                                         ", expected a floating-point scalar");
  }
}

struct Parts {
  std::string a, b, alpha;
};

// diffusers/PEFT key -> (module, role); false when the key is not of that layout.
bool diffusersKey(const std::string& key, std::string& module, std::string& role) {
  static const char* kRoles[] = {".lora_A.weight", ".lora_B.weight", ".alpha"};
  for (const char* r : kRoles) {
    if (endsWith(key, r)) {
      module = key.substr(0, key.size() - std::strlen(r));
      role = r;
      return true;
    }
  }
  return false;
}

bool kohyaKey(const std::string& key, std::string& module, std::string& role) {
  if (!startsWith(key, "lora_")) return false;
  static const char* kRoles[] = {".lora_down.weight", ".lora_up.weight", ".alpha"};
  for (const char* r : kRoles) {
    if (endsWith(key, r)) {
      module = key.substr(0, key.size() - std::strlen(r));
      role = r;
      return true;
    }
  }
  return false;
}

// PEFT's get_pattern_key (peft/utils/other.py): the first key of rank_pattern / alpha_pattern,
// in the file's order, that matches the whole module path as re.match(rf"(.*\.)?({key})$") does,
// i.e. the key is a regular expression matched against the full path or a dot-separated suffix.
// Returns the index of the matching entry or -1. Keys that are not valid regular expressions are
// refused by the caller (checkPattern).
int patternIndex(const std::vector<std::pair<std::string, std::regex>>& pattern,
                 const std::string& module) {
  for (size_t i = 0; i < pattern.size(); ++i)
    if (std::regex_match(module, pattern[i].second)) return static_cast<int>(i);
  return -1;
}

// "an integer", "a string", "an array", ... for messages.
std::string jsonTypeName(const nlohmann::ordered_json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  if (v.is_null()) return "null";
  return std::string("a ") + v.type_name();
}

// A ModelFileError naming the file, the metadata field and the type it has against `want` (the
// type PEFT's LoraConfig declares for it).
[[noreturn]] void badField(const std::string& path, const std::string& key, const std::string& want,
                           const nlohmann::ordered_json& v) {
  throw ModelFileError(path, "lora_adapter_metadata field '" + key + "' is " + jsonTypeName(v) +
                                 " (" + v.dump().substr(0, 60) + "), expected " + want);
}

double finiteNumber(const std::string& path, const std::string& key,
                    const nlohmann::ordered_json& v) {
  if (!v.is_number()) badField(path, key, "a number", v);
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max())
    throw ModelFileError(path, "lora_adapter_metadata field '" + key + "' is " + v.dump() +
                                   ", outside the float32 range LoRA scales are computed in");
  return d;
}

int64_t positiveRank(const std::string& path, const std::string& key,
                     const nlohmann::ordered_json& v) {
  if (!v.is_number_integer()) badField(path, key, "a positive integer", v);
  const int64_t r = v.get<int64_t>();
  if (r <= 0) badField(path, key, "a positive integer", v);
  return r;
}

// rank_pattern / alpha_pattern: an object of regular expression -> value (checked by `check`).
template <typename T, typename Check>
std::vector<std::pair<std::string, std::regex>> readPattern(const std::string& path,
                                                            const nlohmann::ordered_json& config,
                                                            const std::string& field,
                                                            std::vector<T>& values, Check check) {
  std::vector<std::pair<std::string, std::regex>> out;
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) return out;
  if (!it->is_object()) badField(path, field, "an object of module pattern -> value", *it);
  for (const auto& [k, v] : it->items()) {
    try {
      out.emplace_back(k, std::regex("(.*\\.)?(" + k + ")", std::regex::ECMAScript));
    } catch (const std::regex_error& e) {
      throw ModelFileError(path, "lora_adapter_metadata field '" + field + "' has key '" + k +
                                     "', which is not a regular expression (" + e.what() + ")");
    }
    values.push_back(check(path, field + "." + k, v));
  }
  return out;
}

}  // namespace

const char* loraFormatName(LoraFormat f) { return f == LoraFormat::Kohya ? "kohya" : "diffusers"; }

std::string LoraFileInfo::summary() const {
  return std::string(loraFormatName(format)) + ", rank " + std::to_string(rank) + ", " +
         std::to_string(modules.size()) + " modules, alpha from " + alphaSource;
}

LoraFileInfo inspectLoraFile(const std::string& path) {
  SafetensorsReader r(path);  // throws ModelFileError for anything that is not safetensors
  LoraFileInfo info;
  info.path = path;
  info.metadata = r.metadata();
  const auto names = r.names();
  if (names.empty()) throw ModelFileError(path, "not a LoRA file: it holds no tensors");

  // Decide the layout from the keys: every key must belong to one of them.
  bool anyDiffusers = false, anyKohya = false;
  std::map<std::string, Parts> parts;  // module -> keys (ordered by module name)
  for (const auto& key : names) {
    std::string module, role;
    if (kohyaKey(key, module, role)) {
      anyKohya = true;
    } else if (diffusersKey(key, module, role)) {
      anyDiffusers = true;
    } else {
      throw ModelFileError(path, "unknown LoRA format: key '" + key +
                                     "' is neither diffusers/PEFT (<module>.lora_A.weight, "
                                     "<module>.lora_B.weight, <module>.alpha) nor kohya "
                                     "(lora_unet_<module>.lora_down.weight / .lora_up.weight / "
                                     ".alpha)");
    }
    Parts& p = parts[module];
    if (role == ".lora_A.weight" || role == ".lora_down.weight") p.a = key;
    if (role == ".lora_B.weight" || role == ".lora_up.weight") p.b = key;
    if (role == ".alpha") p.alpha = key;
  }
  if (anyDiffusers && anyKohya)
    throw ModelFileError(path, "unknown LoRA format: it mixes diffusers/PEFT and kohya keys");
  info.format = anyKohya ? LoraFormat::Kohya : LoraFormat::Diffusers;

  // diffusers: the adapter config in the header, if any. Read in the file's key order (PEFT
  // matches rank_pattern / alpha_pattern keys in dict order), every field with the type PEFT's
  // LoraConfig gives it.
  nlohmann::ordered_json config;
  bool hasConfig = false, anyAlphaTensor = false, rslora = false;
  int64_t configRank = 0;
  double configAlpha = 0;
  std::vector<int64_t> rankValues;
  std::vector<double> alphaValues;
  std::vector<std::pair<std::string, std::regex>> rankPattern, alphaPattern;
  if (info.format == LoraFormat::Diffusers) {
    auto it = info.metadata.find("lora_adapter_metadata");
    if (it != info.metadata.end()) {
      nlohmann::ordered_json j;
      try {
        j = nlohmann::ordered_json::parse(it->second);
      } catch (const std::exception& e) {
        throw ModelFileError(path, std::string("lora_adapter_metadata is not a PEFT LoraConfig "
                                               "JSON object: ") +
                                       e.what());
      }
      if (!j.is_object())
        throw ModelFileError(path, "lora_adapter_metadata is " + jsonTypeName(j) +
                                       ", expected a PEFT LoraConfig JSON object");
      // Keys are "transformer.<field>" (diffusers prefixes them); plain "<field>" is accepted.
      for (const auto& [k, v] : j.items())
        config[startsWith(k, "transformer.") ? k.substr(12) : k] = v;
      if (!config.contains("lora_alpha") || !config.contains("r"))
        throw ModelFileError(path,
                             "lora_adapter_metadata lacks a numeric 'lora_alpha' and an "
                             "integer 'r'");
      configRank = positiveRank(path, "r", config["r"]);
      configAlpha = finiteNumber(path, "lora_alpha", config["lora_alpha"]);
      for (const char* flag : {"use_rslora", "use_dora"}) {
        auto f = config.find(flag);
        if (f != config.end() && !f->is_null() && !f->is_boolean())
          badField(path, flag, "true or false", *f);
      }
      rslora = config.value("use_rslora", false);
      if (config.value("use_dora", false))
        throw ModelFileError(path, "DoRA adapters (use_dora) are not supported");
      rankPattern = readPattern(path, config, "rank_pattern", rankValues, positiveRank);
      alphaPattern = readPattern(path, config, "alpha_pattern", alphaValues, finiteNumber);
      hasConfig = true;
    }
  }

  for (const auto& [name, p] : parts) {
    if (p.a.empty() || p.b.empty()) {
      const bool kohya = info.format == LoraFormat::Kohya;
      throw ModelFileError(
          path,
          "module '" + name + "' has " +
              (p.a.empty() ? (kohya ? "lora_up" : "lora_B") : (kohya ? "lora_down" : "lora_A")) +
              " but no " +
              (p.a.empty() ? (kohya ? "lora_down" : "lora_A") : (kohya ? "lora_up" : "lora_B")));
    }
    const TensorInfo& a = r.info(p.a);
    const TensorInfo& b = r.info(p.b);
    for (const TensorInfo* t : {&a, &b}) {
      if (t->shape.size() != 2)
        throw ModelFileError(path, "tensor '" + t->name + "' has shape " + shapeStr(t->shape) +
                                       ", a LoRA factor must be 2-D (convolution LoRAs are not "
                                       "supported)");
      if (!isFloat(t->dtype))
        throw ModelFileError(path, "tensor '" + t->name + "' is " + dtypeName(t->dtype) +
                                       ", expected F32, F16, BF16 or F64");
    }
    if (a.shape[0] != b.shape[1] || a.shape[0] <= 0)
      throw ModelFileError(path, "module '" + name + "': rank of '" + p.a + "' " +
                                     shapeStr(a.shape) + " and of '" + p.b + "' " +
                                     shapeStr(b.shape) + " disagree");
    LoraFileModule m;
    m.keyA = p.a;
    m.keyB = p.b;
    m.keyAlpha = p.alpha;
    m.rank = a.shape[0];
    m.in = a.shape[1];
    m.out = b.shape[0];
    info.bytes += a.nbytes() + b.nbytes();
    if (info.format == LoraFormat::Kohya) {
      if (!startsWith(name, "lora_unet_"))
        throw ModelFileError(path, "module '" + name +
                                       "' is not a denoiser (lora_unet_) module; text-encoder "
                                       "LoRAs are not supported");
      m.name = name.substr(10);
    } else {
      m.name = name;
      for (const char* prefix : {"transformer.", "base_model.model."})
        if (startsWith(m.name, prefix)) {
          m.name = m.name.substr(std::strlen(prefix));
          break;
        }
      for (const char* te : {"text_encoder.", "text_encoder_2.", "te."})
        if (startsWith(name, te))
          throw ModelFileError(path, "module '" + name +
                                         "' belongs to a text encoder; only denoiser "
                                         "(transformer) LoRAs are supported");
    }
    if (!p.alpha.empty()) {
      const TensorInfo& t = r.info(p.alpha);
      if (t.numel() != 1)
        throw ModelFileError(path, "alpha tensor '" + p.alpha + "' has shape " + shapeStr(t.shape) +
                                       ", expected a scalar");
      m.alpha = scalarValue(r, t);
      if (!(m.alpha > 0) || !std::isfinite(m.alpha))
        throw ModelFileError(path, "alpha tensor '" + p.alpha + "' is " + std::to_string(m.alpha) +
                                       ", expected a positive number");
      anyAlphaTensor = true;
      info.bytes += t.nbytes();
    }
    info.modules.push_back(std::move(m));
  }
  if (info.modules.empty()) throw ModelFileError(path, "not a LoRA file: no lora_A/lora_B pairs");
  if (hasConfig && anyAlphaTensor)
    throw ModelFileError(path,
                         "the file has both lora_adapter_metadata and alpha tensors "
                         "(diffusers refuses such a file: the alpha would be ambiguous)");

  // diffusers get_peft_kwargs: with alpha tensors, lora_alpha = the most common alpha (what a
  // module without its own alpha tensor gets), the others are per-module overrides.
  double commonAlpha = 0;
  if (anyAlphaTensor && info.format == LoraFormat::Diffusers) {
    std::map<double, int> counts;
    for (const auto& m : info.modules)
      if (!m.keyAlpha.empty()) ++counts[m.alpha];
    int best = 0;
    for (const auto& [v, n] : counts)
      if (n > best) best = n, commonAlpha = v;
  }
  // Alpha and scale per module.
  for (auto& m : info.modules) {
    if (info.format == LoraFormat::Kohya) {
      if (m.keyAlpha.empty()) m.alpha = static_cast<double>(m.rank);
    } else if (hasConfig) {
      // PEFT LoraModel._create_and_replace: r = rank_pattern.get(key, r), alpha likewise.
      int64_t r0 = configRank;
      double alpha = configAlpha;
      std::string rankFrom = "r";
      if (const int i = patternIndex(rankPattern, m.name); i >= 0) {
        r0 = rankValues[static_cast<size_t>(i)];
        rankFrom = "rank_pattern '" + rankPattern[static_cast<size_t>(i)].first + "'";
      }
      if (const int i = patternIndex(alphaPattern, m.name); i >= 0)
        alpha = alphaValues[static_cast<size_t>(i)];
      if (r0 != m.rank)
        throw ModelFileError(path, "module '" + m.name + "': lora_adapter_metadata gives " +
                                       (rankFrom == "r" ? "r " : rankFrom + " rank ") +
                                       std::to_string(r0) + " but its factors have rank " +
                                       std::to_string(m.rank));
      m.alpha = alpha;
    } else if (m.keyAlpha.empty()) {
      m.alpha = anyAlphaTensor ? commonAlpha : static_cast<double>(m.rank);
    }
    m.scale = rslora ? m.alpha / std::sqrt(static_cast<double>(m.rank))
                     : m.alpha / static_cast<double>(m.rank);
    // The deltas are computed in float32 (at most in the model's dtype): a scale outside its
    // range would turn every output of the module into Inf / NaN.
    if (!std::isfinite(m.scale) || std::fabs(m.scale) > std::numeric_limits<float>::max())
      throw ModelFileError(path, "module '" + m.name + "': alpha " + std::to_string(m.alpha) +
                                     " / rank " + std::to_string(m.rank) +
                                     " gives a scale outside the float32 range");
    if (m.rank > info.rank) info.rank = m.rank;
  }
  info.alphaSource = info.format == LoraFormat::Kohya
                         ? (anyAlphaTensor ? "kohya .alpha" : "rank (no alpha)")
                     : hasConfig      ? "lora_adapter_metadata"
                     : anyAlphaTensor ? "alpha tensors"
                                      : "rank (no alpha)";
  return info;
}

}  // namespace dit
