#include "backend/models/request_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/io/image_io.h"
#include "backend/io/model_folder.h"
#include "backend/models/family_request.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"

namespace dit {

namespace {

std::string num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  // Shortest text that reads back to v.
  for (int p = 1; p <= 17; ++p) {
    char s[40];
    std::snprintf(s, sizeof s, "%.*g", p, v);
    if (std::strtod(s, nullptr) == v) return s;
  }
  return b;
}

std::string sizeText(int w, int h) { return std::to_string(w) + "x" + std::to_string(h); }

}  // namespace

FieldSpec numberField(const std::string& name, FieldType type, double def, double lo, double hi,
                      const std::string& unit, const std::string& help,
                      const std::string& diffusers) {
  FieldSpec f;
  f.name = name;
  f.type = type;
  f.default_value = def;
  f.min = lo;
  f.max = hi;
  f.unit = unit;
  f.help = help;
  f.diffusers_arg = diffusers;
  return f;
}

FieldSpec knobField(const std::string& name, FieldType type, double def, double lo, double hi,
                    const std::string& unit, const std::string& help,
                    const std::string& diffusers) {
  FieldSpec f = numberField(name, type, def, lo, hi, unit, help, diffusers);
  f.knob = true;
  return f;
}

FieldSpec notReadKnob(FieldSpec knob, const std::string& why) {
  knob.knob = true;
  knob.read = false;
  knob.not_read = why;
  return knob;
}

