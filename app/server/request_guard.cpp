#include "app/server/request_guard.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "app/common/request_values.h"

namespace dit::server {

using nlohmann::json;

namespace {

constexpr std::size_t kKeyShown = 64;  // bytes of a key kept for a field's name

struct Level {
  bool object = false;
  bool expectKey = false;
  std::string key;
  std::size_t index = 0;
};

std::string fieldPath(const std::vector<Level>& st) {
  std::string p;
  for (const Level& l : st) {
    if (l.object) {  // appended piece by piece (GCC 12 -O3 warns -Wrestrict on "[" + x + "]")
      if (l.key.empty()) break;
      if (!p.empty()) p += '.';
      p += l.key;
    } else {
      p += '[';
      p += std::to_string(l.index);
      p += ']';
    }
  }
  return p;
}

std::string hexByte(unsigned char c) {
  char b[8];
  std::snprintf(b, sizeof b, "0x%02x", c);
  return b;
}

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not one.
std::size_t utf8Length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n;
  unsigned lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;  // no overlong forms
    if (c == 0xed) hi = 0x9f;  // no surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;  // at most U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xbf) return 0;
  return n;
}

std::string inQuotes(const std::string& field) { return "'" + field + "'"; }

}  // namespace

std::optional<std::size_t> invalidUtf8At(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8Length(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::nullopt;
}

std::optional<FieldError> scanJsonBody(std::string_view body, int maxDepth) {
  std::vector<Level> st;
  st.reserve(static_cast<std::size_t>(std::max(0, maxDepth)) + 1);
  for (std::size_t i = 0; i < body.size(); ++i) {
    const char ch = body[i];
    if (ch == '"') {
      const bool isKey = !st.empty() && st.back().object && st.back().expectKey;
      const std::size_t start = ++i;
      while (i < body.size() && body[i] != '"') {
        const auto c = static_cast<unsigned char>(body[i]);
        if (c == '\\') {
          i += 2;
          continue;
        }
        if (c < 0x80) {
          ++i;
          continue;
        }
        const std::size_t n = utf8Length(body, i);
        if (n == 0) {
          const std::string field = fieldPath(st);
          const std::string what = field.empty() ? "a name in the request body" : inQuotes(field);
          return FieldError{what + " is not valid UTF-8 text (byte " + hexByte(c) + " at offset " +
                                std::to_string(i - start) + " of the text)",
                            field};
        }
        i += n;
      }
      if (isKey) {
        st.back().key.assign(body.substr(start, std::min(i, body.size()) - start));
        if (st.back().key.size() > kKeyShown) st.back().key.resize(kKeyShown);
        st.back().expectKey = false;
      }
      continue;
    }
    switch (ch) {
      case '{':
      case '[':
        if (static_cast<int>(st.size()) >= maxDepth) {
          // The top-level field that holds the nest ("override_settings"), not its whole path.
          std::string field = fieldPath(st);
          field = field.substr(0, field.find_first_of(".["));
          return FieldError{"the request body nests JSON more than " + std::to_string(maxDepth) +
                                " levels deep" +
                                (field.empty() ? "" : " (in " + inQuotes(field) + ")"),
                            field};
        }
        st.push_back(Level{ch == '{', ch == '{', {}, 0});
        break;
      case '}':
      case ']':
        if (!st.empty()) st.pop_back();
        break;
      case ',':
        if (!st.empty()) {
          if (st.back().object) {
            st.back().expectKey = true;
            st.back().key.clear();
          } else {
            ++st.back().index;
          }
        }
        break;
      default:
        break;
    }
  }
  return std::nullopt;
}

std::optional<FieldError> parseJsonBody(std::string_view body, int maxDepth, json& out) {
  if (body.empty()) return FieldError{"the request body is empty; a JSON object is expected", ""};
  if (auto e = scanJsonBody(body, maxDepth)) return e;
  json b = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (b.is_discarded()) {
    // Where: the parser's position, found again without exceptions by a SAX pass.
    struct Where : json::json_sax_t {
      std::size_t at = 0;
      bool null() override { return true; }
      bool boolean(bool) override { return true; }
      bool number_integer(number_integer_t) override { return true; }
      bool number_unsigned(number_unsigned_t) override { return true; }
      bool number_float(number_float_t, const string_t&) override { return true; }
      bool string(string_t&) override { return true; }
      bool binary(binary_t&) override { return true; }
      bool start_object(std::size_t) override { return true; }
      bool key(string_t&) override { return true; }
      bool end_object() override { return true; }
      bool start_array(std::size_t) override { return true; }
      bool end_array() override { return true; }
      bool parse_error(std::size_t position, const std::string&,
                       const nlohmann::detail::exception&) override {
        at = position;
        return false;
      }
    } where;
    json::sax_parse(body, &where, json::input_format_t::json, /*strict=*/true);
    return FieldError{
        "the request body is not valid JSON (at byte " + std::to_string(where.at) + ")", ""};
  }
  if (!b.is_object()) {
    const char* t = b.is_array()     ? "an array"
                    : b.is_string()  ? "a string"
                    : b.is_number()  ? "a number"
                    : b.is_boolean() ? "a boolean"
                                     : "null";
    return FieldError{std::string("the request body must be a JSON object, got ") + t, ""};
  }
  out = std::move(b);
  return std::nullopt;
}

// --- field types -----------------------------------------------------------------------------

namespace {

enum class T { String, Integer, Number, Boolean };

const char* typeWord(T t) {
  switch (t) {
    case T::String:
      return "a string";
    case T::Integer:
      return "an integer";
    case T::Number:
      return "a number";
    case T::Boolean:
      return "a boolean";
  }
  return "";
}

const char* jsonWord(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

bool isType(const json& v, T t) {
  switch (t) {
    case T::String:
      return v.is_string();
    case T::Integer:
      return v.is_number_integer();
    case T::Number:
      return v.is_number();
    case T::Boolean:
      return v.is_boolean();
  }
  return false;
}

// `nullOk`: null counts as absent (the routes read it so); otherwise null is refused too (the
// routes read such a field with a default only when it is missing).
std::optional<FieldError> expect(const json& obj, const std::string& prefix, const char* key, T t,
                                 bool nullOk = true) {
  auto it = obj.find(key);
  if (it == obj.end() || (nullOk && it->is_null()) || isType(*it, t)) return std::nullopt;
  const std::string field = prefix + key;
  return FieldError{inQuotes(field) + " must be " + typeWord(t) + ", got " + jsonWord(*it), field};
}

}  // namespace

std::optional<FieldError> checkFieldTypes(const json& b, BodyKind kind) {
  if (!b.is_object()) return std::nullopt;
  static const std::vector<std::pair<const char*, T>> common{
      {"prompt", T::String},
      {"negative_prompt", T::String},
      {"model", T::String},
      {"steps", T::Integer},
      {"guidance", T::Number},
      {"strength", T::Number},
      {"max_sequence_length", T::Integer},
      {"cache", T::String},
  };
  static const std::vector<std::pair<const char*, T>> openai{
      {"n", T::Integer},
      {"size", T::String},
      {"response_format", T::String},
      {"output_format", T::String},
      {"output_compression", T::Integer},
      {"stream", T::Boolean},
      {"partial_images", T::Integer},
      {"quality", T::String},
      {"background", T::String},
      {"user", T::String},
      {"moderation", T::String},
      {"style", T::String},
  };
  static const std::vector<std::pair<const char*, T>> sdapi{
      {"cfg_scale", T::Number},
      {"distilled_guidance", T::Number},
      {"denoising_strength", T::Number},
      {"batch_size", T::Integer},
      {"n_iter", T::Integer},
      {"width", T::Integer},
      {"height", T::Integer},
      {"inpainting_mask_invert", T::Integer},
      {"mask", T::String},
  };
  for (const auto& [k, t] : common)
    if (auto e = expect(b, "", k, t)) return e;
  for (const FieldSpec& k : allFamilyKnobs())  // a family knob sent as an extra field: a number
    if (auto e = expect(b, "", k.name.c_str(), T::Number)) return e;
  for (const auto& [k, t] : kind == BodyKind::OpenAi ? openai : sdapi)
    if (auto e = expect(b, "", k, t, std::string_view(k) != "inpainting_mask_invert")) return e;
  if (auto it = b.find("seed"); it != b.end() && !it->is_null() && !it->is_number_integer())
    return FieldError{"'seed' must be an integer (0 .. 2^64-1, or -1 for random), got " +
                          std::string(jsonWord(*it)),
                      "seed"};
  if (auto it = b.find("loras"); it != b.end() && !it->is_null()) {
    if (!it->is_array())
      return FieldError{"'loras' must be an array of {\"name\": FILE, \"strength\": NUMBER}, got " +
                            std::string(jsonWord(*it)),
                        "loras"};
    for (std::size_t i = 0; i < it->size(); ++i) {
      const json& l = (*it)[i];
      const std::string key = "loras[" + std::to_string(i) + "]";
      if (!l.is_object())
        return FieldError{inQuotes(key) +
                              " must be an object {\"name\": FILE, \"strength\": NUMBER}, got " +
                              jsonWord(l),
                          key};
      if (auto e = expect(l, key + ".", "name", T::String, false)) return e;
      if (auto e = expect(l, key + ".", "file", T::String, false)) return e;
      if (auto e = expect(l, key + ".", "strength", T::Number, false)) return e;
    }
  }
  if (kind == BodyKind::SdapiImg2Img) {
    auto it = b.find("init_images");
    if (it != b.end() && it->is_array())
      for (std::size_t i = 0; i < it->size(); ++i)
        if (!(*it)[i].is_string()) {
          const std::string key = "init_images[" + std::to_string(i) + "]";
          return FieldError{
              inQuotes(key) + " must be a string (base64 image), got " + jsonWord((*it)[i]), key};
        }
  }
  return std::nullopt;
}

// --- browser headers -------------------------------------------------------------------------

std::string hostName(std::string_view h) {
  while (!h.empty() && (h.back() == ' ' || h.back() == '\t')) h.remove_suffix(1);
  while (!h.empty() && (h.front() == ' ' || h.front() == '\t')) h.remove_prefix(1);
  if (h.empty()) return "";
  std::string_view name;
  if (h.front() == '[') {  // [v6]:port
    const auto close = h.find(']');
    if (close == std::string_view::npos) return "";
    name = h.substr(1, close - 1);
    const std::string_view rest = h.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return "";
  } else {
    const auto colon = h.find(':');
    name = h.substr(0, colon);
    if (colon != std::string_view::npos && h.find(':', colon + 1) != std::string_view::npos)
      return "";  // a bare IPv6 address is not a valid Host
  }
  std::string out;
  for (const char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || c == '.' || c == '-' || c == '_' || c == ':')) return "";
    out += static_cast<char>(std::tolower(u));
  }
  while (!out.empty() && out.back() == '.') out.pop_back();  // "localhost." = "localhost"
  return out;
}

