// Qwen2Tokenizer: the byte-level BPE tokenizer of the Qwen2/Qwen3 text encoders (FLUX.2 [klein]'s
// `tokenizer/`), with the Qwen3 chat template that diffusers' Flux2KleinPipeline applies.
//
// No Torch here (part of dit_backend_core).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dit {

/// Byte-level BPE tokenizer reproducing transformers' Qwen2Tokenizer / Qwen2TokenizerFast
/// (transformers models/qwen2/tokenization_qwen2*.py, the HF `tokenizers` pipeline of
/// tokenizer.json) token for token:
///
///  1. Every added token (tokenizer.json `added_tokens`, special or not) is matched verbatim in
///     the raw text first (leftmost, then longest) and becomes its id.
///  2. Every other stretch of text is NFC-normalized (ICU), then pre-tokenized with the Qwen2
///     pattern `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
///     ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+` (PCRE2, UTF + UCP; digits one by one).
///  3. Each piece's bytes are mapped to GPT-2's byte-to-unicode alphabet and merged by the rank of
///     `merges.txt` / tokenizer.json `model.merges`. No BOS/EOS are added.
///
/// Input strings are UTF-8; each maximal ill-formed subsequence is read as one U+FFFD.
/// encode() and applyChatTemplate() are thread-safe.
class Qwen2Tokenizer {
 public:
  /// What `tokenizer(text, padding="max_length", truncation=True, max_length=N)` returns.
  struct Encoding {
    std::vector<int64_t> input_ids;       ///< N ids (or all ids when max_length <= 0)
    std::vector<int64_t> attention_mask;  ///< 1 for real tokens, 0 for padding; same length
    size_t untruncated_length = 0;        ///< ids before truncation / padding (of the text read)
  };

  /// Loads a tokenizer folder: `vocab.json` ({token: id}), `merges.txt` ("#version" line
  /// optional, then "left right" per line, highest priority first), `tokenizer_config.json`
  /// (`added_tokens_decoder`, `pad_token`, `chat_template`) and, when present, `tokenizer.json`
  /// (its `added_tokens` list; its normalizer / pre_tokenizer must be the Qwen2 ones: NFC and the
  /// Qwen2 Split regex + ByteLevel without prefix space). The pad token defaults to
  /// `<|endoftext|>` as in transformers' Qwen2Tokenizer.
  ///
  /// Throws dit::ModelFileError ("<file>: <cause>") when vocab.json or merges.txt is missing or
  /// unreadable, a JSON file is invalid or has the wrong shape, a merge names a token missing
  /// from vocab.json, an added token's id collides with a different vocab entry, the pad token is
  /// unknown, tokenizer.json declares a normalizer / pre-tokenizer / model other than Qwen2's, or
  /// tokenizer_config.json another tokenizer_class (naming it).
  static Qwen2Tokenizer fromFolder(const std::string& dir);

  ~Qwen2Tokenizer();
  Qwen2Tokenizer(Qwen2Tokenizer&&) noexcept;
  Qwen2Tokenizer& operator=(Qwen2Tokenizer&&) noexcept;
  Qwen2Tokenizer(const Qwen2Tokenizer&) = delete;
  Qwen2Tokenizer& operator=(const Qwen2Tokenizer&) = delete;

  /// The checkpoint's chat template rendered for one user message `prompt` with
  /// add_generation_prompt=True and `enable_thinking` (default false, as diffusers'
  /// Flux2KleinPipeline._get_qwen3_prompt_embeds calls `apply_chat_template`; ZImagePipeline
  /// passes true). For the Qwen3 template this is exactly
  /// "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
  /// with enable_thinking false, and without the empty think block with enable_thinking true
  /// (the prompt is pasted verbatim). Only the Qwen3 template family is recognised (no general
  /// Jinja engine): throws ModelFileError naming tokenizer_config.json when the folder has no
  /// chat_template or an unrecognised one.
  std::string applyChatTemplate(const std::string& prompt, bool enable_thinking = false) const;

  /// Token ids of `text` (no special tokens added). When max_length > 0: truncated to the first
  /// max_length ids and right-padded with padId() to exactly max_length, attention_mask 1/0
  /// (= `tokenizer(text, padding="max_length", truncation=True, max_length=max_length)`); when
  /// max_length <= 0: all ids, mask all ones. Only the part of `text` the first max_length
  /// tokens (kUntruncatedTokenBudget = 2048 when max_length <= 0) can come from is tokenized
  /// (tokenBudgetPrefix in token_split.h), so time and memory are bounded whatever the text;
  /// untruncated_length counts the ids of that part.
  Encoding encode(const std::string& text, int max_length) const;

  /// `<|endoftext|>` (pad_token) id.
  int64_t padId() const;
  /// vocab.json entries plus added tokens not in it (largest id + 1).
  size_t vocabSize() const;
  /// The token string of `id` (byte-level alphabet or added-token text); throws std::out_of_range.
  const std::string& idToToken(int64_t id) const;

 private:
  Qwen2Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dit
