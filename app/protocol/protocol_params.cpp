// GenerationParams: its JSON (read with the field checks, written with the protocol's keys), the
// door checks of every field (checkParams, checkLoras) and its comparison.
#include <cctype>
#include <cmath>

#include "app/protocol/protocol.h"
#include "app/protocol/protocol_detail.h"
#include "backend/models/cache/step_cache_config.h"

namespace dit::protocol {

using nlohmann::json;
using namespace detail;

namespace {

// Why `name` cannot be a knob name ("" when it can): 1 .. 64 characters of [a-z0-9_].
std::string optionNameProblem(const std::string& name) {
  if (name.empty() || name.size() > 64)
    return "has a name of " + std::to_string(name.size()) + " characters; names are 1 .. 64";
  for (const char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
      return "has a name that is not [a-z0-9_]: '" + name.substr(0, 64) + "'";
  return "";
}

// "options": {"name": number, ...}: names of [a-z0-9_] (1 .. 64), finite numbers, at most
// kMaxOptions entries. Which names a model knows and their ranges are the family's (resolve).
std::map<std::string, double> readOptions(const json& v, const std::optional<std::string>& id) {
  if (!v.is_object())
    throw ProtocolError(
        "request field 'options' must be an object of numbers, got " + std::string(v.type_name()),
        "options", id);
  if (v.size() > kMaxOptions)
    throw ProtocolError("request field 'options' has " + std::to_string(v.size()) +
                            " entries; at most " + std::to_string(kMaxOptions),
                        "options", id);
  std::map<std::string, double> out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& name = it.key();
    if (const std::string why = optionNameProblem(name); !why.empty())
      throw ProtocolError("request field 'options' " + why, "options", id);
    if (!it->is_number() || !std::isfinite(it->get<double>()))
      throw ProtocolError(
          "request field 'options." + name + "' must be a finite number, got " + it->dump(),
          "options." + name, id);
    out[name] = it->get<double>();
  }
  return out;
}

// "reference_images": [{"file", "sha256"} or "path", ...] (at most kMaxReferenceImages).
std::vector<ReferenceImage> readReferences(const json& v, const std::optional<std::string>& id) {
  if (!v.is_array()) wrongType("request", "reference_images", v, id);
  if (v.size() > static_cast<std::size_t>(kMaxReferenceImages))
    throw ProtocolError("request field 'reference_images' holds " + std::to_string(v.size()) +
                            " images; at most " + std::to_string(kMaxReferenceImages),
                        "reference_images", id);
  std::vector<ReferenceImage> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    const std::string field = "reference_images[" + std::to_string(i) + "]";
    ReferenceImage ref;
    if (e.is_string()) {
      ref.file = e.get<std::string>();
    } else if (e.is_object()) {
      for (const auto& [k, x] : e.items()) {
        if ((k == "file" || k == "sha256") && x.is_string())
          (k == "file" ? ref.file : ref.sha256) = x.get<std::string>();
        else if (k == "file" || k == "sha256")
          throw ProtocolError(
              "request field '" + field + "." + k + "' has the wrong type: " + dumpSafe(x),
              "reference_images", id);
        else
          throw ProtocolError(
              "request field '" + field + "' has an unknown key '" + k + "' (file, sha256)",
              "reference_images", id);
      }
    } else {
      throw ProtocolError("request field '" + field +
                              "' must be a path or an object {\"file\", \"sha256\"}, got " +
                              dumpSafe(e),
                          "reference_images", id);
    }
    out.push_back(std::move(ref));
  }
  return out;
}

bool isSha256Hex(const std::string& h) {
  bool hex = h.size() == 64;
  for (char c : h) hex = hex && std::isxdigit(static_cast<unsigned char>(c));
  return hex;
}

}  // namespace

