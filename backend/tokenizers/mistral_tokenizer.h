// MistralTokenizer: the tekken byte-level BPE tokenizer of Mistral Small 3.x (FLUX.2 [dev]'s
// `tokenizer/` folder, a PixtralProcessor whose tokenizer is a PreTrainedTokenizerFast), with the
// Mistral chat template as diffusers' Flux2Pipeline applies it (format_input + SYSTEM_MESSAGE).
//
// No Torch here (part of dit_backend_core).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dit {

/// Byte-level BPE tokenizer reproducing the HF `tokenizers` pipeline of a tekken tokenizer.json
/// (no normalizer) token for token:
///
///  1. Every added token (tokenizer.json `added_tokens`: `<unk>`, `<s>`, `[INST]`, `<pad>`, ...)
///     is matched verbatim in the raw text first (leftmost, then longest) and becomes its id.
///  2. Every other stretch of text (no normalization: combining marks stay as typed) is
///     pre-tokenized with the tekken pattern `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*
///     [\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+
///     [\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
///     (PCRE2, UTF + UCP; case-aware letter runs, one digit per token).
///  3. Each piece's bytes are mapped to GPT-2's byte-to-unicode alphabet and merged by the rank of
///     tokenizer.json `model.merges` (with `ignore_merges`, a piece that is a whole vocabulary
///     entry is taken as is).
///
/// encode() adds no special tokens: the chat string starts with `<s>`, so transformers'
/// ProcessorMixin.apply_chat_template tokenizes it with add_special_tokens=False (the `<s> $A`
/// post-processor would add a second BOS). Input strings are UTF-8; each maximal ill-formed
/// subsequence is read as one U+FFFD. Thread-safe.
class MistralTokenizer {
 public:
  /// What `tokenizer(text, padding="max_length", truncation=True, max_length=N)` returns with
  /// the folder's padding_side / truncation_side (FLUX.2 [dev]: pad LEFT, truncate right).
  struct Encoding {
    std::vector<int64_t> input_ids;       ///< N ids (or all ids when max_length <= 0)
    std::vector<int64_t> attention_mask;  ///< 1 for real tokens, 0 for padding; same length
    size_t untruncated_length = 0;        ///< ids before truncation / padding (of the text read)
  };

  /// diffusers pipelines/flux2/system_messages.py SYSTEM_MESSAGE (Flux2Pipeline's default).
  static const char* const kFlux2SystemMessage;

  /// Loads a tokenizer folder: `tokenizer.json` (model BPE with `vocab` and `merges`, as lists
  /// or "a b" strings; `added_tokens`; normalizer null; pre_tokenizer the tekken Split +
  /// ByteLevel without prefix space), `tokenizer_config.json` (bos_token, pad_token,
  /// padding_side, truncation_side, tokenizer_class) and the chat template from
  /// `chat_template.jinja`, else `tokenizer_config.json`'s "chat_template", else
  /// `chat_template.json`'s.
  ///
  /// Throws dit::ModelFileError ("<file>: <cause>") when a file is missing or unreadable, invalid
  /// JSON or of the wrong shape, a merge names an unknown token, a byte symbol is missing, the
  /// bos / pad token is unknown, the normalizer / pre-tokenizer / model is not tekken's (naming
  /// what it is), or there is no chat template at all (naming chat_template.jinja and
  /// tokenizer_config.json) or one that is not the Mistral template.
  static MistralTokenizer fromFolder(const std::string& dir);

  ~MistralTokenizer();
  MistralTokenizer(MistralTokenizer&&) noexcept;
  MistralTokenizer& operator=(MistralTokenizer&&) noexcept;
  MistralTokenizer(const MistralTokenizer&) = delete;
  MistralTokenizer& operator=(const MistralTokenizer&) = delete;

  /// diffusers Flux2Pipeline's chat string for one prompt: format_input removes every "[IMG]"
  /// substring of `prompt` (one str.replace pass), builds [system: `system_message`, user:
  /// prompt], and the Mistral template renders it (add_generation_prompt=False) as exactly
  /// bos_token + "[SYSTEM_PROMPT]" + system_message + "[/SYSTEM_PROMPT][INST]" + prompt +
  /// "[/INST]" (special-token text inside the prompt stays text here and becomes special tokens
  /// in encode()).
  std::string applyChatTemplate(const std::string& prompt,
                                const std::string& system_message = kFlux2SystemMessage) const;

  /// Token ids of `text` (no special tokens added). When max_length > 0: truncated to max_length
  /// ids (the first ones with truncation_side "right", the last with "left") and padded with
  /// padId() to exactly max_length on padding_side (left for FLUX.2 [dev]), attention_mask 0 on
  /// the padding; when max_length <= 0: all ids, mask all ones. Only the part of `text` the first
  /// max_length tokens (kUntruncatedTokenBudget when max_length <= 0) can come from is tokenized
  /// (tokenBudgetPrefix); with truncation_side "left" the whole text is read.
  Encoding encode(const std::string& text, int max_length) const;

  /// The pad token's id (`<pad>` for Mistral).
  int64_t padId() const;
  /// The bos token's id (`<s>`).
  int64_t bosId() const;
  /// Whether padding goes on the left (tokenizer_config.json padding_side "left").
  bool padsLeft() const;
  /// Largest id + 1.
  size_t vocabSize() const;
  /// The token string of `id` (byte-level alphabet or added-token text); throws std::out_of_range.
  const std::string& idToToken(int64_t id) const;

 private:
  MistralTokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dit
