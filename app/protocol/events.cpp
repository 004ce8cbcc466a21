#include "app/protocol/events.h"

#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace dit::protocol {

using nlohmann::json;

namespace {

// Lenient field readers: absent keys and keys of another JSON type keep `out`.
struct Fields {
  const json& j;
  const json* find(const char* key) const {
    if (!j.is_object()) return nullptr;
    auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
  }
  void str(const char* key, std::string& out) const {
    if (const json* v = find(key); v && v->is_string()) out = v->get<std::string>();
  }
  void optStr(const char* key, std::optional<std::string>& out) const {
    if (const json* v = find(key); v && v->is_string()) out = v->get<std::string>();
  }
  template <class Int>
  void integer(const char* key, Int& out) const {
    const json* v = find(key);
    if (!v || !v->is_number()) return;
    if (v->is_number_float())
      out = static_cast<Int>(v->get<double>());
    else if (v->is_number_unsigned())
      out = static_cast<Int>(v->get<std::uint64_t>());
    else
      out = static_cast<Int>(v->get<std::int64_t>());
  }
  void number(const char* key, double& out) const {
    if (const json* v = find(key); v && v->is_number()) out = v->get<double>();
  }
  void boolean(const char* key, bool& out) const {
    if (const json* v = find(key); v && v->is_boolean()) out = v->get<bool>();
  }
  void object(const char* key, json& out) const {
    if (const json* v = find(key); v && v->is_object()) out = *v;
  }
  void any(const char* key, json& out) const {
    if (const json* v = find(key)) out = *v;
  }
};

// ---- one field table per event drives both directions
// How a JSON member is read back: an object only, an array only, or any value (null included).
enum class JsonAs { Object, Array, Any };

// One field of event E: its key and member. Encoding writes every member (an optional string
// only when set); decoding reads each leniently by the member's type (Fields above).
template <class E>
struct Field {
  const char* key;
  std::variant<std::string E::*, std::optional<std::string> E::*, int E::*, std::int64_t E::*,
               double E::*, bool E::*, json E::*>
      member;
  JsonAs as = JsonAs::Object;
};

// Each event's name and fields (app/PROTOCOL.md "Events"). The image event's seed, the ranks
// list and the error event's null id are written and read by hand below.
template <class E>
struct Schema;
template <>
struct Schema<HelloEvent> {
  static constexpr const char* name = "hello";
  inline static const std::vector<Field<HelloEvent>> fields{
      {"rank", &HelloEvent::rank},
      {"world", &HelloEvent::world},
      {"pid", &HelloEvent::pid},
      {"host", &HelloEvent::host},
      {"blas", &HelloEvent::blas, JsonAs::Any}};
};
template <>
struct Schema<ReadyEvent> {
  static constexpr const char* name = "ready";
  inline static const std::vector<Field<ReadyEvent>> fields{
      {"world", &ReadyEvent::world},
      {"strategy", &ReadyEvent::strategy},
      {"load_seconds", &ReadyEvent::load_seconds},
      {"weight_reads", &ReadyEvent::weight_reads},
      {"weight_bytes_rank0", &ReadyEvent::weight_bytes_rank0},
      {"transformer_storage_rank0", &ReadyEvent::transformer_storage_rank0},
      {"model", &ReadyEvent::model}};
};
template <>
struct Schema<StatusEvent> {
  static constexpr const char* name = "status";
  inline static const std::vector<Field<StatusEvent>> fields{
      {"stage", &StatusEvent::stage}, {"message", &StatusEvent::message}, {"id", &StatusEvent::id}};
};
template <>
struct Schema<AcceptedEvent> {
  static constexpr const char* name = "accepted";
  inline static const std::vector<Field<AcceptedEvent>> fields{
      {"id", &AcceptedEvent::id}, {"queue_position", &AcceptedEvent::queue_position}};
};
template <>
struct Schema<ProgressEvent> {
  static constexpr const char* name = "progress";
  inline static const std::vector<Field<ProgressEvent>> fields{
      {"id", &ProgressEvent::id},
      {"step", &ProgressEvent::step},
      {"steps", &ProgressEvent::steps},
      {"step_ms", &ProgressEvent::step_ms},
      {"image_index", &ProgressEvent::image_index},
      {"eta_s", &ProgressEvent::eta_s}};
};
template <>
struct Schema<PreviewEvent> {
  static constexpr const char* name = "preview";
  inline static const std::vector<Field<PreviewEvent>> fields{
      {"id", &PreviewEvent::id},
      {"step", &PreviewEvent::step},
      {"image_index", &PreviewEvent::image_index},
      {"png", &PreviewEvent::png}};
};
template <>
struct Schema<ImageEvent> {  // + "seed" (has_seed)
  static constexpr const char* name = "image";
  inline static const std::vector<Field<ImageEvent>> fields{
      {"id", &ImageEvent::id},           {"image_index", &ImageEvent::image_index},
      {"path", &ImageEvent::path},       {"params", &ImageEvent::params},
      {"seconds", &ImageEvent::seconds}, {"cache", &ImageEvent::cache, JsonAs::Any},
      {"rank", &ImageEvent::rank},       {"host", &ImageEvent::host}};
};
template <>
struct Schema<LoraEvent> {
  static constexpr const char* name = "lora";
  inline static const std::vector<Field<LoraEvent>> fields{
      {"id", &LoraEvent::id},
      {"loras", &LoraEvent::loras, JsonAs::Array},
      {"lora_bytes_rank0", &LoraEvent::lora_bytes_rank0},
      {"lora_files_parsed", &LoraEvent::lora_files_parsed},
      {"weight_reads", &LoraEvent::weight_reads}};
};
template <>
struct Schema<DoneEvent> {
  static constexpr const char* name = "done";
  inline static const std::vector<Field<DoneEvent>> fields{{"id", &DoneEvent::id},
                                                           {"seconds", &DoneEvent::seconds}};
};
template <>
struct Schema<CancelledEvent> {
  static constexpr const char* name = "cancelled";
  inline static const std::vector<Field<CancelledEvent>> fields{{"id", &CancelledEvent::id},
                                                                {"step", &CancelledEvent::step}};
};
template <>
struct Schema<ErrorEvent> {  // written by errorEvent() (its id is null when absent)
  static constexpr const char* name = "error";
  inline static const std::vector<Field<ErrorEvent>> fields{{"id", &ErrorEvent::id},
                                                            {"rank", &ErrorEvent::rank},
                                                            {"message", &ErrorEvent::message},
                                                            {"fatal", &ErrorEvent::fatal},
                                                            {"refused", &ErrorEvent::refused}};
};
template <>
struct Schema<LogEvent> {
  static constexpr const char* name = "log";
  inline static const std::vector<Field<LogEvent>> fields{{"id", &LogEvent::id},
                                                          {"rank", &LogEvent::rank},
                                                          {"level", &LogEvent::level},
                                                          {"message", &LogEvent::message}};
};
template <>
struct Schema<ByeEvent> {
  static constexpr const char* name = "bye";
  inline static const std::vector<Field<ByeEvent>> fields{};
};

template <class E>
json encode(const E& e) {
  json j{{"event", Schema<E>::name}};
  for (const Field<E>& f : Schema<E>::fields)
    std::visit(
        [&](auto member) {
          const auto& v = e.*member;
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::optional<std::string>>) {
            if (v) j[f.key] = *v;
          } else {
            j[f.key] = v;
          }
        },
        f.member);
  return j;
}