std::string FieldSpec::cliFlag() const {
  std::string s = "--" + name;
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

std::string FieldSpec::rangeText() const {
  if (type == FieldType::Int) return num(min) + " .. " + num(max) + unit;
  if (min_exclusive) return "(" + num(min) + ", " + num(max) + "]" + unit;
  return num(min) + " .. " + num(max) + unit;
}

bool FieldSpec::accepts(double v) const {
  if (!std::isfinite(v)) return false;
  if (type == FieldType::Int && v != std::floor(v)) return false;
  if (min_exclusive ? !(v > min) : v < min) return false;
  return v <= max;
}

const FieldSpec* RequestSpec::field(std::string_view name) const {
  for (const FieldSpec& f : fields)
    if (f.name == name) return &f;
  return nullptr;
}

FieldSpec& RequestSpec::at(std::string_view name) {
  for (FieldSpec& f : fields)
    if (f.name == name) return f;
  throw std::logic_error("request spec of " + family + " declares no field '" + std::string(name) +
                         "'");
}

std::vector<const FieldSpec*> RequestSpec::knobs() const {
  std::vector<const FieldSpec*> out;
  for (const FieldSpec& f : fields)
    if (f.knob) out.push_back(&f);
  return out;
}

RequestSpec folderRequestBase(const ModelFolder& folder, const std::string& family,
                              const std::string& pipeline) {
  if (!folder.config) throw std::logic_error("folderRequestBase on a folder that was not opened");
  const PipelineConfig& c = *folder.config;
  RequestSpec spec = baseRequestSpec(family, pipeline);
  spec.size.vae_scale_factor = c.dims.vae_scale_factor;
  spec.size.default_width = spec.size.default_height = c.dims.defaultImageSide();
  spec.default_max_sequence_length = c.max_sequence_length;
  spec.at("max_sequence_length").max = c.max_sequence_length_limit;
  spec.max_sequence_length_rule = c.max_sequence_length_rule;
  return spec;
}

RequestSpec baseRequestSpec(const std::string& family, const std::string& pipeline) {
  RequestSpec s;
  s.family = family;
  s.pipeline = pipeline;
  s.fields.push_back(numberField("steps", FieldType::Int, 28, 1, 1000, "",
                                 "denoising steps (0: the model's default)",
                                 "num_inference_steps"));
  s.fields.push_back(numberField("guidance", FieldType::Float, 3.5, 0, 100, "", "guidance scale",
                                 "guidance_scale"));
  s.fields.back().read = false;
  s.fields.back().not_read = "this model does not read guidance_scale";
  FieldSpec neg;
  neg.name = "negative_prompt";
  neg.type = FieldType::Text;
  neg.help = "what the unconditional branch encodes";
  neg.diffusers_arg = "negative_prompt";
  neg.read = false;
  neg.not_read = "this model runs no second (unconditional) branch";
  s.fields.push_back(neg);
  s.fields.push_back(numberField("max_sequence_length", FieldType::Int, 512, 1, 512, " tokens",
                                 "text tokens the encoder reads (0: the model's default)",
                                 "max_sequence_length"));
  FieldSpec strength =
      numberField("strength", FieldType::Float, 0.6, 0, 1, "",
                  "how much of the schedule an init image is denoised", "strength");
  strength.min_exclusive = true;
  s.fields.push_back(strength);
  FieldSpec init;
  init.name = "init_image";
  init.type = FieldType::Image;
  init.help = "image-to-image: the image to start from";
  init.diffusers_arg = "image";
  s.fields.push_back(init);
  FieldSpec mask;
  mask.name = "mask_image";
  mask.type = FieldType::Image;
  mask.help = "inpainting: white = repaint (needs init_image)";
  mask.diffusers_arg = "mask_image";
  s.fields.push_back(mask);
  FieldSpec refs;
  refs.name = "reference_images";
  refs.type = FieldType::Images;
  refs.help = "editing: reference images in order";
  refs.diffusers_arg = "image";
  refs.read = false;
  refs.not_read = "this model takes no reference images";
  s.fields.push_back(refs);
  // Every input the family's capabilities allow (requestSpecOf bounds these by them); a pipeline
  // class that takes less says so in its request.
  s.inputs.init_image = s.inputs.mask = s.inputs.step_cache = true;
  return s;
}

double RequestValues::number(const std::string& name, double fallback) const {
  if (name == "steps") return steps;
  if (name == "guidance") return guidance;
  if (name == "max_sequence_length") return max_sequence_length;
  if (name == "strength") return strength;
  if (name == "width") return width;
  if (name == "height") return height;
  auto it = options.find(name);
  return it != options.end() ? it->second : fallback;
}

std::string ResolvedRequest::message() const {
  std::string s;
  for (const RequestProblem& p : problems) s += (s.empty() ? "" : "; ") + p.message;
  return s;
}

RequestDims ResolvedRequest::dims() const {
  RequestDims d;
  d.width = values.width;
  d.height = values.height;
  d.text_len = values.max_sequence_length;
  d.true_cfg = cfg;
  d.cfg_requirement = cfg_requirement;
  d.num_images = values.num_images;
  d.reference_tokens = reference_tokens;
  return d;
}

ReferenceFit fitReference(const ReferenceRule& rule, int multiple, int width, int height,
                          bool auto_resize) {
  ReferenceFit f;
  const std::string size = sizeText(width, height);
  if (width <= 0 || height <= 0) {
    f.problem = "has no pixels (" + size + ")";
    return f;
  }
  if (rule.min_side > 0 && (width < rule.min_side || height < rule.min_side)) {
    f.problem =
        "is " + size + " pixels; both sides must be at least " + std::to_string(rule.min_side);
    return f;
  }
  const double aspect = static_cast<double>(std::max(width, height)) / std::min(width, height);
  if (rule.max_aspect > 0 && aspect > rule.max_aspect) {
    f.problem = "is " + size + " pixels, aspect ratio " + num(std::round(aspect * 100) / 100) +
                "; it must be at most " + num(rule.max_aspect);
    return f;
  }
  int w = width, h = height;
  if (rule.max_area > 0 && static_cast<int64_t>(w) * h > rule.max_area) {
    // _resize_to_target_area: scale = sqrt(area / (w * h)), int(w * scale) x int(h * scale).
    const double scale =
        std::sqrt(static_cast<double>(rule.max_area) / (static_cast<double>(w) * h));
    w = static_cast<int>(w * scale);
    h = static_cast<int>(h * scale);
  }
  f.scaled_width = w;
  f.scaled_height = h;
  int W = w / multiple * multiple, H = h / multiple * multiple;
  if (rule.fit == ReferenceRule::Fit::Resize && auto_resize && W > 0 && H > 0 &&
      !rule.preferred_sizes.empty()) {
    // min((abs(aspect - pw / ph), pw, ph)): the nearest aspect, ties to the smaller width.
    const double a = static_cast<double>(W) / H;
    std::tuple<double, int, int> best{1e300, 0, 0};
    for (const auto& [pw, ph] : rule.preferred_sizes)
      best = std::min(best, std::make_tuple(std::fabs(a - static_cast<double>(pw) / ph), pw, ph));
    W = std::get<1>(best) / multiple * multiple;
    H = std::get<2>(best) / multiple * multiple;
  }
  if (W <= 0 || H <= 0) {
    f.problem = "is " + size + " pixels; both sides must be at least " + std::to_string(multiple);
    return f;
  }
  f.width = W;
  f.height = H;
  if (rule.fit == ReferenceRule::Fit::CenterCrop) {
    f.crop_left = (w - W) / 2;
    f.crop_top = (h - H) / 2;
  } else {
    f.resample = W != width || H != height;
  }
  return f;
}

ResolvedRequest resolveRequest(const RequestSpec& spec, const RequestValues& request,
                               const ImageSizeFn& imageSizeFn) {
  ResolvedRequest r;
  r.values = request;
  RequestValues& v = r.values;
  auto problem = [&](const std::string& field, const std::string& rule, const std::string& msg) {
    for (const RequestProblem& p : r.problems)
      if (p.field == field && p.rule == rule) return;
    r.problems.push_back({field, rule, msg});
  };
  const SizeRule& size = spec.size;
  const int vsf = size.vae_scale_factor, mult = size.multiple();

  // The model's CFG scale by its generic name: onto the field the guider reads.
  if (auto it = v.options.find(kCfgScaleOption);
      it != v.options.end() && !spec.field(kCfgScaleOption)) {
    const double scale = it->second;
    v.options.erase(it);
    const std::string& target = spec.guider.scale_field;
    if (target.empty() || target == "guidance")
      v.guidance = scale;
    else
      v.options[target] = scale;
    v.given.erase(kCfgScaleOption);
    v.given.insert(target.empty() ? std::string("guidance") : target);
  }
  // Knobs: unknown names are refused, absent ones take their default.
  for (const auto& [name, value] : v.options) {
    const FieldSpec* f = spec.field(name);
    if (!f || !f->knob) {
      std::string known;
      for (const FieldSpec* k : spec.knobs())
        if (k->read) known += (known.empty() ? "" : ", ") + k->name;
      problem(name, "unknown",
              "'" + name + "' is not an option of " + spec.family + " (" + spec.pipeline +
                  "); it takes " + (known.empty() ? std::string("no options") : known));
    }
  }
  for (const FieldSpec* k : spec.knobs())  // a knob declared as not read stays absent
    if (k->read && !v.options.count(k->name)) v.options[k->name] = k->default_value;

  // Negative sizes, steps and text lengths (0 = the model's default).
  if (v.width < 0 || v.height < 0 || v.steps < 0 || v.max_sequence_length < 0)
    problem(v.width < 0    ? "width"
            : v.height < 0 ? "height"
            : v.steps < 0  ? "steps"
                           : "max_sequence_length",
            "range",
            "width, height, steps and max_sequence_length cannot be negative (0 = the model's "
            "default)");

  // Numeric fields in their declared ranges; fields given that this model does not read.
  for (const FieldSpec& f : spec.fields) {
    if (f.type == FieldType::Image || f.type == FieldType::Images || f.type == FieldType::Text) {
      const bool given = f.name == "negative_prompt" ? v.hasNegativePrompt() : false;
      if (!f.read && given && v.given.count(f.name))
        r.notes.push_back(f.name + " is ignored: " + f.not_read);
      continue;
    }
    if (f.name == "steps" || f.name == "max_sequence_length") continue;  // defaults below
    const double value = v.number(f.name, f.default_value);
    if (!f.accepts(value))
      problem(f.name, "range",
              f.name + " must be " + (f.type == FieldType::Int ? "an integer in " : "") +
                  (f.type == FieldType::Float ? "a finite number in " : "") + f.rangeText() +
                  " for " + spec.family + ", got " + num(value));
    if (!f.read && v.given.count(f.name)) r.notes.push_back(f.name + " is ignored: " + f.not_read);
  }

  // Inputs: what the family takes, a mask only with an init image.
  if (!v.mask_image.empty() && v.init_image.empty())
    problem("mask_image", "requires",
            "a mask needs an init image (inpainting repaints the init image)");
  if (!v.mask_image.empty() && !spec.inputs.mask)
    problem("mask_image", "capability",
            "inpainting is not supported for " + spec.family + "; remove mask_image");
  if (!v.init_image.empty() && !spec.inputs.init_image)
    problem("init_image", "capability",
            "image-to-image is not supported for " + spec.family + "; remove init_image");
  if (v.cache && !spec.inputs.step_cache)
    problem("cache", "capability",
            "step caching (First Block Cache, TaylorSeer) is not supported for " + spec.family +
                "; remove cache");

  // Reference images: how many, each readable and fitted; their tokens join every call.
  const ReferenceRule& refs = spec.references;
  if (!v.reference_images.empty()) {
    const int n = static_cast<int>(v.reference_images.size());
    if (refs.max_count == 0)
      problem("reference_images", "capability",
              "reference images are not supported for " + spec.family + " (" + spec.pipeline +
                  "), whose request declares no reference_images; remove them (an editing "
                  "model's --print-request-spec lists reference_images)");
    else if (n > refs.max_count)
      problem("reference_images", "reference_count",
              std::to_string(n) + " reference images given; " + spec.pipeline + " takes at most " +
                  std::to_string(refs.max_count));
    if (!v.init_image.empty())
      problem("reference_images", "conflict",
              "reference images and an init image cannot be combined: editing starts from "
              "noise with the references as conditioning; remove init_image (or the references)");
    if (refs.max_count > 0 && n <= refs.max_count) {
      const bool autoResize =
          !refs.auto_resize_field.empty() && v.number(refs.auto_resize_field, 1) != 0;
      for (int i = 0; i < n; ++i) {
        const std::string& path = v.reference_images[static_cast<size_t>(i)];
        try {
          const auto [iw, ih] = imageSizeFn ? imageSizeFn(path) : imageSize(path);
          const ReferenceFit fit = fitReference(refs, mult, iw, ih, autoResize);
          if (!fit.problem.empty()) {
            problem("reference_images", "reference_size",
                    "reference image " + std::to_string(i + 1) + " (" + path + ") " + fit.problem +
                        " (" + refs.source + ")");
            continue;
          }
          r.reference_sizes.emplace_back(fit.width, fit.height);
          r.reference_tokens += fit.tokens(mult);
        } catch (const std::exception& e) {
          problem("reference_images", "image",
                  "reference image " + std::to_string(i + 1) + ": " + e.what());
        }
      }
      if (refs.output_size_from_first && !r.reference_sizes.empty()) {
        // height = height or image_height (the first reference's fitted size).
        if (v.width <= 0) v.width = r.reference_sizes.front().first;
        if (v.height <= 0) v.height = r.reference_sizes.front().second;
      }
    }
  }

  // The size: from the init image where the family says so, the defaults, the multiple.
  bool sized = true;
  if (!v.init_image.empty() && spec.inputs.init_image) {
    try {
      auto [iw, ih] = imageSizeFn ? imageSizeFn(v.init_image) : imageSize(v.init_image);
      const bool always = size.init_image == SizeRule::FromInitImage::Always;
      if (always && size.init_image_max_area > 0 &&
          static_cast<int64_t>(iw) * ih > size.init_image_max_area) {
        // Flux2KleinInpaintPipeline: scale = sqrt(max_area / (h * w)), int(h * scale) x
        // int(w * scale).
        const double scale = std::sqrt(static_cast<double>(size.init_image_max_area) /
                                       (static_cast<double>(ih) * iw));
        ih = static_cast<int>(ih * scale);
        iw = static_cast<int>(iw * scale);
      }
      if (iw < mult || ih < mult) {
        problem("init_image", "min_side",
                "init image " + v.init_image + " is " + sizeText(iw, ih) +
                    " pixels; it must be at least " + sizeText(mult, mult));
        sized = false;
      } else {
        if (always || v.width <= 0) v.width = iw / mult * mult;
        if (always || v.height <= 0) v.height = ih / mult * mult;
      }
    } catch (const std::exception& e) {
      problem("init_image", "image", e.what());
      sized = false;
    }
  }
  if (v.width <= 0) v.width = size.default_width;
  if (v.height <= 0) v.height = size.default_height;
  if (!size.max_area_field.empty() && sized && v.width > 0 && v.height > 0) {
    // FluxKontextPipeline: the output is rescaled to max_area at the requested aspect, then
    // floored to the multiple below (round() is Python's: half to even).
    const double area = v.number(size.max_area_field, 1024.0 * 1024.0);
    const double aspect = static_cast<double>(v.width) / v.height;
    const int w = static_cast<int>(std::nearbyint(std::sqrt(area * aspect)));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(area / aspect)));
    if (w / mult * mult != v.width || h / mult * mult != v.height)
      r.notes.push_back(spec.pipeline + " rescales the output to " + size.max_area_field + " " +
                        num(area) +
                        " pixels at the requested aspect: " + sizeText(v.width, v.height) +
                        " makes " + sizeText(w / mult * mult, h / mult * mult));
    // Floored here (one note); a side under the multiple stays as it is and is refused below.
    v.width = w >= mult ? w / mult * mult : w;
    v.height = h >= mult ? h / mult * mult : h;
  }
  if (v.steps <= 0) v.steps = spec.default_steps;
  if (v.max_sequence_length <= 0) v.max_sequence_length = spec.default_max_sequence_length;
  if (sized && v.width > 0 && v.height > 0) {
    if (size.rounding == SizeRule::Rounding::Floor) {
      if (v.width < mult || v.height < mult) {
        problem(v.width < mult ? "width" : "height", "min_side",
                "width and height must be at least " + std::to_string(mult) +
                    " (2 x vae_scale_factor " + std::to_string(vsf) + "); got " +
                    sizeText(v.width, v.height));
      } else if (v.width % mult != 0 || v.height % mult != 0) {
        // Flux2KleinPipeline.prepare_latents: 2 * (size // (vsf * 2)) latent pixels (diffusers
        // warns and resizes).
        const int w = v.width / mult * mult, h = v.height / mult * mult;
        r.notes.push_back("width and height are floored to multiples of " + std::to_string(mult) +
                          " by " + spec.pipeline + ": " + sizeText(v.width, v.height) + " makes " +
                          sizeText(w, h));
        v.width = w;
        v.height = h;
      }
    } else if (v.width % mult != 0 || v.height % mult != 0) {
      problem(v.width % mult != 0 ? "width" : "height", "multiple",
              "width and height must be multiples of " + std::to_string(mult) +
                  " (2 x vae_scale_factor " + std::to_string(vsf) + ") for this model; got " +
                  sizeText(v.width, v.height) + " — try " +
                  sizeText(std::max(mult, v.width / mult * mult),
                           std::max(mult, v.height / mult * mult)));
    }
    if (v.width > size.max_side || v.height > size.max_side)
      problem(v.width > size.max_side ? "width" : "height", "max_side",
              "width and height are limited to " + std::to_string(size.max_side) + " pixels; got " +
                  sizeText(v.width, v.height));
  }
  if (const FieldSpec* f = spec.field("steps"); f && !f->accepts(v.steps))
    problem("steps", "range",
            "steps are limited to " + num(f->max) + "; got " + std::to_string(v.steps));
  if (const FieldSpec* f = spec.field("max_sequence_length"); f && v.max_sequence_length > f->max)
    problem("max_sequence_length", "range",
            "max_sequence_length cannot be greater than " + num(f->max) + " for " +
                spec.max_sequence_length_rule + ", got " + std::to_string(v.max_sequence_length));
  if (!v.init_image.empty() && r.ok()) {
    // FluxImg2ImgPipeline.get_timesteps: t_start = int(N - min(N * strength, N)).
    if (img2imgStartIndex(v.steps, v.strength) >= v.steps)
      problem("strength", "strength_steps",
              "strength " + std::to_string(v.strength) + " with " + std::to_string(v.steps) +
                  " steps runs no denoising step (steps * strength < 1); raise strength or steps");
  }

  // The guider: whether a second branch runs.
  const GuiderSpec& g = spec.guider;
  r.cfg_requirement = g.requirement;
  switch (g.kind) {
    case GuiderSpec::Kind::None:
      r.cfg = false;
      break;
    case GuiderSpec::Kind::ClassicCfg:
      r.cfg = v.number(g.scale_field) > g.threshold;
      break;
    case GuiderSpec::Kind::TrueCfg:
      r.cfg = v.hasNegativePrompt() && v.number(g.scale_field) > g.threshold;
      break;
  }
  return r;
}

