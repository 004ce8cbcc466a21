// Qwen-Image's family record (QwenImagePipeline + QwenImageTransformer2DModel): one line in
// models/family_registry.cpp's table.
#pragma once

#include "backend/models/family.h"

namespace dit {

/// QwenImagePipeline / QwenImageTransformer2DModel: Qwen2.5-VL text encoder (language model, last
/// hidden state, 34 template rows dropped), AutoencoderKLQwenImage, true CFG with the norm
/// rescale; read from a diffusers folder only; text-to-image.
FamilySpec qwenImageFamily();

}  // namespace dit
