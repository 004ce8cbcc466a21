// A family's request, declared once (Torch-free, Qt-free): every field the family's pipeline
// reads with its type, default, range, unit, help and the diffusers argument it is; the size
// rule; the guidance kind (the guider the flow-matching loop runs); the image inputs it takes.
// The one resolve below turns a request into the values the pipeline runs, or into problems that
// each name the field and the rule. The CLI's pre-check, the GUI's live validation, the server's
// validation and the worker all call resolveRequest; none of them restates a family rule.
//
// The shape follows diffusers' modular pipelines (InputParam: name, type_hint, default,
// description) and its guiders package (ClassifierFreeGuidance and friends: one component owns
// whether a second branch runs and how the two predictions combine); ComfyUI's INPUT_TYPES (one
// declaration drives widget, API schema and validation) and llama.cpp's llama-arch tables.
//
// A family's record (FamilySpec::request, backend/models/family.h) builds its RequestSpec for an
// opened folder (distilled or not, guidance embedding or not) starting from baseRequestSpec().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "parallel/strategy.h"  // RequestDims, Strategy, ModelDims

namespace dit {

/// The kind of value a request field holds (what a front end shows for it).
enum class FieldType {
  Int,     ///< an integer (steps, max_sequence_length)
  Float,   ///< a finite number (guidance, strength, a family knob such as cfg_truncation)
  Text,    ///< free text (negative_prompt)
  Image,   ///< one image file (init_image, mask_image)
  Images,  ///< image files in order (reference_images: diffusers' `image=[...]` of the editors)
};

/// One request input as the family reads it (diffusers' InputParam).
struct FieldSpec {
  std::string name;  ///< the request key: "steps", "guidance", a knob's name, ...
  FieldType type = FieldType::Float;
  double default_value = 0;  ///< numeric fields: the value when the request leaves it out
  /// Inclusive range of the accepted values (min_exclusive: (min, max]).
  double min = 0, max = 0;
  bool min_exclusive = false;
  std::string unit;           ///< shown after values: " pixels", " tokens", ""
  std::string help;           ///< one line for people (CLI help, GUI tooltip, docs)
  std::string diffusers_arg;  ///< the pipeline __call__ argument it is: "guidance_scale"
  /// The pipeline reads it for this model; when false `not_read` says why (CLI warning, the GUI
  /// greys the row out with it as the tooltip, the server's notes).
  bool read = true;
  std::string not_read;
  /// A family knob: not one of the request's common fields but carried in its options map
  /// (GenerationParams::options, PipelineInputs::options) under `name`. The CLI offers it as
  /// --<name with dashes> and --set name=value, the server as a JSON field of that name.
  bool knob = false;

