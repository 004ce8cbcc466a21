// Pieces shared by CLIPTokenizer and T5Tokenizer (the HF tokenizers "added tokens" behaviour).
#pragma once

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

}  // namespace dit
