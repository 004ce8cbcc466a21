// ModelFolder::open: the dispatch from a folder's (or a single file's) class to its family record.
// It lives here, beside the one table, so that backend/io/ knows no family.
#include "backend/models/family_registry.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/io/config_json.h"
#include "backend/io/model_folder.h"
#include "backend/models/checkpoint_layouts.h"
#include "backend/models/flux/flux_family.h"
#include "backend/models/flux2/flux2_family.h"
#include "backend/models/qwenimage/qwenimage_family.h"
#include "backend/models/zimage/zimage_family.h"

namespace dit {
namespace fs = std::filesystem;
using nlohmann::json;

// One line per family.
const std::vector<FamilySpec>& modelFamilies() {
  static const std::vector<FamilySpec> f{
      fluxFamily(),
      flux2KleinFamily(),
      qwenImageFamily(),
      zimageFamily(),
  };
  return f;
}

namespace {

constexpr const char* kDefaultSettingsKey = "_dit_studio_default_settings";

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

RequestSpec requestSpecOf(const ModelFolder& folder) {
  return familyOf(folder).requestSpec(folder);
}

const std::vector<FieldSpec>& allFamilyKnobs() {
  static const std::vector<FieldSpec> knobs = [] {
    std::vector<FieldSpec> out;
    for (const FamilySpec& f : modelFamilies())
      for (const FieldSpec& k : f.knobs) {
        bool seen = false;
        for (const FieldSpec& o : out) seen = seen || o.name == k.name;
        if (!seen) {
          out.push_back(k);
          out.back().knob = true;
        }
      }
    return out;
  }();
  return knobs;
}

const FamilySpec& pipelineFamily(const std::string& pipeline_class, const std::string& file) {
  for (const auto& f : modelFamilies()) {
    if (f.pipeline_class == pipeline_class) return f;
    for (const std::string& v : f.pipeline_variants)
      if (v == pipeline_class) return f;
  }
  throw UnsupportedModelError(file, "pipeline class \"" + pipeline_class +
                                        "\" is not supported; supported pipeline classes: " +
                                        joined(supportedPipelineClasses()));
}

const FamilySpec& transformerFamily(const std::string& transformer_class, const std::string& file) {
  for (const auto& f : modelFamilies())
    if (f.transformer_class == transformer_class) return f;
  throw UnsupportedModelError(file, "transformer class \"" + transformer_class +
                                        "\" is not supported; supported transformer classes: " +
                                        joined(supportedTransformerClasses()));
}

const FamilySpec& checkpointFamily(const std::string& checkpoint_family, const std::string& file) {
  std::vector<std::string> known;
  for (const auto& f : modelFamilies()) {
    if (f.checkpoint_family.empty()) continue;
    if (f.checkpoint_family == checkpoint_family) return f;
    known.push_back(f.display_name);
  }
  throw UnsupportedModelError(
      file, "single-file checkpoints of the \"" + checkpoint_family +
                "\" family are not supported; single files are read for: " + joined(known));
}

const FamilySpec& familyOf(const ModelFolder& folder) {
  return pipelineFamily(folder.pipeline_class, folder.path + "/model_index.json");
}

std::vector<std::string> supportedPipelineClasses() {
  std::vector<std::string> v;
  for (const auto& f : modelFamilies()) {
    v.push_back(f.pipeline_class);
    v.insert(v.end(), f.pipeline_variants.begin(), f.pipeline_variants.end());
  }
  return v;
}

std::vector<std::string> supportedTransformerClasses() {
  std::vector<std::string> v;
  for (const auto& f : modelFamilies()) v.push_back(f.transformer_class);
  return v;
}

ModelFolder ModelFolder::open(const std::string& path) {
  ModelFolder m;
  m.path = path;
  if (!fs::is_directory(path)) throw ModelFileError(path, "model folder does not exist");
  const std::string idx = path + "/model_index.json";
  const json mi = readConfigJson(idx);
  getConfigValue(mi, "_class_name", m.pipeline_class, idx);
  if (m.pipeline_class.empty())
    throw ModelFileError(idx, "no \"_class_name\": not a diffusers pipeline folder");
  const FamilySpec& family = pipelineFamily(m.pipeline_class, idx);
  for (const std::string& comp : family.components) {
    if (mi.contains(comp) && mi[comp].is_array() && !mi[comp].empty() && mi[comp][0].is_null())
      throw ModelFileError(
          idx, "component '" + comp + "' is null; " + family.pipeline_class + " needs it");
    if (!fs::is_directory(path + "/" + comp))
      throw ModelFileError(path + "/" + comp, "component folder is missing");
  }
  // The denoiser's class: transformer/config.json "_class_name", else model_index.json's
  // ["library", "class"] entry for the component.
  {
    const std::string f = path + "/" + family.transformer_component + "/config.json";
    const json tc = readConfigJson(f);
    getConfigValue(tc, "_class_name", m.transformer_class, f);
    if (m.transformer_class.empty()) {
      auto it = mi.find(family.transformer_component);
      if (it != mi.end() && it->is_array() && it->size() == 2 && (*it)[1].is_string())
        m.transformer_class = (*it)[1].get<std::string>();
    }
    if (m.transformer_class.empty())
      throw ModelFileError(
          f, "no \"_class_name\" here nor in model_index.json: unknown transformer class");
    const FamilySpec& denoiser = transformerFamily(m.transformer_class, f);  // refuses unknown
    if (&denoiser != &family)
      throw UnsupportedModelError(f, "transformer class \"" + m.transformer_class +
                                         "\" belongs to " + denoiser.pipeline_class + ", not to " +
                                         m.pipeline_class + " (" + idx + ")");
  }
  m.config = family.parse(m);
  if (auto it = mi.find(kDefaultSettingsKey); it != mi.end() && !it->is_null()) {
    const std::string what = std::string("\"") + kDefaultSettingsKey + "\"";
    if (!it->is_object()) throw ModelFileError(idx, what + " is not a JSON object");
    // The common settings and the knobs this folder's request declares (FluxPipeline's
    // true_cfg_scale, ...), at the top level as a request's extra fields.
    std::string knobs;
    const RequestSpec spec = family.requestSpec(m);
    for (const FieldSpec* k : spec.knobs()) knobs += ", " + k->name;
    for (const auto& [k, v] : it->items()) {
      const FieldSpec* field = spec.field(k);
      const bool integer = k == "steps" || k == "width" || k == "height";
      const bool number = k == "guidance" || (field && field->knob);
      const bool text = k == "negative_prompt";
      if (!integer && !number && !text)
        throw ModelFileError(idx, what + ": unknown setting \"" + k +
                                      "\" (known: steps, width, height, guidance, "
                                      "negative_prompt" +
                                      knobs + ")");
      if ((integer && !v.is_number_integer()) || (number && !v.is_number()) ||
          (text && !v.is_string()))
        throw ModelFileError(idx, what + ": \"" + k + "\" must be " +
                                      (integer  ? "an integer"
                                       : number ? "a number"
                                                : "a string"));
    }
    m.default_settings = it->dump();
  } else if (family.default_settings) {
    m.default_settings = family.default_settings(m);  // the family's recommendation
  }
  return m;
}

namespace {
// The option that supplies each component.
std::string flagFor(const std::string& comp) {
  static const std::map<std::string, std::string> f{
      {"transformer", "--model"},         {"vae", "--vae"},
      {"text_encoder", "--text-encoder"}, {"text_encoder_2", "--text-encoder-2"},
      {"tokenizer", "--tokenizer"},       {"tokenizer_2", "--tokenizer-2"},
      {"scheduler", "--config"}};
  auto it = f.find(comp);
  return it == f.end() ? "--model" : it->second;
}
}  // namespace

ModelFolder ModelFolder::open(const ModelSources& s) {
  const std::string modelPath = s.model.empty() ? defaultModelDir() : s.model;
  ModelFolder m;
  const FamilySpec* family = nullptr;
  if (fs::is_directory(modelPath)) {
    m = open(modelPath);
    family = &pipelineFamily(m.pipeline_class, modelPath + "/model_index.json");
    for (const std::string& c : family->components)
      m.components[c] = ComponentSource{modelPath + "/" + c, false, "", "", "--model"};
  } else if (fs::is_regular_file(modelPath)) {
    const CheckpointInfo info = inspectCheckpoint(modelPath);
    info.require("transformer", "--model");
    m.path = modelPath;
    family = &checkpointFamily(info.family, modelPath);
    m.pipeline_class = family->pipeline_class;
    m.transformer_class = family->transformer_class;
    m.variant = info.variant;
    for (const auto& c : info.components)
      m.components[c.name] = ComponentSource{modelPath, true, c.prefix, c.layout, "--model"};
  } else {
    throw ModelFileError(modelPath, "model folder does not exist (nor a checkpoint file)");
  }
  if (!s.config.empty() && !fs::is_directory(s.config))
    throw ModelFileError(s.config, "--config must be a diffusers model folder");
  auto over = [&](const std::string& name, const std::string& p) {
    if (p.empty()) return;
    const std::string flag = flagFor(name);
    const bool tokenizer = name.rfind("tokenizer", 0) == 0;
    if (fs::is_directory(p)) {
      if (!tokenizer && !fs::exists(p + "/config.json"))
        throw ModelFileError(p, "no config.json: " + flag +
                                    " takes a diffusers component folder "
                                    "or a single .safetensors file");
      m.components[name] = ComponentSource{p, false, "", "", flag};
    } else if (fs::is_regular_file(p)) {
      if (tokenizer) throw ModelFileError(p, flag + " takes a tokenizer folder, not a file");
      const CheckpointComponent c = inspectCheckpoint(p).require(name, flag);  // a copy
      m.components[name] = ComponentSource{p, true, c.prefix, c.layout, flag};
    } else {
      throw ModelFileError(p, "no such file or folder (" + flag + ")");
    }
  };
  over("vae", s.vae);
  over("text_encoder", s.text_encoder);
  over("text_encoder_2", s.text_encoder_2);
  over("tokenizer", s.tokenizer);
  over("tokenizer_2", s.tokenizer_2);
  const std::string fallback = s.config.empty() ? defaultModelDir() : s.config;
  for (const char* tok : {"tokenizer", "tokenizer_2"}) {
    // Only the tokenizers this pipeline family has (FLUX.2 [klein] has no tokenizer_2).
    if (m.components.count(tok) || std::find(family->components.begin(), family->components.end(),
                                             tok) == family->components.end())
      continue;
    m.components[tok] = ComponentSource{fallback + "/" + tok, false, "", "",
                                        s.config.empty() ? "embedded" : "--config"};
    m.notes.push_back(std::string(tok) + ": the checkpoint has none; using " +
                      (s.config.empty() ? "the embedded model's " : "--config's ") + tok + " (" +
                      fallback + "/" + tok + ")");
  }
  if (!m.components.count("scheduler")) {
    if (!s.config.empty()) {
      m.components["scheduler"] =
          ComponentSource{s.config + "/scheduler", false, "", "", "--config"};
    } else {
      m.notes.push_back("scheduler: " + family->display_name + " " +
                        (m.variant.empty() ? std::string("") : m.variant + " ") +
                        "published FlowMatchEulerDiscreteScheduler config");
    }
  }
  std::string missing;
  for (const std::string& c : family->components) {
    if (c == "scheduler" || m.components.count(c)) continue;
    missing += (missing.empty() ? "has no " : ", no ") + c + " (give one with " + flagFor(c) + ")";
  }
  if (!missing.empty())
    throw ModelFileError(modelPath,
                         missing + ": each a diffusers component folder or a single file");
  if (!family->caps.single_file) {
    // A family read from its diffusers folder only: any component that is not the folder's own
    // (a single file, or --vae/--text-encoder/--tokenizer/--config elsewhere) is refused.
    for (const auto& [name, c] : m.components)
      if (c.single_file || c.path != modelPath + "/" + name)
        throw ModelFileError(
            c.path, family->refusal("single_file") + " (" + name + " from " + c.flag + ")");
  }
  m.sources = s;
  m.sources.model = modelPath;
  m.singleFileLayout = [components = m.components](const std::string& name) {
    const auto it = components.find(name);
    if (it == components.end() || !it->second.single_file)
      throw ModelFileError(name, "not a single-file component of this model");
    SafetensorsReader r(it->second.path);
    return componentLayout(r,
                           CheckpointComponent{name, it->second.prefix, it->second.layout, {}, 0});
  };
  m.config = family->parse(m);
  return m;
}

}  // namespace dit
