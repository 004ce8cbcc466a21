#include "backend/models/registry.h"

#include "backend/io/model_folder.h"  // UnsupportedModelError
#include "backend/models/flux/flux_plan.h"
#include "backend/models/flux2/flux2_plan.h"

namespace dit {
namespace {

// One line per family.
const std::vector<TransformerFamily>& families() {
  static const std::vector<TransformerFamily> f{
      fluxTransformerFamily(),
      flux2TransformerFamily(),
  };
  return f;
}

}  // namespace

const TransformerFamily& transformerFamily(const std::string& class_name, const std::string& file) {
  for (const auto& f : families())
    if (f.class_name == class_name) return f;
  std::string list;
  for (const auto& c : supportedTransformerClasses()) list += (list.empty() ? "" : ", ") + c;
  throw UnsupportedModelError(file,
                              "transformer class \"" + class_name +
                                  "\" is not supported; supported transformer classes: " + list);
}

std::vector<std::string> supportedTransformerClasses() {
  std::vector<std::string> v;
  for (const auto& f : families()) v.push_back(f.class_name);
  return v;
}

}  // namespace dit
