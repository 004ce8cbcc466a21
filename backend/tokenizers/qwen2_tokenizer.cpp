// Qwen2Tokenizer: see qwen2_tokenizer.h.
#include "backend/tokenizers/qwen2_tokenizer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <nlohmann/json.hpp>
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

nlohmann::json parseJsonFile(const std::filesystem::path& p) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) throw ModelFileError(p.string(), "file not found");
  if (std::filesystem::is_directory(p, ec)) throw ModelFileError(p.string(), "is a directory");
  const std::string text = readRegularFile(p.string(), std::uint64_t(1) << 30);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ModelFileError(p.string(), std::string("not valid JSON: ") + e.what());
  }
}

// "<tok>" or {"content": "<tok>"}; empty when absent / null.
std::string tokenString(const nlohmann::json& cfg, const char* key, const std::string& file) {
  if (!cfg.contains(key) || cfg[key].is_null()) return {};
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  throw ModelFileError(
      file, std::string("\"") + key + "\" must be a string or an object with a \"content\" string");
}

// The Qwen2 pre-tokenizer pattern (transformers tokenization_qwen2.py PRETOKENIZE_REGEX). `\s`
// follows Oniguruma's Unicode White_Space (HF tokenizers' engine), which unlike PCRE2 in UCP mode
// does not include U+180E: written out with that exclusion.
std::string qwen2Pattern() {
  const std::string s = "[^\\S\\x{180E}]", S = "[\\S\\x{180E}]";
  return "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
         "?(?:[^\\s\\p{L}\\p{N}]|"
         "\\x{180E})+[\\r\\n]*|" +
         s + "*[\\r\\n]+|" + s + "+(?!" + S + ")|" + s + "+";
}

// The Qwen3 chat template family (Qwen3 / Qwen3-Instruct tokenizer_config.json): recognised by
// the statements that render one user message and the generation prompt with thinking disabled.
bool isQwen3ChatTemplate(const std::string& t) {
  const char* markers[] = {
      "'<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n'",
      "{%- if add_generation_prompt %}",
      "'<|im_start|>assistant\\n'",
      "enable_thinking is defined and enable_thinking is false",
      "'<think>\\n\\n</think>\\n\\n'",
  };
  return std::all_of(std::begin(markers), std::end(markers),
                     [&](const char* m) { return t.find(m) != std::string::npos; });
}

}  // namespace

struct Qwen2Tokenizer::Impl {
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> idToToken;
  BpeMerges merges;  // (l<<32|r) -> rank, merged
  std::array<int64_t, 256> byteId{};
  std::vector<std::pair<std::string, int64_t>> added;  // every added token
  int64_t padId = -1;
  size_t maxTokenBytes = 1;  // the most text bytes one token covers (tokenBudgetPrefix)
  std::string chatTemplate, configFile;
  std::unique_ptr<UnicodeRegex> splitRe;

  BpeWordCache cache;  // the words merged so far

  void bpe(std::string_view piece, std::vector<int64_t>& out) const;
  void encodeSegment(std::string_view raw, std::vector<int64_t>& out) const;
};

// Byte-level BPE of one pre-token: repeatedly merge the adjacent pair of lowest rank (leftmost
// among equals), as HF tokenizers' BPE::merge_word.
// Byte-level BPE of one pre-token (bpeMergeWord: HF tokenizers' BPE::merge_word).
void Qwen2Tokenizer::Impl::bpe(std::string_view piece, std::vector<int64_t>& out) const {
  if (piece.empty() || cache.appendTo(piece, out)) return;
  std::vector<int64_t> symbols(piece.size());
  for (size_t i = 0; i < piece.size(); ++i)
    symbols[i] = byteId[static_cast<unsigned char>(piece[i])];
  std::vector<int64_t> ids = bpeMergeWord(symbols, merges);
  out.insert(out.end(), ids.begin(), ids.end());
  cache.keep(piece, std::move(ids));
}