std::vector<RequestProblem> strategyProblems(const Strategy& s, const ModelDims& dims,
                                             const ResolvedRequest& r) {
  std::vector<RequestProblem> out;
  for (const StrategyIssue& i : validateForRequest(s, dims, r.dims()))
    out.push_back({"strategy", i.rule, i.message});
  return out;
}

void throwIfProblems(const ResolvedRequest& r) {
  if (!r.ok()) throw std::invalid_argument(r.message());
}

namespace {

const char* typeName(FieldType t) {
  switch (t) {
    case FieldType::Int:
      return "int";
    case FieldType::Float:
      return "float";
    case FieldType::Text:
      return "text";
    case FieldType::Image:
      return "image";
    case FieldType::Images:
      return "images";
  }
  return "float";
}

template <typename E>
E enumOf(const std::string& member, const std::string& name,
         std::initializer_list<std::pair<const char*, E>> values) {
  for (const auto& [n, v] : values)
    if (name == n) return v;
  throw std::invalid_argument("request spec: " + member + " '" + name + "' is not known");
}

template <typename T>
T member(const nlohmann::json& j, const char* key, T fallback) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return fallback;
  try {
    return j[key].get<T>();
  } catch (const std::exception&) {
    throw std::invalid_argument(std::string("request spec: '") + key + "' has the wrong type");
  }
}

}  // namespace

