// T5Tokenizer: see t5_tokenizer.h.
#include "backend/tokenizers/t5_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "backend/io/config_json.h"
#include "backend/io/file_guard.h"
#include "backend/io/safetensors.h"  // dit::ModelFileError
#include "backend/tokenizers/spm_loader.h"
#include "backend/tokenizers/token_split.h"

namespace dit {

struct T5Tokenizer::Impl {
  std::unique_ptr<SentencePieceModel> sp;
  int64_t eosId = 1, padId = 0, unkId = 2;
  int modelMaxLength = 512;
  size_t vocabSize = 0;
  size_t maxTokenBytes = 1;  // the most text bytes one piece covers (tokenBudgetPrefix)
  std::vector<std::pair<std::string, int64_t>> specials;  // matched verbatim in the raw text

  void encodeSegment(std::string_view s, std::vector<int64_t>& out) const {
    if (s.empty()) return;
    const std::vector<int> ids = sp->encode(s);
    out.insert(out.end(), ids.begin(), ids.end());
  }
};

namespace {

std::string readFile(const std::filesystem::path& p) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) throw ModelFileError(p.string(), "file not found");
  // Regular files only (a FIFO would block), bounded (issue 16).
  return readRegularFile(p.string(), std::uint64_t(1) << 30);
}

// A special token entry: "<tok>" or {"content": "<tok>", ...}; empty when absent or malformed.
std::string tokenString(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return {};
}

}  // namespace

T5Tokenizer::T5Tokenizer(const std::string& folder) : impl_(std::make_unique<Impl>()) {
  namespace fs = std::filesystem;
  Impl& m = *impl_;
  const fs::path dir(folder);
  const fs::path modelPath = dir / "spiece.model";
  std::error_code ec;
  if (!fs::exists(modelPath, ec)) throw ModelFileError(modelPath.string(), "file not found");
  if (fs::is_directory(modelPath, ec)) throw ModelFileError(modelPath.string(), "is a directory");
  {
    const std::string bytes = readFile(modelPath);
    if (bytes.rfind("version https://git-lfs", 0) == 0)
      throw ModelFileError(
          modelPath.string(),
          "is a git-lfs pointer file, not the SentencePiece model (run git lfs pull)");
    try {
      m.sp = std::make_unique<SentencePieceModel>(bytes);
    } catch (const std::exception& e) {
      throw ModelFileError(modelPath.string(),
                           std::string("not a valid SentencePiece model: ") + e.what());
    }
  }
  const int pieces = m.sp->pieceSize();
  if (pieces <= 0) throw ModelFileError(modelPath.string(), "SentencePiece model has no pieces");

  std::string eos = "</s>", pad = "<pad>", unk = "<unk>";
  int extraIds = 100;
  std::vector<std::string> additional;
  const fs::path cfgPath = dir / "tokenizer_config.json";
  if (fs::exists(cfgPath, ec)) {
    nlohmann::json cfg;
    try {
      cfg = nlohmann::json::parse(readFile(cfgPath));
    } catch (const nlohmann::json::exception& e) {
      throw ModelFileError(cfgPath.string(), std::string("not valid JSON: ") + e.what());
    }
    if (!cfg.is_object()) throw ModelFileError(cfgPath.string(), "expected a JSON object");
    requireDeclaredAs(
        cfg, "tokenizer_class",
        {"T5Tokenizer", "T5TokenizerFast", "PreTrainedTokenizer", "PreTrainedTokenizerFast"},
        cfgPath.string());
    if (cfg.contains("eos_token")) {
      if (auto s = tokenString(cfg["eos_token"]); !s.empty()) eos = s;
    }
    if (cfg.contains("pad_token")) {
      if (auto s = tokenString(cfg["pad_token"]); !s.empty()) pad = s;
    }
    if (cfg.contains("unk_token")) {
      if (auto s = tokenString(cfg["unk_token"]); !s.empty()) unk = s;
    }
    if (cfg.contains("extra_ids") && cfg["extra_ids"].is_number_integer())
      extraIds = std::max(0, cfg["extra_ids"].get<int>());
    if (cfg.contains("additional_special_tokens") && cfg["additional_special_tokens"].is_array())
      for (const auto& t : cfg["additional_special_tokens"])
        if (auto s = tokenString(t); !s.empty()) additional.push_back(s);
    if (cfg.contains("model_max_length") && cfg["model_max_length"].is_number()) {
      const double v = cfg["model_max_length"].get<double>();
      m.modelMaxLength = (v > 0 && v < 1e9) ? static_cast<int>(v) : 1000000000;
    }
  }

  auto pieceId = [&](const std::string& tok, const char* what) -> int64_t {
    const int id = m.sp->pieceToId(tok);
    if (id < 0 || id >= pieces || (m.sp->idToPiece(id) != tok))
      throw ModelFileError(modelPath.string(),
                           std::string(what) + " \"" + tok + "\" is not a piece of the model");
    return id;
  };
  m.eosId = pieceId(eos, "eos_token");
  m.padId = pieceId(pad, "pad_token");
  m.unkId = pieceId(unk, "unk_token");

  auto addSpecial = [&](const std::string& tok, int64_t id) {
    if (std::none_of(m.specials.begin(), m.specials.end(),
                     [&](const auto& s) { return s.first == tok; }))
      m.specials.emplace_back(tok, id);
  };
  addSpecial(eos, m.eosId);
  addSpecial(pad, m.padId);
  addSpecial(unk, m.unkId);
  for (int i = 0; i < extraIds; ++i)
    addSpecial("<extra_id_" + std::to_string(i) + ">", int64_t(pieces) + extraIds - 1 - i);
  int64_t next = int64_t(pieces) + extraIds;
  for (const std::string& tok : additional) {
    if (std::any_of(m.specials.begin(), m.specials.end(),
                    [&](const auto& s) { return s.first == tok; }))
      continue;
    const int id = m.sp->pieceToId(tok);
    if (id >= 0 && id < pieces && m.sp->idToPiece(id) == tok && id != m.unkId)
      addSpecial(tok, id);
    else
      addSpecial(tok, next++);  // transformers appends unknown added tokens to the vocabulary
  }
  m.vocabSize = static_cast<size_t>(next);
  // A piece covers at most its own bytes of normalized text ("\u2581" stands for one space).
  for (int id = 0; id < pieces; ++id)
    m.maxTokenBytes = std::max(m.maxTokenBytes, m.sp->idToPiece(id).size());
  for (const auto& s : m.specials) m.maxTokenBytes = std::max(m.maxTokenBytes, s.first.size());
}

