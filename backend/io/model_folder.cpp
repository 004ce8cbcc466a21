#include "backend/io/model_folder.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/io/config_json.h"
#include "backend/io/key_layout.h"

namespace dit {
namespace fs = std::filesystem;
using nlohmann::json;

uint64_t ModelFolder::transformerParameterCount() const {
  return componentParameterCount("transformer", "diffusion_pytorch_model");
}

uint64_t ModelFolder::componentParameterCount(const std::string& name,
                                              const std::string& stem) const {
  uint64_t n = 0;
  auto it = components.find(name);
  if (it != components.end() && it->second.single_file) {
    SafetensorsReader r(it->second.path);
    for (const auto& k : r.names())
      if (k.rfind(it->second.prefix, 0) == 0 && !isFp8AuxiliaryKey(k))
        n += static_cast<uint64_t>(r.info(k).numel());
    return n;
  }
  auto st = SafetensorsCollection::openFolder(component(name), stem);
  for (auto& k : st.names()) n += static_cast<uint64_t>(st.info(k).numel());
  return n;
}

std::string ModelFolder::describeSources() const {
  std::string r;
  for (const auto& [name, c] : components) {
    r += name + ": " + c.path;
    if (c.single_file)
      r += " (single file, " + c.layout + " layout" +
           (c.prefix.empty() ? std::string() : ", prefix '" + c.prefix + "'") + ")";
    r += " [" + c.flag + "]\n";
  }
  return r;
}

std::string defaultModelDir() {
  if (const char* e = std::getenv("DITSTUDIO_MODEL_DIR"); e && *e) return e;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "share/ditstudio/models/tiny-flux";
  return (exe.parent_path().parent_path() / "share/ditstudio/models/tiny-flux")
      .lexically_normal()
      .string();
}

}  // namespace dit
