#include "backend/tokenizers/token_split.h"

namespace dit {

void encodeAroundSpecials(
    const std::string& text, const std::vector<std::pair<std::string, int64_t>>& specials,
    const std::function<void(std::string_view, std::vector<int64_t>&)>& encodeSegment,
    std::vector<int64_t>& out) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t best = std::string::npos, bestLen = 0;
    int64_t bestId = -1;
    for (const auto& [tok, id] : specials) {
      const size_t f = text.find(tok, pos);
      if (f == std::string::npos) continue;
      if (f < best || (f == best && tok.size() > bestLen))
        best = f, bestLen = tok.size(), bestId = id;
    }
    if (best == std::string::npos) {
      encodeSegment(std::string_view(text).substr(pos), out);
      return;
    }
    encodeSegment(std::string_view(text).substr(pos, best - pos), out);
    out.push_back(bestId);
    pos = best + bestLen;
  }
}

std::vector<int64_t> truncateAndPad(std::vector<int64_t> ids, size_t length, int64_t eos,
                                    int64_t pad) {
  if (ids.size() > length) {
    ids.resize(length - 1);
    ids.push_back(eos);
  }
  ids.resize(length, pad);
  return ids;
}

}  // namespace dit
