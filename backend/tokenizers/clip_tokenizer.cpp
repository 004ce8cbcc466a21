// CLIPTokenizer: see clip_tokenizer.h.
#include "backend/tokenizers/clip_tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include "backend/io/config_json.h"
#include "backend/io/file_guard.h"
#include "backend/io/safetensors.h"  // dit::ModelFileError
#include "backend/tokenizers/bpe.h"
#include "backend/tokenizers/token_split.h"

namespace dit {
namespace {

// ---------------------------------------------------------------------------------------------
// Unicode (ICU): decoding, NFC, per-character lower-casing
// ---------------------------------------------------------------------------------------------

// Lower-case mapping of one character on its own, as Rust's char::to_lowercase (which HF
// `tokenizers`' Lowercase normalizer applies character by character): u_tolower's simple
// mapping, or, where Unicode's full mapping is longer (U+0130 'İ' -> "i\u0307", the only such
// character up to Unicode 15), ICU's full root-locale mapping of the character alone. On a lone
// character that mapping's only context rule (Final_Sigma) cannot fire, so 'Σ' -> 'σ' always,
// and the root locale has no Turkish/Lithuanian rules (the process locale plays no part).
// (Every character whose full mapping changes it has a simple mapping that changes it: checked
// over all code points with ICU 72, so u_tolower is the filter.)
void appendLower(icu::UnicodeString& out, UChar32 c) {
  const UChar32 simple = u_tolower(c);
  if (simple == c) {
    out.append(c);
    return;
  }
  UChar src[U16_MAX_LENGTH];
  int32_t srcLen = 0;
  U16_APPEND_UNSAFE(src, srcLen, c);
  UChar full[8];
  UErrorCode err = U_ZERO_ERROR;
  const int32_t len = u_strToLower(full, 8, src, srcLen, "", &err);
  if (U_SUCCESS(err))
    out.append(full, 0, len);
  else
    out.append(simple);
}

// The normalizer of the CLIP pipeline on non-ASCII text: UTF-8 decoding (each maximal ill-formed
// subsequence becomes U+FFFD, as Python's and Rust's lossy decoders do), NFC, then lower-casing
// when asked. Returns UTF-8.
std::string normalize(std::string_view raw, bool lowerCase) {
  if (raw.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max() / 4))
    throw std::length_error("CLIPTokenizer: text too long (" + std::to_string(raw.size()) +
                            " bytes)");
  const icu::UnicodeString decoded =
      icu::UnicodeString::fromUTF8(icu::StringPiece(raw.data(), static_cast<int32_t>(raw.size())));
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
  icu::UnicodeString text;
  if (U_SUCCESS(err)) text = nfc->normalize(decoded, err);
  if (U_FAILURE(err))
    throw std::runtime_error(std::string("CLIPTokenizer: ICU NFC normalization failed: ") +
                             u_errorName(err));
  if (lowerCase) {
    icu::UnicodeString lower;
    for (int32_t i = 0; i < text.length();) {
      const UChar32 c = text.char32At(i);
      appendLower(lower, c);
      i += U16_LENGTH(c);
    }
    text = std::move(lower);
  }
  std::string out;
  text.toUTF8String(out);
  return out;
}

std::string regexEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// File helpers
// ---------------------------------------------------------------------------------------------
std::string readFile(const std::filesystem::path& p) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) throw ModelFileError(p.string(), "file not found");
  if (std::filesystem::is_directory(p, ec)) throw ModelFileError(p.string(), "is a directory");
  // Regular files only (a FIFO would block), bounded (issue 16).
  return readRegularFile(p.string(), std::uint64_t(1) << 30);
}

nlohmann::json parseJsonFile(const std::filesystem::path& p) {
  const std::string text = readFile(p);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ModelFileError(p.string(), std::string("not valid JSON: ") + e.what());
  }
}

