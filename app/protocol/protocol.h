// The worker protocol of app/PROTOCOL.md in one place: the event prefix, the request types and
// their JSON (with the field checks the worker applies), event lines (build and parse), the one
// request-parameter type GenerationParams, and Strategy <-> JSON.
//
// Target dit_protocol: no Torch, no Qt, no MPI (nlohmann_json, CLI11 and the Torch-free strategy
// library only). It is a leaf library: the worker, ditstudio-cli, ditstudio-bench, the GUI (through
// thin Qt adapters in ui/) and parallel/runtime.cpp (which prints the fatal `error` event of
// abortGroup and every event line through eventLine()) link it; it links nothing of app/, ui/,
// backend/ or the Torch side of parallel/, so the dependency graph stays acyclic:
//   dit_protocol -> strategy (Torch-free);  parallel runtime, dit_app, dit_ui -> dit_protocol.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "app/protocol/limits.h"
#include "parallel/strategy.h"

namespace dit::protocol {

/// The prefix of an event line on the worker's stdout: "@@DIT " then one JSON object.
inline constexpr std::string_view kEventPrefix = "@@DIT ";

/// The default prompt of every front end (GUI panel, headless run, ditstudio-cli): a caption of
/// the synthetic shapes the embedded default model was trained on, from the held-out combinations
/// it never saw in training (app/demo/shapes_dataset.h), so the first image shows what it learned.
inline constexpr const char* kDefaultPrompt = "a large yellow star on a purple background, centre";

/// A request or strategy object that does not follow the protocol. what() is the sentence shown to
/// the user (e.g. "request field 'width' has the wrong type: \"64\""); field() names the offending
/// field ("" when the problem is the line or object as a whole); requestId() is the request's
/// "id" when it could be read (so an error event can name the request).
class ProtocolError : public std::invalid_argument {
 public:
  explicit ProtocolError(const std::string& message, std::string field = {},
                         std::optional<std::string> requestId = std::nullopt)
      : std::invalid_argument(message), field_(std::move(field)), id_(std::move(requestId)) {}
  const std::string& field() const { return field_; }
  const std::optional<std::string>& requestId() const { return id_; }

