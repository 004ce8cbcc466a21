#include "backend/pipelines/registry.h"

#include "backend/io/model_folder.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"
#include "backend/pipelines/flux2/flux2_pipeline_config.h"

namespace dit {
namespace {

// One line per family.
const std::vector<PipelineFamily>& families() {
  static const std::vector<PipelineFamily> f{
      fluxPipelineFamily(),
      flux2KleinPipelineFamily(),
  };
  return f;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

const PipelineFamily& pipelineFamily(const std::string& class_name, const std::string& file) {
  for (const auto& f : families())
    if (f.class_name == class_name) return f;
  throw UnsupportedModelError(file, "pipeline class \"" + class_name +
                                        "\" is not supported; supported pipeline classes: " +
                                        joined(supportedPipelineClasses()));
}

std::vector<std::string> supportedPipelineClasses() {
  std::vector<std::string> v;
  for (const auto& f : families()) v.push_back(f.class_name);
  return v;
}

}  // namespace dit
