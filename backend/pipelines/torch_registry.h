// The Torch half of the pipeline-family registry: model_index.json "_class_name" -> how to load
// the pipeline. The Torch-free half (pipelines/registry.h: component folders, config parsing) is
// the table of record, consulted by ModelFolder::open: a class unknown there never reaches this
// table; a class known there but without a Torch loader is refused naming both lists.
//
// Adding a family: its pipeline implements DiffusionPipeline and provides a PipelineLoader (e.g.
// fluxPipelineLoader() in pipelines/flux/pipeline_flux.h), plus one line in the table in
// pipelines/torch_registry.cpp.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/pipelines/diffusion_pipeline.h"

namespace dit {

struct PipelineLoader {
  std::string class_name;  ///< diffusers pipeline class, e.g. "FluxPipeline"
  /// Loads every component of `model` (opened by ModelFolder::open). Throws ModelFileError /
  /// std::invalid_argument naming the file or the degree that does not fit.
  std::function<std::unique_ptr<DiffusionPipeline>(const ModelFolder& model,
                                                   const PipelineOptions& opts)>
      load;
};

/// Loads the pipeline registered under model.pipeline_class. Throws UnsupportedModelError naming
/// the class and model_index.json and listing the supported classes (an unopened folder: the
/// class is empty and named as such).
std::unique_ptr<DiffusionPipeline> loadPipeline(const ModelFolder& model,
                                                const PipelineOptions& opts);
/// Classes with a Torch loader, in registration order.
std::vector<std::string> loadablePipelineClasses();

}  // namespace dit