  /// "--cfg-truncation" for "cfg_truncation".
  std::string cliFlag() const;
  /// "0 .. 100", "(0, 1]", "1 .. 512 tokens".
  std::string rangeText() const;
  /// Whether `v` is of the right kind (Int: integral) and inside the range.
  bool accepts(double v) const;
};

/// How the output size is found and checked (the pipeline's check_inputs / prepare_latents).
struct SizeRule {
  int vae_scale_factor = 8;
  /// width and height step: 2 x vae_scale_factor (latents are packed 2x2).
  int multiple() const { return 2 * vae_scale_factor; }
  int default_width = 1024, default_height = 1024;  ///< pixels, when the request gives 0
  int max_side = 16384;                             ///< pixels
  /// Refuse: a size off the multiple is refused naming the nearest valid one (FluxPipeline,
  /// ZImagePipeline). Floor: it is floored to the multiple (Flux2KleinPipeline, QwenImagePipeline).
  enum class Rounding { Refuse, Floor } rounding = Rounding::Refuse;
  /// DefaultsToImage: a width/height of 0 takes the init image's size floored to the multiple
  /// (FluxImg2ImgPipeline). Always: the output is always the init image's size, first scaled
  /// down to init_image_max_area pixels when larger (Flux2KleinInpaintPipeline).
  enum class FromInitImage { DefaultsToImage, Always } init_image = FromInitImage::DefaultsToImage;
  int64_t init_image_max_area = 0;  ///< pixels; 0 = no cap
  /// A knob holding an area in pixels ("" = none): the output is always rescaled to that area at
  /// the requested aspect, W = round(sqrt(area * W / H)), H = round(sqrt(area * H / W)) (Python
  /// round: half to even), then floored to the multiple (FluxKontextPipeline's max_area).
  std::string max_area_field;
  /// Where the rule comes from, named in messages: "FluxPipeline.check_inputs".
  std::string source;
};

/// What the flow-matching loop's guider does (diffusers' guiders: ClassifierFreeGuidance, the
/// distilled guidance embedding, FluxPipeline's true CFG).
struct GuiderSpec {
  enum class Kind {
    /// One prediction per step; `guidance` (when read) is an input of the transformer (the
    /// guidance-distilled embedding, FLUX.1 [dev]) or unused.
    None,
    /// Classic CFG: a second branch (the negative prompt, "" when none) runs when the
    /// `scale_field` value is above `threshold` (Flux2KleinPipeline: guidance > 1; ZImagePipeline:
    /// guidance > 0).
    ClassicCfg,
    /// True CFG: a second branch runs when a negative prompt is given (even "") and the
    /// `scale_field` value is above `threshold` (FluxPipeline, QwenImagePipeline: true_cfg_scale
    /// > 1).
    TrueCfg,
  };
  Kind kind = Kind::None;
  std::string scale_field;  ///< the request field holding the CFG scale
  double threshold = 1.0;
  /// How the two predictions combine: UncondPlus = uncond + s (cond - uncond) (diffusers'
  /// ClassifierFreeGuidance, FluxPipeline); CondPlus = cond + s (cond - uncond) computed in
  /// float32 (ZImagePipeline).
  enum class Formula { UncondPlus, CondPlus } formula = Formula::UncondPlus;
  /// After combining: PerTokenNorm rescales each token's prediction to the conditional one's
  /// L2 norm (QwenImagePipeline); GlobalNormClip clips the whole prediction's L2 norm at
  /// `normalization_field` x the conditional one's when that value is > 0 (ZImagePipeline's
  /// cfg_normalization).
  enum class Rescale { None, PerTokenNorm, GlobalNormClip } rescale = Rescale::None;
  /// Knob fields the guider reads ("" = none): a step whose normalised time
  /// (1000 - timestep) / 1000 is above the truncation value runs the conditional branch only
  /// (ZImagePipeline's cfg_truncation; > 1 = every step).
  std::string truncation_field, normalization_field;
  /// When CFG runs, in words, for refusals: "true CFG (a negative prompt and true_cfg_scale > 1)".
  /// For Kind::None: why this model runs no CFG.
  std::string requirement;
};

/// Reference images (diffusers' `image=` of Flux2KleinPipeline and FluxKontextPipeline): how many
/// a model takes, how each is checked and fitted to the VAE's multiple, and whether the output
/// size follows the first. A reference's tokens are appended to the image tokens in every
/// transformer call (clean, never noised) and dropped from the prediction.
struct ReferenceRule {
  int max_count = 0;      ///< 0 = the model takes none
  int min_side = 0;       ///< pixels, both sides of the file (Flux2ImageProcessor: 64)
  double max_aspect = 0;  ///< longer / shorter side at most this (Flux2ImageProcessor: 8); 0 = any
  /// Larger files are first scaled (PIL LANCZOS) to this area: int(W * s) x int(H * s),
  /// s = sqrt(max_area / (W * H)) (Flux2ImageProcessor._resize_to_target_area); 0 = never.
  int64_t max_area = 0;
  /// CenterCrop: both sides floored to the multiple and the image centre-cropped to that, no
  /// resampling (Flux2ImageProcessor._resize_and_crop). Resize: the floored size, or with the
  /// `auto_resize_field` knob on the entry of `preferred_sizes` nearest in aspect (ties: the
  /// smaller width), resampled with PIL LANCZOS (FluxKontextPipeline).
  enum class Fit { CenterCrop, Resize } fit = Fit::CenterCrop;
  std::vector<std::pair<int, int>> preferred_sizes;  ///< (width, height) pixels
  std::string auto_resize_field;                     ///< knob (0 / 1); "" = never
  /// A width / height of 0 takes the first reference's fitted size (Flux2KleinPipeline).
  bool output_size_from_first = false;
  /// What the first position id axis of reference i is, in words, for the docs:
  /// "T = 10 + 10 i", "1".
  std::string ids;
  std::string source;  ///< named in messages: "Flux2KleinPipeline (Flux2ImageProcessor)"
};

/// How one reference image of `width` x `height` pixels is fitted (fitReference).
struct ReferenceFit {
  int scaled_width = 0, scaled_height = 0;  ///< after the area cap (= the file's size without)
  int width = 0, height = 0;                ///< what the VAE encodes, multiples of the multiple
  int crop_left = 0, crop_top = 0;          ///< CenterCrop: the box's origin in the scaled image
  bool resample = false;                    ///< Resize: LANCZOS from the file to width x height
  std::string problem;                      ///< non-empty: refused (too small, too long)
  /// Packed tokens of the fitted image for `multiple` pixels per token side.
  int tokens(int multiple) const { return (width / multiple) * (height / multiple); }
};

/// Fits a `width` x `height` reference by `rule` for `multiple` pixels per token side;
/// `auto_resize` is the rule's knob value. Never throws: a refusal is ReferenceFit::problem.
ReferenceFit fitReference(const ReferenceRule& rule, int multiple, int width, int height,
                          bool auto_resize);

/// The image inputs a family takes beyond the prompt (baseRequestSpec: all; requestSpecOf bounds
/// them by the family's capabilities).
struct InputLimits {
  bool init_image = false;  ///< image-to-image (init_image, strength)
  bool mask = false;        ///< inpainting (mask_image; needs init_image)
  bool step_cache = false;  ///< First Block Cache / TaylorSeer (cache)
};

/// A family's request for one opened model.
struct RequestSpec {
  std::string family;    ///< FamilySpec::display_name, named in messages: "FLUX.2 [klein]"
  std::string pipeline;  ///< the diffusers pipeline class whose __call__ the fields follow
  std::vector<FieldSpec> fields;
  SizeRule size;
  GuiderSpec guider;
  InputLimits inputs;
  ReferenceRule references;
  int default_steps = 28;
  int default_max_sequence_length = 512;
  /// Where the max_sequence_length limit comes from, named in its refusal: "FluxPipeline (T5)".
  std::string max_sequence_length_rule;