template <class E>
E decode(const Fields& in) {
  E e;
  for (const Field<E>& f : Schema<E>::fields)
    std::visit(
        [&](auto member) {
          auto& out = e.*member;
          using T = std::decay_t<decltype(out)>;
          if constexpr (std::is_same_v<T, std::string>)
            in.str(f.key, out);
          else if constexpr (std::is_same_v<T, std::optional<std::string>>)
            in.optStr(f.key, out);
          else if constexpr (std::is_same_v<T, double>)
            in.number(f.key, out);
          else if constexpr (std::is_same_v<T, bool>)
            in.boolean(f.key, out);
          else if constexpr (std::is_same_v<T, json>) {
            if (f.as == JsonAs::Any)
              in.any(f.key, out);
            else if (f.as == JsonAs::Object)
              in.object(f.key, out);
            else if (const json* v = in.find(f.key); v && v->is_array())
              out = *v;
          } else {
            in.integer(f.key, out);
          }
        },
        f.member);
  return e;
}

// The first of the events E... named `type`, decoded; nullopt when none is.
template <class... E>
std::optional<WorkerEvent> decodeNamed(const std::string& type, const Fields& in) {
  std::optional<WorkerEvent> out;
  ((!out && type == Schema<E>::name ? (void)(out = decode<E>(in)) : (void)0), ...);
  return out;
}

}  // namespace

