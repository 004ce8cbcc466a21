// FLUX.2 [klein]'s Torch half of the family record (backend/family_runtime_record.h): one line in
// its table.
#pragma once

#include "backend/family_runtime_record.h"

namespace dit {

/// Flux2KleinPipeline / Flux2Transformer2DModel: loading, the benchmark's inputs and traffic
/// model, and random Qwen3 / AutoencoderKLFlux2 components for make-model.
FamilyRuntime flux2KleinRuntime();

}  // namespace dit