namespace {

nlohmann::json referencesJson(const ReferenceRule& r) {
  nlohmann::json preferred = nlohmann::json::array();
  for (const auto& [w, h] : r.preferred_sizes) preferred.push_back({w, h});
  return {{"max_count", r.max_count},
          {"min_side", r.min_side},
          {"max_aspect", r.max_aspect},
          {"max_area", r.max_area},
          {"fit", r.fit == ReferenceRule::Fit::Resize ? "resize" : "center_crop"},
          {"preferred_sizes", preferred},
          {"auto_resize_field", r.auto_resize_field},
          {"output_size_from_first", r.output_size_from_first},
          {"ids", r.ids},
          {"source", r.source}};
}

ReferenceRule referencesFromJson(const nlohmann::json& j) {
  ReferenceRule r;
  r.max_count = member<int>(j, "max_count", 0);
  r.min_side = member<int>(j, "min_side", 0);
  r.max_aspect = member<double>(j, "max_aspect", 0);
  r.max_area = member<int64_t>(j, "max_area", 0);
  r.fit = enumOf<ReferenceRule::Fit>(
      "references fit", member<std::string>(j, "fit", "center_crop"),
      {{"center_crop", ReferenceRule::Fit::CenterCrop}, {"resize", ReferenceRule::Fit::Resize}});
  r.preferred_sizes =
      member<std::vector<std::pair<int, int>>>(j, "preferred_sizes", r.preferred_sizes);
  r.auto_resize_field = member<std::string>(j, "auto_resize_field", "");
  r.output_size_from_first = member<bool>(j, "output_size_from_first", false);
  r.ids = member<std::string>(j, "ids", "");
  r.source = member<std::string>(j, "source", "");
  return r;
}

}  // namespace

