// Z-Image's family record (ZImagePipeline + ZImageTransformer2DModel): one line in
// models/family_registry.cpp's table.
#pragma once

#include "backend/models/family.h"

namespace dit {

/// ZImagePipeline / ZImageTransformer2DModel: Qwen3 text encoder (hidden_states[-2] of the real
/// tokens), the FLUX.1 AutoencoderKL, real CFG when guidance > 0; read from a diffusers folder
/// only. Recommends Z-Image-Turbo's settings (few steps, no CFG).
FamilySpec zimageFamily();

}  // namespace dit
