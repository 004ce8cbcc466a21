// The table of the families' Torch halves (the records: backend/family_runtime_record.h):
// programs reach a family's pipeline and transformer only through this table and the Torch-free
// one (backend/models/family_registry.h); none of them names a class.
//
// Adding a family: one line in the table in backend/family_runtime.cpp.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "backend/family_runtime_record.h"

namespace dit {

/// The runtime of the family registered under `pipeline_class`. Throws UnsupportedModelError
/// naming the class and `file` and listing the implemented pipeline classes.
const FamilyRuntime& familyRuntime(const std::string& pipeline_class, const std::string& file);

/// Loads the pipeline of model.pipeline_class: see FamilyRuntime::loadPipeline. Throws
/// UnsupportedModelError naming the class and model_index.json and listing the supported classes.
std::unique_ptr<DiffusionPipeline> loadPipeline(const ModelFolder& model,
                                                const PipelineOptions& opts);
/// Builds the transformer of class `transformer_class`: see FamilyRuntime::loadTransformer.
/// Throws UnsupportedModelError naming the class and `file` and listing the supported classes.
std::unique_ptr<DiffusionTransformer> loadTransformer(const std::string& transformer_class,
                                                      const nlohmann::json& config,
                                                      const std::string& file, WeightSource& w,
                                                      const TransformerParallelism& par = {});
/// Pipeline classes with a Torch runtime, in registration order.
std::vector<std::string> loadablePipelineClasses();
/// Transformer classes with a Torch runtime, in registration order.
std::vector<std::string> loadableTransformerClasses();

}  // namespace dit