void Qwen2Tokenizer::Impl::encodeSegment(std::string_view raw, std::vector<int64_t>& out) const {
  if (raw.empty()) return;
  const bool ascii = std::all_of(raw.begin(), raw.end(),
                                 [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  const std::string text =
      ascii ? std::string(raw) : nfcUtf8(raw, "Qwen2Tokenizer");  // ASCII is NFC
  const std::string_view sv(text);
  splitRe->forEachMatch(sv, [&](size_t b, size_t e) { bpe(sv.substr(b, e - b), out); });
}

Qwen2Tokenizer::Qwen2Tokenizer() : impl_(std::make_unique<Impl>()) {}
Qwen2Tokenizer::~Qwen2Tokenizer() = default;
Qwen2Tokenizer::Qwen2Tokenizer(Qwen2Tokenizer&&) noexcept = default;
Qwen2Tokenizer& Qwen2Tokenizer::operator=(Qwen2Tokenizer&&) noexcept = default;

Qwen2Tokenizer Qwen2Tokenizer::fromFolder(const std::string& folder) {
  namespace fs = std::filesystem;
  Qwen2Tokenizer tok;
  Impl& m = *tok.impl_;
  const fs::path dir(folder);
  {
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      throw ModelFileError(folder,
                           "tokenizer folder not found (expected vocab.json, merges.txt "
                           "and tokenizer_config.json)");
  }

  // --- vocab.json
  const fs::path vocabPath = dir / "vocab.json";
  const std::string vp = vocabPath.string();
  {
    const nlohmann::json v = parseJsonFile(vocabPath);
    if (!v.is_object() || v.empty())
      throw ModelFileError(vp, "expected a non-empty JSON object mapping token strings to ids");
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
          it.value().get<int64_t>() >= (int64_t(1) << 31))
        throw ModelFileError(vp, "token \"" + it.key() + "\" has no id in 0 .. 2^31-1");
      m.vocab.emplace(it.key(), it.value().get<int64_t>());
    }
  }
  auto setToken = [&](int64_t id, const std::string& s) {
    if (static_cast<size_t>(id) >= m.idToToken.size())
      m.idToToken.resize(static_cast<size_t>(id) + 1);
    m.idToToken[static_cast<size_t>(id)] = s;
  };
  for (const auto& [s, id] : m.vocab) setToken(id, s);

  // --- added tokens: tokenizer_config.json added_tokens_decoder, tokenizer.json added_tokens
  const fs::path cfgPath = dir / "tokenizer_config.json";
  m.configFile = cfgPath.string();
  const nlohmann::json cfg = parseJsonFile(cfgPath);
  if (!cfg.is_object()) throw ModelFileError(m.configFile, "expected a JSON object");
  requireDeclaredAs(
      cfg, "tokenizer_class",
      {"Qwen2Tokenizer", "Qwen2TokenizerFast", "PreTrainedTokenizer", "PreTrainedTokenizerFast"},
      m.configFile);
  auto addToken = [&](const std::string& file, int64_t id, const std::string& content) {
    if (content.empty()) throw ModelFileError(file, "an added token has empty content");
    if (id < 0 || id >= (int64_t(1) << 31))
      throw ModelFileError(
          file, "added token \"" + content + "\" has id " + std::to_string(id) + " out of range");
    auto v = m.vocab.find(content);
    if (v != m.vocab.end() && v->second != id)
      throw ModelFileError(file, "added token \"" + content + "\" has id " + std::to_string(id) +
                                     " but vocab.json gives it " + std::to_string(v->second));
    if (static_cast<size_t>(id) < m.idToToken.size() &&
        !m.idToToken[static_cast<size_t>(id)].empty() &&
        m.idToToken[static_cast<size_t>(id)] != content)
      throw ModelFileError(file, "added token \"" + content + "\" reuses id " + std::to_string(id) +
                                     " of \"" + m.idToToken[static_cast<size_t>(id)] + "\"");
    for (const auto& a : m.added)
      if (a.first == content) return;
    m.added.emplace_back(content, id);
    m.vocab.emplace(content, id);
    setToken(id, content);
  };
  if (auto it = cfg.find("added_tokens_decoder"); it != cfg.end() && !it->is_null()) {
    if (!it->is_object())
      throw ModelFileError(m.configFile, "\"added_tokens_decoder\" must be an object");
    for (auto e = it->begin(); e != it->end(); ++e) {
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(e.key(), &used);
        if (used != e.key().size()) id = -1;
      } catch (const std::exception&) {
        id = -1;
      }
      if (id < 0 || !e.value().is_object() || !e.value().contains("content") ||
          !e.value()["content"].is_string())
        throw ModelFileError(m.configFile, "\"added_tokens_decoder\" entry \"" + e.key() +
                                               "\" must map an id to {\"content\": ...}");
      addToken(m.configFile, id, e.value()["content"].get<std::string>());
    }
  }
  const fs::path tjPath = dir / "tokenizer.json";
  std::error_code ec;
  if (fs::exists(tjPath, ec)) {
    const std::string tp = tjPath.string();
    const nlohmann::json tj = parseJsonFile(tjPath);
    if (!tj.is_object()) throw ModelFileError(tp, "expected a JSON object");
    if (auto it = tj.find("added_tokens"); it != tj.end() && !it->is_null()) {
      if (!it->is_array()) throw ModelFileError(tp, "\"added_tokens\" must be a list");
      for (const auto& a : *it) {
        if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
            !a.contains("content") || !a["content"].is_string())
          throw ModelFileError(tp, "an \"added_tokens\" entry lacks an integer id or a content");
        addToken(tp, a["id"].get<int64_t>(), a["content"].get<std::string>());
      }
    }
    // The pipeline must be Qwen2's (transformers v5 rebuilds it from the class anyway; refuse
    // a tokenizer.json that says otherwise rather than tokenizing differently from it).
    auto type = [](const nlohmann::json& j) {
      return j.is_object() && j.contains("type") && j["type"].is_string()
                 ? j["type"].get<std::string>()
                 : std::string();
    };
    if (auto it = tj.find("normalizer"); it != tj.end() && !it->is_null() && type(*it) != "NFC")
      throw ModelFileError(tp, "normalizer \"" + type(*it) + "\" is not Qwen2's NFC");
    if (auto it = tj.find("model"); it != tj.end() && !it->is_null() && type(*it) != "BPE")
      throw ModelFileError(tp, "model \"" + type(*it) + "\" is not a BPE model");
    if (auto it = tj.find("pre_tokenizer"); it != tj.end() && !it->is_null()) {
      bool ok = type(*it) == "Sequence" && it->contains("pretokenizers") &&
                (*it)["pretokenizers"].is_array() && (*it)["pretokenizers"].size() == 2;
      if (ok) {
        const auto& split = (*it)["pretokenizers"][0];
        const auto& bl = (*it)["pretokenizers"][1];
        const std::string want =
            "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
            "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
        ok = type(split) == "Split" && split.contains("pattern") && split["pattern"].is_object() &&
             split["pattern"].contains("Regex") && split["pattern"]["Regex"] == want &&
             type(bl) == "ByteLevel" &&
             !(bl.contains("add_prefix_space") && bl["add_prefix_space"] == true);
      }
      if (!ok)
        throw ModelFileError(tp,
                             "pre_tokenizer is not Qwen2's (Split on the Qwen2 pattern, then "
                             "ByteLevel without prefix space)");
    }
  }
  std::sort(m.added.begin(), m.added.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });

  // --- pad token (transformers Qwen2Tokenizer default "<|endoftext|>")
  std::string pad = tokenString(cfg, "pad_token", m.configFile);
  if (pad.empty()) pad = "<|endoftext|>";
  if (auto it = m.vocab.find(pad); it != m.vocab.end())
    m.padId = it->second;
  else
    throw ModelFileError(m.configFile, "pad_token \"" + pad + "\" is not a known token");
  if (auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
    if (!it->is_string())
      throw ModelFileError(
          m.configFile, "\"chat_template\" must be a string (named templates are not supported)");
    m.chatTemplate = it->get<std::string>();
  }

  // --- byte alphabet
  const auto byteChar = gpt2BytesToUnicode();
  for (int b = 0; b < 256; ++b) {
    auto it = m.vocab.find(byteChar[b]);
    if (it == m.vocab.end())
      throw ModelFileError(vp, "byte-level symbol \"" + byteChar[b] + "\" (byte " +
                                   std::to_string(b) + ") is not in the vocabulary");
    m.byteId[b] = it->second;
  }

  // --- merges.txt
  const fs::path mergesPath = dir / "merges.txt";
  const std::string mp = mergesPath.string();
  {
    if (!fs::exists(mergesPath, ec)) throw ModelFileError(mp, "file not found");
    const std::string text = readRegularFile(mp, std::uint64_t(1) << 30);
    size_t pos = 0;
    int lineNo = 0;
    int32_t rank = 0;
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
      for (const auto& [it, t] : {std::pair{ia, &a}, {ib, &b}})
        if (it == m.vocab.end())
          throw ModelFileError(
              mp, "line " + std::to_string(lineNo) + ": token \"" + *t + "\" is not in vocab.json");
      if (iab == m.vocab.end())
        throw ModelFileError(mp, "line " + std::to_string(lineNo) + ": merged token \"" + a + b +
                                     "\" is not in vocab.json");
      m.merges.emplace(bpePairKey(ia->second, ib->second), std::pair{rank, iab->second});
      ++rank;
    }
    if (m.merges.empty()) throw ModelFileError(mp, "no merges found");
  }
  m.splitRe = std::make_unique<UnicodeRegex>(qwen2Pattern(), "Qwen2Tokenizer");
  // Each byte-level symbol stands for one byte of text; added tokens are matched verbatim.
  for (const std::string& t : m.idToToken)
    m.maxTokenBytes = std::max(m.maxTokenBytes, utf8CodePoints(t));
  for (const auto& a : m.added) m.maxTokenBytes = std::max(m.maxTokenBytes, a.first.size());
  return tok;
}

