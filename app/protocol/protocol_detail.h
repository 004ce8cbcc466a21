// Internal to dit_protocol (not installed, not included outside app/protocol/): the JSON field
// reader and the small helpers that the protocol's translation units share (protocol.cpp: request
// and event lines; protocol_params.cpp: GenerationParams; protocol_utf8.cpp: UTF-8 checks;
// protocol_strategy.cpp: Strategy <-> JSON).
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "app/protocol/protocol.h"

namespace dit::protocol::detail {

using nlohmann::json;

// Invalid UTF-8 (e.g. echoed from a bad request line) is replaced, never thrown.
inline std::string dumpSafe(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

[[noreturn]] inline void wrongType(const char* what, const std::string& key, const json& v,
                                   const std::optional<std::string>& id) {
  throw ProtocolError(std::string(what) + " field '" + key + "' has the wrong type: " + dumpSafe(v),
                      key, id);
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
      if (v->is_number_unsigned()
              ? v->get<std::uint64_t>() > std::uint64_t(std::numeric_limits<int>::max())
              : (v->get<std::int64_t>() < std::numeric_limits<int>::min() ||
                 v->get<std::int64_t>() > std::numeric_limits<int>::max()))
        throw ProtocolError(
            std::string(what) + " field '" + key + "' is out of range: " + dumpSafe(*v), key, id);
      out = static_cast<int>(v->get<std::int64_t>());
    }
  }
  // A numeric request field with a row in the limits table (limits.h): any JSON number is read,
  // and refused with the field's allowed range unless it is of the right kind and in range.
  void limited(const char* key, int& out) const {
    if (const json* v = find(key)) {
      if (!v->is_number()) wrongType(what, key, *v, id);
      const FieldLimit& l = requestLimit(key);
      const double d = v->get<double>();
      // A float with an integral value (2.0) is not an integer here: JSON integers only.
      if (!v->is_number_integer() || !l.accepts(d))
        throw ProtocolError(limitMessage(l, jsonNumberText(*v), !v->is_number_integer()), key, id);
      out = static_cast<int>(v->get<std::int64_t>());
    }
  }
  void limited(const char* key, double& out) const {
    if (const json* v = find(key)) {
      if (!v->is_number()) wrongType(what, key, *v, id);
      const FieldLimit& l = requestLimit(key);
      const double d = v->get<double>();
      if (!l.accepts(d)) throw ProtocolError(limitMessage(l, jsonNumberText(*v)), key, id);
      out = d;
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

// A value already in memory (GUI, CLI, or read from JSON) against its row of the limits table.
inline void checkLimit(const char* field, double v, const std::optional<std::string>& id) {
  const FieldLimit& l = requestLimit(field);
  if (!l.accepts(v)) throw ProtocolError(limitMessage(l, numberText(v)), field, id);
}

inline void trimLineEnd(std::string_view& line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
}

// The generate request's parameter keys present in `j` over `defaults`, each read with its type
// and checked (checkParams); throws ProtocolError naming the field (protocol_params.cpp).
GenerationParams readParams(const json& j, const GenerationParams& defaults,
                            const std::optional<std::string>& id);

// Throws naming the field that holds a request line's first invalid UTF-8 byte
// (protocol_utf8.cpp); returns when there is none inside a string.
void refuseInvalidUtf8Line(std::string_view line);

}  // namespace dit::protocol::detail
