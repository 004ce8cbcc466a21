// Z-Image's Torch half of the family record (backend/family_runtime_record.h): one line in its
// table.
#pragma once

#include "backend/family_runtime_record.h"

namespace dit {

/// ZImagePipeline / ZImageTransformer2DModel: loading, the benchmark's inputs and traffic model,
/// and random Qwen3 / AutoencoderKL components for make-model.
FamilyRuntime zimageRuntime();

}  // namespace dit
