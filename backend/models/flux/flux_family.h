// FLUX.1's family record (FluxPipeline + FluxTransformer2DModel): one line in
// models/family_registry.cpp's table.
#pragma once

#include "backend/models/family.h"

namespace dit {

/// FluxPipeline / FluxTransformer2DModel: CLIP + T5 text encoders, AutoencoderKL, distilled
/// guidance embedding and true CFG; image-to-image, inpainting, step caching, BFL/ComfyUI single
/// files, LoRA in diffusers, kohya and BFL layouts.
FamilySpec fluxFamily();

}  // namespace dit
