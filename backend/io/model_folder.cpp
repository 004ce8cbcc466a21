#include "backend/io/model_folder.h"

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/io/config_json.h"
#include "backend/models/registry.h"
#include "backend/pipelines/registry.h"

namespace dit {
namespace fs = std::filesystem;
using nlohmann::json;

ModelFolder ModelFolder::open(const std::string& path) {
  ModelFolder m;
  m.path = path;
  if (!fs::is_directory(path)) throw ModelFileError(path, "model folder does not exist");
  const std::string idx = path + "/model_index.json";
  const json mi = readConfigJson(idx);
  getConfigValue(mi, "_class_name", m.pipeline_class, idx);
  if (m.pipeline_class.empty())
    throw ModelFileError(idx, "no \"_class_name\": not a diffusers pipeline folder");
  const PipelineFamily& family = pipelineFamily(m.pipeline_class, idx);
  for (const std::string& comp : family.components) {
    if (mi.contains(comp) && mi[comp].is_array() && !mi[comp].empty() && mi[comp][0].is_null())
      throw ModelFileError(idx,
                           "component '" + comp + "' is null; " + family.class_name + " needs it");
    if (!fs::is_directory(path + "/" + comp))
      throw ModelFileError(path + "/" + comp, "component folder is missing");
  }
  // The denoiser's class: transformer/config.json "_class_name", else model_index.json's
  // ["library", "class"] entry for the component.
  {
    const std::string f = path + "/" + family.transformer_component + "/config.json";
    const json tc = readConfigJson(f);
    getConfigValue(tc, "_class_name", m.transformer_class, f);
    if (m.transformer_class.empty()) {
      auto it = mi.find(family.transformer_component);
      if (it != mi.end() && it->is_array() && it->size() == 2 && (*it)[1].is_string())
        m.transformer_class = (*it)[1].get<std::string>();
    }
    if (m.transformer_class.empty())
      throw ModelFileError(
          f, "no \"_class_name\" here nor in model_index.json: unknown transformer class");
    transformerFamily(m.transformer_class, f);  // refuses an unregistered class
  }
  m.config = family.parse(m);
  return m;
}

uint64_t ModelFolder::transformerParameterCount() const {
  auto st = SafetensorsCollection::openFolder(path + "/transformer", "diffusion_pytorch_model");
  uint64_t n = 0;
  for (auto& name : st.names()) n += static_cast<uint64_t>(st.info(name).numel());
  return n;
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
