#include "backend/models/torch_registry.h"

#include <nlohmann/json.hpp>

#include "backend/io/model_folder.h"  // UnsupportedModelError
#include "backend/models/flux/transformer_flux.h"
#include "backend/models/flux2/transformer_flux2.h"
#include "backend/models/registry.h"

namespace dit {
namespace {

// One line per family.
const std::vector<TransformerBuilder>& builders() {
  static const std::vector<TransformerBuilder> b{
      fluxTransformerBuilder(),
      flux2TransformerBuilder(),
  };
  return b;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

std::unique_ptr<DiffusionTransformer> loadTransformer(const std::string& class_name,
                                                      const nlohmann::json& config,
                                                      const std::string& file, WeightSource& w,
                                                      const TransformerParallelism& par) {
  (void)transformerFamily(class_name, file);  // unknown class: refused with the supported list
  for (const auto& b : builders())
    if (b.class_name == class_name) return b.load(config, file, w, par);
  throw UnsupportedModelError(
      file, "transformer class \"" + class_name +
                "\" has a config reader but no Torch implementation in this build; "
                "implemented transformer classes: " +
                joined(loadableTransformerClasses()));
}

std::vector<std::string> loadableTransformerClasses() {
  std::vector<std::string> v;
  for (const auto& b : builders()) v.push_back(b.class_name);
  return v;
}

}  // namespace dit
