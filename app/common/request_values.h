// The protocol's request (protocol::GenerationParams) as the family request spec reads it
// (dit::RequestValues, backend/models/request_spec.h). Header-only and Torch-free, so that every
// front end (the CLI and the worker in dit_app, the GUI in dit_ui) resolves the same values the
// same way through dit::resolveRequest.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "app/protocol/protocol.h"
#include "backend/models/family_registry.h"
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

/// A family knob spelled at the top level of a request object, as an OpenAI client sends an
/// extra body field ({"prompt": ..., "cfg_truncation": 0.25}) and as presets, history and PNG
/// metadata wrote FluxPipeline's true CFG scale before it became a knob: every top-level key of
/// `j` (an object; anything else is left alone) naming a knob some registered family declares
/// (allFamilyKnobs) moves into j["options"], unless "options" already has that name (the
/// explicit spelling wins). Other keys stay where they are; the value is not checked here (the
/// protocol's reader checks "options", the family's resolve the name and range). Returns the
/// names moved.
inline std::set<std::string> liftKnobKeys(nlohmann::json& j) {
  std::set<std::string> moved;
  if (!j.is_object()) return moved;
  for (const FieldSpec& k : allFamilyKnobs()) {
    auto it = j.find(k.name);
    if (it == j.end()) continue;
    nlohmann::json value = *it;
    j.erase(it);
    if (!j.contains("options") || j["options"].is_null()) j["options"] = nlohmann::json::object();
    if (!j["options"].is_object()) continue;  // the reader refuses the malformed "options"
    if (!j["options"].contains(k.name)) j["options"][k.name] = std::move(value);
    moved.insert(k.name);
  }
  return moved;
}

}  // namespace dit
