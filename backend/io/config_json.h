// Reading diffusers/transformers config.json files (Torch-free). Every error is a ModelFileError
// naming the file and the key, so a broken model folder is reported as such.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "backend/io/safetensors.h"  // ModelFileError

namespace dit {

/// Parses `file` as JSON. Throws ModelFileError: "file is missing", "cannot open file",
/// "not valid JSON: <parser message>".
nlohmann::json readConfigJson(const std::string& file);

/// Sets `out` from `j[key]` when the key is present and not null (else leaves the default).
/// Throws ModelFileError naming `file`, the key and the value when it has the wrong type.
template <typename T>
void getConfigValue(const nlohmann::json& j, const char* key, T& out, const std::string& file) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    out = it->template get<T>();
  } catch (const nlohmann::json::exception&) {
    throw ModelFileError(file,
                         std::string("config key '") + key + "' has the wrong type: " + it->dump());
  }
}

}  // namespace dit
