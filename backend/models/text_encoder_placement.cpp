#include "backend/models/text_encoder_placement.h"

#include <stdexcept>

namespace dit {

const char* textEncoderPlacementName(TextEncoderPlacement p) {
  switch (p) {
    case TextEncoderPlacement::Sharded:
      return "sharded";
    case TextEncoderPlacement::OwnRank:
      return "own-rank";
    case TextEncoderPlacement::HostStreamed:
      return "host-streamed";
    case TextEncoderPlacement::Once:
      return "once";
  }
  return "sharded";
}

std::vector<std::string> textEncoderPlacementNames() {
  return {"sharded", "own-rank", "host-streamed", "once"};
}

TextEncoderPlacement parseTextEncoderPlacement(const std::string& name) {
  for (TextEncoderPlacement p : {TextEncoderPlacement::Sharded, TextEncoderPlacement::OwnRank,
                                 TextEncoderPlacement::HostStreamed, TextEncoderPlacement::Once})
    if (name == textEncoderPlacementName(p)) return p;
  throw std::invalid_argument("text encoder placement \"" + name +
                              "\" is not one of sharded, own-rank, host-streamed, once");
}

}  // namespace dit
