// FLUX.2 [klein]'s family record (Flux2KleinPipeline + Flux2Transformer2DModel): one line in
// models/family_registry.cpp's table.
#pragma once

#include "backend/models/family.h"

namespace dit {

/// Flux2KleinPipeline / Flux2Transformer2DModel: Qwen3 text encoder (hidden states 9, 18, 27
/// stacked), AutoencoderKLFlux2, classic CFG on base models; read from a diffusers folder only.
FamilySpec flux2KleinFamily();

}  // namespace dit