bool hostAllowed(std::string_view hostHeader, const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), "*") != allowed.end()) return true;
  const std::string name = hostName(hostHeader);
  if (name.empty()) return false;
  for (const std::string& a : allowed)
    if (hostName(a.find(':') != std::string::npos && a.front() != '[' ? "[" + a + "]" : a) == name)
      return true;
  return false;
}

std::vector<std::string> defaultAllowedHosts(const std::string& bindHost) {
  if (bindHost.empty() || bindHost == "0.0.0.0" || bindHost == "::" || bindHost == "[::]")
    return {"*"};
  std::vector<std::string> out{"localhost", "127.0.0.1", "::1"};
  if (std::find(out.begin(), out.end(), bindHost) == out.end()) out.push_back(bindHost);
  return out;
}

bool originAllowed(std::string_view origin, std::string_view hostHeader,
                   const std::vector<std::string>& corsOrigins) {
  if (origin.empty()) return true;  // not a browser's cross-site request
  for (const std::string& o : corsOrigins)
    if (o == "*" || o == origin) return true;
  if (hostHeader.empty()) return false;
  return origin == "http://" + std::string(hostHeader);
}

namespace {
std::string mediaType(std::string_view ct) {
  std::string t(ct.substr(0, ct.find(';')));
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
  std::size_t s = 0;
  while (s < t.size() && (t[s] == ' ' || t[s] == '\t')) ++s;
  t = t.substr(s);
  std::transform(t.begin(), t.end(), t.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return t;
}
}  // namespace

bool isJsonContentType(std::string_view ct) {
  const std::string t = mediaType(ct);
  if (t == "application/json") return true;
  return t.rfind("application/", 0) == 0 && t.size() > 17 &&
         t.compare(t.size() - 5, 5, "+json") == 0;
}

bool isMultipartContentType(std::string_view ct) { return mediaType(ct) == "multipart/form-data"; }

// --- messages --------------------------------------------------------------------------------

std::string clientMessage(std::string m,
                          const std::vector<std::pair<std::string, std::string>>& names) {
  for (const auto& [path, name] : names) {
    if (path.empty()) continue;
    for (std::size_t at = m.find(path); at != std::string::npos;
         at = m.find(path, at + name.size()))
      m.replace(at, path.size(), name);
  }
  // Every other absolute path: its last component only. A path starts with '/' at the start or
  // after a space, quote or bracket, and runs to the next space, quote, comma, colon or bracket.
  std::string out;
  out.reserve(m.size());
  for (std::size_t i = 0; i < m.size();) {
    const bool start = m[i] == '/' && (i == 0 || std::string_view(" '\"(`[=").find(m[i - 1]) !=
                                                     std::string_view::npos);
    if (!start) {
      out += m[i++];
      continue;
    }
    std::size_t j = i;
    while (j < m.size() && std::string_view(" '\"`,;:()[]\n").find(m[j]) == std::string_view::npos)
      ++j;
    const std::string_view p(m.data() + i, j - i);
    const auto slash = p.find_last_of('/');
    std::string_view last = p.substr(slash + 1);
    if (last.empty()) {  // "/a/b/": the folder's name
      const std::string_view q = p.substr(0, slash);
      last = q.substr(q.find_last_of('/') + 1);
    }
    if (p.find('/', 1) == std::string_view::npos && slash == 0)
      out.append(p);  // "/x": a route or a single word, not a server folder
    else
      out.append(last);
    i = j;
  }
  return out;
}

}  // namespace dit::server
