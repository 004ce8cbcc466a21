// The one refusal of a request feature the model's family cannot run (Torch-free). What a family
// can do is data in its record (FamilyCapabilities, backend/models/family.h); the shared
// flow-matching loop (pipelines/flow_match_pipeline.h) refuses through checkRequestSupported, and
// the GUI enables its init-image / mask / step-cache controls from the same flags.
#pragma once

#include <string>

#include "backend/models/family.h"

namespace dit {

/// The features a request asks for (what PipelineInputs holds, without Torch).
struct RequestedFeatures {
  bool init_image = false;
  bool mask = false;
  bool step_cache = false;
};

/// Throws std::invalid_argument "<feature> is not supported for <display_name>; remove <field>"
/// for the first requested feature the family lacks (inpainting, image-to-image, step caching).
void checkRequestSupported(const std::string& display_name, const FamilyCapabilities& caps,
                           const RequestedFeatures& request);

}  // namespace dit