 private:
  std::string field_;
  std::optional<std::string> id_;
};

/// One LoRA of a request (issue 13): the adapter file and its strength (diffusers
/// set_adapters(adapter_weights) / fuse_lora(lora_scale)); its scaling per module is
/// strength * alpha / rank. In JSON {"file", "strength", "sha256"}.
struct LoraRequest {
  std::string file;       ///< path of the LoRA safetensors file, as the client names it
  double strength = 1.0;  ///< finite, -kMaxLoraStrength .. kMaxLoraStrength (negative subtracts)
  /// SHA-256 of the file (64 lowercase hex digits): filled in by the worker for image events and
  /// the PNG "parameters" chunk; in a request it is informational (may be empty).
  std::string sha256;
  bool operator==(const LoraRequest&) const = default;
};

/// One reference image of an editing request (Flux2KleinPipeline's image=[...],
/// FluxKontextPipeline's image): the file, read by every rank, and the SHA-256 it must have. In
/// JSON {"file", "sha256"} or just the path as a string.
struct ReferenceImage {
  std::string file;  ///< path of the image (PNG, JPEG, WebP, ...), as the client names it
  /// SHA-256 of the file (64 lowercase hex digits): "" = not checked; filled in for image events
  /// and PNG metadata, so a recalled request refuses a changed file.
  std::string sha256;
  bool operator==(const ReferenceImage&) const = default;
};

/// The user-facing parameters of one generate request: the single request-parameter type of the
/// GUI, the CLI and the worker, with the single set of defaults below. A field absent from a
/// request keeps these defaults; 0 for width/height/steps/max_sequence_length means "the model's
/// default", resolved by the pipeline (FluxPipeline::resolve: 128 x vae_scale_factor pixels,
/// 28 steps, tokenizer_2's max length capped at 512).
struct GenerationParams {
  std::string prompt = kDefaultPrompt;
  std::string negative_prompt;
  /// The negative prompt was given (diffusers' `negative_prompt is not None`), even as "": with
  /// the family's CFG scale above its threshold that runs CFG (FluxPipeline's true CFG). A
  /// non-empty negative_prompt counts as given too. In JSON: the key "negative_prompt" present with
  /// a string value (absent or null: not given).
  bool negative_prompt_given = false;
  int width = 0;          ///< pixels, multiple of 2 x vae_scale_factor; 0 = model default
  int height = 0;         ///< pixels; 0 = model default
  int steps = 0;          ///< denoising steps; 0 = model default (28)
  double guidance = 3.5;  ///< the pipeline's guidance_scale; 0 .. 100
  /// The model family's own knobs by field name (backend FamilySpec::knobs, e.g. Z-Image's
  /// cfg_truncation, FluxPipeline's true CFG scale): finite numbers; their ranges, defaults and
  /// whether the model knows the name are the family's (the request's resolve refuses an
  /// unknown one). In JSON: the object "options", e.g. {"cfg_truncation": 0.5}; absent = every
  /// knob at its default. (A knob at the top level is moved here by the front ends that read
  /// JSON from users: liftKnobKeys, app/common/request_values.h.)
  std::map<std::string, double> options;
  /// Seed of the CPU noise generator: the full 64-bit range, carried as a JSON integer (never a
  /// double). Image i of a request uses seed + i (mod 2^64).
  std::uint64_t seed = 42;
  /// The worker draws the seed (sent as "seed": -1; `seed` keeps the last explicit value).
  bool random_seed = false;
  int num_images = 1;           ///< images of the request (>= 1)
  int max_sequence_length = 0;  ///< T5 tokens; 0 = model default
  /// Image-to-image (issue 14): path of the init image, read by the worker's ranks (PNG, JPEG,
  /// ...); "" = text-to-image. width/height 0 = the image's size rounded down to the multiple.
  std::string init_image;
  /// SHA-256 (64 hex digits) the init image must have; "" = not checked. PNG metadata records
  /// it so that a recalled request refuses a changed file.
  std::string init_image_sha256;
  /// Inpainting: path of the mask (white = repaint; resized to the output size like the image);
  /// needs init_image.
  std::string mask_image;
  /// Image-to-image strength in (0, 1] (diffusers' default 0.6); used only with init_image.
  double strength = 0.6;
  /// Editing: reference images in order (reference i is the i-th the model sees: FLUX.2 [klein]
  /// position id T = 10 + 10 i). How many a model takes and how each is fitted are the family's
  /// (its RequestSpec::references; the resolve refuses more); at most kMaxReferenceImages at the
  /// door. In JSON "reference_images": [{"file": ..., "sha256": ...} or "path", ...].
  std::vector<ReferenceImage> reference_images;
  /// Step caching: "" / "none", "first-block:THRESHOLD" or
  /// "taylorseer:ORDER[,INTERVAL,WARMUP][,lite]" (backend/models/cache/step_cache_config.h).
  std::string cache;
  /// LoRAs applied to the denoiser for this request (in order; their deltas add). Empty = the base
  /// weights exactly. At most kMaxLoras.
  std::vector<LoraRequest> loras;

