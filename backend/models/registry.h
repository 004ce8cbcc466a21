// Transformer (denoiser) families, keyed by the diffusers model class (transformer/config.json
// "_class_name", e.g. "FluxTransformer2DModel"). This is the Torch-free half of a family: what the
// strategy validation, the GUI advisor, the benchmark's byte counts and the memory test need
// without loading a weight. The Torch half (building the model through the weight loader) lives
// next to the model (e.g. models/flux/transformer_flux.h).
//
// Adding a family: a folder models/<family>/ with its config parser and a function returning its
// TransformerFamily, plus one line in the table in models/registry.cpp.
#pragma once

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "parallel/strategy.h"  // ModelDims

namespace dit {

struct TransformerFamily {
  std::string class_name;  ///< diffusers class, e.g. "FluxTransformer2DModel"
  /// Sizes the parallel-strategy rules need, from the transformer's config.json object read from
  /// `file` (named in errors). vae_scale_factor is left at its default: the pipeline sets it.
  /// Throws ModelFileError for an invalid config.
  std::function<ModelDims(const nlohmann::json& config, const std::string& file)> dims;
};

/// The family registered under `class_name`. Throws UnsupportedModelError naming the class and
/// `file` (where it was read) and listing the supported transformer classes.
const TransformerFamily& transformerFamily(const std::string& class_name, const std::string& file);
/// Registered transformer classes, in registration order.
std::vector<std::string> supportedTransformerClasses();

}  // namespace dit