namespace detail {

GenerationParams readParams(const json& j, const GenerationParams& defaults,
                            const std::optional<std::string>& id) {
  Reader r{j, "request", id};
  GenerationParams p = defaults;
  r.str("prompt", p.prompt);
  if (r.find("negative_prompt")) {
    r.str("negative_prompt", p.negative_prompt);
    p.negative_prompt_given = true;  // even "": diffusers' `negative_prompt is not None`
  }
  r.limited("width", p.width);
  r.limited("height", p.height);
  r.limited("steps", p.steps);
  r.limited("guidance", p.guidance);
  if (const json* v = r.find("options")) p.options = readOptions(*v, id);
  r.limited("num_images", p.num_images);
  r.limited("max_sequence_length", p.max_sequence_length);
  r.str("init_image", p.init_image);
  r.str("init_image_sha256", p.init_image_sha256);
  r.str("mask_image", p.mask_image);
  r.limited("strength", p.strength);
  if (const json* v = r.find("reference_images")) p.reference_images = readReferences(*v, id);
  r.str("cache", p.cache);
  if (const json* v = r.find("loras")) {
    if (!v->is_array()) wrongType("request", "loras", *v, id);
    std::vector<LoraRequest> loras;
    for (std::size_t i = 0; i < v->size(); ++i) {
      const json& e = (*v)[i];
      const std::string field = "loras[" + std::to_string(i) + "]";
      if (!e.is_object())
        throw ProtocolError("request field '" + field +
                                "' must be an object {\"file\", \"strength\"}, got " + dumpSafe(e),
                            "loras", id);
      LoraRequest l;
      for (const auto& [k, x] : e.items()) {
        if (k == "file" && x.is_string())
          l.file = x.get<std::string>();
        else if (k == "strength" && x.is_number())
          l.strength = x.get<double>();
        else if (k == "sha256" && x.is_string())
          l.sha256 = x.get<std::string>();
        else if (k == "file" || k == "strength" || k == "sha256")
          throw ProtocolError(
              "request field '" + field + "." + k + "' has the wrong type: " + dumpSafe(x), "loras",
              id);
        else
          throw ProtocolError("request field '" + field + "' has an unknown key '" + k +
                                  "' (file, strength, sha256)",
                              "loras", id);
      }
      loras.push_back(std::move(l));
    }
    p.loras = std::move(loras);
  }
  if (const json* v = r.find("seed")) {
    // Integers only: a double cannot hold every 64-bit seed, so 1.0 or 1e19 is refused too.
    if (!v->is_number_integer()) wrongType("request", "seed", *v, id);
    if (v->is_number_unsigned()) {
      p.seed = v->get<std::uint64_t>();
      p.random_seed = false;
    } else if (v->get<std::int64_t>() < 0) {
      p.random_seed = true;
    } else {
      p.seed = static_cast<std::uint64_t>(v->get<std::int64_t>());
      p.random_seed = false;
    }
  }
  checkParams(p, id);
  return p;
}

}  // namespace detail

bool GenerationParams::operator==(const GenerationParams& o) const {
  return prompt == o.prompt && negative_prompt == o.negative_prompt &&
         hasNegativePrompt() == o.hasNegativePrompt() && width == o.width && height == o.height &&
         steps == o.steps && guidance == o.guidance && options == o.options && seed == o.seed &&
         random_seed == o.random_seed && num_images == o.num_images &&
         max_sequence_length == o.max_sequence_length && init_image == o.init_image &&
         init_image_sha256 == o.init_image_sha256 && mask_image == o.mask_image &&
         strength == o.strength && reference_images == o.reference_images && cache == o.cache &&
         loras == o.loras;
}

void checkParams(const GenerationParams& p, const std::optional<std::string>& id) {
  checkUtf8("prompt", p.prompt, id);
  checkUtf8("negative_prompt", p.negative_prompt, id);
  checkLimit("guidance", p.guidance, id);
  if (p.options.size() > kMaxOptions)
    throw ProtocolError("request field 'options' has " + std::to_string(p.options.size()) +
                            " entries; at most " + std::to_string(kMaxOptions),
                        "options", id);
  for (const auto& [name, value] : p.options) {
    if (const std::string why = optionNameProblem(name); !why.empty())
      throw ProtocolError("request field 'options' " + why, "options", id);
    if (!std::isfinite(value))
      throw ProtocolError(
          "request field 'options." + name + "' must be a finite number, got " + numberText(value),
          "options." + name, id);
  }
  checkLimit("width", p.width, id);
  checkLimit("height", p.height, id);
  checkLimit("steps", p.steps, id);
  checkLimit("max_sequence_length", p.max_sequence_length, id);
  checkLimit("num_images", p.num_images, id);
  checkUtf8("init_image", p.init_image, id);
  checkUtf8("mask_image", p.mask_image, id);
  checkLimit("strength", p.strength, id);
  if (!p.mask_image.empty() && p.init_image.empty())
    throw ProtocolError("request field 'mask_image' needs an init_image (inpainting repaints it)",
                        "mask_image", id);
  if (!p.init_image_sha256.empty() && !isSha256Hex(p.init_image_sha256))
    throw ProtocolError("request field 'init_image_sha256' must be 64 hex digits",
                        "init_image_sha256", id);
  if (p.reference_images.size() > static_cast<std::size_t>(kMaxReferenceImages))
    throw ProtocolError("request field 'reference_images' holds " +
                            std::to_string(p.reference_images.size()) + " images; at most " +
                            std::to_string(kMaxReferenceImages),
                        "reference_images", id);
  for (std::size_t i = 0; i < p.reference_images.size(); ++i) {
    const std::string f = "reference_images[" + std::to_string(i) + "]";
    const ReferenceImage& ref = p.reference_images[i];
    if (ref.file.empty())
      throw ProtocolError("request field '" + f + ".file' must name an image file",
                          "reference_images", id);
    checkUtf8(f + ".file", ref.file, id);
    if (!ref.sha256.empty() && !isSha256Hex(ref.sha256))
      throw ProtocolError("request field '" + f + ".sha256' must be 64 hex digits",
                          "reference_images", id);
  }
  checkUtf8("cache", p.cache, id);
  try {
    parseStepCacheConfig(p.cache);
  } catch (const std::invalid_argument& e) {
    throw ProtocolError(std::string("request field 'cache': ") + e.what(), "cache", id);
  }
  checkLoras(p.loras, id);
}

