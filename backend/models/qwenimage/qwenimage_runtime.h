// Qwen-Image's Torch half of the family record (backend/family_runtime_record.h): one line in its
// table.
#pragma once

#include "backend/family_runtime_record.h"

namespace dit {

/// QwenImagePipeline / QwenImageTransformer2DModel: loading, the benchmark's inputs and traffic
/// model, and random Qwen2.5-VL text / AutoencoderKLQwenImage components for make-model.
FamilyRuntime qwenImageRuntime();

}  // namespace dit