// A special token entry: "<tok>" or {"content": "<tok>", ...}; empty when absent.
std::string tokenString(const nlohmann::json& cfg, const char* key, const std::string& file) {
  if (!cfg.is_object() || !cfg.contains(key) || cfg[key].is_null()) return {};
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  throw ModelFileError(
      file, std::string("\"") + key + "\" must be a string or an object with a \"content\" string");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// CLIPTokenizer
// ---------------------------------------------------------------------------------------------
struct CLIPTokenizer::Impl {
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> idToToken;  // by id; empty strings for ids vocab.json skips
  // (left id << 32 | right id) -> (rank, merged id)
  BpeMerges merges;
  std::array<int64_t, 256> byteId{};     // id of the byte's symbol
  std::array<int64_t, 256> byteEowId{};  // id of the byte's symbol + "</w>"
  std::array<std::string, 256> byteChar;

  std::string bos = "<|startoftext|>", eos = "<|endoftext|>", pad = "<|endoftext|>",
              unk = "<|endoftext|>";
  int64_t bosId = -1, eosId = -1, padId = -1, unkId = -1;
  int modelMaxLength = 77;
  bool lowerCase = true;
  size_t maxTokenBytes = 1;  // the most text bytes one token covers (tokenBudgetPrefix)
  std::vector<std::pair<std::string, int64_t>> specials;  // matched verbatim in the raw text

  std::unique_ptr<UnicodeRegex> splitRe;      // CLIP pre-tokenizer pattern
  std::unique_ptr<UnicodeRegex> byteLevelRe;  // GPT-2 ByteLevel pattern

  BpeWordCache cache;  // the words merged so far

  int64_t lookup(const std::string& tok) const {
    auto it = vocab.find(tok);
    return it == vocab.end() ? unkId : it->second;
  }

  void bpe(std::string_view piece, std::vector<int64_t>& out) const;
  void encodeSegment(std::string_view raw, std::vector<int64_t>& out) const;
};

void CLIPTokenizer::Impl::bpe(std::string_view piece, std::vector<int64_t>& out) const {
  if (piece.empty() || cache.appendTo(piece, out)) return;
  // One symbol a byte; the last byte in its end-of-word form ("</w>").
  std::vector<int64_t> symbols(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    const auto b = static_cast<unsigned char>(piece[i]);
    symbols[i] = i + 1 == piece.size() ? byteEowId[b] : byteId[b];
  }
  std::vector<int64_t> ids = bpeMergeWord(symbols, merges);
  out.insert(out.end(), ids.begin(), ids.end());
  cache.keep(piece, std::move(ids));
}

void CLIPTokenizer::Impl::encodeSegment(std::string_view raw, std::vector<int64_t>& out) const {
  if (raw.empty()) return;
  // Normalizer: NFC, then \s+ -> " " (no effect on the result: the pre-tokenizer drops all
  // whitespace, and lower-casing never creates or removes whitespace), then lower-case.
  std::string text;
  const bool ascii = std::all_of(raw.begin(), raw.end(),
                                 [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  if (ascii) {  // ASCII is NFC already and lower-cases byte by byte
    text.assign(raw);
    if (lowerCase)
      for (char& c : text)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  } else {
    text = normalize(raw, lowerCase);
  }
  const std::string_view sv(text);
  splitRe->forEachMatch(sv, [&](size_t b, size_t e) {
    const std::string_view piece = sv.substr(b, e - b);
    byteLevelRe->forEachMatch(piece,
                              [&](size_t b2, size_t e2) { bpe(piece.substr(b2, e2 - b2), out); });
  });
}

CLIPTokenizer::CLIPTokenizer(const std::string& folder) : impl_(std::make_unique<Impl>()) {
  namespace fs = std::filesystem;
  Impl& m = *impl_;
  const fs::path dir(folder);
  {
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      throw ModelFileError(folder,
                           "tokenizer folder not found (expected vocab.json and merges.txt)");
  }

  // --- tokenizer_config.json / special_tokens_map.json (optional)
  for (const char* name : {"special_tokens_map.json", "tokenizer_config.json"}) {
    const fs::path p = dir / name;
    std::error_code ec;
    if (!fs::exists(p, ec)) continue;
    const nlohmann::json cfg = parseJsonFile(p);
    if (!cfg.is_object()) throw ModelFileError(p.string(), "expected a JSON object");
    const std::string ps = p.string();
    // Another tokenizer's folder (T5's, Qwen2's) is refused naming the class it declares.
    requireDeclaredAs(
        cfg, "tokenizer_class",
        {"CLIPTokenizer", "CLIPTokenizerFast", "PreTrainedTokenizer", "PreTrainedTokenizerFast"},
        ps);
    if (auto s = tokenString(cfg, "bos_token", ps); !s.empty()) m.bos = s;
    if (auto s = tokenString(cfg, "eos_token", ps); !s.empty()) m.eos = s;
    if (auto s = tokenString(cfg, "pad_token", ps); !s.empty()) m.pad = s;
    if (auto s = tokenString(cfg, "unk_token", ps); !s.empty()) m.unk = s;
    if (cfg.contains("model_max_length") && cfg["model_max_length"].is_number()) {
      const double v = cfg["model_max_length"].get<double>();
      // transformers writes a huge sentinel (1e30) when there is no limit.
      m.modelMaxLength = (v > 0 && v < 1e9) ? static_cast<int>(v) : 1000000000;
    }
    if (cfg.contains("do_lower_case") && cfg["do_lower_case"].is_boolean())
      m.lowerCase = cfg["do_lower_case"].get<bool>();
  }

  // --- vocab.json
  const fs::path vocabPath = dir / "vocab.json";
  {
    const nlohmann::json v = parseJsonFile(vocabPath);
    if (!v.is_object() || v.empty())
      throw ModelFileError(vocabPath.string(),
                           "expected a non-empty JSON object mapping token strings to ids");
    m.vocab.reserve(v.size());
    int64_t maxId = -1;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0)
        throw ModelFileError(vocabPath.string(),
                             "token \"" + it.key() + "\" has no non-negative integer id");
      const int64_t id = it.value().get<int64_t>();
      if (id >= (int64_t(1) << 31))
        throw ModelFileError(vocabPath.string(), "id " + std::to_string(id) + " out of range");
      m.vocab.emplace(it.key(), id);
      maxId = std::max(maxId, id);
    }
    m.idToToken.assign(static_cast<size_t>(maxId + 1), std::string());
    for (const auto& [tok, id] : m.vocab) m.idToToken[static_cast<size_t>(id)] = tok;
  }
  auto specialId = [&](const std::string& tok, const char* what) {
    auto it = m.vocab.find(tok);
    if (it == m.vocab.end())
      throw ModelFileError(vocabPath.string(),
                           std::string(what) + " \"" + tok + "\" is not in the vocabulary");
    return it->second;
  };
  m.bosId = specialId(m.bos, "bos_token");
  m.eosId = specialId(m.eos, "eos_token");
  m.padId = specialId(m.pad, "pad_token");
  m.unkId = specialId(m.unk, "unk_token");
  for (const auto& [tok, id] :
       {std::pair{m.bos, m.bosId}, {m.eos, m.eosId}, {m.pad, m.padId}, {m.unk, m.unkId}}) {
    if (std::none_of(m.specials.begin(), m.specials.end(),
                     [&](const auto& s) { return s.first == tok; }))
      m.specials.emplace_back(tok, id);
  }

  // Each byte-level symbol stands for one byte of text ("</w>" counted too: an upper bound);
  // special tokens are matched verbatim.
  for (const std::string& t : m.idToToken)
    m.maxTokenBytes = std::max(m.maxTokenBytes, utf8CodePoints(t));
  for (const auto& s : m.specials) m.maxTokenBytes = std::max(m.maxTokenBytes, s.first.size());

  // --- byte alphabet
  m.byteChar = gpt2BytesToUnicode();
  for (int b = 0; b < 256; ++b) {
    m.byteId[b] = m.lookup(m.byteChar[b]);
    m.byteEowId[b] = m.lookup(m.byteChar[b] + "</w>");
  }

  // --- merges.txt
  const fs::path mergesPath = dir / "merges.txt";
  {
    const std::string text = readFile(mergesPath);
    const std::string mp = mergesPath.string();
    size_t pos = 0;
    int lineNo = 0;
    int32_t rank = 0;
    m.merges.reserve(50000);
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      std::string_view line(text.data() + pos, end - pos);
      pos = end + 1;
      ++lineNo;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) continue;
      if (lineNo == 1 && line.rfind("#version", 0) == 0) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
          line.find(' ', sp + 1) != std::string_view::npos)
        throw ModelFileError(mp, "line " + std::to_string(lineNo) +
                                     ": expected two tokens separated by one space, got \"" +
                                     std::string(line.substr(0, 80)) + "\"");
      const std::string a(line.substr(0, sp)), b(line.substr(sp + 1));
      const auto ia = m.vocab.find(a), ib = m.vocab.find(b), iab = m.vocab.find(a + b);
      for (const auto& [it, tok] : {std::pair{ia, &a}, {ib, &b}})
        if (it == m.vocab.end())
          throw ModelFileError(mp, "line " + std::to_string(lineNo) + ": token \"" + *tok +
                                       "\" is not in vocab.json");
      if (iab == m.vocab.end())
        throw ModelFileError(mp, "line " + std::to_string(lineNo) + ": merged token \"" + a + b +
                                     "\" is not in vocab.json");
      // The first occurrence of a pair wins (later duplicates have a lower priority).
      m.merges.emplace(bpePairKey(ia->second, ib->second), std::pair{rank, iab->second});
      ++rank;
    }
    if (m.merges.empty()) throw ModelFileError(mp, "no merges found");
  }

  // --- pre-tokenizer patterns. `\s` follows Oniguruma's Unicode White_Space, which (unlike
  // PCRE2 in UCP mode) does not include U+180E MONGOLIAN VOWEL SEPARATOR.
  const std::string sp = "[^\\S\\x{180E}]";                      // whitespace
  const std::string nsp = "[\\S\\x{180E}]";                      // non-whitespace
  const std::string other = "(?:[^\\s\\p{L}\\p{N}]|\\x{180E})";  // not space, letter, number
  m.splitRe = std::make_unique<UnicodeRegex>(regexEscape(m.bos) + "|" + regexEscape(m.eos) +
                                                 "|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|" +
                                                 other + "+",
                                             "CLIPTokenizer");
  m.byteLevelRe =
      std::make_unique<UnicodeRegex>("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?" + other +
                                         "+|" + sp + "+(?!" + nsp + ")|" + sp + "+",
                                     "CLIPTokenizer");
}

