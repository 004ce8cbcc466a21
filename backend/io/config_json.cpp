#include "backend/io/config_json.h"

#include "backend/io/file_guard.h"

namespace dit {

nlohmann::json readConfigJson(const std::string& file) {
  // Regular files only, at most 64 MiB, depth-limited, no file bytes in the error.
  return readModelJson(file, "config");
}

}  // namespace dit
