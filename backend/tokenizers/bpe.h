// Byte-level BPE merging and the per-tokenizer word cache shared by CLIPTokenizer,
// Qwen2Tokenizer and MistralTokenizer (HF tokenizers' `BPE::merge_word` and its `Cache`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dit {

/// A BPE merge table: key (left id << 32 | right id as uint32) -> (rank, merged id). Built from
/// merges.txt or tokenizer.json's model.merges; rank = the merge's line (0 = merged first).
using BpeMerges = std::unordered_map<uint64_t, std::pair<int32_t, int64_t>>;

/// The key of the pair (left, right) in a BpeMerges table.
inline uint64_t bpePairKey(int64_t left, int64_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint64_t>(static_cast<uint32_t>(right));
}

/// Merges one pre-tokenized word: `symbols` are its initial ids (one per byte of the word, in
/// the tokenizer's byte alphabet; CLIP's last byte carries its "</w>" form), and the adjacent
/// pair of lowest rank is merged repeatedly (leftmost among equal ranks) until no pair of the
/// table is left, exactly as HF tokenizers' `BPE::merge_word` orders its priority queue.
/// Returns the word's ids. O(n log n) in the word's length; throws only std::bad_alloc.
std::vector<int64_t> bpeMergeWord(const std::vector<int64_t>& symbols, const BpeMerges& merges);

/// The ids of words already merged (HF tokenizers' BPE cache): at most kCapacity words of at
/// most kMaxCachedPieceBytes bytes (token_split.h) each, never evicted. Thread-safe.
class BpeWordCache {
 public:
  static constexpr std::size_t kCapacity = 10000;  // as HF tokenizers' BPE cache
  /// Appends the cached ids of `word` to `out` and returns true; false when not cached.
  bool appendTo(std::string_view word, std::vector<int64_t>& out) const;
  /// Keeps `ids` for `word` when there is room and the word is short enough.
  void keep(std::string_view word, std::vector<int64_t> ids) const;

 private:
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> words_;
};

}  // namespace dit
