// MistralTokenizer: see mistral_tokenizer.h.
#include "backend/tokenizers/mistral_tokenizer.h"

#include <unicode/utf8.h>

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

const char* const MistralTokenizer::kFlux2SystemMessage =
    "You are an AI that reasons about image descriptions. You give structured responses focusing "
    "on object relationships, object\nattribution and actions without speculation.";

namespace {

namespace fs = std::filesystem;

nlohmann::json parseJsonFile(const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(p, ec)) throw ModelFileError(p.string(), "file not found");
  if (fs::is_directory(p, ec)) throw ModelFileError(p.string(), "is a directory");
  const std::string text = readRegularFile(p.string(), std::uint64_t(1) << 30);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ModelFileError(p.string(), std::string("not valid JSON: ") + e.what());
  }
}

// "<tok>" or {"content": "<tok>"}; `fallback` when absent / null.
std::string tokenString(const nlohmann::json& cfg, const char* key, const std::string& file,
                        const std::string& fallback) {
  if (!cfg.contains(key) || cfg[key].is_null()) return fallback;
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  throw ModelFileError(
      file, std::string("\"") + key + "\" must be a string or an object with a \"content\" string");
}

// The tekken pre-tokenizer pattern as tokenizer.json spells it.
const char* const kTekkenPattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// The same for PCRE2: `\s` follows Oniguruma's Unicode White_Space (HF tokenizers' engine), which
// unlike PCRE2 in UCP mode does not include U+180E (as qwen2_tokenizer.cpp writes it).
std::string tekkenPcrePattern() {
  const std::string s = "[^\\S\\x{180E}]", S = "[\\S\\x{180E}]";
  return "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
         "|"
         "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
         "|"
         "\\p{N}| ?(?:[^\\s\\p{L}\\p{N}]|\\x{180E})+[\\r\\n/]*|" +
         s + "*[\\r\\n]+|" + s + "+(?!" + S + ")|" + s + "+";
}

// The Mistral Small 3.x chat template (tokenizer/chat_template.jinja): recognised by the
// statements that render the BOS, the system prompt and a user message (string or text blocks).
bool isMistralChatTemplate(const std::string& t) {
  const char* markers[] = {
      "bos_token",
      "'[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]'",
      "messages[0]['content'][0]['text']",
      "'[INST]'",
      "'[/INST]'",
      "block['text']",
  };
  return std::all_of(std::begin(markers), std::end(markers),
                     [&](const char* m) { return t.find(m) != std::string::npos; });
}

// `s` with every maximal ill-formed UTF-8 subsequence replaced by U+FFFD (Python's
// errors="replace"); no normalization.
std::string lenientUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const int32_t n = static_cast<int32_t>(s.size());
  int32_t i = 0;
  while (i < n) {
    const int32_t start = i;
    UChar32 c = 0;
    U8_NEXT(p, i, n, c);
    if (c < 0)
      out += "\xEF\xBF\xBD";
    else
      out.append(s.substr(static_cast<size_t>(start), static_cast<size_t>(i - start)));
  }
  return out;
}

}  // namespace

struct MistralTokenizer::Impl {
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> idToToken;
  BpeMerges merges;  // (l<<32|r) -> rank, merged
  std::array<int64_t, 256> byteId{};
  std::array<std::string, 256> byteChar;
  std::vector<std::pair<std::string, int64_t>> added;  // every added token
  int64_t padId = -1, bosId = -1;
  bool padLeft = false, truncateLeft = false, ignoreMerges = false;
  size_t maxTokenBytes = 1;
  std::string chatTemplate, bosToken;
  std::unique_ptr<UnicodeRegex> splitRe;

  BpeWordCache cache;  // the words merged so far

  void bpe(std::string_view piece, std::vector<int64_t>& out) const;
  void encodeSegment(std::string_view raw, std::vector<int64_t>& out) const;
};

