// What every route shares: the OpenAI-shape error, typed body fields, JSON and form bodies
// (http_routes.h).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "app/server/http_routes.h"

namespace dit::server {

namespace fs = std::filesystem;
using nlohmann::json;

ApiError badRequest(const std::string& message, const std::string& param) {
  return ApiError(400, "invalid_request_error", message, param);
}

json errorBody(const std::string& message, const std::string& type, const std::string& param,
               const std::string& code) {
  return json{{"error",
               {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

void sendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  // A message may quote client bytes that are not UTF-8 (a path with %ff): replaced, never a
  // throw from dump() (it escaped the handlers and dropped the connection unanswered).
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void sendError(httplib::Response& res, const ApiError& e) {
  sendJson(res, e.status, errorBody(e.what(), e.type, e.param, e.code));
}

std::string typeName(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// --- typed body fields (absent or null: nullopt) ------------------------------------------
std::optional<std::string> str(const json& b, const char* key) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  if (!b[key].is_string())
    throw badRequest(std::string("'") + key + "' must be a string, got " + typeName(b[key]), key);
  return b[key].get<std::string>();
}
std::optional<long long> integer(const json& b, const char* key, long long lo, long long hi) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  const json& v = b[key];
  if (!v.is_number_integer())
    throw badRequest(std::string("'") + key + "' must be an integer, got " + v.dump(), key);
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
    throw badRequest(std::string("'") + key + "' must be in " + std::to_string(lo) + " .. " +
                         std::to_string(hi) + ", got " + v.dump(),
                     key);
  const long long x = v.get<long long>();
  if (x < lo || x > hi)
    throw badRequest(std::string("'") + key + "' must be in " + std::to_string(lo) + " .. " +
                         std::to_string(hi) + ", got " + v.dump(),
                     key);
  return x;
}
std::optional<double> number(const json& b, const char* key) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  if (!b[key].is_number())
    throw badRequest(std::string("'") + key + "' must be a number, got " + b[key].dump(), key);
  return b[key].get<double>();
}
std::optional<bool> boolean(const json& b, const char* key) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  if (!b[key].is_boolean())
    throw badRequest(std::string("'") + key + "' must be a boolean, got " + b[key].dump(), key);
  return b[key].get<bool>();
}

// A JSON body: depth and UTF-8 scanned before the parser sees it, our words for every refusal,
// the JSON types of the fields the route reads checked before it reads them.
json parseBody(const httplib::Request& req, int maxDepth, BodyKind kind) {
  json b;
  if (auto e = parseJsonBody(req.body, maxDepth, b)) throw badRequest(e->message, e->param);
  if (auto e = checkFieldTypes(b, kind)) throw badRequest(e->message, e->param);
  liftKnobKeys(b);  // a family knob as an extra top-level field -> options
  return b;
}

// Multipart fields -> a JSON object: numbers, booleans and the JSON-valued `loras` typed.
json formToJson(const httplib::Request& req, int maxDepth) {
  static const std::vector<std::string> ints{
      "n", "seed", "steps", "partial_images", "output_compression", "max_sequence_length"};
  static const std::vector<std::string> reals = [] {
    std::vector<std::string> r{"guidance", "strength"};
    for (const FieldSpec& k : allFamilyKnobs()) r.push_back(k.name);  // the families' knobs
    return r;
  }();
  static const std::vector<std::string> bools{"stream"};
  json b = json::object();
  for (const auto& [name, item] : req.files) {
    if (!item.filename.empty() || name == "image" || name == "image[]" || name == "mask")
      continue;  // files
    const std::string& v = item.content;
    if (auto at = invalidUtf8At(name))
      throw badRequest("a form field's name is not valid UTF-8 text (byte at offset " +
                       std::to_string(*at) + ")");
    if (auto at = invalidUtf8At(v))
      throw badRequest("form field '" + name + "' is not valid UTF-8 text (byte at offset " +
                           std::to_string(*at) + ")",
                       name);
    auto has = [&](const std::vector<std::string>& l) {
      return std::find(l.begin(), l.end(), name) != l.end();
    };
    try {
      if (has(ints)) {
        size_t used = 0;
        if (!v.empty() && v[0] == '-') {
          const long long x = std::stoll(v, &used);
          if (used != v.size()) throw std::invalid_argument(v);
          b[name] = x;
        } else {
          const unsigned long long x = std::stoull(v, &used);
          if (used != v.size()) throw std::invalid_argument(v);
          b[name] = x;
        }
      } else if (has(reals)) {
        size_t used = 0;
        const double x = std::stod(v, &used);
        if (used != v.size()) throw std::invalid_argument(v);
        b[name] = x;
      } else if (has(bools)) {
        if (v != "true" && v != "false") throw std::invalid_argument(v);
        b[name] = v == "true";
      } else if (name == "loras") {
        json l;
        if (auto e = parseJsonBody("{\"loras\":" + v + "}", maxDepth, l))
          throw badRequest(
              "form field 'loras' is not a JSON array of {name, strength}: " + e->message, name);
        b[name] = std::move(l["loras"]);
      } else {
        b[name] = v;
      }
    } catch (const ApiError&) {
      throw;
    } catch (const std::exception&) {
      throw badRequest("form field '" + name + "' has an invalid value '" + v.substr(0, 64) + "'",
                       name);
    }
  }
  if (auto e = checkFieldTypes(b, BodyKind::OpenAi)) throw badRequest(e->message, e->param);
  liftKnobKeys(b);  // a family knob as a form field -> options
  return b;
}

bool safeName(const std::string& n) {
  static const std::regex re("[A-Za-z0-9_][A-Za-z0-9._-]{0,199}");
  return std::regex_match(n, re) && n.find("..") == std::string::npos;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ApiError(500, "server_error",
                   "cannot read the image " + fs::path(path).filename().string());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::int64_t unixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool constantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

}  // namespace dit::server