json toJson(const HelloEvent& e) { return encode(e); }
json toJson(const ReadyEvent& e) { return encode(e); }
json toJson(const StatusEvent& e) { return encode(e); }

json toJson(const RanksEvent& e) {
  json ranks = json::array();
  for (const RankStats& r : e.ranks)
    ranks.push_back(json{{"rank", r.rank},
                         {"stage", r.stage},
                         {"step", r.step},
                         {"steps", r.steps},
                         {"rss", r.rss},
                         {"rss_peak", r.rss_peak},
                         {"dev", r.dev},
                         {"dev_peak", r.dev_peak},
                         {"bytes_sent", r.bytes_sent},
                         {"step_ms", r.step_ms}});
  return json{{"event", "ranks"}, {"ranks", std::move(ranks)}};
}

json toJson(const AcceptedEvent& e) { return encode(e); }
json toJson(const ProgressEvent& e) { return encode(e); }
json toJson(const PreviewEvent& e) { return encode(e); }

json toJson(const ImageEvent& e) {
  json j = encode(e);
  if (e.has_seed) j["seed"] = e.seed;  // number_unsigned: exact for every 64-bit value
  return j;
}

json toJson(const LoraEvent& e) { return encode(e); }
json toJson(const DoneEvent& e) { return encode(e); }
json toJson(const CancelledEvent& e) { return encode(e); }
json toJson(const ErrorEvent& e) {
  json j = errorEvent(e.id, e.rank, e.message, e.fatal);
  if (e.refused) j["refused"] = true;
  return j;
}
json toJson(const LogEvent& e) { return encode(e); }
json toJson(const ByeEvent& e) { return encode(e); }

json toJson(const WorkerEvent& e) {
  return std::visit(
      [](const auto& ev) -> json {
        if constexpr (std::is_same_v<std::decay_t<decltype(ev)>, UnknownEvent>)
          return json{{"event", ev.type}};
        else
          return toJson(ev);
      },
      e);
}

std::string fatalErrorLine(int rank, const std::string& message) {
  nlohmann::ordered_json ev;
  ev["event"] = "error";
  ev["id"] = nullptr;
  ev["rank"] = rank;
  ev["message"] = message;
  ev["fatal"] = true;
  return eventLine(ev);
}

std::string eventName(const WorkerEvent& e) {
  if (const auto* u = std::get_if<UnknownEvent>(&e)) return u->type;
  return toJson(e).at("event").get<std::string>();
}

WorkerEvent decodeEvent(const Event& ev) {
  const Fields f{ev.data};
  const std::string& t = ev.type;
  if (t == "ranks") return RanksEvent{parseRanks(ev.data)};
  if (t == Schema<ImageEvent>::name) {
    ImageEvent e = decode<ImageEvent>(f);
    if (const json* s = f.find("seed");
        s && (s->is_number_unsigned() || (s->is_number_integer() && s->get<std::int64_t>() >= 0))) {
      e.seed = s->get<std::uint64_t>();
      e.has_seed = true;
    }
    return e;
  }
  if (t == Schema<ByeEvent>::name) return ByeEvent{};
  if (auto e =
          decodeNamed<HelloEvent, ReadyEvent, StatusEvent, AcceptedEvent, ProgressEvent,
                      PreviewEvent, LoraEvent, DoneEvent, CancelledEvent, ErrorEvent, LogEvent>(t,
                                                                                                f))
    return *e;
  return UnknownEvent{t};
}

}  // namespace dit::protocol