// Byte-level BPE of one pre-token: repeatedly merge the adjacent pair of lowest rank (leftmost
// among equals), as HF tokenizers' BPE::merge_word.
// Byte-level BPE of one pre-token (bpeMergeWord: HF tokenizers' BPE::merge_word).
void MistralTokenizer::Impl::bpe(std::string_view piece, std::vector<int64_t>& out) const {
  if (piece.empty() || cache.appendTo(piece, out)) return;
  std::vector<int64_t> ids;
  if (ignoreMerges) {  // HF BPE: a word already in the vocabulary is one token
    std::string sym;
    for (unsigned char b : piece) sym += byteChar[b];
    if (auto it = vocab.find(sym); it != vocab.end()) ids.push_back(it->second);
  }
  if (ids.empty()) {
    std::vector<int64_t> symbols(piece.size());
    for (size_t i = 0; i < piece.size(); ++i)
      symbols[i] = byteId[static_cast<unsigned char>(piece[i])];
    ids = bpeMergeWord(symbols, merges);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  cache.keep(piece, std::move(ids));
}

void MistralTokenizer::Impl::encodeSegment(std::string_view raw, std::vector<int64_t>& out) const {
  if (raw.empty()) return;
  const std::string text = lenientUtf8(raw);  // no normalizer
  const std::string_view sv(text);
  splitRe->forEachMatch(sv, [&](size_t b, size_t e) { bpe(sv.substr(b, e - b), out); });
}

MistralTokenizer::MistralTokenizer() : impl_(std::make_unique<Impl>()) {}
MistralTokenizer::~MistralTokenizer() = default;
MistralTokenizer::MistralTokenizer(MistralTokenizer&&) noexcept = default;
MistralTokenizer& MistralTokenizer::operator=(MistralTokenizer&&) noexcept = default;

MistralTokenizer MistralTokenizer::fromFolder(const std::string& folder) {
  MistralTokenizer tok;
  Impl& m = *tok.impl_;
  const fs::path dir(folder);
  {
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      throw ModelFileError(folder,
                           "tokenizer folder not found (expected tokenizer.json, "
                           "tokenizer_config.json and chat_template.jinja)");
  }
  auto type = [](const nlohmann::json& j) {
    return j.is_object() && j.contains("type") && j["type"].is_string()
               ? j["type"].get<std::string>()
               : std::string();
  };
  auto setToken = [&](int64_t id, const std::string& s) {
    if (static_cast<size_t>(id) >= m.idToToken.size())
      m.idToToken.resize(static_cast<size_t>(id) + 1);
    m.idToToken[static_cast<size_t>(id)] = s;
  };

  // --- tokenizer.json: the model (vocab, merges), added tokens, the pipeline's steps
  const fs::path tjPath = dir / "tokenizer.json";
  const std::string tp = tjPath.string();
  const nlohmann::json tj = parseJsonFile(tjPath);
  if (!tj.is_object()) throw ModelFileError(tp, "expected a JSON object");
  if (auto it = tj.find("normalizer"); it != tj.end() && !it->is_null())
    throw ModelFileError(
        tp, "normalizer \"" + type(*it) + "\" is set; the tekken tokenizer has none (null)");
  if (auto it = tj.find("pre_tokenizer"); it != tj.end() && !it->is_null()) {
    bool ok = type(*it) == "Sequence" && it->contains("pretokenizers") &&
              (*it)["pretokenizers"].is_array() && (*it)["pretokenizers"].size() == 2;
    if (ok) {
      const auto& split = (*it)["pretokenizers"][0];
      const auto& bl = (*it)["pretokenizers"][1];
      ok = type(split) == "Split" && split.contains("pattern") && split["pattern"].is_object() &&
           split["pattern"].contains("Regex") && split["pattern"]["Regex"] == kTekkenPattern &&
           type(bl) == "ByteLevel" &&
           !(bl.contains("add_prefix_space") && bl["add_prefix_space"] == true);
    }
    if (!ok)
      throw ModelFileError(tp,
                           "pre_tokenizer is not tekken's (Split on the tekken pattern, then "
                           "ByteLevel without prefix space)");
  } else {
    throw ModelFileError(tp, "no pre_tokenizer (the tekken Split + ByteLevel is expected)");
  }
  const auto mit = tj.find("model");
  if (mit == tj.end() || !mit->is_object() || type(*mit) != "BPE")
    throw ModelFileError(
        tp, "model \"" + (mit == tj.end() ? std::string() : type(*mit)) + "\" is not a BPE model");
  const nlohmann::json& model = *mit;
  if (model.contains("byte_fallback") && model["byte_fallback"] == true)
    throw ModelFileError(tp, "model.byte_fallback is true; byte-level BPE has no byte fallback");
  if (model.contains("ignore_merges") && model["ignore_merges"].is_boolean())
    m.ignoreMerges = model["ignore_merges"].get<bool>();
  {
    const auto v = model.find("vocab");
    if (v == model.end() || !v->is_object() || v->empty())
      throw ModelFileError(tp, "model.vocab must be a non-empty object of token -> id");
    for (auto it = v->begin(); it != v->end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
          it.value().get<int64_t>() >= (int64_t(1) << 31))
        throw ModelFileError(tp, "model.vocab token \"" + it.key() + "\" has no id in 0 .. 2^31-1");
      m.vocab.emplace(it.key(), it.value().get<int64_t>());
      setToken(it.value().get<int64_t>(), it.key());
    }
  }
  if (auto it = tj.find("added_tokens"); it != tj.end() && !it->is_null()) {
    if (!it->is_array()) throw ModelFileError(tp, "\"added_tokens\" must be a list");
    for (const auto& a : *it) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string() ||
          a["content"].get<std::string>().empty())
        throw ModelFileError(tp, "an \"added_tokens\" entry lacks an integer id or a content");
      const int64_t id = a["id"].get<int64_t>();
      const std::string content = a["content"].get<std::string>();
      if (id < 0 || id >= (int64_t(1) << 31))
        throw ModelFileError(
            tp, "added token \"" + content + "\" has id " + std::to_string(id) + " out of range");
      if (auto v = m.vocab.find(content); v != m.vocab.end() && v->second != id)
        throw ModelFileError(tp, "added token \"" + content + "\" has id " + std::to_string(id) +
                                     " but model.vocab gives it " + std::to_string(v->second));
      m.added.emplace_back(content, id);
      m.vocab.emplace(content, id);
      setToken(id, content);
    }
  }
  m.byteChar = gpt2BytesToUnicode();
  for (int b = 0; b < 256; ++b) {
    auto it = m.vocab.find(m.byteChar[static_cast<size_t>(b)]);
    if (it == m.vocab.end())
      throw ModelFileError(tp, "byte-level symbol \"" + m.byteChar[static_cast<size_t>(b)] +
                                   "\" (byte " + std::to_string(b) + ") is not in the vocabulary");
    m.byteId[static_cast<size_t>(b)] = it->second;
  }
  {
    const auto mg = model.find("merges");
    if (mg == model.end() || !mg->is_array() || mg->empty())
      throw ModelFileError(tp, "model.merges must be a non-empty list");
    int32_t rank = 0;
    for (const auto& e : *mg) {
      std::string a, b;
      if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else if (e.is_string()) {  // the older "left right" form
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp != std::string::npos && sp > 0 && sp + 1 < s.size() &&
            s.find(' ', sp + 1) == std::string::npos) {
          a = s.substr(0, sp);
          b = s.substr(sp + 1);
        }
      }
      if (a.empty() || b.empty())
        throw ModelFileError(
            tp, "model.merges entry " + std::to_string(rank) + " is not a pair of tokens");
      const auto ia = m.vocab.find(a), ib = m.vocab.find(b), iab = m.vocab.find(a + b);
      for (const auto& [it, t] : {std::pair{ia, &a}, {ib, &b}, {iab, nullptr}})
        if (it == m.vocab.end())
          throw ModelFileError(tp, "model.merges entry " + std::to_string(rank) + ": token \"" +
                                       (t ? *t : a + b) + "\" is not in model.vocab");
      m.merges.emplace(bpePairKey(ia->second, ib->second), std::pair{rank, iab->second});
      ++rank;
    }
  }
  std::sort(m.added.begin(), m.added.end(),
            [](const auto& x, const auto& y) { return x.second < y.second; });

  // --- tokenizer_config.json: the special tokens and the sides
  const fs::path cfgPath = dir / "tokenizer_config.json";
  const std::string cp = cfgPath.string();
  const nlohmann::json cfg = parseJsonFile(cfgPath);
  if (!cfg.is_object()) throw ModelFileError(cp, "expected a JSON object");
  requireDeclaredAs(cfg, "tokenizer_class",
                    {"PreTrainedTokenizerFast", "LlamaTokenizerFast", "LlamaTokenizer",
                     "MistralCommonTokenizer", "TokenizersBackend"},
                    cp);
  m.bosToken = tokenString(cfg, "bos_token", cp, "<s>");
  const std::string pad = tokenString(cfg, "pad_token", cp, "");
  if (pad.empty())
    throw ModelFileError(cp, "no \"pad_token\": padding to max_sequence_length needs one");
  auto tokenId = [&](const char* name, const std::string& t) {
    auto it = m.vocab.find(t);
    if (it == m.vocab.end())
      throw ModelFileError(cp, std::string(name) + " \"" + t + "\" is not a known token");
    return it->second;
  };
  m.bosId = tokenId("bos_token", m.bosToken);
  m.padId = tokenId("pad_token", pad);
  for (const auto& [key, flag] :
       {std::pair{"padding_side", &m.padLeft}, std::pair{"truncation_side", &m.truncateLeft}}) {
    std::string side = "right";  // transformers' default
    getConfigValue(cfg, key, side, cp);
    if (side != "left" && side != "right")
      throw ModelFileError(
          cp, std::string("\"") + key + "\" must be \"left\" or \"right\", got \"" + side + "\"");
    *flag = side == "left";
  }

  // --- the chat template: chat_template.jinja (transformers >= 4.47 saves it apart), else
  // tokenizer_config.json's "chat_template", else chat_template.json's.
  const fs::path jinja = dir / "chat_template.jinja";
  std::error_code ec;
  std::string templateFile;
  if (fs::is_regular_file(jinja, ec)) {
    m.chatTemplate = readRegularFile(jinja.string(), std::uint64_t(1) << 24);
    templateFile = jinja.string();
  } else if (auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
    if (!it->is_string())
      throw ModelFileError(
          cp, "\"chat_template\" must be a string (named templates are not supported)");
    m.chatTemplate = it->get<std::string>();
    templateFile = cp;
  } else if (fs::is_regular_file(dir / "chat_template.json", ec)) {
    const std::string f = (dir / "chat_template.json").string();
    const nlohmann::json ct = parseJsonFile(dir / "chat_template.json");
    if (!ct.is_object() || !ct.contains("chat_template") || !ct["chat_template"].is_string())
      throw ModelFileError(f, "expected {\"chat_template\": \"...\"}");
    m.chatTemplate = ct["chat_template"].get<std::string>();
    templateFile = f;
  }
  if (m.chatTemplate.empty())
    throw ModelFileError(jinja.string(),
                         "no chat template: neither chat_template.jinja nor a \"chat_template\" "
                         "in tokenizer_config.json (FLUX.2 [dev] renders its prompt with the "
                         "Mistral chat template)");
  if (!isMistralChatTemplate(m.chatTemplate))
    throw ModelFileError(templateFile,
                         "unrecognised chat template (" + std::to_string(m.chatTemplate.size()) +
                             " characters, starting \"" + m.chatTemplate.substr(0, 60) +
                             "\"): only the Mistral Small 3.x template is supported");

  m.splitRe = std::make_unique<UnicodeRegex>(tekkenPcrePattern(), "MistralTokenizer");
  for (const std::string& t : m.idToToken)
    m.maxTokenBytes = std::max(m.maxTokenBytes, utf8CodePoints(t));
  for (const auto& a : m.added) m.maxTokenBytes = std::max(m.maxTokenBytes, a.first.size());
  return tok;
}

