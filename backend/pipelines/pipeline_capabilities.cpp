#include "backend/pipelines/pipeline_capabilities.h"

#include <stdexcept>

namespace dit {

void checkRequestSupported(const std::string& display_name, const FamilyCapabilities& caps,
                           const RequestedFeatures& r) {
  auto refuse = [&](const std::string& feature, const std::string& field) {
    throw std::invalid_argument(feature + " is not supported for " + display_name + "; remove " +
                                field);
  };
  if (r.mask && !caps.inpaint) refuse("inpainting", "mask_image");
  if (r.init_image && !caps.img2img) refuse("image-to-image", "init_image");
  if (r.step_cache && !caps.step_cache)
    refuse("step caching (First Block Cache, TaylorSeer)", "cache");
}

}  // namespace dit
