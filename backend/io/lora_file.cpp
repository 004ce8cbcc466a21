#include "backend/io/lora_file.h"

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

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

// PEFT pattern match (rank_pattern / alpha_pattern keys): the module path ends in the key.
const nlohmann::json* patternFor(const nlohmann::json& pattern, const std::string& module) {
  if (!pattern.is_object()) return nullptr;
  for (const auto& [k, v] : pattern.items())
    if (module == k || endsWith(module, "." + k)) return &v;
  return nullptr;
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

  // diffusers: the adapter config in the header, if any.
  nlohmann::json config;
  bool hasConfig = false, anyAlphaTensor = false;
  if (info.format == LoraFormat::Diffusers) {
    auto it = info.metadata.find("lora_adapter_metadata");
    if (it != info.metadata.end()) {
      try {
        nlohmann::json j = nlohmann::json::parse(it->second);
        if (!j.is_object()) throw std::runtime_error("not a JSON object");
        // Keys are "transformer.<field>" (diffusers prefixes them); plain "<field>" is accepted.
        for (const auto& [k, v] : j.items())
          config[startsWith(k, "transformer.") ? k.substr(12) : k] = v;
      } catch (const std::exception& e) {
        throw ModelFileError(path, std::string("lora_adapter_metadata is not a PEFT LoraConfig "
                                               "JSON object: ") +
                                       e.what());
      }
      if (!config.contains("lora_alpha") || !config["lora_alpha"].is_number() ||
          !config.contains("r") || !config["r"].is_number_integer())
        throw ModelFileError(path,
                             "lora_adapter_metadata lacks a numeric 'lora_alpha' and an "
                             "integer 'r'");
      hasConfig = true;
    }
  }
  const bool rslora = hasConfig && config.value("use_rslora", false);
  if (hasConfig && config.value("use_dora", false))
    throw ModelFileError(path, "DoRA adapters (use_dora) are not supported");

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
      int64_t r0 = config["r"].get<int64_t>();
      double alpha = config["lora_alpha"].get<double>();
      if (const auto* rp = patternFor(config.value("rank_pattern", nlohmann::json()), m.name))
        if (rp->is_number_integer()) r0 = rp->get<int64_t>();
      if (const auto* ap = patternFor(config.value("alpha_pattern", nlohmann::json()), m.name))
        if (ap->is_number()) alpha = ap->get<double>();
      if (r0 != m.rank)
        throw ModelFileError(path, "module '" + m.name + "': lora_adapter_metadata gives r " +
                                       std::to_string(r0) + " but its factors have rank " +
                                       std::to_string(m.rank));
      m.alpha = alpha;
    } else if (m.keyAlpha.empty()) {
      m.alpha = anyAlphaTensor ? commonAlpha : static_cast<double>(m.rank);
    }
    m.scale = rslora ? m.alpha / std::sqrt(static_cast<double>(m.rank))
                     : m.alpha / static_cast<double>(m.rank);
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
