#include "app/protocol/limits.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace dit::protocol {

namespace {

using K = FieldLimit::Kind;

// The one table (PROTOCOL.md "Limits"). Ranges are inclusive.
const std::vector<FieldLimit> kRequestLimits = {
    {"width", K::Integer, 1, kMaxSide, true, " pixels", ""},
    {"height", K::Integer, 1, kMaxSide, true, " pixels", ""},
    {"steps", K::Integer, 1, kMaxSteps, true, "", ""},
    {"max_sequence_length", K::Integer, 1, kMaxSequenceLength, true, " tokens", ""},
    {"num_images", K::Integer, 1, kMaxImages, false, "", ""},
    {"preview_every", K::Integer, 0, 1000000, false, "", " (0: no previews)"},
    {"guidance", K::Real, 0, kMaxGuidance, false, "", ""},
    {"strength", K::Real, 0, 1, false, "", "", true},
};

std::string intText(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

}  // namespace

std::string numberText(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  if (std::floor(v) == v && std::fabs(v) < 1e15) return intText(v);
  for (int prec = 1; prec <= 17; ++prec) {  // the shortest text that reads back exactly
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string jsonNumberText(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return std::to_string(v.get<std::uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<std::int64_t>());
  if (v.is_number_float()) {
    std::string t = numberText(v.get<double>());
    // A float keeps a float's look (1.0, not 1), so "must be an integer, got 1.0" reads right.
    if (t.find_first_of(".en") == std::string::npos) t += ".0";
    return t;
  }
  return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string FieldLimit::rangeText() const {
  if (kind == K::Real && lo_exclusive)
    return "a finite number in (" + numberText(lo) + ", " + numberText(hi) + "]" +
           std::string(unit);
  if (kind == K::Real)
    return "a finite number in " + numberText(lo) + " .. " + numberText(hi) + std::string(unit);
  std::string r;
  if (zero_is_default)
    r = "0 (the model's default) or ";
  else
    r = "in ";
  return r + intText(lo) + " .. " + intText(hi) + std::string(unit) + std::string(note);
}

bool FieldLimit::accepts(double v) const {
  if (!std::isfinite(v)) return false;
  if (kind == K::Integer && std::floor(v) != v) return false;
  if (zero_is_default && v == 0) return true;
  return (lo_exclusive ? v > lo : v >= lo) && v <= hi;
}

const std::vector<FieldLimit>& requestLimits() { return kRequestLimits; }

const FieldLimit& requestLimit(std::string_view field) {
  for (const FieldLimit& l : kRequestLimits)
    if (l.field == field) return l;
  throw std::logic_error("no request limit for field '" + std::string(field) + "'");
}

std::string limitMessage(const FieldLimit& l, const std::string& got, bool notInteger) {
  return "request field '" + std::string(l.field) + "' must be " +
         (notInteger ? "a JSON integer, " : "") + l.rangeText() + ", got " + got;
}

std::string idProblem(std::string_view id) {
  if (id.empty()) return "request id is empty";
  if (id.size() > kMaxIdLength)
    return "request id is " + std::to_string(id.size()) + " characters long; at most " +
           std::to_string(kMaxIdLength);
  for (std::size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "0x%02x", c);
      return "request id has the character " +
             (c >= 0x20 && c < 0x7f ? "'" + std::string(1, static_cast<char>(c)) + "' (" + buf + ")"
                                    : std::string(buf)) +
             " at offset " + std::to_string(i) + "; ids use only A-Z a-z 0-9 . _ : -";
    }
  }
  return {};
}

int jsonNestingDepth(std::string_view s, int stopAt) {
  int depth = 0, maxDepth = 0;
  bool inString = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (inString) {
      if (c == '\\')
        ++i;  // the escaped character
      else if (c == '"')
        inString = false;
      continue;
    }
    if (c == '"') {
      inString = true;
    } else if (c == '{' || c == '[') {
      if (++depth > maxDepth) {
        maxDepth = depth;
        if (maxDepth > stopAt) return stopAt + 1;
      }
    } else if (c == '}' || c == ']') {
      if (depth > 0) --depth;
    }
  }
  return maxDepth;
}

}  // namespace dit::protocol
