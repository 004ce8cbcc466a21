// A diffusers model folder (model_index.json + one sub-folder per component), read without Torch:
// the GUI, the strategy validation and the benchmark read model sizes through this too.
//
// The generic part knows only what every diffusers pipeline folder has: model_index.json's
// `_class_name` (the pipeline class, e.g. "FluxPipeline") and transformer/config.json's
// `_class_name` (the denoiser class, e.g. "FluxTransformer2DModel"). Everything else is parsed by
// the family registered under that class (backend/models/family_registry.h) into its own
// PipelineConfig subclass (e.g. FluxPipelineConfig), reached through configAs<T>().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/io/key_layout.h"
#include "backend/io/safetensors.h"  // ModelFileError
#include "parallel/strategy.h"       // ModelDims

namespace dit {

/// What a pipeline family parses from a folder (component configs, tokenizer limits). Each family
/// derives its own; ModelFolder holds it type-erased.
struct PipelineConfig {
  virtual ~PipelineConfig() = default;
  /// Sizes the parallel-strategy rules need: the transformer family's dims (FamilySpec::dims)
  /// with the pipeline's vae_scale_factor.
  ModelDims dims;
  /// The pipeline's default number of text tokens (FLUX: min(512, tokenizer_2 model_max_length)),
  /// what a request with max_sequence_length 0 gets.
  int max_sequence_length = 512;
  /// The largest max_sequence_length the pipeline takes and where that rule comes from:
  /// FluxPipeline.check_inputs refuses more than 512 (T5); Flux2KleinPipeline has no check (its
  /// text encoder's max_position_embeddings bounds it); QwenImagePipeline its
  /// tokenizer_max_length (1024). The family's RequestSpec takes its max_sequence_length range
  /// from these.
  int max_sequence_length_limit = 512;
  std::string max_sequence_length_rule = "FluxPipeline (T5)";
  // What a request means for the family (its fields, defaults, guidance and CFG rules) is not
  // here: the family declares it once as a RequestSpec (FamilySpec::request,
  // backend/models/request_spec.h) built from this config.
};

/// Where each component comes from: ditstudio-cli / ditstudio-worker --model, --config, --vae,
/// --text-encoder, --text-encoder-2, --tokenizer, --tokenizer-2. Empty = not given.
struct ModelSources {
  std::string model;  ///< diffusers folder, single transformer file, or all-in-one checkpoint
  /// diffusers folder whose configs complete single files (what the tensors cannot say: RoPE
  /// axes, VAE scaling, scheduler), as diffusers' from_single_file(config=...).
  std::string config;
  std::string vae, text_encoder, text_encoder_2;  ///< component folder or single file each
  std::string tokenizer, tokenizer_2;             ///< tokenizer folders
  /// True when only `model` (or nothing) is set: a plain diffusers folder run.
  bool onlyModel() const {
    return config.empty() && vae.empty() && text_encoder.empty() && text_encoder_2.empty() &&
           tokenizer.empty() && tokenizer_2.empty();
  }
};

/// Where one component's files are.
struct ComponentSource {
  std::string path;          ///< folder, or single file
  bool single_file = false;  ///< read through a KeyLayout (ModelFolder::singleFileLayout)
  std::string prefix;        ///< single files: key prefix of the component
  std::string layout;        ///< single files: "bfl", "ldm", "diffusers", "transformers"
  std::string flag;          ///< option that supplied it ("--model", "--vae", ...; "embedded")
};

struct ModelFolder {
  std::string path;
  std::string pipeline_class;  ///< model_index.json "_class_name", e.g. "FluxPipeline"
  std::string
      transformer_class;  ///< transformer/config.json "_class_name", e.g. "FluxTransformer2DModel"
  std::shared_ptr<const PipelineConfig> config;  ///< parsed by the pipeline family

