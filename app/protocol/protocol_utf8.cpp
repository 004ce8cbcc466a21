// UTF-8 validation of request text (RFC 3629) and the naming of the field that holds the first
// invalid byte of an unparsed request line.
#include <cstdio>
#include <cstdlib>

#include "app/protocol/protocol.h"
#include "app/protocol/protocol_detail.h"

namespace dit::protocol {

namespace {

// Length of the well-formed UTF-8 sequence at s[i] (RFC 3629 table 3-7), 0 if there is none.
std::size_t utf8SequenceLength(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no UTF-16 surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else
    return 0;
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}

std::string hexByte(unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", c);
  return buf;
}

[[noreturn]] void notUtf8(const std::string& field, std::size_t offset, unsigned char byte,
                          const std::optional<std::string>& id) {
  throw ProtocolError("request field '" + field + "' is not valid UTF-8: invalid byte " +
                          hexByte(byte) + " at byte offset " + std::to_string(offset) +
                          " of its text",
                      field, id);
}

}  // namespace

std::size_t invalidUtf8Offset(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8SequenceLength(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string::npos;
}

void checkUtf8(const std::string& field, std::string_view s, const std::optional<std::string>& id) {
  if (const std::size_t at = invalidUtf8Offset(s); at != std::string::npos)
    notUtf8(field, at, static_cast<unsigned char>(s[at]), id);
}

namespace detail {

// A request line that is not valid UTF-8: finds the JSON string holding the first bad byte
// lexically (the line cannot be parsed) and throws naming its field ("prompt", "prompts[1]",
// or the key itself) and the byte offset inside the decoded text. Returns when the line is valid
// UTF-8 or the bad byte is outside any string (then the JSON parser reports the syntax error).
void refuseInvalidUtf8Line(std::string_view line) {
  if (invalidUtf8Offset(line) == std::string::npos) return;
  struct Level {
    bool object;
    bool expectKey;
    std::string key;
    int index;
  };
  std::vector<Level> stack;
  std::optional<std::string> id;  // the request's id, when it came before the bad byte
  std::string lastKeyAtTop;
  std::size_t i = 0;
  while (i < line.size()) {
    const char c = line[i];
    if (c == '{' || c == '[') {
      stack.push_back(Level{c == '{', c == '{', {}, 0});
      ++i;
    } else if (c == '}' || c == ']') {
      if (!stack.empty()) stack.pop_back();
      ++i;
    } else if (c == ',') {
      if (!stack.empty()) {
        if (stack.back().object)
          stack.back().expectKey = true;
        else
          ++stack.back().index;
      }
      ++i;
    } else if (c == '"') {
      const bool isKey = !stack.empty() && stack.back().object && stack.back().expectKey;
      std::string field;
      if (isKey)
        field = "(a key)";
      else if (!stack.empty()) {
        // The innermost object key, with the array index when inside a list ("prompts[1]").
        std::string suffix;
        for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
          if (!it->object)
            suffix.insert(0, '[' + std::to_string(it->index) + ']');
          else {
            field = it->key + suffix;
            break;
          }
        }
        if (field.empty()) field = "(value)" + suffix;
      }
      std::string text;  // decoded, for the key or id
      std::size_t decoded = 0;
      ++i;
      while (i < line.size() && line[i] != '"') {
        if (line[i] == '\\' && i + 1 < line.size()) {
          if (line[i + 1] == 'u' && i + 5 < line.size()) {
            const unsigned cp = static_cast<unsigned>(
                std::strtoul(std::string(line.substr(i + 2, 4)).c_str(), nullptr, 16));
            decoded += cp < 0x80                        ? 1
                       : cp < 0x800                     ? 2
                       : (cp >= 0xD800 && cp <= 0xDBFF) ? 4
                       : (cp >= 0xDC00 && cp <= 0xDFFF) ? 0
                                                        : 3;
            i += 6;
          } else {
            text += line[i + 1];
            decoded += 1;
            i += 2;
          }
          continue;
        }
        const std::size_t n = utf8SequenceLength(line, i);
        if (n == 0)
          notUtf8(isKey ? std::string("(a key)") : field, decoded,
                  static_cast<unsigned char>(line[i]), id);
        text.append(line.substr(i, n));
        decoded += n;
        i += n;
      }
      ++i;  // closing quote
      if (isKey) {
        stack.back().key = text;
        stack.back().expectKey = false;
      } else if (stack.size() == 1 && stack.back().object && stack.back().key == "id") {
        id = text;
      }
    } else {
      if (utf8SequenceLength(line, i) == 0) return;  // outside a string: a JSON syntax error
      ++i;
    }
  }
}

}  // namespace detail

}  // namespace dit::protocol
