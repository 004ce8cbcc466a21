#include "app/protocol/protocol.h"

#include <algorithm>
#include <limits>

namespace dit::protocol {

using nlohmann::json;

namespace {

// Invalid UTF-8 (e.g. echoed from a bad request line) is replaced, never thrown.
std::string dumpSafe(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

[[noreturn]] void wrongType(const char* what, const std::string& key, const json& v,
                            const std::optional<std::string>& id) {
  throw ProtocolError(std::string(what) + " field '" + key + "' has the wrong type: " + dumpSafe(v), key, id);
}

// Field readers: absent or null keeps `out`; a value of the wrong type throws naming the field.
struct Reader {
  const json& j;
  const char* what;  // "request" or "strategy"
  std::optional<std::string> id;

  const json* find(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  void str(const char* key, std::string& out) const {
    if (const json* v = find(key)) {
      if (!v->is_string()) wrongType(what, key, *v, id);
      out = v->get<std::string>();
    }
  }
  void integer(const char* key, int& out) const {
    if (const json* v = find(key)) {
      if (!v->is_number_integer()) wrongType(what, key, *v, id);
      if (v->is_number_unsigned() ? v->get<std::uint64_t>() > std::uint64_t(std::numeric_limits<int>::max())
                                  : (v->get<std::int64_t>() < std::numeric_limits<int>::min() ||
                                     v->get<std::int64_t>() > std::numeric_limits<int>::max()))
        throw ProtocolError(std::string(what) + " field '" + key + "' is out of range: " + dumpSafe(*v), key, id);
      out = static_cast<int>(v->get<std::int64_t>());
    }
  }
  void number(const char* key, double& out) const {
    if (const json* v = find(key)) {
      if (!v->is_number()) wrongType(what, key, *v, id);
      out = v->get<double>();
    }
  }
  void boolean(const char* key, bool& out) const {
    if (const json* v = find(key)) {
      if (!v->is_boolean()) wrongType(what, key, *v, id);
      out = v->get<bool>();
    }
  }
  void strings(const char* key, std::vector<std::string>& out) const {
    if (const json* v = find(key)) {
      if (!v->is_array()) wrongType(what, key, *v, id);
      std::vector<std::string> r;
      for (const json& e : *v) {
        if (!e.is_string()) wrongType(what, key, *v, id);
        r.push_back(e.get<std::string>());
      }
      out = std::move(r);
    }
  }
};

GenerationParams readParams(const json& j, const GenerationParams& defaults, const std::optional<std::string>& id) {
  Reader r{j, "request", id};
  GenerationParams p = defaults;
  r.str("prompt", p.prompt);
  r.str("negative_prompt", p.negative_prompt);
  r.number("true_cfg_scale", p.true_cfg_scale);
  r.integer("width", p.width);
  r.integer("height", p.height);
  r.integer("steps", p.steps);
  r.number("guidance", p.guidance);
  r.integer("num_images", p.num_images);
  r.integer("max_sequence_length", p.max_sequence_length);
  if (const json* v = r.find("seed")) {
    // Integers only: a double cannot hold every 64-bit seed, so 1.0 or 1e19 is refused too.
    if (!v->is_number_integer()) wrongType("request", "seed", *v, id);
    if (v->is_number_unsigned()) {
      p.seed = v->get<std::uint64_t>();
      p.random_seed = false;
    } else if (v->get<std::int64_t>() < 0) {
      p.random_seed = true;
    } else {
      p.seed = static_cast<std::uint64_t>(v->get<std::int64_t>());
      p.random_seed = false;
    }
  }
  if (p.num_images < 1)
    throw ProtocolError("num_images must be at least 1 (got " + std::to_string(p.num_images) + ")", "num_images", id);
  return p;
}

void trimLineEnd(std::string_view& line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
}

}  // namespace

bool GenerationParams::trueCfg() const {
  return !negative_prompt.empty() && true_cfg_scale > 1.0;
}

json toJson(const GenerationParams& p) {
  json j{{"prompt", p.prompt},
         {"negative_prompt", p.negative_prompt},
         {"true_cfg_scale", p.true_cfg_scale},
         {"width", p.width},
         {"height", p.height},
         {"steps", p.steps},
         {"guidance", p.guidance},
         {"num_images", p.num_images},
         {"max_sequence_length", p.max_sequence_length}};
  if (p.random_seed) j["seed"] = -1;
  else j["seed"] = p.seed;  // number_unsigned: exact for every 64-bit value
  return j;
}

GenerationParams paramsFromJson(const json& j, const GenerationParams& defaults) {
  if (!j.is_object()) throw ProtocolError("generation parameters must be a JSON object, got " + dumpSafe(j));
  return readParams(j, defaults, std::nullopt);
}

int GenerateRequest::imageCount() const {
  return prompts.empty() ? params.num_images : static_cast<int>(prompts.size());
}

std::string requestType(const Request& r) {
  switch (r.index()) {
    case 0: return "generate";
    case 1: return "cancel";
    default: return "shutdown";
  }
}

json toJson(const Request& r) {
  if (const auto* g = std::get_if<GenerateRequest>(&r)) {
    json j = toJson(g->params);
    j["type"] = "generate";
    j["id"] = g->id;
    if (!g->prompts.empty()) j["prompts"] = g->prompts;
    if (!g->output.empty()) j["output"] = g->output;
    if (!g->output_dir.empty()) j["output_dir"] = g->output_dir;
    if (!g->output_tensors.empty()) j["output_tensors"] = g->output_tensors;
    j["preview_every"] = g->preview_every;
    return j;
  }
  if (const auto* c = std::get_if<CancelRequest>(&r)) return json{{"type", "cancel"}, {"id", c->id}};
  const auto& s = std::get<ShutdownRequest>(r);
  json j{{"type", "shutdown"}};
  if (!s.reason.empty()) j["reason"] = s.reason;
  return j;
}

std::string requestLine(const Request& r) { return dumpSafe(toJson(r)); }

Request parseRequest(const json& j) {
  if (!j.is_object()) throw ProtocolError("request must be a JSON object, got " + dumpSafe(j));
  auto t = j.find("type");
  if (t == j.end() || !t->is_string())
    throw ProtocolError("request needs a string \"type\" (generate, cancel or shutdown)", "type");
  const std::string type = t->get<std::string>();
  if (type != "generate" && type != "cancel" && type != "shutdown")
    throw ProtocolError("unknown request type '" + type + "' (generate, cancel or shutdown)", "type");
  std::optional<std::string> id;
  if (auto i = j.find("id"); i != j.end() && i->is_string()) id = i->get<std::string>();
  if (type == "shutdown") {
    ShutdownRequest s;
    Reader{j, "request", id}.str("reason", s.reason);
    return s;
  }
  if (!id) throw ProtocolError("a " + type + " request needs a string \"id\"", "id");
  if (type == "cancel") return CancelRequest{*id};
  GenerateRequest g;
  g.id = *id;
  g.params = readParams(j, GenerationParams{}, id);
  Reader r{j, "request", id};
  r.strings("prompts", g.prompts);
  r.str("output", g.output);
  r.str("output_dir", g.output_dir);
  r.str("output_tensors", g.output_tensors);
  r.integer("preview_every", g.preview_every);
  if (!g.prompts.empty()) g.params.num_images = static_cast<int>(g.prompts.size());
  return g;
}

Request parseRequestLine(std::string_view line) {
  trimLineEnd(line);
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& e) {
    throw ProtocolError(std::string("request is not valid JSON: ") + e.what());
  }
  return parseRequest(j);
}

std::string eventLine(const json& event) { return std::string(kEventPrefix) + dumpSafe(event); }

std::string eventLine(const nlohmann::ordered_json& event) {
  return std::string(kEventPrefix) + event.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::optional<Event> parseEventLine(std::string_view line) {
  trimLineEnd(line);
  size_t start = 0;
  while (start < line.size() && (line[start] == ' ' || line[start] == '\t')) ++start;
  // OpenMPI --tag-output: "[1,0]<stdout>:"
  if (start < line.size() && line[start] == '[') {
    constexpr std::string_view tag = "]<stdout>:";
    const size_t close = line.find(tag, start);
    if (close != std::string_view::npos && close < start + 32) start = close + tag.size();
  }
  if (line.size() - start < kEventPrefix.size() + 2) return std::nullopt;
  if (line.substr(start, kEventPrefix.size()) != kEventPrefix) return std::nullopt;
  json j = json::parse(line.substr(start + kEventPrefix.size()), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;  // also the "discarded" value of a parse error
  auto t = j.find("event");
  if (t == j.end() || !t->is_string()) t = j.find("type");
  if (t == j.end() || !t->is_string() || t->get_ref<const std::string&>().empty()) return std::nullopt;
  Event ev;
  ev.type = t->get<std::string>();
  ev.data = std::move(j);
  return ev;
}

std::optional<EventInLine> findEventInLine(std::string_view line) {
  if (auto ev = parseEventLine(line)) return EventInLine{0, std::move(*ev)};
  for (size_t at = line.find(kEventPrefix); at != std::string_view::npos; at = line.find(kEventPrefix, at + 1)) {
    if (auto ev = parseEventLine(line.substr(at))) return EventInLine{at, std::move(*ev)};
  }
  return std::nullopt;
}

json errorEvent(const std::optional<std::string>& id, int rank, const std::string& message, bool fatal) {
  return json{{"event", "error"}, {"id", id ? json(*id) : json()}, {"rank", rank}, {"message", message},
              {"fatal", fatal}};
}

std::vector<RankStats> parseRanks(const json& event) {
  std::vector<RankStats> out;
  auto it = event.find("ranks");
  if (it == event.end() || !it->is_array()) return out;
  auto i64 = [](const json& o, const char* key) -> std::int64_t {
    auto v = o.find(key);
    if (v == o.end() || !v->is_number()) return -1;
    return v->is_number_float() ? static_cast<std::int64_t>(v->get<double>()) : v->get<std::int64_t>();
  };
  for (const json& o : *it) {
    if (!o.is_object()) continue;
    auto r = o.find("rank");
    if (r == o.end() || !r->is_number_integer()) continue;
    RankStats s;
    s.rank = r->get<int>();
    if (auto v = o.find("stage"); v != o.end() && v->is_string()) s.stage = v->get<std::string>();
    s.step = static_cast<int>(std::max<std::int64_t>(0, i64(o, "step")));
    s.steps = static_cast<int>(std::max<std::int64_t>(0, i64(o, "steps")));
    s.rss = i64(o, "rss");
    s.rss_peak = i64(o, "rss_peak");
    s.dev = i64(o, "dev");
    s.dev_peak = i64(o, "dev_peak");
    s.bytes_sent = i64(o, "bytes_sent");
    if (auto v = o.find("step_ms"); v != o.end() && v->is_number()) s.step_ms = v->get<double>();
    out.push_back(std::move(s));
  }
  return out;
}

json strategyToJson(const Strategy& s) {
  return json{{"world", s.world},
              {"tp_degree", s.tp_degree},
              {"ring_degree", s.ring_degree},
              {"ulysses_degree", s.ulysses_degree},
              {"cfg_degree", s.cfg_degree},
              {"dp_degree", s.dp_degree},
              {"ulysses_anything", s.ulysses_anything},
              {"ring_anything", s.ring_anything},
              {"device", s.device}};
}

Strategy strategyFromJson(const json& j) {
  if (!j.is_object()) throw ProtocolError("strategy must be a JSON object, got " + dumpSafe(j));
  Reader r{j, "strategy", std::nullopt};
  Strategy s;  // absent keys keep the defaults
  r.integer("tp_degree", s.tp_degree);
  r.integer("ring_degree", s.ring_degree);
  r.integer("ulysses_degree", s.ulysses_degree);
  r.integer("cfg_degree", s.cfg_degree);
  r.integer("dp_degree", s.dp_degree);
  r.boolean("ulysses_anything", s.ulysses_anything);
  r.boolean("ring_anything", s.ring_anything);
  r.str("device", s.device);
  const long long product =
      1LL * s.tp_degree * s.ring_degree * s.ulysses_degree * s.cfg_degree * s.dp_degree;
  s.world = product > std::numeric_limits<int>::max() || product < std::numeric_limits<int>::min()
                ? 0  // refused by validateDegrees ("world size 0 must be at least 1 rank")
                : static_cast<int>(product);
  for (const char* key : {"world", "ranks", "np"})
    if (r.find(key)) {
      r.integer(key, s.world);
      break;
    }
  return s;
}

}  // namespace dit::protocol

namespace dit {
void to_json(nlohmann::json& j, const Strategy& s) { j = protocol::strategyToJson(s); }
void from_json(const nlohmann::json& j, Strategy& s) { s = protocol::strategyFromJson(j); }
}  // namespace dit
