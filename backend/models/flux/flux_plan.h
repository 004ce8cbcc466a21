// FLUX.1 (diffusers FluxTransformer2DModel) as data, without Torch: the sizes the strategy rules
// need and the family registration. Used by the registry (models/registry.cpp), hence by the GUI's
// validation and advisor, the benchmark and the memory test.
#pragma once

#include "backend/models/flux/flux_config.h"
#include "backend/models/registry.h"

namespace dit {

/// ModelDims of a FLUX.1 transformer (heads, head dim, mlp hidden = 4 * inner_dim, joint
/// attention dim). vae_scale_factor is left at its default (the pipeline sets it).
ModelDims fluxModelDims(const FluxTransformerConfig& c);

/// The "FluxTransformer2DModel" registration (models/registry.cpp).
TransformerFamily fluxTransformerFamily();

}  // namespace dit
