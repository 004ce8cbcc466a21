// FLUX.1's transformer config from a Black Forest Labs single file's tensor shapes (the family's
// half of backend/models/checkpoint_layouts.h, which detects the file and maps its keys).
// Torch-free.
#pragma once

#include <string>

#include "backend/io/safetensors.h"
#include "backend/models/flux/flux_config.h"

namespace dit {

/// FluxTransformer2DModel config from the BFL tensor shapes under `prefix`: in_channels,
/// out_channels, num_layers, num_single_layers, attention_head_dim (RMSNorm scale width),
/// num_attention_heads (width / head dim), joint_attention_dim, pooled_projection_dim,
/// guidance_embeds. axes_dims_rope is not in the shapes: taken from `reference` when given (a
/// diffusers config, --config), else FLUX.1's [16, 56, 56] when the head dim is 128. Throws
/// ModelFileError naming the file: an MLP ratio other than 4, a width not divisible by the head
/// dim, a head dim other than 128 without `reference`.
FluxTransformerConfig fluxConfigFromBfl(const SafetensorsReader& r, const std::string& prefix,
                                        const FluxTransformerConfig* reference);

}  // namespace dit