std::string Qwen2Tokenizer::applyChatTemplate(const std::string& prompt,
                                              bool enable_thinking) const {
  const Impl& m = *impl_;
  if (m.chatTemplate.empty())
    throw ModelFileError(m.configFile, "no \"chat_template\": cannot build the Qwen3 prompt");
  if (!isQwen3ChatTemplate(m.chatTemplate))
    throw ModelFileError(
        m.configFile, "unrecognised \"chat_template\" (" + std::to_string(m.chatTemplate.size()) +
                          " characters, starting \"" + m.chatTemplate.substr(0, 60) +
                          "\"): only the Qwen3 chat template is supported");
  // The Qwen3 template adds the empty think block only when enable_thinking is false.
  return "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n" +
         (enable_thinking ? "" : "<think>\n\n</think>\n\n");
}

Qwen2Tokenizer::Encoding Qwen2Tokenizer::encode(const std::string& text, int max_length) const {
  const Impl& m = *impl_;
  Encoding e;
  // Byte-level BPE tokenizes whitespace too: every byte counts towards the budget.
  const std::string kept(tokenBudgetPrefix(
      text, max_length > 0 ? static_cast<size_t>(max_length) : kUntruncatedTokenBudget,
      m.maxTokenBytes, true));
  encodeAroundSpecials(
      kept, m.added,
      [&m](std::string_view seg, std::vector<int64_t>& out) { m.encodeSegment(seg, out); },
      e.input_ids);
  e.untruncated_length = e.input_ids.size();
  if (max_length > 0) {
    const size_t n = std::min(e.input_ids.size(), static_cast<size_t>(max_length));
    e.input_ids.resize(n);
    e.attention_mask.assign(n, 1);
    e.input_ids.resize(static_cast<size_t>(max_length), m.padId);
    e.attention_mask.resize(static_cast<size_t>(max_length), 0);
  } else {
    e.attention_mask.assign(e.input_ids.size(), 1);
  }
  return e;
}

int64_t Qwen2Tokenizer::padId() const { return impl_->padId; }
size_t Qwen2Tokenizer::vocabSize() const { return impl_->idToToken.size(); }

const std::string& Qwen2Tokenizer::idToToken(int64_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->idToToken.size() ||
      impl_->idToToken[static_cast<size_t>(id)].empty())
    throw std::out_of_range("Qwen2Tokenizer::idToToken: no token with id " + std::to_string(id));
  return impl_->idToToken[static_cast<size_t>(id)];
}

}  // namespace dit
