// The family record: everything the programs know about one model family (a diffusers pipeline
// class with its denoiser class), in one place. Torch-free and Qt-free: the GUI, the CLI, the
// worker and the benchmark all read it. The Torch half (loading the pipeline and the transformer,
// example inputs for the benchmark, random components for make-model) is FamilyRuntime
// (backend/family_runtime.h), registered under the same pipeline class.
//
// Nothing outside a family's folders (backend/models/<family>/, backend/pipelines/<family>/) tests
// a class name: code that needs a family fact asks the record (tests/layering_check.sh enforces
// it). Adding a family: its folders, one line in the table in backend/models/family_registry.cpp
// and one in backend/family_runtime.cpp (ARCHITECTURE.md, "How to add a model family").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "backend/models/request_spec.h"
#include "parallel/strategy.h"  // ModelDims

namespace dit {

struct ModelFolder;
struct PipelineConfig;
struct AutoencoderKLConfig;

/// What a family's pipeline can do beyond text-to-image. The generic refusal
/// (FamilySpec::refusal) and the GUI (which greys out what the loaded family cannot do) read it.
struct FamilyCapabilities {
  bool img2img = false;     ///< --init-image / --strength (diffusers' *Img2ImgPipeline)
  bool inpaint = false;     ///< --mask (diffusers' *InpaintPipeline)
  bool step_cache = false;  ///< First Block Cache / TaylorSeer (--cache)
  /// Single-file checkpoints (BFL / ComfyUI layouts) and --config / --vae / --text-encoder
  /// overrides; a family without it is read from a diffusers folder only.
  bool single_file = false;
  /// LoRA key layouts the family reads ("diffusers", "kohya", "bfl"); empty = no LoRA.
  std::vector<std::string> lora_formats;
};

/// One fact about a loaded model for people (the GUI's model summary, the `ready` event, the
/// HTTP model list): "blocks" -> "19 double + 38 single".
struct ModelFact {
  std::string key;    ///< stable machine name, e.g. "blocks", "text_encoder"
  std::string label;  ///< what the GUI shows, e.g. "blocks"
  std::string value;  ///< e.g. "19 double + 38 single"
};

/// The VAE decoder's up path, for the memory model's decode stage (memory_estimate.h follows
/// the decoder op by op and counts the feature maps alive at each point).
struct VaeDecoderShape {
  /// diffusers AutoencoderKL / AutoencoderKLFlux2 (GroupNorm resnets, upsample convs keeping
  /// their channels); false: AutoencoderKLQwenImage (RMS-norm resnets, upsample convs halving).
  bool autoencoder_kl = true;
  int latent_channels = 4;
  /// The decoder's channels per level, latent side first: AutoencoderKL's reversed
  /// block_out_channels, AutoencoderKLQwenImage's base_dim x reversed dim_mult. Empty: unknown
  /// (the estimate then counts vae_decoder_channels maps at full resolution).
  std::vector<int> channels;
  int resnets_per_block = 2;  ///< layers_per_block + 1, or num_res_blocks + 1
  bool mid_attention = true;  ///< the mid block's single-head attention over the latent pixels
};

/// Memory facts of a parsed model folder for the one memory model (memory_estimate.h).
struct FamilyMemoryFacts {
  /// Bytes of the text encoders one rank holds at the tensor-parallel degree asked for.
  uint64_t text_encoder_bytes = 0;
  /// Bytes of the text encoder's largest layer one rank holds at that degree: what the
  /// host-streamed placement keeps on the device at a time (text_encoder_placement.h). 0: the
  /// family's encoders are not streamed (FLUX.1's CLIP and T5).
  uint64_t text_encoder_layer_bytes = 0;
  /// Channels of the VAE decoder's full-resolution stage (block_out_channels[0]).
  int vae_decoder_channels = 128;
  /// The VAE decoder's shape (its config); its channels empty when not known.
  VaeDecoderShape vae_decoder;
  /// What the estimate assumed that changes the picture (e.g. an encoder replicated on every tp
  /// rank because its plan does not divide); empty otherwise.
  std::string note;
};

/// A real-size model of the family, for the strategy advisor and the placement planner (no
/// weights needed): its declared transformer dims and the parameters of everything else the
/// pipeline holds.
struct KnownModel {
  std::string name;             ///< e.g. "FLUX.1 [dev]"
  ModelDims dims;               ///< transformer sizes, plans and parameter table
  double other_parameters = 0;  ///< text encoders + VAE parameters (elements)
  int text_len = 512;           ///< text tokens of a default request
  /// The text encoders and VAE as FamilySpec::memory gives them for a folder of this model, at
  /// tensor-parallel degree tp (>= 1) in a compute dtype of elementBytes bytes: text-encoder bytes
  /// per rank under their own sharding plan (and the note when it does not divide), the VAE
  /// decoder's full-resolution channels. Null: other_parameters is held whole on every rank.
  std::function<FamilyMemoryFacts(int tp, int64_t elementBytes)> memory = nullptr;
  /// The VAE's parameters (elements; part of other_parameters), held whole on every rank. Read
  /// with `memory` (the text encoders are then memory's, not other_parameters - vae_parameters).
  double vae_parameters = 0;
};

struct FamilySpec {
  std::string key;             ///< short stable id: "flux1", "flux2-klein"
  std::string display_name;    ///< "FLUX.1", "FLUX.2 [klein]"
  std::string pipeline_class;  ///< model_index.json "_class_name", e.g. "FluxPipeline"
  /// Further pipeline classes of the family's folders (same components and transformer, another
  /// __call__): "FluxKontextPipeline", "Flux2KleinKVPipeline". `request` and the pipeline read
  /// the folder's class.
  std::vector<std::string> pipeline_variants;
  std::string transformer_class;  ///< transformer/config.json "_class_name"
  /// inspectCheckpoint's family name for single files of this family ("flux"); empty = none.
  std::string checkpoint_family;
  std::vector<std::string> components;                ///< component folders the pipeline needs
  std::string transformer_component = "transformer";  ///< the denoiser's folder
  FamilyCapabilities caps;

