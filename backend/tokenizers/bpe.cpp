// Byte-level BPE merging and word cache: see bpe.h.
#include "backend/tokenizers/bpe.h"

#include <functional>
#include <queue>

#include "backend/tokenizers/token_split.h"

namespace dit {

std::vector<int64_t> bpeMergeWord(const std::vector<int64_t>& symbols, const BpeMerges& merges) {
  // Symbols as a doubly linked list over the word.
  struct Sym {
    int64_t id;
    int prev, next;
    bool alive;
  };
  const int n = static_cast<int>(symbols.size());
  std::vector<Sym> syms(symbols.size());
  for (int i = 0; i < n; ++i)
    syms[static_cast<size_t>(i)] = {symbols[static_cast<size_t>(i)], i - 1, i + 1 < n ? i + 1 : -1,
                                    true};
  // Min-heap of candidate merges ordered by (rank, position): the lowest rank wins, leftmost
  // first.
  struct Cand {
    int32_t rank;
    int pos;
    int64_t left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int pos) {
    const Sym& l = syms[static_cast<size_t>(pos)];
    if (l.next < 0) return;
    const int64_t right = syms[static_cast<size_t>(l.next)].id;
    if (auto it = merges.find(bpePairKey(l.id, right)); it != merges.end())
      heap.push({it->second.first, pos, l.id, right, it->second.second});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& l = syms[static_cast<size_t>(c.pos)];
    if (!l.alive || l.id != c.left || l.next < 0) continue;
    Sym& r = syms[static_cast<size_t>(l.next)];
    if (r.id != c.right) continue;
    // Merge r into l.
    l.id = c.merged;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) syms[static_cast<size_t>(r.next)].prev = c.pos;
    if (l.prev >= 0) push(l.prev);
    push(c.pos);
  }
  std::vector<int64_t> ids;
  for (int i = n > 0 ? 0 : -1; i >= 0; i = syms[static_cast<size_t>(i)].next)
    ids.push_back(syms[static_cast<size_t>(i)].id);
  return ids;
}

bool BpeWordCache::appendTo(std::string_view word, std::vector<int64_t>& out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = words_.find(std::string(word));
  if (it == words_.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void BpeWordCache::keep(std::string_view word, std::vector<int64_t> ids) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (words_.size() < kCapacity && word.size() <= kMaxCachedPieceBytes)
    words_.emplace(std::string(word), std::move(ids));
}

}  // namespace dit
