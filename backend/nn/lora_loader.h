// Reads a LoRA file (diffusers/PEFT or kohya, backend/io/lora_file.h) into the model-neutral
// tensor_parallel::LoraAdapter: one entry per target module in the model's naming, with its whole
// A [r, in] and B [out, r] in float32 on the CPU and its scale (alpha / r). Fused kohya modules are
// split with the family's KohyaLoraMapping: lora_down is copied to every part, lora_up cut by rows
// (diffusers _convert_kohya_flux_lora_to_diffusers; alpha / rank stays with each part).
#pragma once

#include <string>

#include "backend/io/lora_file.h"
#include "parallel/tensor_parallel/lora.h"

namespace dit {

/// Parses `path` (inspectLoraFile, then the factors). `kohya` maps kohya module names; an empty
/// function refuses kohya files. Throws ModelFileError naming the file and the first module that
/// cannot be placed (a kohya module the family does not know, sizes it cannot split) and every
/// inspectLoraFile error.
tensor_parallel::LoraAdapter loadLoraAdapter(const std::string& path,
                                             const KohyaLoraMapping& kohya);

}  // namespace dit