  /// A negative prompt was given (negative_prompt_given or a non-empty negative_prompt).
  bool hasNegativePrompt() const { return negative_prompt_given || !negative_prompt.empty(); }
  /// Field-wise, with negative_prompt_given compared as hasNegativePrompt() (a non-empty
  /// negative prompt is given whether or not the flag is set).
  bool operator==(const GenerationParams& o) const;
};

/// The parameters as a JSON object with the protocol's keys (prompt, negative_prompt,
/// width, height, steps, guidance, seed, num_images, max_sequence_length); seed is
/// the unsigned integer, or -1 when random_seed; negative_prompt only when hasNegativePrompt();
/// init_image, init_image_sha256, mask_image and strength only with an init image; cache only
/// when set (canonical spelling).
nlohmann::json toJson(const GenerationParams& p);
/// Reads the parameter keys present in `j` (absent or null keys keep `defaults`). A negative
/// integer seed sets random_seed (seed keeps the default); 0..2^64-1 is taken exactly. Throws
/// ProtocolError naming the field ("request field 'seed' has the wrong type: 1.5") when a key has
/// the wrong JSON type or an int field is outside the int range, and every checkParams refusal.
GenerationParams paramsFromJson(const nlohmann::json& j, const GenerationParams& defaults = {});

/// The allowed ranges of the numeric request fields: limits.h (kMaxSide, ... and the table).
inline constexpr int kMaxLoras = 16;              ///< loras: at most this many per request
inline constexpr int kMaxReferenceImages = 16;    ///< reference_images: at the door
inline constexpr double kMaxLoraStrength = 10.0;  ///< loras[i].strength: finite, -10 .. 10

/// The first byte of `s` that is not part of well-formed UTF-8 (RFC 3629: no overlongs, no
/// surrogates, nothing above U+10FFFF), or std::string::npos when `s` is valid.
std::size_t invalidUtf8Offset(std::string_view s);
/// Throws ProtocolError naming `field` and the byte offset ("request field 'prompt' is not valid
/// UTF-8: byte 3 (0xff) ...") when `s` is not valid UTF-8.
void checkUtf8(const std::string& field, std::string_view s,
               const std::optional<std::string>& id = std::nullopt);
/// Checks every field at the door, before any work starts: each number finite and in its range
/// (messages state the allowed range, e.g. "request field 'guidance' must be a finite number in
/// 0 .. 100, got nan"), each text field valid UTF-8, strength in (0, 1], a mask only with an init
/// image, init_image_sha256 64 hex digits, cache a known mode. Throws ProtocolError naming the
/// field.
void checkParams(const GenerationParams& p, const std::optional<std::string>& id = std::nullopt);
/// The loras field: at most kMaxLoras entries, each with a non-empty UTF-8 file, a finite
/// strength in -kMaxLoraStrength .. kMaxLoraStrength and an empty or 64-hex-digit sha256. Throws
/// ProtocolError naming the entry ("request field 'loras[1].strength' must be ...").
void checkLoras(const std::vector<LoraRequest>& loras,
                const std::optional<std::string>& id = std::nullopt);

/// {"type":"generate", "id", parameters..., "prompts", "output", "output_dir", "output_tensors",
///  "preview_every"}: see PROTOCOL.md.
struct GenerateRequest {
  std::string id;
  GenerationParams params;
  std::vector<std::string> prompts;  ///< one image per prompt (num_images is then their count)
  std::string output;          ///< PNG path ("name-i.png" with several images); "" = output_dir
  std::string output_dir;      ///< "" = the system temporary folder
  std::string output_tensors;  ///< optional safetensors with image and latents
  /// false (default): an existing file at `output` / `output_tensors` is an error (nothing is
  /// overwritten); true: replace it. Images under output_dir always get new unique names.
  bool overwrite = false;
  int preview_every = 0;  ///< > 0: a preview event every N steps (0 .. 1000000)
  /// Images this request makes: prompts.size() when a prompt list is given, else num_images.
  int imageCount() const;
  bool operator==(const GenerateRequest&) const = default;
};
/// {"type":"cancel","id"}: takes effect at the next denoising step on every rank.
struct CancelRequest {
  std::string id;
  bool operator==(const CancelRequest&) const = default;
};
/// {"type":"shutdown"} (optional "reason", e.g. "stdin closed").
struct ShutdownRequest {
  std::string reason;
  bool operator==(const ShutdownRequest&) const = default;
};
using Request = std::variant<GenerateRequest, CancelRequest, ShutdownRequest>;

/// "generate", "cancel" or "shutdown".
std::string requestType(const Request& r);
/// The request as its JSON object (fields as in PROTOCOL.md; empty optional strings omitted).
nlohmann::json toJson(const Request& r);
/// toJson(r) as one compact line without the trailing newline (what goes to the worker's stdin).
std::string requestLine(const Request& r);
/// checkParams plus the request's own fields: id, prompts[i], output, output_dir and
/// output_tensors valid UTF-8, preview_every in 0 .. 1000000, prompts at most kMaxImages.
void checkRequest(const GenerateRequest& r);
/// Checks and reads one request object. Throws ProtocolError: not an object ("request must be a
/// JSON object, got 42"), no string "type", unknown type, generate/cancel without a string "id",
/// every parameter or option field of the wrong type ("request field 'output_dir' has the
/// wrong type: 5"), and every checkRequest refusal.
Request parseRequest(const nlohmann::json& j);
/// Reads one line of `in` (up to '\n' or the end) into `line`, storing at most `maxBytes` bytes:
/// a longer line is consumed to its end and reported as TooLong (`line` then holds its first
/// maxBytes bytes), so a client cannot make the reader hold more than maxBytes. End: nothing
/// left to read.
enum class LineRead { Line, TooLong, End };
LineRead readRequestLine(std::istream& in, std::string& line,
                         std::size_t maxBytes = kMaxRequestLineBytes);
/// The id of the generate request whose line starts with `prefix` (a line the worker refuses
/// unparsed: too long, not valid JSON), read lexically from the top-level object: its "id"
/// string, when it is a valid id (limits.h) and the top-level "type" seen before it, if any, is
/// "generate". nullopt otherwise (then the refusal names no request: the launcher fails the
/// oldest request the worker has not accepted, app/PROTOCOL.md). Reads at most the whole
/// prefix, never throws.
std::optional<std::string> generateIdInPrefix(std::string_view prefix);
/// parseRequest of one stdin line. A line longer than kMaxRequestLineBytes or nesting JSON
/// deeper than kMaxRequestDepth is refused before it is parsed ("request nests JSON more than 16
/// levels deep"); ids outside limits.h's character set are refused ("request id has the
/// character '/' ..."). Invalid UTF-8 inside a string is refused naming the field and
/// the byte offset in its text ("request field 'prompt' is not valid UTF-8: byte 3 (0xff)");
/// other invalid JSON throws ProtocolError "request is not valid JSON: ...".
Request parseRequestLine(std::string_view line);

/// One event: `type` is its "event" field (a line with "type" instead is accepted too), `data`
/// the whole object.
struct Event {
  std::string type;
  nlohmann::json data;
};
/// kEventPrefix + event.dump() on one line, no trailing newline. Keys of a json are sorted, an
/// ordered_json keeps insertion order. Invalid UTF-8 in strings is replaced (U+FFFD), never thrown.
std::string eventLine(const nlohmann::json& event);
std::string eventLine(const nlohmann::ordered_json& event);
/// Parses one stdout line (with or without "\n"/"\r\n"; leading blanks and an OpenMPI
/// --tag-output prefix such as "[1,0]<stdout>:" are skipped). nullopt for anything that is not
/// the prefix followed by a JSON object with a non-empty string "event" (or "type"): library
/// noise, truncated JSON. Integers stay exact (64-bit seeds).
std::optional<Event> parseEventLine(std::string_view line);
/// An event that starts inside `line`, and where: mpirun forwards each rank's stdout and stderr
/// separately and in pieces, so one line of the merged stream can hold log text and then an event
/// ("...: da@@DIT {...}", OpenMPI 5), or the first part of one event, a whole second event and
/// nothing of the first's rest ("@@DIT {...safete@@DIT {...}" — the rest of the cut event comes
/// on the next line). Tries each kEventPrefix occurrence from the first and returns the first
/// from which the rest of the line parses with parseEventLine; `offset` is that occurrence's
/// byte offset (text before it is log output or a cut event). A whole line that parses as is
/// (an OpenMPI --tag-output prefix included) gives offset 0. nullopt when nothing parses.
struct EventInLine {
  size_t offset = 0;
  Event event;
};
std::optional<EventInLine> findEventInLine(std::string_view line);
/// The `error` event: {"event":"error","id":id or null,"rank","message","fatal"}.
nlohmann::json errorEvent(const std::optional<std::string>& id, int rank,
                          const std::string& message, bool fatal);

/// Per-rank figures of a `ranks` event (bytes, milliseconds); -1 when the worker omitted one.
struct RankStats {
  int rank = -1;
  std::string stage;
  int step = 0, steps = 0;
  std::int64_t rss = -1, rss_peak = -1, dev = -1, dev_peak = -1, bytes_sent = -1;
  double step_ms = -1;
};
/// The `ranks` array of a `ranks` event; entries without an integer "rank" are skipped.
std::vector<RankStats> parseRanks(const nlohmann::json& event);

/// Strategy <-> JSON with the keys of the CLI flags (world, tp_degree, ring_degree, ulysses_degree,
/// cfg_degree, dp_degree, ulysses_anything, ring_anything, device): the worker's `ready` event,
/// presets, bench output. Absent keys keep Strategy's defaults, except "world": absent, it is
/// the product of the degrees ("ranks" and "np" are accepted as its older spellings). Throws
/// ProtocolError naming the field ("strategy field 'tp_degree' has the wrong type: \"2\"") for
/// a non-object or a key of the wrong type.
nlohmann::json strategyToJson(const Strategy& s);
Strategy strategyFromJson(const nlohmann::json& j);

}  // namespace dit::protocol

namespace dit {
/// nlohmann's ADL hooks for dit::Strategy (`json j = s;`, `j.get<Strategy>()`), defined by
/// protocol::strategyToJson / strategyFromJson.
void to_json(nlohmann::json& j, const Strategy& s);
void from_json(const nlohmann::json& j, Strategy& s);
}  // namespace dit