  /// Reads model_index.json, dispatches on its `_class_name` to the registered pipeline family,
  /// which checks its component folders and parses their configs; then checks that the
  /// transformer's `_class_name` is a registered transformer family.
  /// Throws ModelFileError naming the file: folder missing, model_index.json missing or not
  /// JSON, no `_class_name`, a component folder or its config missing or null, a config value of
  /// the wrong type. Throws UnsupportedModelError for a pipeline or transformer class that is not
  /// registered (the message names it and lists the supported ones).
  static ModelFolder open(const std::string& path);
  /// Opens a model from its sources: `s.model` a diffusers folder (then each other source
  /// overrides the folder's component), a single FLUX.1 transformer file or a ComfyUI
  /// all-in-one checkpoint (family and variant detected from its keys, inspectCheckpoint). A
  /// component neither the model nor a flag supplies is refused naming the flag that supplies
  /// it; missing tokenizers fall back to the --config folder's, else the embedded model's
  /// (noted in `notes`). Configs: folders' config.json; single files' hyper-parameters from
  /// their tensor shapes, the rest from --config, else FLUX.1's published configs. Throws
  /// ModelFileError / UnsupportedModelError naming the file and the cause.
  static ModelFolder open(const ModelSources& s);
  /// The component's folder (or single file when components[name].single_file).
  std::string component(const std::string& name) const {
    auto it = components.find(name);
    return it != components.end() ? it->second.path : path + "/" + name;
  }
  /// Filled by open(ModelSources): every component's source; empty for open(path).
  std::map<std::string, ComponentSource> components;
  ModelSources sources;            ///< what open(ModelSources) was given
  std::string variant;             ///< "flux-dev" / "flux-schnell" when detected from keys
  std::vector<std::string> notes;  ///< what was inferred (embedded tokenizers, default configs)
  /// The generation settings the model's maker recommends (as InvokeAI's per-model default
  /// settings), from model_index.json's "_dit_studio_default_settings" (diffusers ignores keys
  /// that start with "_"): a JSON object text with any of steps, width, height (integers),
  /// guidance and the family's knobs (numbers, e.g. FluxPipeline's true CFG scale) and
  /// negative_prompt (a string; "" with true CFG is CFG against the empty prompt). The GUI applies
  /// them when the model is chosen; the CLI does not (its flags are explicit). When the folder
  /// declares none, the family's recommendation (FamilySpec::default_settings); empty when neither
  /// has any.
  std::string default_settings;
  /// The key layout of single-file component `name` (its diffusers parameter names -> stored
  /// pieces), set by open(ModelSources) from the detected layouts (models/checkpoint_layouts.h),
  /// so io/ reads single files without knowing any family. Null for a plain folder. Throws
  /// ModelFileError naming the file.
  std::function<std::shared_ptr<const KeyLayout>(const std::string& name)> singleFileLayout;
  /// One line per component: "vae: <path> (single file, ldm layout, from --model)".
  std::string describeSources() const;
  /// The strategy rules' view of this model (config->dims). Throws std::logic_error when the
  /// folder was not opened.
  const ModelDims& dims() const {
    if (!config) throw std::logic_error("ModelFolder::dims() on a folder that was not opened");
    return config->dims;
  }
  /// Total number of transformer parameters on disk (sum of numel over the safetensors shards).
  uint64_t transformerParameterCount() const;
  /// Parameters (elements) of component `name`: its folder's `stem` safetensors, or its
  /// tensors inside a single file (scales and markers excluded).
  uint64_t componentParameterCount(const std::string& name, const std::string& stem) const;

  /// The family's config, e.g. configAs<FluxPipelineConfig>(). Throws std::invalid_argument when
  /// the folder holds another family (naming the pipeline class).
  template <typename T>
  const T& configAs() const {
    if (auto* c = dynamic_cast<const T*>(config.get())) return *c;
    throw std::invalid_argument(
        "model folder " + path + " holds a " +
        (pipeline_class.empty() ? std::string("<no pipeline>") : pipeline_class) +
        ", which this code path does not support");
  }
};

/// A model folder of a class that no registered family handles. what() names the class, the file
/// it came from, and lists the supported classes.
class UnsupportedModelError : public ModelFileError {
 public:
  UnsupportedModelError(const std::string& file, const std::string& cause)
      : ModelFileError(file, cause) {}
};

/// The embedded default model shipped with DiT Studio: $DITSTUDIO_MODEL_DIR, else
/// <dir of the running executable>/../share/ditstudio/models/tiny-flux. Returns the path (may not
/// exist; ModelFolder::open reports that).
std::string defaultModelDir();

}  // namespace dit
