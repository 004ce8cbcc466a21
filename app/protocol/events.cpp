#include "app/protocol/events.h"

#include <type_traits>

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

json withId(json j, const std::optional<std::string>& id) {
  if (id) j["id"] = *id;
  return j;
}

}  // namespace

json toJson(const HelloEvent& e) {
  return json{{"event", "hello"}, {"rank", e.rank}, {"world", e.world},
              {"pid", e.pid},     {"host", e.host}, {"blas", e.blas}};
}

json toJson(const ReadyEvent& e) {
  return json{{"event", "ready"},
              {"world", e.world},
              {"strategy", e.strategy},
              {"load_seconds", e.load_seconds},
              {"weight_reads", e.weight_reads},
              {"weight_bytes_rank0", e.weight_bytes_rank0},
              {"transformer_storage_rank0", e.transformer_storage_rank0},
              {"model", e.model}};
}

json toJson(const StatusEvent& e) {
  return withId(json{{"event", "status"}, {"stage", e.stage}, {"message", e.message}}, e.id);
}

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

json toJson(const AcceptedEvent& e) {
  return json{{"event", "accepted"}, {"id", e.id}, {"queue_position", e.queue_position}};
}

json toJson(const ProgressEvent& e) {
  return json{{"event", "progress"}, {"id", e.id},           {"step", e.step},
              {"steps", e.steps},    {"step_ms", e.step_ms}, {"image_index", e.image_index},
              {"eta_s", e.eta_s}};
}

json toJson(const PreviewEvent& e) {
  return json{{"event", "preview"},
              {"id", e.id},
              {"step", e.step},
              {"image_index", e.image_index},
              {"png", e.png}};
}

json toJson(const ImageEvent& e) {
  json j{
      {"event", "image"}, {"id", e.id},         {"cache", e.cache}, {"image_index", e.image_index},
      {"path", e.path},   {"params", e.params}, {"rank", e.rank},   {"seconds", e.seconds}};
  if (e.has_seed) j["seed"] = e.seed;  // number_unsigned: exact for every 64-bit value
  if (e.host) j["host"] = *e.host;
  return j;
}

json toJson(const LoraEvent& e) {
  return json{{"event", "lora"},
              {"id", e.id},
              {"loras", e.loras},
              {"lora_bytes_rank0", e.lora_bytes_rank0},
              {"lora_files_parsed", e.lora_files_parsed},
              {"weight_reads", e.weight_reads}};
}

json toJson(const DoneEvent& e) {
  return json{{"event", "done"}, {"id", e.id}, {"seconds", e.seconds}};
}

json toJson(const CancelledEvent& e) {
  return json{{"event", "cancelled"}, {"id", e.id}, {"step", e.step}};
}

json toJson(const ErrorEvent& e) { return errorEvent(e.id, e.rank, e.message, e.fatal); }

json toJson(const LogEvent& e) {
  return withId(
      json{{"event", "log"}, {"rank", e.rank}, {"level", e.level}, {"message", e.message}}, e.id);
}

json toJson(const ByeEvent&) { return json{{"event", "bye"}}; }

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
  if (t == "hello") {
    HelloEvent e;
    f.integer("rank", e.rank);
    f.integer("world", e.world);
    f.integer("pid", e.pid);
    f.str("host", e.host);
    f.any("blas", e.blas);
    return e;
  }
  if (t == "ready") {
    ReadyEvent e;
    f.integer("world", e.world);
    f.object("strategy", e.strategy);
    f.number("load_seconds", e.load_seconds);
    f.integer("weight_reads", e.weight_reads);
    f.object("weight_bytes_rank0", e.weight_bytes_rank0);
    f.object("transformer_storage_rank0", e.transformer_storage_rank0);
    f.object("model", e.model);
    return e;
  }
  if (t == "status") {
    StatusEvent e;
    f.str("stage", e.stage);
    f.str("message", e.message);
    f.optStr("id", e.id);
    return e;
  }
  if (t == "ranks") return RanksEvent{parseRanks(ev.data)};
  if (t == "accepted") {
    AcceptedEvent e;
    f.str("id", e.id);
    f.integer("queue_position", e.queue_position);
    return e;
  }
  if (t == "progress") {
    ProgressEvent e;
    f.str("id", e.id);
    f.integer("step", e.step);
    f.integer("steps", e.steps);
    f.number("step_ms", e.step_ms);
    f.integer("image_index", e.image_index);
    f.number("eta_s", e.eta_s);
    return e;
  }
  if (t == "preview") {
    PreviewEvent e;
    f.str("id", e.id);
    f.integer("step", e.step);
    f.integer("image_index", e.image_index);
    f.str("png", e.png);
    return e;
  }
  if (t == "image") {
    ImageEvent e;
    f.str("id", e.id);
    f.integer("image_index", e.image_index);
    f.str("path", e.path);
    if (const json* s = f.find("seed");
        s && (s->is_number_unsigned() || (s->is_number_integer() && s->get<std::int64_t>() >= 0))) {
      e.seed = s->get<std::uint64_t>();
      e.has_seed = true;
    }
    f.object("params", e.params);
    f.number("seconds", e.seconds);
    f.any("cache", e.cache);
    f.integer("rank", e.rank);
    f.optStr("host", e.host);
    return e;
  }
  if (t == "lora") {
    LoraEvent e;
    f.str("id", e.id);
    if (const json* v = f.find("loras"); v && v->is_array()) e.loras = *v;
    f.integer("lora_bytes_rank0", e.lora_bytes_rank0);
    f.integer("lora_files_parsed", e.lora_files_parsed);
    f.integer("weight_reads", e.weight_reads);
    return e;
  }
  if (t == "done") {
    DoneEvent e;
    f.str("id", e.id);
    f.number("seconds", e.seconds);
    return e;
  }
  if (t == "cancelled") {
    CancelledEvent e;
    f.str("id", e.id);
    f.integer("step", e.step);
    return e;
  }
  if (t == "error") {
    ErrorEvent e;
    f.optStr("id", e.id);
    f.integer("rank", e.rank);
    f.str("message", e.message);
    f.boolean("fatal", e.fatal);
    return e;
  }
  if (t == "log") {
    LogEvent e;
    f.optStr("id", e.id);
    f.integer("rank", e.rank);
    f.str("level", e.level);
    f.str("message", e.message);
    return e;
  }
  if (t == "bye") return ByeEvent{};
  return UnknownEvent{t};
}

}  // namespace dit::protocol
