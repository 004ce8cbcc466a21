// Pieces shared by CLIPTokenizer, T5Tokenizer and Qwen2Tokenizer (the HF tokenizers "added tokens"
// behaviour, GPT-2's byte alphabet, NFC, PCRE2 pre-tokenizer patterns).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dit {

/// Splits `text` on the special tokens (matched verbatim in the raw text: leftmost match, then the
/// longest), appends each special token's id, and hands the text between them to `encodeSegment`,
/// which appends that segment's ids to `out`.
void encodeAroundSpecials(
    const std::string& text, const std::vector<std::pair<std::string, int64_t>>& specials,
    const std::function<void(std::string_view, std::vector<int64_t>&)>& encodeSegment,
    std::vector<int64_t>& out);

/// What the pipelines do with `padding="max_length", truncation=True`: truncate to `length`
/// keeping `eos` as the last id, then pad with `pad`.
std::vector<int64_t> truncateAndPad(std::vector<int64_t> ids, size_t length, int64_t eos,
                                    int64_t pad);

/// Tokens an untruncated encode (CLIPTokenizer::encode, T5Tokenizer::encode, Qwen2Tokenizer::encode
/// with max_length <= 0) tokenizes at most: more than any pipeline reads (Qwen-Image: 1024 + 34
/// template rows), so counts of dropped tokens stay right up to it.
inline constexpr std::size_t kUntruncatedTokenBudget = 2048;
/// A BPE cache keeps pieces of at most this many bytes (HF tokenizers' MAX_LENGTH): a long word
/// is merged again when it comes back instead of being held for the life of the process.
inline constexpr std::size_t kMaxCachedPieceBytes = 256;

/// The part of `text` a tokenizer reads when only its first `maxTokens` tokens are used (issue
/// 48: a few-MiB one-word prompt made the BPE hold ~300 bytes per prompt byte although the
/// encoders read at most 512 tokens). `maxTokenBytes` is the most text bytes one token of the
/// vocabulary covers (at least 1). `text` is returned whole when it holds at most
/// 3 x (maxTokens + 2) x maxTokenBytes counted bytes (ASCII whitespace counts only when
/// `countWhitespace`: CLIP drops it and T5 collapses it, byte-level Qwen2 tokenizes it, and the
/// whole is at most 8 x that many bytes), else it is cut there, at a UTF-8 character boundary. The
/// kept text then yields at least maxTokens + 2 tokens (each covers at most maxTokenBytes bytes;
/// normalization such as NFC shrinks text at most threefold), so the first maxTokens tokens equal
/// the whole text's, unless the words at the cut merge differently (adversarial text only). Memory
/// and time of tokenizing are then bounded by maxTokens and the vocabulary, whatever the text.
std::string_view tokenBudgetPrefix(std::string_view text, std::size_t maxTokens,
                                   std::size_t maxTokenBytes, bool countWhitespace);
/// The number of code points of UTF-8 `s` (bytes that do not continue a character).
std::size_t utf8CodePoints(std::string_view s);

/// GPT-2's bytes_to_unicode(): the UTF-8 string of the symbol each byte maps to in byte-level BPE
/// vocabularies (printable bytes map to themselves, the others to U+0100 upwards).
std::array<std::string, 256> gpt2BytesToUnicode();

/// `utf8` decoded leniently (each maximal ill-formed subsequence becomes U+FFFD, as Python's and
/// Rust's lossy decoders do) and NFC-normalized with ICU, as UTF-8. Throws std::length_error for
/// text over 512 MiB, std::runtime_error naming `who` when ICU fails.
std::string nfcUtf8(std::string_view utf8, const char* who);

/// A PCRE2 pattern compiled in UTF + UCP mode (JIT when available), for pre-tokenizer splits.
class UnicodeRegex {
 public:
  /// Throws std::runtime_error naming `who` and the offset when the pattern does not compile.
  UnicodeRegex(const std::string& pattern, std::string who);
  ~UnicodeRegex();
  UnicodeRegex(const UnicodeRegex&) = delete;
  UnicodeRegex& operator=(const UnicodeRegex&) = delete;
  /// Calls fn(begin, end) (byte offsets) for every non-overlapping, non-empty match in `s`
  /// (valid UTF-8), left to right. Thread-safe. Throws std::runtime_error when matching fails.
  void forEachMatch(std::string_view s, const std::function<void(size_t, size_t)>& fn) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  std::string who_;
};

}  // namespace dit