  /// The field named `name`, or nullptr.
  const FieldSpec* field(std::string_view name) const;
  /// The field named `name`; throws std::logic_error when the spec has none (a programming
  /// error in the family's declaration).
  FieldSpec& at(std::string_view name);
  /// The family knobs (FieldSpec::knob), in declaration order.
  std::vector<const FieldSpec*> knobs() const;
};

/// The option naming "the model's CFG scale" whichever field its guider reads (A1111's
/// cfg_scale, ComfyUI's cfg): resolveRequest moves its value onto GuiderSpec::scale_field
/// (guidance or the family's knob), unless the family declares a knob of that name.
inline constexpr const char* kCfgScaleOption = "cfg_scale";

/// The spec every family starts from: the common fields (steps, guidance, negative_prompt,
/// max_sequence_length, strength, init_image, mask_image, reference_images) with the
/// protocol's ranges, guidance, the negative prompt and the references declared as not read
/// until the family says otherwise. A family's own fields (FluxPipeline's true_cfg_scale,
/// ZImagePipeline's cfg_truncation, ...) are knobs the family declares (FamilySpec::knobs).
RequestSpec baseRequestSpec(const std::string& family, const std::string& pipeline);

/// A numeric field: `name` (the request key), Int or Float, default `def` in [lo, hi], `unit`
/// (" px", " tokens", "" for none), one line of `help`, and the `diffusers` __call__ argument it
/// is. Read, not a knob: a family declaring a knob sets `knob` (and `read`, `not_read`).
FieldSpec numberField(const std::string& name, FieldType type, double def, double lo, double hi,
                      const std::string& unit, const std::string& help,
                      const std::string& diffusers);

/// A family's own option (an entry of FamilySpec::knobs): numberField(...) with `knob` set.
FieldSpec knobField(const std::string& name, FieldType type, double def, double lo, double hi,
                    const std::string& unit, const std::string& help, const std::string& diffusers);

/// `knob` declared as one this pipeline does not read (`read` false, `not_read` = `why`): a
/// request that carries it is told why instead of refused (Flux2KleinPipeline's true_cfg_scale).
FieldSpec notReadKnob(FieldSpec knob, const std::string& why);

/// A request as a front end holds it, before the family's defaults (0 = the model's default for
/// width, height, steps and max_sequence_length).
struct RequestValues {
  std::string prompt, negative_prompt;
  /// diffusers' `negative_prompt is not None` (an empty one counts).
  bool negative_prompt_given = false;
  int width = 0, height = 0, steps = 0, max_sequence_length = 0;
  int num_images = 1;
  double guidance = 3.5, strength = 0.6;
  std::string init_image, mask_image;  ///< paths; "" = none
  /// Reference images (paths) in order: reference i gets position id T = 10 + 10 i on FLUX.2
  /// [klein]; empty = none.
  std::vector<std::string> reference_images;
  bool cache = false;  ///< step caching asked for
  /// Family knobs by field name (FieldSpec::knob); absent = the field's default.
  std::map<std::string, double> options;
  /// The fields the user set explicitly (a CLI flag given, a JSON key present): a field the
  /// model does not read is a note (a warning) only when it was given.
  std::set<std::string> given;