T5Tokenizer::~T5Tokenizer() = default;
T5Tokenizer::T5Tokenizer(T5Tokenizer&&) noexcept = default;
T5Tokenizer& T5Tokenizer::operator=(T5Tokenizer&&) noexcept = default;

std::vector<int64_t> T5Tokenizer::encode(const std::string& text) const {
  return encodeBounded(text, kUntruncatedTokenBudget);
}

std::vector<int64_t> T5Tokenizer::encodeBounded(const std::string& text, size_t maxTokens) const {
  const Impl& m = *impl_;
  // SentencePiece's normalizer collapses whitespace: it does not count towards the budget.
  const std::string kept(tokenBudgetPrefix(text, maxTokens, m.maxTokenBytes, false));
  std::vector<int64_t> ids;
  ids.reserve(kept.size() / 2 + 1);
  encodeAroundSpecials(
      kept, m.specials,
      [&m](std::string_view seg, std::vector<int64_t>& out) { m.encodeSegment(seg, out); }, ids);
  ids.push_back(m.eosId);
  return ids;
}

std::vector<int64_t> T5Tokenizer::encodePadded(const std::string& text, int max_length) const {
  if (max_length < 1)
    throw std::invalid_argument("T5Tokenizer::encodePadded: max_length must be >= 1, got " +
                                std::to_string(max_length));
  return truncateAndPad(encodeBounded(text, static_cast<size_t>(max_length)),
                        static_cast<size_t>(max_length), impl_->eosId, impl_->padId);
}

int64_t T5Tokenizer::eosId() const { return impl_->eosId; }
int64_t T5Tokenizer::padId() const { return impl_->padId; }
int64_t T5Tokenizer::unkId() const { return impl_->unkId; }
int T5Tokenizer::modelMaxLength() const { return impl_->modelMaxLength; }
size_t T5Tokenizer::vocabSize() const { return impl_->vocabSize; }

}  // namespace dit