  /// Parses the component configs of `folder` (path and classes already set; components filled
  /// when opened from sources). Throws ModelFileError naming the file.
  std::function<std::shared_ptr<const PipelineConfig>(const ModelFolder& folder)> parse;
  /// The transformer's declared dims (sizes, tensor- and context-parallel plans, parameter table)
  /// from its config.json object read from `file` (named in errors); vae_scale_factor at its
  /// default (the pipeline sets it). Throws ModelFileError for an invalid config.
  std::function<ModelDims(const nlohmann::json& config, const std::string& file)> dims;
  /// Memory facts of an opened folder of this family at tensor-parallel degree `tp` in a compute
  /// dtype of `elementBytes` bytes (headers only). Throws ModelFileError.
  std::function<FamilyMemoryFacts(const ModelFolder& folder, int tp, int64_t elementBytes)> memory;
  /// The facts shown for an opened folder of this family (GUI summary, `ready` event).
  std::function<std::vector<ModelFact>(const ModelFolder& folder)> facts;
  /// The transformer config.json object of a single-file checkpoint of this family (ditstudio-bench
  /// --model FILE): hyper-parameters from its tensor shapes, completed by the transformer
  /// config.json at `reference` (empty: the family's published defaults). Null for a family
  /// without single files. Throws ModelFileError naming the file.
  std::function<nlohmann::json(const std::string& file, const std::string& reference)>
      single_file_transformer_config;
  /// Real-size models of the family for the advisor.
  std::function<std::vector<KnownModel>()> known_models;
  /// The family's recommended request settings for an opened folder that declares none of its
  /// own (model_index.json "_dit_studio_default_settings"), in the same form: a JSON object text
  /// with any of steps, width, height, guidance, negative_prompt and the family's knobs (e.g.
  /// Z-Image-Turbo's few steps and no CFG). Null or "" = none.
  std::function<std::string(const ModelFolder& folder)> default_settings;
  /// The family's request for an opened folder of this family, built on baseRequestSpec: what
  /// each common field means for this model (read or not and why, defaults, ranges, the diffusers
  /// argument), the size rule, the guider, max_sequence_length's limit. Generic code reads it
  /// through requestSpecOf (family_registry.h), which adds `knobs` and the inputs from `caps`.
  /// Throws std::invalid_argument when the folder holds another family.
  std::function<RequestSpec(const ModelFolder& folder)> request;
  /// The family's own request knobs (FieldSpec::knob = true), declared once here: every front
  /// end offers them from this list (the CLI a flag each and --set name=value, the GUI a row
  /// each, the server a JSON field each) and the pipeline reads them by name from its inputs'
  /// options map. E.g. ZImagePipeline's cfg_truncation and cfg_normalization.
  std::vector<FieldSpec> knobs;

  /// "" when the family can do `feature` ("img2img", "inpaint", "step_cache", "single_file"),
  /// else the one refusal every front end shows: "FLUX.2 [klein] (Flux2KleinPipeline) cannot do
  /// inpainting (--mask)".
  std::string refusal(const std::string& feature) const;

  /// The request of `folder` (a folder of this family): `request(folder)` (or the base spec)
  /// with the family's knobs appended and the inputs it takes bounded by its capabilities.
  /// requestSpecOf (family_registry.h) is this on the folder's family; a family's pipeline and
  /// the flow-matching loop call it on their own record. Throws what `request` throws.
  RequestSpec requestSpec(const ModelFolder& folder) const;
};

}  // namespace dit