CLIPTokenizer::~CLIPTokenizer() = default;
CLIPTokenizer::CLIPTokenizer(CLIPTokenizer&&) noexcept = default;
CLIPTokenizer& CLIPTokenizer::operator=(CLIPTokenizer&&) noexcept = default;

std::vector<int64_t> CLIPTokenizer::encode(const std::string& text) const {
  return encodeBounded(text, kUntruncatedTokenBudget);
}

std::vector<int64_t> CLIPTokenizer::encodeBounded(const std::string& text, size_t maxTokens) const {
  const Impl& m = *impl_;
  // The pre-tokenizer drops whitespace: it does not count towards the budget.
  const std::string kept(tokenBudgetPrefix(text, maxTokens, m.maxTokenBytes, false));
  std::vector<int64_t> ids;
  ids.reserve(kept.size() / 3 + 2);
  ids.push_back(m.bosId);
  encodeAroundSpecials(
      kept, m.specials,
      [&m](std::string_view seg, std::vector<int64_t>& out) { m.encodeSegment(seg, out); }, ids);
  ids.push_back(m.eosId);
  return ids;
}

std::vector<int64_t> CLIPTokenizer::encodePadded(const std::string& text, int max_length) const {
  if (max_length < 2)
    throw std::invalid_argument("CLIPTokenizer::encodePadded: max_length must be >= 2, got " +
                                std::to_string(max_length));
  return truncateAndPad(encodeBounded(text, static_cast<size_t>(max_length)),
                        static_cast<size_t>(max_length), impl_->eosId, impl_->padId);
}

int64_t CLIPTokenizer::bosId() const { return impl_->bosId; }
int64_t CLIPTokenizer::eosId() const { return impl_->eosId; }
int64_t CLIPTokenizer::padId() const { return impl_->padId; }
int64_t CLIPTokenizer::unkId() const { return impl_->unkId; }
int CLIPTokenizer::modelMaxLength() const { return impl_->modelMaxLength; }
size_t CLIPTokenizer::vocabSize() const { return impl_->vocab.size(); }

const std::string& CLIPTokenizer::idToToken(int64_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->idToToken.size() ||
      impl_->idToToken[static_cast<size_t>(id)].empty())
    throw std::out_of_range("CLIPTokenizer::idToToken: no token with id " + std::to_string(id));
  return impl_->idToToken[static_cast<size_t>(id)];
}

}  // namespace dit