nlohmann::json requestSpecToJson(const RequestSpec& s) {
  using nlohmann::json;
  json fields = json::array();
  for (const FieldSpec& f : s.fields)
    fields.push_back({{"name", f.name},
                      {"type", typeName(f.type)},
                      {"default", f.default_value},
                      {"min", f.min},
                      {"max", f.max},
                      {"min_exclusive", f.min_exclusive},
                      {"unit", f.unit},
                      {"help", f.help},
                      {"diffusers_arg", f.diffusers_arg},
                      {"read", f.read},
                      {"not_read", f.not_read},
                      {"knob", f.knob}});
  const SizeRule& z = s.size;
  const GuiderSpec& g = s.guider;
  return {
      {"family", s.family},
      {"pipeline", s.pipeline},
      {"fields", fields},
      {"size",
       {{"vae_scale_factor", z.vae_scale_factor},
        {"default_width", z.default_width},
        {"default_height", z.default_height},
        {"max_side", z.max_side},
        {"rounding", z.rounding == SizeRule::Rounding::Floor ? "floor" : "refuse"},
        {"init_image",
         z.init_image == SizeRule::FromInitImage::Always ? "always" : "defaults_to_image"},
        {"init_image_max_area", z.init_image_max_area},
        {"max_area_field", z.max_area_field},
        {"source", z.source}}},
      {"guider",
       {{"kind", g.kind == GuiderSpec::Kind::None         ? "none"
                 : g.kind == GuiderSpec::Kind::ClassicCfg ? "classic_cfg"
                                                          : "true_cfg"},
        {"scale_field", g.scale_field},
        {"threshold", g.threshold},
        {"formula", g.formula == GuiderSpec::Formula::CondPlus ? "cond_plus" : "uncond_plus"},
        {"rescale", g.rescale == GuiderSpec::Rescale::PerTokenNorm     ? "per_token_norm"
                    : g.rescale == GuiderSpec::Rescale::GlobalNormClip ? "global_norm_clip"
                                                                       : "none"},
        {"truncation_field", g.truncation_field},
        {"normalization_field", g.normalization_field},
        {"requirement", g.requirement}}},
      {"inputs",
       {{"init_image", s.inputs.init_image},
        {"mask", s.inputs.mask},
        {"step_cache", s.inputs.step_cache}}},
      {"references", referencesJson(s.references)},
      {"default_steps", s.default_steps},
      {"default_max_sequence_length", s.default_max_sequence_length},
      {"max_sequence_length_rule", s.max_sequence_length_rule},
  };
}

