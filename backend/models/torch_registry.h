// The Torch half of the transformer-family registry: the class name (transformer/config.json
// "_class_name") -> how to build the model through a WeightSource. The Torch-free half
// (models/registry.h: sizes and declared plans) is the table of record: a class unknown there is
// refused with its list of supported classes; a class known there but without a Torch builder is
// refused naming both lists.
//
// Adding a family: its Torch model implements DiffusionTransformer and provides a
// TransformerBuilder (e.g. fluxTransformerBuilder() in models/flux/transformer_flux.h), plus one
// line in the table in models/torch_registry.cpp.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "backend/models/diffusion_transformer.h"

namespace dit {

class WeightSource;

struct TransformerBuilder {
  std::string class_name;  ///< diffusers class, e.g. "FluxTransformer2DModel"
  /// Parses `config` (the transformer's config.json object, read from `file`, named in errors)
  /// and loads the model's weights from `w` under `par` (each rank reads only its tensor-parallel
  /// slices). Throws ModelFileError (config, missing/mismatching tensors) or
  /// std::invalid_argument (the plan does not fit the tp degree).
  std::function<std::unique_ptr<DiffusionTransformer>(const nlohmann::json& config,
                                                      const std::string& file, WeightSource& w,
                                                      const TransformerParallelism& par)>
      load;
};

/// Builds the transformer of class `class_name`: see TransformerBuilder::load. Throws
/// UnsupportedModelError naming the class and `file` and listing the supported classes.
std::unique_ptr<DiffusionTransformer> loadTransformer(const std::string& class_name,
                                                      const nlohmann::json& config,
                                                      const std::string& file, WeightSource& w,
                                                      const TransformerParallelism& par = {});
/// Classes with a Torch builder, in registration order.
std::vector<std::string> loadableTransformerClasses();

}  // namespace dit
