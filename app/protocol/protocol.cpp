// The worker protocol's lines: requests (their JSON, checks, parsing of a stdin line, the id of a
// refused line) and event lines (build, parse, find inside merged mpirun output, ranks figures).
// GenerationParams is protocol_params.cpp's, UTF-8 protocol_utf8.cpp's, Strategy JSON
// protocol_strategy.cpp's.
#include "app/protocol/protocol.h"

#include <algorithm>
#include <filesystem>
#include <istream>

#include "app/protocol/protocol_detail.h"

namespace dit::protocol {

using nlohmann::json;
using namespace detail;

void checkRequest(const GenerateRequest& r) {
  const std::optional<std::string> id = r.id;
  checkUtf8("id", r.id, std::nullopt);
  if (std::string why = idProblem(r.id); !why.empty()) throw ProtocolError(why, "id");
  if (static_cast<long long>(r.prompts.size()) > kMaxImages)
    throw ProtocolError("request field 'prompts' holds " + std::to_string(r.prompts.size()) +
                            " prompts; at most " + std::to_string(kMaxImages),
                        "prompts", id);
  checkParams(r.params, id);
  for (std::size_t i = 0; i < r.prompts.size(); ++i)
    checkUtf8("prompts[" + std::to_string(i) + "]", r.prompts[i], id);
  checkUtf8("output", r.output, id);
  checkUtf8("output_dir", r.output_dir, id);
  checkUtf8("output_tensors", r.output_tensors, id);
  // Both written to one path, the tensors would replace the PNG (lexically: "a/./x" is "a/x").
  if (!r.output.empty() && !r.output_tensors.empty() &&
      std::filesystem::path(r.output).lexically_normal() ==
          std::filesystem::path(r.output_tensors).lexically_normal())
    throw ProtocolError("request fields 'output' and 'output_tensors' name the same file (" +
                            r.output + "): the tensors would replace the image",
                        "output_tensors", id);
  checkLimit("preview_every", r.preview_every, id);
}

int GenerateRequest::imageCount() const {
  return prompts.empty() ? params.num_images : static_cast<int>(prompts.size());
}

std::string requestType(const Request& r) {
  switch (r.index()) {
    case 0:
      return "generate";
    case 1:
      return "cancel";
    default:
      return "shutdown";
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
    if (g->overwrite) j["overwrite"] = true;
    j["preview_every"] = g->preview_every;
    return j;
  }
  if (const auto* c = std::get_if<CancelRequest>(&r))
    return json{{"type", "cancel"}, {"id", c->id}};
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
    throw ProtocolError("unknown request type '" + type + "' (generate, cancel or shutdown)",
                        "type");
  std::optional<std::string> id;
  if (auto i = j.find("id"); i != j.end() && i->is_string()) id = i->get<std::string>();
  if (type == "shutdown") {
    ShutdownRequest s;
    Reader{j, "request", id}.str("reason", s.reason);
    return s;
  }
  if (!id) throw ProtocolError("a " + type + " request needs a string \"id\"", "id");
  checkUtf8("id", *id, std::nullopt);
  // Refused without naming the bad id as the request's (it is shown in the message, escaped).
  if (std::string why = idProblem(*id); !why.empty()) throw ProtocolError(why, "id");
  if (type == "cancel") return CancelRequest{*id};
  GenerateRequest g;
  g.id = *id;
  g.params = readParams(j, GenerationParams{}, id);
  Reader r{j, "request", id};
  r.strings("prompts", g.prompts);
  r.str("output", g.output);
  r.str("output_dir", g.output_dir);
  r.str("output_tensors", g.output_tensors);
  r.boolean("overwrite", g.overwrite);
  r.limited("preview_every", g.preview_every);
  if (!g.prompts.empty())
    g.params.num_images = static_cast<int>(std::min<std::size_t>(g.prompts.size(), kMaxImages + 1));
  checkRequest(g);
  return g;
}

Request parseRequestLine(std::string_view line) {
  trimLineEnd(line);
  if (line.size() > kMaxRequestLineBytes)
    throw ProtocolError("request line is " + std::to_string(line.size()) + " bytes long; at most " +
                        std::to_string(kMaxRequestLineBytes));
  // Depth first, before any parser or recursive routine (destructor, dump) sees the value.
  if (const int depth = jsonNestingDepth(line, kMaxRequestDepth); depth > kMaxRequestDepth)
    throw ProtocolError("request nests JSON more than " + std::to_string(kMaxRequestDepth) +
                        " levels deep (requests need 2)");
  refuseInvalidUtf8Line(line);
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& e) {
    throw ProtocolError(std::string("request is not valid JSON: ") + e.what());
  }
  return parseRequest(j);
}