RequestSpec requestSpecFromJson(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("request spec: not a JSON object");
  RequestSpec s;
  s.family = member<std::string>(j, "family", "");
  s.pipeline = member<std::string>(j, "pipeline", "");
  if (j.contains("fields")) {
    if (!j["fields"].is_array())
      throw std::invalid_argument("request spec: 'fields' is not a list");
    for (const nlohmann::json& f : j["fields"]) {
      FieldSpec x;
      x.name = member<std::string>(f, "name", "");
      x.type = enumOf<FieldType>("field type", member<std::string>(f, "type", "float"),
                                 {{"int", FieldType::Int},
                                  {"float", FieldType::Float},
                                  {"text", FieldType::Text},
                                  {"image", FieldType::Image},
                                  {"images", FieldType::Images}});
      x.default_value = member<double>(f, "default", 0);
      x.min = member<double>(f, "min", 0);
      x.max = member<double>(f, "max", 0);
      x.min_exclusive = member<bool>(f, "min_exclusive", false);
      x.unit = member<std::string>(f, "unit", "");
      x.help = member<std::string>(f, "help", "");
      x.diffusers_arg = member<std::string>(f, "diffusers_arg", "");
      x.read = member<bool>(f, "read", true);
      x.not_read = member<std::string>(f, "not_read", "");
      x.knob = member<bool>(f, "knob", false);
      s.fields.push_back(x);
    }
  }
  const nlohmann::json z = j.value("size", nlohmann::json::object());
  s.size.vae_scale_factor = member<int>(z, "vae_scale_factor", 8);
  s.size.default_width = member<int>(z, "default_width", 1024);
  s.size.default_height = member<int>(z, "default_height", 1024);
  s.size.max_side = member<int>(z, "max_side", 16384);
  s.size.rounding = enumOf<SizeRule::Rounding>(
      "size rounding", member<std::string>(z, "rounding", "refuse"),
      {{"refuse", SizeRule::Rounding::Refuse}, {"floor", SizeRule::Rounding::Floor}});
  s.size.init_image = enumOf<SizeRule::FromInitImage>(
      "size init_image", member<std::string>(z, "init_image", "defaults_to_image"),
      {{"defaults_to_image", SizeRule::FromInitImage::DefaultsToImage},
       {"always", SizeRule::FromInitImage::Always}});
  s.size.init_image_max_area = member<int64_t>(z, "init_image_max_area", 0);
  s.size.max_area_field = member<std::string>(z, "max_area_field", "");
  s.size.source = member<std::string>(z, "source", "");
  s.references = referencesFromJson(j.value("references", nlohmann::json::object()));
  const nlohmann::json g = j.value("guider", nlohmann::json::object());
  s.guider.kind = enumOf<GuiderSpec::Kind>("guider kind", member<std::string>(g, "kind", "none"),
                                           {{"none", GuiderSpec::Kind::None},
                                            {"classic_cfg", GuiderSpec::Kind::ClassicCfg},
                                            {"true_cfg", GuiderSpec::Kind::TrueCfg}});
  s.guider.scale_field = member<std::string>(g, "scale_field", "");
  s.guider.threshold = member<double>(g, "threshold", 1.0);
  s.guider.formula = enumOf<GuiderSpec::Formula>("guider formula",
                                                 member<std::string>(g, "formula", "uncond_plus"),
                                                 {{"uncond_plus", GuiderSpec::Formula::UncondPlus},
                                                  {"cond_plus", GuiderSpec::Formula::CondPlus}});
  s.guider.rescale =
      enumOf<GuiderSpec::Rescale>("guider rescale", member<std::string>(g, "rescale", "none"),
                                  {{"none", GuiderSpec::Rescale::None},
                                   {"per_token_norm", GuiderSpec::Rescale::PerTokenNorm},
                                   {"global_norm_clip", GuiderSpec::Rescale::GlobalNormClip}});
  s.guider.truncation_field = member<std::string>(g, "truncation_field", "");
  s.guider.normalization_field = member<std::string>(g, "normalization_field", "");
  s.guider.requirement = member<std::string>(g, "requirement", "");
  const nlohmann::json in = j.value("inputs", nlohmann::json::object());
  s.inputs.init_image = member<bool>(in, "init_image", false);
  s.inputs.mask = member<bool>(in, "mask", false);
  s.inputs.step_cache = member<bool>(in, "step_cache", false);
  s.default_steps = member<int>(j, "default_steps", 28);
  s.default_max_sequence_length = member<int>(j, "default_max_sequence_length", 512);
  s.max_sequence_length_rule = member<std::string>(j, "max_sequence_length_rule", "");
  return s;
}

