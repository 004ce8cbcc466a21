// The protocol's request (protocol::GenerationParams) as the family request spec reads it
// (dit::RequestValues, backend/models/request_spec.h). Header-only and Torch-free, so that every
// front end (the CLI and the worker in dit_app, the GUI in dit_ui) resolves the same values the
// same way through dit::resolveRequest.
#pragma once

#include <set>
#include <string>

#include "app/protocol/protocol.h"
#include "backend/models/request_spec.h"

namespace dit {

/// `p` as RequestValues; `given`: the fields the user set explicitly (CLI flags on the command
/// line, JSON keys present), whose being ignored by the model is a warning.
inline RequestValues requestValues(const protocol::GenerationParams& p,
                                   const std::set<std::string>& given = {}) {
  RequestValues v;
  v.prompt = p.prompt;
  v.negative_prompt = p.negative_prompt;
  v.negative_prompt_given = p.hasNegativePrompt();
  v.width = p.width;
  v.height = p.height;
  v.steps = p.steps;
  v.max_sequence_length = p.max_sequence_length;
  v.num_images = p.num_images;
  v.guidance = p.guidance;
  v.true_cfg_scale = p.true_cfg_scale;
  v.strength = p.strength;
  v.init_image = p.init_image;
  v.mask_image = p.mask_image;
  for (const protocol::ReferenceImage& ref : p.reference_images)
    v.reference_images.push_back(ref.file);
  v.cache = !p.cache.empty() && p.cache != "none";
  v.options = p.options;
  v.given = given;
  for (const auto& [name, value] : p.options) v.given.insert(name);
  return v;
}

}  // namespace dit
