// The one table of model families (Torch-free). ModelFolder::open dispatches on model_index.json's
// `_class_name` here; the strategy rules, the memory estimate, the GUI and the benchmark reach a
// family's facts through the record it returns (models/family.h).
//
// Adding a family: one line in the table in models/family_registry.cpp (and one in
// backend/family_runtime.cpp for its Torch half).
#pragma once

#include <string>
#include <vector>

#include "backend/models/family.h"

namespace dit {

/// Every registered family, in registration order.
const std::vector<FamilySpec>& modelFamilies();

/// The family whose pipeline class is `pipeline_class`. Throws UnsupportedModelError naming the
/// class and `file` (where it was read) and listing the supported pipeline classes.
const FamilySpec& pipelineFamily(const std::string& pipeline_class, const std::string& file);
/// The family whose denoiser class is `transformer_class`. Throws UnsupportedModelError naming
/// the class and `file` and listing the supported transformer classes.
const FamilySpec& transformerFamily(const std::string& transformer_class, const std::string& file);
/// The family that reads single files inspectCheckpoint detects as `checkpoint_family` ("flux").
/// Throws UnsupportedModelError naming `file`.
const FamilySpec& checkpointFamily(const std::string& checkpoint_family, const std::string& file);
/// The family of an opened folder (by its pipeline class). Throws UnsupportedModelError.
const FamilySpec& familyOf(const ModelFolder& folder);
/// The request of an opened folder: its family's FamilySpec::request with the family's knobs
/// appended and the inputs it takes set from its capabilities. Every front end and the worker
/// resolve requests against this (resolveRequest, request_spec.h). Throws as familyOf does.
RequestSpec requestSpecOf(const ModelFolder& folder);
/// Every knob any registered family declares (the CLI's generated flags), each name once.
const std::vector<FieldSpec>& allFamilyKnobs();

/// Registered pipeline classes, in registration order.
std::vector<std::string> supportedPipelineClasses();
/// Registered transformer classes, in registration order.
std::vector<std::string> supportedTransformerClasses();

}  // namespace dit