std::string requestSpecMarkdown(const RequestSpec& s) {
  auto type = [](const FieldSpec& f) {
    switch (f.type) {
      case FieldType::Int:
        return "integer";
      case FieldType::Float:
        return "number";
      case FieldType::Text:
        return "text";
      case FieldType::Image:
        return "image";
      case FieldType::Images:
        return "images";
    }
    return "";
  };
  std::string md = "### " + s.family + " (`" + s.pipeline + "`)\n\n";
  md += "| field | diffusers argument | type | default | range | for this family |\n";
  md += "|---|---|---|---|---|---|\n";
  for (const FieldSpec& f : s.fields) {
    std::string def = "", range = "";
    if (f.type == FieldType::Int || f.type == FieldType::Float) {
      if (f.name == "steps")
        def = std::to_string(s.default_steps);
      else if (f.name == "max_sequence_length")
        def = std::to_string(s.default_max_sequence_length);
      else
        def = num(f.default_value);
      range = f.name == "max_sequence_length"
                  ? "1 .. " + num(f.max) + " tokens (" + s.max_sequence_length_rule + ")"
                  : f.rangeText();
    }
    std::string meaning = f.read ? f.help : "not read: " + f.not_read;
    if (f.knob)
      meaning += " (a family option: CLI `" + f.cliFlag() + "` or `--set " + f.name +
                 "=V`, JSON `options." + f.name + "`)";
    md += "| `" + f.name + "` | `" + f.diffusers_arg + "` | " + type(f) + " | " + def + " | " +
          range + " | " + meaning + " |\n";
  }
  const SizeRule& z = s.size;
  md += "\nSize: width and height are multiples of 2 x vae_scale_factor, ";
  md += z.rounding == SizeRule::Rounding::Refuse ? "other sizes refused naming the nearest one"
                                                 : "other sizes floored to the multiple";
  md += " (" + z.source + "); at most " + std::to_string(z.max_side) + " pixels a side. ";
  if (!s.inputs.init_image)
    md += "No init image.";
  else if (z.init_image == SizeRule::FromInitImage::Always)
    md += "With an init image the output is always the image's size" +
          (z.init_image_max_area > 0
               ? ", first scaled down to " + std::to_string(z.init_image_max_area) +
                     " pixels of area when larger"
               : std::string()) +
          ", floored to the multiple.";
  else
    md +=
        "With an init image a width or height of 0 takes the image's size, floored to the "
        "multiple.";
  if (!z.max_area_field.empty())
    md += " The output is always rescaled to `" + z.max_area_field +
          "` pixels of area at the requested aspect, then floored.";
  const ReferenceRule& rf = s.references;
  if (rf.max_count == 0) {
    md += " No reference images.";
  } else {
    md += " Reference images: up to " + std::to_string(rf.max_count) + " (" + rf.source + ")";
    if (rf.min_side > 0) md += ", both sides at least " + std::to_string(rf.min_side) + " pixels";
    if (rf.max_aspect > 0) md += ", aspect at most " + num(rf.max_aspect);
    if (rf.max_area > 0)
      md += ", larger than " + std::to_string(rf.max_area) + " pixels scaled down (LANCZOS)";
    md +=
        rf.fit == ReferenceRule::Fit::CenterCrop
            ? "; each centre-cropped to the multiple (no resampling)"
            : "; each resized (LANCZOS) to the floored size" +
                  (rf.auto_resize_field.empty()
                       ? std::string()
                       : ", or with `" + rf.auto_resize_field + "` to the nearest of " +
                             std::to_string(rf.preferred_sizes.size()) + " preferred resolutions");
    md += "; position ids " + rf.ids;
    if (rf.output_size_from_first) md += "; width and height of 0 take the first reference's size";
    md += ".";
  }
  md += "\n\nCFG: ";
  switch (s.guider.kind) {
    case GuiderSpec::Kind::None:
      md += "none; cfg_degree 2 needs " + s.guider.requirement + ".";
      break;
    case GuiderSpec::Kind::ClassicCfg:
      md += "classic CFG (the negative prompt, \"\" when none) when " + s.guider.requirement;
      break;
    case GuiderSpec::Kind::TrueCfg:
      md += "true CFG when " + s.guider.requirement;
      break;
  }
  if (s.guider.kind != GuiderSpec::Kind::None) {
    md += s.guider.formula == GuiderSpec::Formula::CondPlus
              ? "; cond + s (cond - uncond) in float32"
              : "; uncond + s (cond - uncond)";
    if (s.guider.rescale == GuiderSpec::Rescale::PerTokenNorm)
      md += ", each token rescaled to the conditional prediction's norm";
    if (s.guider.rescale == GuiderSpec::Rescale::GlobalNormClip)
      md += ", the norm clipped by `" + s.guider.normalization_field + "`";
    if (!s.guider.truncation_field.empty())
      md += "; steps past `" + s.guider.truncation_field + "` run the conditional branch only";
    md += ".";
  }
  md += "\n";
  return md;
}

}  // namespace dit
