// What a pipeline family can do beyond text-to-image, as data (Torch-free: the GUI, the CLI and
// the worker read it from the family's registration, pipelines/registry.h). The shared
// flow-matching loop (pipelines/flow_match_pipeline.h) refuses a request through
// checkRequestSupported with one generic message; the GUI enables its init-image / mask /
// step-cache controls from the same flags. Kept small so it can fold into a per-family record.
#pragma once

#include <string>

namespace dit {

struct PipelineCapabilities {
  std::string display_name;  ///< the family as users know it, e.g. "FLUX.2 [klein]"
  bool img2img = false;      ///< an init image (diffusers' *Img2ImgPipeline / strength)
  bool inpaint = false;      ///< an init image and a mask (diffusers' *InpaintPipeline)
  /// First Block Cache / TaylorSeer through the transformer's step-cache seam
  /// (DiffusionTransformer::supportsStepCache must agree at run time).
  bool step_cache = false;
};

/// The features a request asks for (what PipelineInputs holds, without Torch).
struct RequestedFeatures {
  bool init_image = false;
  bool mask = false;
  bool step_cache = false;
};

/// Throws std::invalid_argument "<feature> is not supported for <display_name>; remove <field>"
/// for the first requested feature the family lacks (image-to-image, inpainting, step caching).
void checkRequestSupported(const PipelineCapabilities& caps, const RequestedFeatures& request);

}  // namespace dit
