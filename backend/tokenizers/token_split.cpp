#include "backend/tokenizers/token_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <limits>
#include <new>
#include <stdexcept>

namespace dit {

void encodeAroundSpecials(
    const std::string& text, const std::vector<std::pair<std::string, int64_t>>& specials,
    const std::function<void(std::string_view, std::vector<int64_t>&)>& encodeSegment,
    std::vector<int64_t>& out) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t best = std::string::npos, bestLen = 0;
    int64_t bestId = -1;
    for (const auto& [tok, id] : specials) {
      const size_t f = text.find(tok, pos);
      if (f == std::string::npos) continue;
      if (f < best || (f == best && tok.size() > bestLen))
        best = f, bestLen = tok.size(), bestId = id;
    }
    if (best == std::string::npos) {
      encodeSegment(std::string_view(text).substr(pos), out);
      return;
    }
    encodeSegment(std::string_view(text).substr(pos, best - pos), out);
    out.push_back(bestId);
    pos = best + bestLen;
  }
}

std::vector<int64_t> truncateAndPad(std::vector<int64_t> ids, size_t length, int64_t eos,
                                    int64_t pad) {
  if (ids.size() > length) {
    ids.resize(length - 1);
    ids.push_back(eos);
  }
  ids.resize(length, pad);
  return ids;
}

std::string_view tokenBudgetPrefix(std::string_view text, std::size_t maxTokens,
                                   std::size_t maxTokenBytes, bool countWhitespace) {
  const std::size_t perToken = std::max<std::size_t>(maxTokenBytes, 1);
  const std::size_t tokens = std::min<std::size_t>(maxTokens, std::size_t(1) << 24) + 2;
  const std::size_t budget = 3 * tokens * perToken;
  if (text.size() <= budget) return text;
  // Uncounted whitespace is still bounded (8 x the budget in all): no tokens, but the
  // normalizers still copy and align it.
  const std::size_t limit = std::min(text.size(), 8 * budget);
  std::size_t counted = 0, i = 0;
  for (; i < limit; ++i) {
    const char c = text[i];
    const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
    if (!space || countWhitespace) {
      if (counted == budget) break;
      ++counted;
    }
  }
  // Back to the start of the character the cut falls in (at most 3 continuation bytes).
  for (int k = 0;
       k < 3 && i > 0 && i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80;
       ++k)
    --i;
  return text.substr(0, i);
}

std::size_t utf8CodePoints(std::string_view s) {
  std::size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::array<std::string, 256> gpt2BytesToUnicode() {
  std::array<std::string, 256> table;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const UChar32 cp = printable ? b : 256 + n++;
    char buf[U8_MAX_LENGTH];
    int32_t len = 0;
    U8_APPEND_UNSAFE(buf, len, cp);
    table[b].assign(buf, static_cast<size_t>(len));
  }
  return table;
}

std::string nfcUtf8(std::string_view raw, const char* who) {
  if (raw.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max() / 4))
    throw std::length_error(std::string(who) + ": text too long (" + std::to_string(raw.size()) +
                            " bytes)");
  const icu::UnicodeString decoded =
      icu::UnicodeString::fromUTF8(icu::StringPiece(raw.data(), static_cast<int32_t>(raw.size())));
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(err);
  icu::UnicodeString text;
  if (U_SUCCESS(err)) text = n->normalize(decoded, err);
  if (U_FAILURE(err))
    throw std::runtime_error(std::string(who) +
                             ": ICU NFC normalization failed: " + u_errorName(err));
  std::string out;
  text.toUTF8String(out);
  return out;
}

UnicodeRegex::UnicodeRegex(const std::string& pattern, std::string who) : who_(std::move(who)) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw std::runtime_error(who_ + ": cannot compile pattern at offset " + std::to_string(off) +
                             ": " + reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  code_ = code;
}

UnicodeRegex::~UnicodeRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void UnicodeRegex::forEachMatch(std::string_view s,
                                const std::function<void(size_t, size_t)>& fn) const {
  auto* code = static_cast<const pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  if (!md) throw std::bad_alloc();
  struct Free {
    pcre2_match_data* m;
    ~Free() { pcre2_match_data_free(m); }
  } guard{md};
  PCRE2_SIZE start = 0;
  while (start < s.size()) {
    const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start,
                               PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw std::runtime_error(who_ + ": regex match failed: " + reinterpret_cast<char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const PCRE2_SIZE b = ov[0], e = ov[1];
    if (e == b) {  // the patterns never match empty; guard against a loop anyway
      start = e + 1;
      while (start < s.size() && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) ++start;
      continue;
    }
    fn(b, e);
    start = e;
  }
}

}  // namespace dit
