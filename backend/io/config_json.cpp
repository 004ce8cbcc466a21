#include "backend/io/config_json.h"

#include <filesystem>
#include <fstream>

namespace dit {

nlohmann::json readConfigJson(const std::string& file) {
  if (!std::filesystem::exists(file)) throw ModelFileError(file, "file is missing");
  std::ifstream in(file);
  if (!in) throw ModelFileError(file, "cannot open file");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ModelFileError(file, std::string("not valid JSON: ") + e.what());
  }
}

}  // namespace dit