void checkLoras(const std::vector<LoraRequest>& loras, const std::optional<std::string>& id) {
  if (loras.size() > static_cast<std::size_t>(kMaxLoras))
    throw ProtocolError("request field 'loras' holds " + std::to_string(loras.size()) +
                            " LoRAs; at most " + std::to_string(kMaxLoras),
                        "loras", id);
  for (std::size_t i = 0; i < loras.size(); ++i) {
    const std::string f = "loras[" + std::to_string(i) + "]";
    if (loras[i].file.empty())
      throw ProtocolError("request field '" + f + ".file' must name a LoRA file", "loras", id);
    checkUtf8(f + ".file", loras[i].file, id);
    const double s = loras[i].strength;
    if (!std::isfinite(s) || s < -kMaxLoraStrength || s > kMaxLoraStrength)
      throw ProtocolError("request field '" + f + ".strength' must be a finite number in " +
                              numberText(-kMaxLoraStrength) + " .. " +
                              numberText(kMaxLoraStrength) + ", got " + numberText(s),
                          "loras", id);
    const std::string& h = loras[i].sha256;
    bool hex = h.size() == 64;
    for (char c : h) hex = hex && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
    if (!h.empty() && !hex)
      throw ProtocolError("request field '" + f + ".sha256' must be 64 lowercase hex digits",
                          "loras", id);
  }
}

json toJson(const GenerationParams& p) {
  json j{{"prompt", p.prompt},
         {"width", p.width},
         {"height", p.height},
         {"steps", p.steps},
         {"guidance", p.guidance},
         {"num_images", p.num_images},
         {"max_sequence_length", p.max_sequence_length}};
  if (p.hasNegativePrompt()) j["negative_prompt"] = p.negative_prompt;  // given, even ""
  // The family's knobs, only when some are set (other requests keep their keys).
  if (!p.options.empty()) j["options"] = p.options;
  if (!p.init_image.empty()) {
    j["init_image"] = p.init_image;
    j["strength"] = p.strength;
    if (!p.init_image_sha256.empty()) j["init_image_sha256"] = p.init_image_sha256;
    if (!p.mask_image.empty()) j["mask_image"] = p.mask_image;
  }
  if (!p.reference_images.empty()) {
    json a = json::array();
    for (const ReferenceImage& ref : p.reference_images) {
      json e{{"file", ref.file}};
      if (!ref.sha256.empty()) e["sha256"] = ref.sha256;
      a.push_back(std::move(e));
    }
    j["reference_images"] = std::move(a);
  }
  if (!p.cache.empty() && p.cache != "none") j["cache"] = p.cache;
  if (!p.loras.empty()) {
    json a = json::array();
    for (const auto& l : p.loras) {
      json e{{"file", l.file}, {"strength", l.strength}};
      if (!l.sha256.empty()) e["sha256"] = l.sha256;
      a.push_back(std::move(e));
    }
    j["loras"] = std::move(a);
  }
  if (p.random_seed)
    j["seed"] = -1;
  else
    j["seed"] = p.seed;  // number_unsigned: exact for every 64-bit value
  return j;
}

GenerationParams paramsFromJson(const json& j, const GenerationParams& defaults) {
  if (!j.is_object())
    throw ProtocolError("generation parameters must be a JSON object, got " + dumpSafe(j));
  return readParams(j, defaults, std::nullopt);
}

}  // namespace dit::protocol
