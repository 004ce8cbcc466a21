// CLIPTokenizer: the byte-level BPE tokenizer of FLUX.1's CLIP text encoder (`tokenizer/`).
//
// No Torch here (part of dit_backend_core).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dit {

/// Byte-level BPE tokenizer that reproduces transformers' `CLIPTokenizerFast` (the HF `tokenizers`
/// pipeline that diffusers' FluxPipeline gets from `CLIPTokenizer.from_pretrained`), token for
/// token:
///
///  1. The special tokens (bos `<|startoftext|>`, eos/pad/unk `<|endoftext|>`) are matched
///     verbatim in the raw text first (leftmost, then longest) and become their ids.
///  2. Every other stretch of text is normalized: NFC, `\s+` -> " ", lower-casing (Unicode full
///     lower-case mapping per character; skipped when `do_lower_case` is false).
///  3. Pre-tokenization with the CLIP pattern
///     `<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+`
///     (whitespace between matches is dropped), then the GPT-2 ByteLevel split of each piece;
///     both run on PCRE2 in UTF + UCP mode. `\s` means the Unicode White_Space property, as in
///     the Oniguruma engine HF `tokenizers` uses (PCRE2's `\s` also takes U+180E; we exclude it).
///  4. Each piece's bytes are mapped to GPT-2's byte-to-unicode alphabet, `</w>` is appended to
///     the last symbol and the merges of `merges.txt` are applied by rank. Results are cached per
///     piece (the cache is shared by all threads; encode() is thread-safe).
///
/// Input strings are UTF-8; each maximal ill-formed subsequence is read as one U+FFFD (as Python's
/// and Rust's lossy decoders do).
///
/// Unicode data (NFC, lower-case mappings) comes from the system ICU (Debian 12: ICU 72, Unicode
/// 15.0): NFC is ICU's Normalizer2, lower-casing maps each character on its own (u_tolower, or
/// ICU's full mapping where that is longer, as for U+0130), like Rust's char::to_lowercase.
class CLIPTokenizer {
 public:
  /// Loads a tokenizer folder holding `vocab.json` ({token: id}), `merges.txt` (optional
  /// `#version` line, then one "left right" merge per line, highest priority first) and
  /// optionally `tokenizer_config.json` / `special_tokens_map.json` (bos_token, eos_token,
  /// pad_token, unk_token as strings or {"content": ...}; model_max_length; do_lower_case).
  /// Defaults when absent: CLIP's special tokens, model_max_length 77, do_lower_case true.
  ///
  /// Throws dit::ModelFileError (a std::runtime_error whose what() is "<file>: <cause>") when
  /// vocab.json or merges.txt is missing or unreadable, a JSON file is not valid JSON or has the
  /// wrong shape, a merges.txt line is malformed or names a token that vocab.json lacks, a
  /// special token is not in vocab.json, or tokenizer_config.json declares another
  /// tokenizer_class (naming it).
  explicit CLIPTokenizer(const std::string& folder);
  ~CLIPTokenizer();
  CLIPTokenizer(CLIPTokenizer&&) noexcept;
  CLIPTokenizer& operator=(CLIPTokenizer&&) noexcept;
  CLIPTokenizer(const CLIPTokenizer&) = delete;
  CLIPTokenizer& operator=(const CLIPTokenizer&) = delete;

  /// Token ids of `text` framed as [bos, ..., eos]; no truncation, no padding
  /// (= `tokenizer(text).input_ids`), for text up to what kUntruncatedTokenBudget (2048) tokens
  /// can cover: longer text is cut there first (tokenBudgetPrefix), so memory stays bounded.
  std::vector<int64_t> encode(const std::string& text) const;

  /// What FluxPipeline feeds the CLIP encoder: encode(text) truncated to `max_length` ids with
  /// eos kept as the last id, then right-padded with padId() to exactly `max_length` ids
  /// (= `tokenizer(text, padding="max_length", max_length=max_length, truncation=True)`).
  /// Only the part of `text` the first max_length tokens can come from is tokenized
  /// (tokenBudgetPrefix in token_split.h): time and memory are bounded whatever the text.
  /// Throws std::invalid_argument when max_length < 2.
  std::vector<int64_t> encodePadded(const std::string& text, int max_length = 77) const;

  int64_t bosId() const;
  int64_t eosId() const;
  int64_t padId() const;
  int64_t unkId() const;
  /// `model_max_length` from tokenizer_config.json (77 for CLIP).
  int modelMaxLength() const;
  /// Number of entries of vocab.json.
  size_t vocabSize() const;
  /// The token string of `id` (byte-level alphabet, with `</w>`); throws std::out_of_range.
  const std::string& idToToken(int64_t id) const;

 private:
  // encode() of tokenBudgetPrefix(text, maxTokens, ...).
  std::vector<int64_t> encodeBounded(const std::string& text, size_t maxTokens) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dit
