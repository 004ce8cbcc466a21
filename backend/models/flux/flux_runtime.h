// FLUX.1's Torch half of the family record (backend/family_runtime_record.h): one line in its
// table.
#pragma once

#include "backend/family_runtime_record.h"

namespace dit {

/// FluxPipeline / FluxTransformer2DModel: loading, the benchmark's inputs and traffic model, and
/// random CLIP / T5 / AutoencoderKL components for make-model.
FamilyRuntime fluxRuntime();

}  // namespace dit