std::string MistralTokenizer::applyChatTemplate(const std::string& prompt,
                                                const std::string& system_message) const {
  // format_input: prompt.replace("[IMG]", "") (one pass, left to right).
  std::string user;
  user.reserve(prompt.size());
  const std::string img = "[IMG]";
  size_t pos = 0;
  for (size_t f; (f = prompt.find(img, pos)) != std::string::npos; pos = f + img.size())
    user.append(prompt, pos, f - pos);
  user.append(prompt, pos, std::string::npos);
  // The Mistral template with a system message first and one user message of text blocks.
  return impl_->bosToken + "[SYSTEM_PROMPT]" + system_message + "[/SYSTEM_PROMPT][INST]" + user +
         "[/INST]";
}

MistralTokenizer::Encoding MistralTokenizer::encode(const std::string& text, int max_length) const {
  const Impl& m = *impl_;
  Encoding e;
  // Byte-level BPE tokenizes whitespace too: every byte counts towards the budget. Keeping the
  // LAST ids needs the whole text.
  const std::string kept =
      m.truncateLeft && max_length > 0
          ? text
          : std::string(tokenBudgetPrefix(
                text, max_length > 0 ? static_cast<size_t>(max_length) : kUntruncatedTokenBudget,
                m.maxTokenBytes, true));
  std::vector<int64_t> ids;
  encodeAroundSpecials(
      kept, m.added,
      [&m](std::string_view seg, std::vector<int64_t>& out) { m.encodeSegment(seg, out); }, ids);
  e.untruncated_length = ids.size();
  if (max_length <= 0) {
    e.input_ids = std::move(ids);
    e.attention_mask.assign(e.input_ids.size(), 1);
    return e;
  }
  const size_t N = static_cast<size_t>(max_length);
  if (ids.size() > N) {
    if (m.truncateLeft)
      ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(N));
    else
      ids.resize(N);
  }
  const size_t pad = N - ids.size();
  if (m.padLeft) {
    e.input_ids.assign(pad, m.padId);
    e.input_ids.insert(e.input_ids.end(), ids.begin(), ids.end());
    e.attention_mask.assign(pad, 0);
    e.attention_mask.resize(N, 1);
  } else {
    e.input_ids = std::move(ids);
    e.attention_mask.assign(e.input_ids.size(), 1);
    e.input_ids.resize(N, m.padId);
    e.attention_mask.resize(N, 0);
  }
  return e;
}

int64_t MistralTokenizer::padId() const { return impl_->padId; }
int64_t MistralTokenizer::bosId() const { return impl_->bosId; }
bool MistralTokenizer::padsLeft() const { return impl_->padLeft; }
size_t MistralTokenizer::vocabSize() const { return impl_->idToToken.size(); }

const std::string& MistralTokenizer::idToToken(int64_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->idToToken.size() ||
      impl_->idToToken[static_cast<size_t>(id)].empty())
    throw std::out_of_range("MistralTokenizer::idToToken: no token with id " + std::to_string(id));
  return impl_->idToToken[static_cast<size_t>(id)];
}

}  // namespace dit
