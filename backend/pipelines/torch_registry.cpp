#include "backend/pipelines/torch_registry.h"

#include "backend/pipelines/flux/pipeline_flux.h"
#include "backend/pipelines/flux2/pipeline_flux2.h"
#include "backend/pipelines/registry.h"

namespace dit {
namespace {

// One line per family.
const std::vector<PipelineLoader>& loaders() {
  static const std::vector<PipelineLoader> l{
      fluxPipelineLoader(),
      flux2KleinPipelineLoader(),
  };
  return l;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

std::unique_ptr<DiffusionPipeline> loadPipeline(const ModelFolder& model,
                                                const PipelineOptions& opts) {
  const std::string file = model.path + "/model_index.json";
  (void)pipelineFamily(model.pipeline_class,
                       file);  // unknown class: refused with the supported list
  for (const auto& l : loaders())
    if (l.class_name == model.pipeline_class) return l.load(model, opts);
  throw UnsupportedModelError(
      file, "pipeline class \"" + model.pipeline_class +
                "\" has a config reader but no Torch implementation in this build; "
                "implemented pipeline classes: " +
                joined(loadablePipelineClasses()));
}

std::vector<std::string> loadablePipelineClasses() {
  std::vector<std::string> v;
  for (const auto& l : loaders()) v.push_back(l.class_name);
  return v;
}

}  // namespace dit
