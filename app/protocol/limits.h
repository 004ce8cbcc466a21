// The limits every untrusted request is parsed under (issue 16), in one table shared by the
// worker's protocol parser, ditstudio-cli (its options are checked through checkRequest) and the
// GUI (which sends what checkRequest accepts): numeric request fields (type, finiteness, range),
// the request line's length and JSON nesting depth, and the request id's character set.
//
// Adding a numeric request field: add one row to kRequestLimits in limits.cpp (name as the JSON
// key, kind, inclusive range, whether 0 means "the model's default", unit) and read it with
// Reader::limited() in protocol_detail.h; the messages, the CLI's option errors and PROTOCOL.md's
// table follow from the row. Torch-free and Qt-free (part of dit_protocol).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dit::protocol {

/// A request line longer than this many bytes (without the newline) is refused unread: 16 MiB
/// holds 10000 prompts of 1600 bytes each.
inline constexpr std::size_t kMaxRequestLineBytes = std::size_t(16) << 20;
/// JSON nesting depth of a request: the protocol needs 2 (the object and the "prompts" array);
/// anything deeper than this is refused before it is parsed (no recursion on untrusted depth).
inline constexpr int kMaxRequestDepth = 16;
/// Request ids: 1 .. kMaxIdLength characters of [A-Za-z0-9._:-] (never a path separator, never
/// blank or control characters), so an id can be shown, logged and put into a file name as is.
inline constexpr std::size_t kMaxIdLength = 128;

/// Allowed ranges of the numeric request fields (inclusive). 0 for width, height, steps and
/// max_sequence_length means "the model's default"; the pipeline further requires width and
/// height to be multiples of 2 x vae_scale_factor.
inline constexpr int kMaxSide = 16384;  ///< width, height: 0 or 1 .. kMaxSide pixels
inline constexpr int kMaxSteps = 1000;  ///< steps: 0 or 1 .. kMaxSteps
/// max_sequence_length: 0 or 1 .. kMaxSequenceLength at the door; each family's own limit
/// (PipelineConfig::max_sequence_length_limit: FLUX.1 512, Qwen-Image 1024, FLUX.2 [klein] its
/// text encoder's positions, 40960 for Qwen3) is checked once the model is known.
inline constexpr int kMaxSequenceLength = 65536;
inline constexpr int kMaxImages = 10000;       ///< num_images: 1 .. kMaxImages
inline constexpr double kMaxGuidance = 100.0;  ///< guidance: finite, 0 .. 100
/// options (a model family's knobs): at most this many entries per request.
inline constexpr std::size_t kMaxOptions = 32;

/// One numeric request field: its kind and inclusive range (`zero_is_default`: 0 is accepted too
/// and means "the model's default").
struct FieldLimit {
  enum class Kind { Integer, Real };
  std::string_view field;  ///< JSON key, e.g. "height"
  Kind kind = Kind::Integer;
  double lo = 0, hi = 0;         ///< inclusive range (for zero_is_default: of the non-zero values)
  bool zero_is_default = false;  ///< 0 = the model's default
  std::string_view unit;         ///< " pixels", " tokens" or ""
  std::string_view note;         ///< appended to the range, e.g. " (0: no previews)"
  bool lo_exclusive = false;     ///< the range is (lo, hi]: lo itself is refused (strength)

  /// The allowed values as text: "0 (the model's default) or 1 .. 16384 pixels", "1 .. 10000",
  /// "a finite number in 0 .. 100", "a finite number in (0, 1]" (lo_exclusive).
  std::string rangeText() const;
  /// The value is of the right kind (integers: integral) and inside the range.
  bool accepts(double v) const;
};

/// Every numeric request field with its limits (width, height, steps, max_sequence_length,
/// num_images, guidance, preview_every, strength; a family's knobs are ranged by its declaration).
/// The GUI's spin boxes take their ranges from here too (ui/generation_panel,
/// ui/image_input_panel).
const std::vector<FieldLimit>& requestLimits();
/// The row of `field`; throws std::logic_error for a field without a row (a programming error).
const FieldLimit& requestLimit(std::string_view field);
/// "request field 'height' must be 0 (the model's default) or 1 .. 16384 pixels, got 1e+18"
/// (`got` is the value as text); with notInteger (a JSON float for an integer field): "request
/// field 'num_images' must be a JSON integer, in 1 .. 10000, got 1.0".
std::string limitMessage(const FieldLimit& l, const std::string& got, bool notInteger = false);
/// A double as it appears in messages: "nan", "inf", "-0.5", "1e+18" (%.17g, shortest exact).
std::string numberText(double v);
/// The text of a JSON number for messages ("18446744073709551615", "1.5", "1e+39").
std::string jsonNumberText(const nlohmann::json& v);

/// Why `id` is not a valid request id ("" when it is): empty, longer than kMaxIdLength, or
/// holding a character outside [A-Za-z0-9._:-] (named with its offset).
std::string idProblem(std::string_view id);

/// The JSON nesting depth of `text` (objects and arrays; brackets inside strings do not count),
/// scanning without recursion. Stops counting once `stopAt` is exceeded (returns stopAt + 1).
int jsonNestingDepth(std::string_view text, int stopAt = 1 << 30);

}  // namespace dit::protocol
