// The worker's events (app/PROTOCOL.md "Events") as types: one struct per event with toJson()
// (what the worker emits; the JSON on the wire is the protocol's, unchanged) and decodeEvent()
// (what a launcher reads). The worker builds these instead of JSON literals; WorkerSession
// (app/launcher/) decodes them, so both ends name each field once.
//
// Decoding is lenient, as the readers always were: a field that is absent or of another JSON type
// keeps the struct's default (an event never throws on its way in); unknown event names decode to
// UnknownEvent. Integers stay exact (64-bit seeds). Part of dit_protocol: no Torch, no Qt.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "app/protocol/protocol.h"

namespace dit::protocol {

/// `hello`: each rank, before loading.
struct HelloEvent {
  int rank = -1;
  int world = 0;
  std::int64_t pid = -1;
  std::string host;
  nlohmann::json blas;  ///< the rank's BLAS library (app/common/blas_kernel.h); null if absent
};
/// `ready`: rank 0, the model loaded on every rank.
struct ReadyEvent {
  int world = 0;
  nlohmann::json strategy = nlohmann::json::object();  ///< strategyToJson() of the group
  double load_seconds = 0;
  std::int64_t weight_reads = 0;
  nlohmann::json weight_bytes_rank0 = nlohmann::json::object();         ///< component -> bytes
  nlohmann::json transformer_storage_rank0 = nlohmann::json::object();  ///< storage -> bytes
  /// path, sources, heads, inner_dim, layers, single_layers, vae_scale_factor, default_steps,
  /// guidance_embeds, max_sequence_length, family, pipeline_class, facts ([{key, label,
  /// value}]), capabilities ({img2img, inpaint, step_cache, single_file, lora_formats})
  /// (PROTOCOL.md).
  nlohmann::json model = nlohmann::json::object();
};
/// `status`: rank 0 at every stage change.
struct StatusEvent {
  std::string stage;  ///< loading, encoding, denoising, decoding, idle
  std::string message;
  std::optional<std::string> id;  ///< the request, except for `loading`
};
/// `ranks`: every rank's figures, gathered by rank 0.
struct RanksEvent {
  std::vector<RankStats> ranks;
};
/// `accepted`: a generate request queued by rank 0.
struct AcceptedEvent {
  std::string id;
  std::int64_t queue_position = 0;
};
/// `progress`: one denoising step of a request's image.
struct ProgressEvent {
  std::string id;
  int step = 0, steps = 0;
  double step_ms = -1;
  int image_index = 0;
  double eta_s = -1;
};
/// `preview`: the x0 estimate of a step as a base64 PNG.
struct PreviewEvent {
  std::string id;
  int step = 0;
  int image_index = 0;
  std::string png;  ///< base64 of the PNG bytes
};
/// `image`: a finished image written by the worker.
struct ImageEvent {
  std::string id;
  int image_index = 0;
  std::string path;
  std::uint64_t seed = 0;
  bool has_seed = false;  ///< false when the event carried no unsigned integer seed
  nlohmann::json params = nlohmann::json::object();  ///< toJson(GenerationParams) as made
  double seconds = 0;
  nlohmann::json cache;             ///< step-cache report or null
  int rank = -1;                    ///< the replica leader that made it
  std::optional<std::string> host;  ///< the host it was made on, when shipped from another host
};
/// `lora`: the LoRAs applied for a request (rank 0).
struct LoraEvent {
  std::string id;
  nlohmann::json loras = nlohmann::json::array();
  std::int64_t lora_bytes_rank0 = 0;
  std::int64_t lora_files_parsed = 0;
  std::int64_t weight_reads = 0;
};
/// `done`: every image of a request is written.
struct DoneEvent {
  std::string id;
  double seconds = 0;
};
/// `cancelled`: a request stopped (at `step`; 0 when it had not started).
struct CancelledEvent {
  std::string id;
  int step = 0;
};
/// `error`: fatal (the group is going down) or not (one request refused).
struct ErrorEvent {
  std::optional<std::string> id;  ///< null when not tied to a request
  int rank = -1;
  std::string message;
  bool fatal = false;
  /// Rank 0 refused a request line at the door (too long, not valid JSON, a field out of range,
  /// a live id): no `accepted` event follows it. Written only when true. With a null id the
  /// launcher fails the oldest request it sent that has not been accepted (app/PROTOCOL.md).
  bool refused = false;
};
/// `log`: a message of a rank (level info / warning / error).
struct LogEvent {
  std::optional<std::string> id;
  int rank = -1;
  std::string level = "info";
  std::string message;
};
/// `bye`: clean shutdown.
struct ByeEvent {};
/// An event this version does not know: its name; the object is in Event::data.
struct UnknownEvent {
  std::string type;
};

using WorkerEvent = std::variant<HelloEvent, ReadyEvent, StatusEvent, RanksEvent, AcceptedEvent,
                                 ProgressEvent, PreviewEvent, ImageEvent, LoraEvent, DoneEvent,
                                 CancelledEvent, ErrorEvent, LogEvent, ByeEvent, UnknownEvent>;

/// The event's JSON object with its "event" name, exactly as PROTOCOL.md lists the fields (what
/// the worker prints through eventLine()). Optional ids are omitted when unset, except `error`,
/// whose "id" is null then.
nlohmann::json toJson(const HelloEvent& e);
nlohmann::json toJson(const ReadyEvent& e);
nlohmann::json toJson(const StatusEvent& e);
nlohmann::json toJson(const RanksEvent& e);
nlohmann::json toJson(const AcceptedEvent& e);
nlohmann::json toJson(const ProgressEvent& e);
nlohmann::json toJson(const PreviewEvent& e);
nlohmann::json toJson(const ImageEvent& e);
nlohmann::json toJson(const LoraEvent& e);
nlohmann::json toJson(const DoneEvent& e);
nlohmann::json toJson(const CancelledEvent& e);
nlohmann::json toJson(const ErrorEvent& e);
nlohmann::json toJson(const LogEvent& e);
nlohmann::json toJson(const ByeEvent& e);
/// Any event (UnknownEvent: {"event": type}).
nlohmann::json toJson(const WorkerEvent& e);

/// abortGroup's line for a rank's fatal error: kEventPrefix + {"event":"error","id":null,"rank",
/// "message","fatal":true} with the keys in that order (PROTOCOL.md "Failure"); invalid UTF-8 is
/// replaced. The worker installs it as parallel/runtime's FatalLineFormatter.
std::string fatalErrorLine(int rank, const std::string& message);

/// The typed event of a parsed line (parseEventLine / findEventInLine). Never throws.
WorkerEvent decodeEvent(const Event& e);
/// The "event" name of a typed event ("hello", ..., UnknownEvent's type).
std::string eventName(const WorkerEvent& e);

}  // namespace dit::protocol