std::optional<std::string> generateIdInPrefix(std::string_view s) {
  std::size_t i = 0;
  auto skipSpace = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) ++i;
  };
  // A JSON string starting at s[i] == '"': its first 200 bytes as written (escapes kept: no
  // valid id has one), enough for the keys and ids looked for; false when the prefix ends
  // inside it.
  auto readString = [&](std::string& out) {
    out.clear();
    for (++i; i < s.size(); ++i) {
      if (s[i] == '"') {
        ++i;
        return true;
      }
      if (out.size() < 200) out += s[i];
      if (s[i] == '\\' && ++i < s.size() && out.size() < 200) out += s[i];
    }
    return false;
  };
  skipSpace();
  if (i >= s.size() || s[i] != '{') return std::nullopt;
  ++i;
  int depth = 1;  // of objects and arrays; keys and values of the request object at depth 1
  bool expectKey = true;
  std::string key, value, type;
  while (i < s.size()) {
    const char c = s[i];
    if (c == '"') {
      if (!readString(depth == 1 && expectKey ? key : value)) return std::nullopt;
      if (depth == 1 && !expectKey) {
        if (key == "type") type = value;
        if (key == "id") {
          if (!type.empty() && type != "generate") return std::nullopt;
          if (idProblem(value).empty()) return value;
          return std::nullopt;
        }
      }
      value.clear();
      continue;
    }
    if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth <= 0) return std::nullopt;
    } else if (c == ':' && depth == 1) {
      expectKey = false;
    } else if (c == ',' && depth == 1) {
      expectKey = true;
    }
    ++i;
  }
  return std::nullopt;
}

LineRead readRequestLine(std::istream& in, std::string& line, std::size_t maxBytes) {
  line.clear();
  std::streambuf* sb = in.rdbuf();
  if (!sb) return LineRead::End;
  bool any = false, tooLong = false;
  for (;;) {
    const int c = sb->sbumpc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(std::ios::eofbit);
      if (!any) return LineRead::End;
      break;
    }
    any = true;
    if (c == '\n') break;
    if (line.size() < maxBytes)
      line.push_back(static_cast<char>(c));
    else
      tooLong = true;  // the rest of the line is read and dropped, never stored
  }
  return tooLong ? LineRead::TooLong : LineRead::Line;
}

std::string eventLine(const json& event) { return std::string(kEventPrefix) + dumpSafe(event); }

std::string eventLine(const nlohmann::ordered_json& event) {
  return std::string(kEventPrefix) +
         event.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
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
  json j =
      json::parse(line.substr(start + kEventPrefix.size()), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;  // also the "discarded" value of a parse error
  auto t = j.find("event");
  if (t == j.end() || !t->is_string()) t = j.find("type");
  if (t == j.end() || !t->is_string() || t->get_ref<const std::string&>().empty())
    return std::nullopt;
  Event ev;
  ev.type = t->get<std::string>();
  ev.data = std::move(j);
  return ev;
}

std::optional<EventInLine> findEventInLine(std::string_view line) {
  if (auto ev = parseEventLine(line)) return EventInLine{0, std::move(*ev)};
  for (size_t at = line.find(kEventPrefix); at != std::string_view::npos;
       at = line.find(kEventPrefix, at + 1)) {
    if (auto ev = parseEventLine(line.substr(at))) return EventInLine{at, std::move(*ev)};
  }
  return std::nullopt;
}

json errorEvent(const std::optional<std::string>& id, int rank, const std::string& message,
                bool fatal) {
  return json{{"event", "error"},
              {"id", id ? json(*id) : json()},
              {"rank", rank},
              {"message", message},
              {"fatal", fatal}};
}

std::vector<RankStats> parseRanks(const json& event) {
  std::vector<RankStats> out;
  auto it = event.find("ranks");
  if (it == event.end() || !it->is_array()) return out;
  auto i64 = [](const json& o, const char* key) -> std::int64_t {
    auto v = o.find(key);
    if (v == o.end() || !v->is_number()) return -1;
    return v->is_number_float() ? static_cast<std::int64_t>(v->get<double>())
                                : v->get<std::int64_t>();
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

}  // namespace dit::protocol
