// Pipeline families, keyed by the diffusers pipeline class (model_index.json "_class_name").
// Torch-free: ModelFolder::open dispatches here, so the GUI reads any registered family.
//
// Adding a family: a folder pipelines/<family>/ with its PipelineConfig subclass and a parse
// function, plus one line in the table in pipelines/registry.cpp.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/pipelines/pipeline_capabilities.h"

namespace dit {

struct ModelFolder;
struct PipelineConfig;

struct PipelineFamily {
  std::string class_name;               ///< diffusers pipeline class, e.g. "FluxPipeline"
  std::vector<std::string> components;  ///< component folders the pipeline needs
  std::string transformer_component = "transformer";  ///< the denoiser's folder
  /// Parses the component configs of `folder` (path and classes already set). Throws
  /// ModelFileError naming the file.
  std::function<std::shared_ptr<const PipelineConfig>(const ModelFolder& folder)> parse;
  /// What the family runs beyond text-to-image (the generic refusal and the GUI read it).
  PipelineCapabilities capabilities;
};

/// The family registered under `class_name`. Throws UnsupportedModelError naming the class and
/// `file` (where it was read) and listing the supported pipeline classes.
const PipelineFamily& pipelineFamily(const std::string& class_name, const std::string& file);
/// Registered pipeline classes, in registration order.
std::vector<std::string> supportedPipelineClasses();

}  // namespace dit
