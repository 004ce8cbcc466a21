// T5Tokenizer: the SentencePiece (unigram) tokenizer of FLUX.1's T5 text encoder (`tokenizer_2/`).
//
// No Torch here (part of dit_backend_core).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dit {

/// SentencePiece tokenizer that reproduces transformers' `T5TokenizerFast` / `T5Tokenizer` with
/// `legacy: true` (what diffusers' FluxPipeline uses for `tokenizer_2`), using libsentencepiece:
///
///  1. Special tokens (`</s>`, `<pad>`, `<unk>`, `<extra_id_0>` ... `<extra_id_{extra_ids-1}>` and
///     any other `additional_special_tokens`) are matched verbatim in the raw text first
///     (leftmost, then longest) and become their ids; `<extra_id_i>` has id
///     `sentencepiece_size + extra_ids - 1 - i`, as in transformers.
///  2. Every other stretch of text is encoded by the SentencePiece model (its own normalizer,
///     whitespace handling and `▁` dummy prefix, i.e. legacy behaviour).
///  3. `</s>` is appended.
///
/// Known difference from the HF `tokenizers` Unigram that produced the reference ids: where two
/// segmentations have exactly the same score, libsentencepiece may pick the other one (seen once
/// in the goldens: "word111" -> `11`+`1` instead of `1`+`11`). All other ids are identical.
/// encode() is const and thread-safe.
class T5Tokenizer {
 public:
  /// Loads `folder/spiece.model` and, when present, `folder/tokenizer_config.json`
  /// (eos_token, pad_token, unk_token, extra_ids [default 100], additional_special_tokens,
  /// model_max_length [default 512]).
  ///
  /// Throws dit::ModelFileError (a std::runtime_error whose what() is "<file>: <cause>") when
  /// spiece.model is missing, unreadable or not a SentencePiece model, when
  /// tokenizer_config.json is not valid JSON, not an object or declares another tokenizer_class
  /// (naming it), or when eos/pad/unk is not in the model.
  explicit T5Tokenizer(const std::string& folder);
  ~T5Tokenizer();
  T5Tokenizer(T5Tokenizer&&) noexcept;
  T5Tokenizer& operator=(T5Tokenizer&&) noexcept;
  T5Tokenizer(const T5Tokenizer&) = delete;
  T5Tokenizer& operator=(const T5Tokenizer&) = delete;

  /// Ids of `text` followed by `</s>`; no truncation, no padding
  /// (= `tokenizer_2(text).input_ids`), for text up to what kUntruncatedTokenBudget (2048) tokens
  /// can cover: longer text is cut there first (tokenBudgetPrefix). Throws std::runtime_error if
  /// SentencePiece fails.
  std::vector<int64_t> encode(const std::string& text) const;

  /// What FluxPipeline feeds the T5 encoder: encode(text) truncated to `max_length` ids with
  /// `</s>` kept as the last id, then right-padded with padId() (0) to exactly `max_length`
  /// (= `tokenizer_2(text, padding="max_length", max_length=max_length, truncation=True)`).
  /// Only the part of `text` the first max_length tokens can come from is tokenized
  /// (tokenBudgetPrefix in token_split.h). Throws std::invalid_argument when max_length < 1.
  std::vector<int64_t> encodePadded(const std::string& text, int max_length = 512) const;

  int64_t eosId() const;  ///< `</s>`, 1 for T5
  int64_t padId() const;  ///< `<pad>`, 0 for T5
  int64_t unkId() const;  ///< `<unk>`, 2 for T5
  /// `model_max_length` from tokenizer_config.json (512 when absent).
  int modelMaxLength() const;
  /// SentencePiece pieces plus extra ids and other added special tokens.
  size_t vocabSize() const;

 private:
  // encode() of tokenBudgetPrefix(text, maxTokens, ...).
  std::vector<int64_t> encodeBounded(const std::string& text, size_t maxTokens) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dit
