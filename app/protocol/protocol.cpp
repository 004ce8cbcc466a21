#include "app/protocol/protocol.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <istream>
#include <limits>

#include "backend/models/cache/step_cache_config.h"

namespace dit::protocol {

using nlohmann::json;

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

// Invalid UTF-8 (e.g. echoed from a bad request line) is replaced, never thrown.
std::string dumpSafe(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

[[noreturn]] void wrongType(const char* what, const std::string& key, const json& v,
                            const std::optional<std::string>& id) {
  throw ProtocolError(std::string(what) + " field '" + key + "' has the wrong type: " + dumpSafe(v),
                      key, id);
}

// Field readers: absent or null keeps `out`; a value of the wrong type throws naming the field.
struct Reader {
  const json& j;
  const char* what;  // "request" or "strategy"
  std::optional<std::string> id;

  const json* find(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  void str(const char* key, std::string& out) const {
    if (const json* v = find(key)) {
      if (!v->is_string()) wrongType(what, key, *v, id);
      out = v->get<std::string>();
    }
  }
  void integer(const char* key, int& out) const {
    if (const json* v = find(key)) {
      if (!v->is_number_integer()) wrongType(what, key, *v, id);
      if (v->is_number_unsigned()
              ? v->get<std::uint64_t>() > std::uint64_t(std::numeric_limits<int>::max())
              : (v->get<std::int64_t>() < std::numeric_limits<int>::min() ||
                 v->get<std::int64_t>() > std::numeric_limits<int>::max()))
        throw ProtocolError(
            std::string(what) + " field '" + key + "' is out of range: " + dumpSafe(*v), key, id);
      out = static_cast<int>(v->get<std::int64_t>());
    }
  }
  // A numeric request field with a row in the limits table (limits.h): any JSON number is read,
  // and refused with the field's allowed range unless it is of the right kind and in range.
  void limited(const char* key, int& out) const {
    if (const json* v = find(key)) {
      if (!v->is_number()) wrongType(what, key, *v, id);
      const FieldLimit& l = requestLimit(key);
      const double d = v->get<double>();
      // A float with an integral value (2.0) is not an integer here: JSON integers only.
      if (!v->is_number_integer() || !l.accepts(d))
        throw ProtocolError(limitMessage(l, jsonNumberText(*v), !v->is_number_integer()), key, id);
      out = static_cast<int>(v->get<std::int64_t>());
    }
  }
  void limited(const char* key, double& out) const {
    if (const json* v = find(key)) {
      if (!v->is_number()) wrongType(what, key, *v, id);
      const FieldLimit& l = requestLimit(key);
      const double d = v->get<double>();
      if (!l.accepts(d)) throw ProtocolError(limitMessage(l, jsonNumberText(*v)), key, id);
      out = d;
    }
  }
  void number(const char* key, double& out) const {
    if (const json* v = find(key)) {
      if (!v->is_number()) wrongType(what, key, *v, id);
      out = v->get<double>();
    }
  }
  void boolean(const char* key, bool& out) const {
    if (const json* v = find(key)) {
      if (!v->is_boolean()) wrongType(what, key, *v, id);
      out = v->get<bool>();
    }
  }
  void strings(const char* key, std::vector<std::string>& out) const {
    if (const json* v = find(key)) {
      if (!v->is_array()) wrongType(what, key, *v, id);
      std::vector<std::string> r;
      for (const json& e : *v) {
        if (!e.is_string()) wrongType(what, key, *v, id);
        r.push_back(e.get<std::string>());
      }
      out = std::move(r);
    }
  }
};

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

GenerationParams readParams(const json& j, const GenerationParams& defaults,
                            const std::optional<std::string>& id) {
  Reader r{j, "request", id};
  GenerationParams p = defaults;
  r.str("prompt", p.prompt);
  if (r.find("negative_prompt")) {
    r.str("negative_prompt", p.negative_prompt);
    p.negative_prompt_given = true;  // even "": diffusers' `negative_prompt is not None`
  }
  r.limited("true_cfg_scale", p.true_cfg_scale);
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

// Length of the well-formed UTF-8 sequence at s[i] (RFC 3629 table 3-7), 0 if there is none.
std::size_t utf8SequenceLength(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no UTF-16 surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else
    return 0;
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}

std::string hexByte(unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", c);
  return buf;
}

[[noreturn]] void notUtf8(const std::string& field, std::size_t offset, unsigned char byte,
                          const std::optional<std::string>& id) {
  throw ProtocolError("request field '" + field + "' is not valid UTF-8: invalid byte " +
                          hexByte(byte) + " at byte offset " + std::to_string(offset) +
                          " of its text",
                      field, id);
}

// A request line that is not valid UTF-8: finds the JSON string holding the first bad byte
// lexically (the line cannot be parsed) and throws naming its field ("prompt", "prompts[1]",
// or the key itself) and the byte offset inside the decoded text. Returns when the line is valid
// UTF-8 or the bad byte is outside any string (then the JSON parser reports the syntax error).
void refuseInvalidUtf8Line(std::string_view line) {
  if (invalidUtf8Offset(line) == std::string::npos) return;
  struct Level {
    bool object;
    bool expectKey;
    std::string key;
    int index;
  };
  std::vector<Level> stack;
  std::optional<std::string> id;  // the request's id, when it came before the bad byte
  std::string lastKeyAtTop;
  std::size_t i = 0;
  while (i < line.size()) {
    const char c = line[i];
    if (c == '{' || c == '[') {
      stack.push_back(Level{c == '{', c == '{', {}, 0});
      ++i;
    } else if (c == '}' || c == ']') {
      if (!stack.empty()) stack.pop_back();
      ++i;
    } else if (c == ',') {
      if (!stack.empty()) {
        if (stack.back().object)
          stack.back().expectKey = true;
        else
          ++stack.back().index;
      }
      ++i;
    } else if (c == '"') {
      const bool isKey = !stack.empty() && stack.back().object && stack.back().expectKey;
      std::string field;
      if (isKey)
        field = "(a key)";
      else if (!stack.empty()) {
        // The innermost object key, with the array index when inside a list ("prompts[1]").
        std::string suffix;
        for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
          if (!it->object)
            suffix.insert(0, '[' + std::to_string(it->index) + ']');
          else {
            field = it->key + suffix;
            break;
          }
        }
        if (field.empty()) field = "(value)" + suffix;
      }
      std::string text;  // decoded, for the key or id
      std::size_t decoded = 0;
      ++i;
      while (i < line.size() && line[i] != '"') {
        if (line[i] == '\\' && i + 1 < line.size()) {
          if (line[i + 1] == 'u' && i + 5 < line.size()) {
            const unsigned cp = static_cast<unsigned>(
                std::strtoul(std::string(line.substr(i + 2, 4)).c_str(), nullptr, 16));
            decoded += cp < 0x80                        ? 1
                       : cp < 0x800                     ? 2
                       : (cp >= 0xD800 && cp <= 0xDBFF) ? 4
                       : (cp >= 0xDC00 && cp <= 0xDFFF) ? 0
                                                        : 3;
            i += 6;
          } else {
            text += line[i + 1];
            decoded += 1;
            i += 2;
          }
          continue;
        }
        const std::size_t n = utf8SequenceLength(line, i);
        if (n == 0)
          notUtf8(isKey ? std::string("(a key)") : field, decoded,
                  static_cast<unsigned char>(line[i]), id);
        text.append(line.substr(i, n));
        decoded += n;
        i += n;
      }
      ++i;  // closing quote
      if (isKey) {
        stack.back().key = text;
        stack.back().expectKey = false;
      } else if (stack.size() == 1 && stack.back().object && stack.back().key == "id") {
        id = text;
      }
    } else {
      if (utf8SequenceLength(line, i) == 0) return;  // outside a string: a JSON syntax error
      ++i;
    }
  }
}

void trimLineEnd(std::string_view& line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
}

}  // namespace

bool GenerationParams::trueCfg() const { return hasNegativePrompt() && true_cfg_scale > 1.0; }

bool GenerationParams::operator==(const GenerationParams& o) const {
  return prompt == o.prompt && negative_prompt == o.negative_prompt &&
         hasNegativePrompt() == o.hasNegativePrompt() && true_cfg_scale == o.true_cfg_scale &&
         width == o.width && height == o.height && steps == o.steps && guidance == o.guidance &&
         options == o.options && seed == o.seed && random_seed == o.random_seed &&
         num_images == o.num_images && max_sequence_length == o.max_sequence_length &&
         init_image == o.init_image && init_image_sha256 == o.init_image_sha256 &&
         mask_image == o.mask_image && strength == o.strength && cache == o.cache &&
         loras == o.loras;
}

std::size_t invalidUtf8Offset(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8SequenceLength(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string::npos;
}

void checkUtf8(const std::string& field, std::string_view s, const std::optional<std::string>& id) {
  if (const std::size_t at = invalidUtf8Offset(s); at != std::string::npos)
    notUtf8(field, at, static_cast<unsigned char>(s[at]), id);
}

namespace {

// A value already in memory (GUI, CLI, or read from JSON) against its row of the limits table.
void checkLimit(const char* field, double v, const std::optional<std::string>& id) {
  const FieldLimit& l = requestLimit(field);
  if (!l.accepts(v)) throw ProtocolError(limitMessage(l, numberText(v)), field, id);
}

}  // namespace

void checkParams(const GenerationParams& p, const std::optional<std::string>& id) {
  checkUtf8("prompt", p.prompt, id);
  checkUtf8("negative_prompt", p.negative_prompt, id);
  checkLimit("true_cfg_scale", p.true_cfg_scale, id);
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
  if (!p.init_image_sha256.empty()) {
    bool hex = p.init_image_sha256.size() == 64;
    for (char c : p.init_image_sha256) hex = hex && std::isxdigit(static_cast<unsigned char>(c));
    if (!hex)
      throw ProtocolError("request field 'init_image_sha256' must be 64 hex digits",
                          "init_image_sha256", id);
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

void checkRequest(const GenerateRequest& r) {
  const std::optional<std::string> id = r.id;
  checkUtf8("id", r.id, std::nullopt);
  if (std::string why = idProblem(r.id); !why.empty()) throw ProtocolError(why, "id");
  if (static_cast<long long>(r.prompts.size()) > kMaxImages)
    throw ProtocolError("request field 'prompts' holds " + std::to_string(r.prompts.size()) +
                            " prompts; at most " + std::to_string(kMaxImages),
                        "prompts", id);
  checkParams(r.params, id);
  for (std::size_t i = 0; i < r.prompts.size(); ++i)
    checkUtf8("prompts[" + std::to_string(i) + "]", r.prompts[i], id);
  checkUtf8("output", r.output, id);
  checkUtf8("output_dir", r.output_dir, id);
  checkUtf8("output_tensors", r.output_tensors, id);
  // Both written to one path, the tensors would replace the PNG (lexically: "a/./x" is "a/x").
  if (!r.output.empty() && !r.output_tensors.empty() &&
      std::filesystem::path(r.output).lexically_normal() ==
          std::filesystem::path(r.output_tensors).lexically_normal())
    throw ProtocolError("request fields 'output' and 'output_tensors' name the same file (" +
                            r.output + "): the tensors would replace the image",
                        "output_tensors", id);
  checkLimit("preview_every", r.preview_every, id);
}

json toJson(const GenerationParams& p) {
  json j{{"prompt", p.prompt},         {"true_cfg_scale", p.true_cfg_scale},
         {"width", p.width},           {"height", p.height},
         {"steps", p.steps},           {"guidance", p.guidance},
         {"num_images", p.num_images}, {"max_sequence_length", p.max_sequence_length}};
  if (p.hasNegativePrompt()) j["negative_prompt"] = p.negative_prompt;  // given, even ""
  // The family's knobs, only when some are set (other requests keep their keys).
  if (!p.options.empty()) j["options"] = p.options;
  if (!p.init_image.empty()) {
    j["init_image"] = p.init_image;
    j["strength"] = p.strength;
    if (!p.init_image_sha256.empty()) j["init_image_sha256"] = p.init_image_sha256;
    if (!p.mask_image.empty()) j["mask_image"] = p.mask_image;
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

int GenerateRequest::imageCount() const {
  return prompts.empty() ? params.num_images : static_cast<int>(prompts.size());
}

std::string requestType(const Request& r) {
  switch (r.index()) {
    case 0:
      return "generate";
    case 1:
      return "cancel";
    default:
      return "shutdown";
  }
}

json toJson(const Request& r) {
  if (const auto* g = std::get_if<GenerateRequest>(&r)) {
    json j = toJson(g->params);
    j["type"] = "generate";
    j["id"] = g->id;
    if (!g->prompts.empty()) j["prompts"] = g->prompts;
    if (!g->output.empty()) j["output"] = g->output;
    if (!g->output_dir.empty()) j["output_dir"] = g->output_dir;
    if (!g->output_tensors.empty()) j["output_tensors"] = g->output_tensors;
    if (g->overwrite) j["overwrite"] = true;
    j["preview_every"] = g->preview_every;
    return j;
  }
  if (const auto* c = std::get_if<CancelRequest>(&r))
    return json{{"type", "cancel"}, {"id", c->id}};
  const auto& s = std::get<ShutdownRequest>(r);
  json j{{"type", "shutdown"}};
  if (!s.reason.empty()) j["reason"] = s.reason;
  return j;
}

std::string requestLine(const Request& r) { return dumpSafe(toJson(r)); }

Request parseRequest(const json& j) {
  if (!j.is_object()) throw ProtocolError("request must be a JSON object, got " + dumpSafe(j));
  auto t = j.find("type");
  if (t == j.end() || !t->is_string())
    throw ProtocolError("request needs a string \"type\" (generate, cancel or shutdown)", "type");
  const std::string type = t->get<std::string>();
  if (type != "generate" && type != "cancel" && type != "shutdown")
    throw ProtocolError("unknown request type '" + type + "' (generate, cancel or shutdown)",
                        "type");
  std::optional<std::string> id;
  if (auto i = j.find("id"); i != j.end() && i->is_string()) id = i->get<std::string>();
  if (type == "shutdown") {
    ShutdownRequest s;
    Reader{j, "request", id}.str("reason", s.reason);
    return s;
  }
  if (!id) throw ProtocolError("a " + type + " request needs a string \"id\"", "id");
  checkUtf8("id", *id, std::nullopt);
  // Refused without naming the bad id as the request's (it is shown in the message, escaped).
  if (std::string why = idProblem(*id); !why.empty()) throw ProtocolError(why, "id");
  if (type == "cancel") return CancelRequest{*id};
  GenerateRequest g;
  g.id = *id;
  g.params = readParams(j, GenerationParams{}, id);
  Reader r{j, "request", id};
  r.strings("prompts", g.prompts);
  r.str("output", g.output);
  r.str("output_dir", g.output_dir);
  r.str("output_tensors", g.output_tensors);
  r.boolean("overwrite", g.overwrite);
  r.limited("preview_every", g.preview_every);
  if (!g.prompts.empty())
    g.params.num_images = static_cast<int>(std::min<std::size_t>(g.prompts.size(), kMaxImages + 1));
  checkRequest(g);
  return g;
}

Request parseRequestLine(std::string_view line) {
  trimLineEnd(line);
  if (line.size() > kMaxRequestLineBytes)
    throw ProtocolError("request line is " + std::to_string(line.size()) + " bytes long; at most " +
                        std::to_string(kMaxRequestLineBytes));
  // Depth first, before any parser or recursive routine (destructor, dump) sees the value.
  if (const int depth = jsonNestingDepth(line, kMaxRequestDepth); depth > kMaxRequestDepth)
    throw ProtocolError("request nests JSON more than " + std::to_string(kMaxRequestDepth) +
                        " levels deep (requests need 2)");
  refuseInvalidUtf8Line(line);
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& e) {
    throw ProtocolError(std::string("request is not valid JSON: ") + e.what());
  }
  return parseRequest(j);
}

std::optional<std::string> generateIdInPrefix(std::string_view s) {
  std::size_t i = 0;
  auto skipSpace = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) ++i;
  };
  // A JSON string starting at s[i] == '"': its first 200 bytes as written (escapes kept: no
  // valid id has one), enough for the keys and ids looked for; false when the prefix ends
  // inside it.
  auto readString = [&](std::string& out) {
    out.clear();
    for (++i; i < s.size(); ++i) {
      if (s[i] == '"') {
        ++i;
        return true;
      }
      if (out.size() < 200) out += s[i];
      if (s[i] == '\\' && ++i < s.size() && out.size() < 200) out += s[i];
    }
    return false;
  };
  skipSpace();
  if (i >= s.size() || s[i] != '{') return std::nullopt;
  ++i;
  int depth = 1;  // of objects and arrays; keys and values of the request object at depth 1
  bool expectKey = true;
  std::string key, value, type;
  while (i < s.size()) {
    const char c = s[i];
    if (c == '"') {
      if (!readString(depth == 1 && expectKey ? key : value)) return std::nullopt;
      if (depth == 1 && !expectKey) {
        if (key == "type") type = value;
        if (key == "id") {
          if (!type.empty() && type != "generate") return std::nullopt;
          if (idProblem(value).empty()) return value;
          return std::nullopt;
        }
      }
      value.clear();
      continue;
    }
    if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth <= 0) return std::nullopt;
    } else if (c == ':' && depth == 1) {
      expectKey = false;
    } else if (c == ',' && depth == 1) {
      expectKey = true;
    }
    ++i;
  }
  return std::nullopt;
}

LineRead readRequestLine(std::istream& in, std::string& line, std::size_t maxBytes) {
  line.clear();
  std::streambuf* sb = in.rdbuf();
  if (!sb) return LineRead::End;
  bool any = false, tooLong = false;
  for (;;) {
    const int c = sb->sbumpc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(std::ios::eofbit);
      if (!any) return LineRead::End;
      break;
    }
    any = true;
    if (c == '\n') break;
    if (line.size() < maxBytes)
      line.push_back(static_cast<char>(c));
    else
      tooLong = true;  // the rest of the line is read and dropped, never stored
  }
  return tooLong ? LineRead::TooLong : LineRead::Line;
}

std::string eventLine(const json& event) { return std::string(kEventPrefix) + dumpSafe(event); }

std::string eventLine(const nlohmann::ordered_json& event) {
  return std::string(kEventPrefix) +
         event.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::optional<Event> parseEventLine(std::string_view line) {
  trimLineEnd(line);
  size_t start = 0;
  while (start < line.size() && (line[start] == ' ' || line[start] == '\t')) ++start;
  // OpenMPI --tag-output: "[1,0]<stdout>:"
  if (start < line.size() && line[start] == '[') {
    constexpr std::string_view tag = "]<stdout>:";
    const size_t close = line.find(tag, start);
    if (close != std::string_view::npos && close < start + 32) start = close + tag.size();
  }
  if (line.size() - start < kEventPrefix.size() + 2) return std::nullopt;
  if (line.substr(start, kEventPrefix.size()) != kEventPrefix) return std::nullopt;
  json j =
      json::parse(line.substr(start + kEventPrefix.size()), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;  // also the "discarded" value of a parse error
  auto t = j.find("event");
  if (t == j.end() || !t->is_string()) t = j.find("type");
  if (t == j.end() || !t->is_string() || t->get_ref<const std::string&>().empty())
    return std::nullopt;
  Event ev;
  ev.type = t->get<std::string>();
  ev.data = std::move(j);
  return ev;
}

std::optional<EventInLine> findEventInLine(std::string_view line) {
  if (auto ev = parseEventLine(line)) return EventInLine{0, std::move(*ev)};
  for (size_t at = line.find(kEventPrefix); at != std::string_view::npos;
       at = line.find(kEventPrefix, at + 1)) {
    if (auto ev = parseEventLine(line.substr(at))) return EventInLine{at, std::move(*ev)};
  }
  return std::nullopt;
}

json errorEvent(const std::optional<std::string>& id, int rank, const std::string& message,
                bool fatal) {
  return json{{"event", "error"},
              {"id", id ? json(*id) : json()},
              {"rank", rank},
              {"message", message},
              {"fatal", fatal}};
}

std::vector<RankStats> parseRanks(const json& event) {
  std::vector<RankStats> out;
  auto it = event.find("ranks");
  if (it == event.end() || !it->is_array()) return out;
  auto i64 = [](const json& o, const char* key) -> std::int64_t {
    auto v = o.find(key);
    if (v == o.end() || !v->is_number()) return -1;
    return v->is_number_float() ? static_cast<std::int64_t>(v->get<double>())
                                : v->get<std::int64_t>();
  };
  for (const json& o : *it) {
    if (!o.is_object()) continue;
    auto r = o.find("rank");
    if (r == o.end() || !r->is_number_integer()) continue;
    RankStats s;
    s.rank = r->get<int>();
    if (auto v = o.find("stage"); v != o.end() && v->is_string()) s.stage = v->get<std::string>();
    s.step = static_cast<int>(std::max<std::int64_t>(0, i64(o, "step")));
    s.steps = static_cast<int>(std::max<std::int64_t>(0, i64(o, "steps")));
    s.rss = i64(o, "rss");
    s.rss_peak = i64(o, "rss_peak");
    s.dev = i64(o, "dev");
    s.dev_peak = i64(o, "dev_peak");
    s.bytes_sent = i64(o, "bytes_sent");
    if (auto v = o.find("step_ms"); v != o.end() && v->is_number()) s.step_ms = v->get<double>();
    out.push_back(std::move(s));
  }
  return out;
}

json strategyToJson(const Strategy& s) {
  return json{{"world", s.world},
              {"tp_degree", s.tp_degree},
              {"ring_degree", s.ring_degree},
              {"ulysses_degree", s.ulysses_degree},
              {"cfg_degree", s.cfg_degree},
              {"dp_degree", s.dp_degree},
              {"ulysses_anything", s.ulysses_anything},
              {"ring_anything", s.ring_anything},
              {"device", s.device}};
}

Strategy strategyFromJson(const json& j) {
  if (!j.is_object()) throw ProtocolError("strategy must be a JSON object, got " + dumpSafe(j));
  Reader r{j, "strategy", std::nullopt};
  Strategy s;  // absent keys keep the defaults
  r.integer("tp_degree", s.tp_degree);
  r.integer("ring_degree", s.ring_degree);
  r.integer("ulysses_degree", s.ulysses_degree);
  r.integer("cfg_degree", s.cfg_degree);
  r.integer("dp_degree", s.dp_degree);
  r.boolean("ulysses_anything", s.ulysses_anything);
  r.boolean("ring_anything", s.ring_anything);
  r.str("device", s.device);
  const long long product =
      1LL * s.tp_degree * s.ring_degree * s.ulysses_degree * s.cfg_degree * s.dp_degree;
  s.world = product > std::numeric_limits<int>::max() || product < std::numeric_limits<int>::min()
                ? 0  // refused by validateDegrees ("world size 0 must be at least 1 rank")
                : static_cast<int>(product);
  for (const char* key : {"world", "ranks", "np"})
    if (r.find(key)) {
      r.integer(key, s.world);
      break;
    }
  return s;
}

}  // namespace dit::protocol

namespace dit {
void to_json(nlohmann::json& j, const Strategy& s) { j = protocol::strategyToJson(s); }
void from_json(const nlohmann::json& j, Strategy& s) { s = protocol::strategyFromJson(j); }
}  // namespace dit