  bool hasNegativePrompt() const { return negative_prompt_given || !negative_prompt.empty(); }
  /// The numeric value of field `name` (a common field or a knob; knobs absent: `fallback`).
  double number(const std::string& name, double fallback = 0) const;
};

/// One refusal: the field it concerns, the rule's stable name and a message in our words.
struct RequestProblem {
  std::string field;    ///< "width", "guidance", a knob's name, "cfg_degree", ...
  std::string rule;     ///< "multiple", "range", "unknown", "requires", "capability", ...
  std::string message;  ///< the sentence a user reads, with the fix
};

/// The pipeline's image size of `path` (width, height); throws std::runtime_error naming the
/// file when it cannot be read.
using ImageSizeFn = std::function<std::pair<int, int>(const std::string& path)>;

/// A resolved request: the values the pipeline runs (defaults filled in, sizes applied) and what
/// the guider will do, or the problems.
struct ResolvedRequest {
  RequestValues values;
  bool cfg = false;             ///< the guider runs a second (unconditional) branch
  std::string cfg_requirement;  ///< GuiderSpec::requirement, for strategy refusals
  std::vector<RequestProblem> problems;
  /// Each reference's fitted size (width, height) in pixels, in order, and their packed tokens
  /// in all (what every transformer call appends to the image tokens).
  std::vector<std::pair<int, int>> reference_sizes;
  int reference_tokens = 0;
  /// Warnings: a given field this model does not read, a size floored to the multiple.
  std::vector<std::string> notes;

  bool ok() const { return problems.empty(); }
  /// The problems' messages joined by "; " ("" when ok).
  std::string message() const;
  /// The sizes the strategy rules and the memory estimate take (RequestDims).
  RequestDims dims() const;
};

/// The one resolve: checks `request` against `spec` and fills the family's defaults. Problems:
/// an unknown knob (rule "unknown"), a numeric field outside its range or not finite ("range"),
/// a mask without an init image or an input the family does not take ("requires",
/// "capability"), more reference images than the model takes ("reference_count"), a reference
/// that cannot be read ("image", field reference_images) or is too small or too long
/// ("reference_size"), references together with an init image ("conflict"), a size off the multiple
/// where the family refuses it ("multiple"), above max_side ("max_side"), too small ("min_side"),
/// an unreadable init image ("image"), strength x steps < 1 ("strength_steps"). `imageSize` reads
/// an init image's size (empty: the project's decoder, backend/io/image_io.h imageSize). Never
/// throws for a bad request.
ResolvedRequest resolveRequest(const RequestSpec& spec, const RequestValues& request,
                               const ImageSizeFn& imageSize = {});

/// The strategy rules for a resolved request (validateForRequest with its dims and the guider's
/// requirement), as problems naming the strategy field.
std::vector<RequestProblem> strategyProblems(const Strategy& s, const ModelDims& dims,
                                             const ResolvedRequest& r);

/// Throws std::invalid_argument with r.message() when `r` has problems.
void throwIfProblems(const ResolvedRequest& r);

/// The spec as JSON (the worker's `ready` event carries it as model.request, so the server
/// resolves a request against the group's model before queueing it): every member by name,
/// enums as their lowercase names.
nlohmann::json requestSpecToJson(const RequestSpec& spec);
/// The spec back from requestSpecToJson's form. Throws std::invalid_argument naming the member
/// when a member has the wrong type or an enum an unknown name.
RequestSpec requestSpecFromJson(const nlohmann::json& j);

/// The spec as the documentation's family table (docs/request-fields.md, `ditstudio-cli
/// --print-request-spec`): a heading, one row per field (name, diffusers argument, type, default,
/// range, what it means here or why it is not read), then the size rule and the guider in words.
/// Numbers that depend on the folder's VAE (sizes) are stated as rules, so the table holds for
/// every model of the family. A test keeps the docs equal to it.
std::string requestSpecMarkdown(const RequestSpec& spec);

}  // namespace dit
