// The family record's own functions (family.h): its declared request for one folder and its
// capability refusals. Apart from the one table (family_registry.cpp), so that a family's pipeline
// and the shared flow-matching loop reach their record without including the table.
#include "backend/models/family.h"

#include <algorithm>

#include "backend/io/model_folder.h"

namespace dit {

RequestSpec FamilySpec::requestSpec(const ModelFolder& folder) const {
  const FamilySpec& f = *this;
  RequestSpec spec =
      f.request ? f.request(folder) : baseRequestSpec(f.display_name, f.pipeline_class);
  // A pipeline variant may name itself (Flux2Pipeline: "FLUX.2 [dev]" in the FLUX.2 family).
  if (spec.family.empty()) spec.family = f.display_name;
  for (const FieldSpec& k : f.knobs) {
    // A knob the folder's request already declares keeps that declaration; declared as not read
    // (FluxKontextPipeline's max_area on a FluxPipeline folder) it is not this folder's option.
    bool declared = false;
    for (FieldSpec& field : spec.fields)
      if (field.name == k.name) field.knob = declared = true;
    if (declared) {
      spec.fields.erase(
          std::remove_if(spec.fields.begin(), spec.fields.end(),
                         [&](const FieldSpec& x) { return x.name == k.name && !x.read; }),
          spec.fields.end());
      continue;
    }
    FieldSpec knob = k;
    knob.knob = true;
    spec.fields.push_back(knob);
  }
  // The family's capabilities bound what its request (or its pipeline class) takes.
  spec.inputs.init_image = spec.inputs.init_image && f.caps.img2img;
  spec.inputs.mask = spec.inputs.mask && f.caps.inpaint;
  spec.inputs.step_cache = spec.inputs.step_cache && f.caps.step_cache;
  // A field not read says why: the pipeline class's own reason when its request gave one, else
  // the family's capability refusal.
  auto notRead = [&](const char* name, const char* feature) {
    FieldSpec& field = spec.at(name);
    field.read = false;
    if (field.not_read.empty()) field.not_read = f.refusal(feature);
  };
  if (!spec.inputs.init_image) {
    notRead("init_image", "img2img");
    notRead("strength", "img2img");
  }
  if (!spec.inputs.mask) notRead("mask_image", "inpaint");
  return spec;
}

std::string FamilySpec::refusal(const std::string& feature) const {
  struct Feature {
    const char* name;
    bool ok;
    const char* what;
  };
  const Feature features[] = {
      {"img2img", caps.img2img, "image-to-image (--init-image)"},
      {"inpaint", caps.inpaint, "inpainting (--mask)"},
      {"step_cache", caps.step_cache, "step caching (--cache)"},
      {"single_file", caps.single_file,
       "reading a single-file checkpoint or a --config/--vae/--text-encoder/--tokenizer override "
       "(give the diffusers folder)"},
      {"lora", !caps.lora_formats.empty(), "LoRA"},
  };
  for (const Feature& f : features)
    if (feature == f.name)
      return f.ok ? std::string()
                  : std::string(f.what) + " is not supported for " + display_name + " (" +
                        pipeline_class + ")";
  return "unknown capability \"" + feature + "\"";
}

}  // namespace dit
