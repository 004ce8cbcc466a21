#include "backend/io/config_json.h"

#include "backend/io/file_guard.h"

namespace dit {

namespace {

const char* jsonKind(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "an object";
    default:
      return "a number";
  }
}

}  // namespace

void requireConfigObject(const nlohmann::json& j, const std::string& file) {
  if (!j.is_object())
    throw ModelFileError(
        file, std::string("config is not a JSON object (its top level is ") + jsonKind(j) + ")");
}

nlohmann::json readConfigJson(const std::string& file) {
  // Regular files only, at most 64 MiB, depth-limited, no file bytes in the error.
  nlohmann::json j = readModelJson(file, "config");
  requireConfigObject(j, file);
  return j;
}

void requireDeclaredAs(const nlohmann::json& j, const char* key,
                       std::initializer_list<const char*> accepted, const std::string& file) {
  if (!j.is_object()) return;
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (!it->is_string()) detail::wrongConfigType(key, *it, file, "a string");
  const std::string declared = it->get<std::string>();
  std::string names;
  for (const char* a : accepted) {
    if (declared == a) return;
    names += (names.empty() ? "" : " or ") + std::string(a);
  }
  const std::string shown = declared.size() > 120 ? declared.substr(0, 117) + "..." : declared;
  throw ModelFileError(file, std::string("declares ") + key + " \"" + shown +
                                 "\", but this component is read as " + names);
}

}  // namespace dit
