// Model facts (FamilySpec::facts, backend/models/family.h) that every dual-stream DiT family states
// the same way, from its transformer config: the blocks, the attention's heads, the latent
// channels. A family adds its own (name, text encoders, guidance). Torch-free.
#pragma once

#include <cstdint>
#include <string>

#include "backend/models/family.h"

namespace dit {

/// "blocks": "<num_layers> double + <num_single_layers> single".
template <class TransformerConfig>
ModelFact dualStreamBlocksFact(const TransformerConfig& t) {
  return {"blocks", "blocks",
          std::to_string(t.num_layers) + " double + " + std::to_string(t.num_single_layers) +
              " single"};
}

/// "heads": "<heads> heads x <head dim> head dim (inner <inner dim>)".
template <class TransformerConfig>
ModelFact attentionHeadsFact(const TransformerConfig& t) {
  return {"heads", "attention",
          std::to_string(t.num_attention_heads) + " heads x " +
              std::to_string(t.attention_head_dim) + " head dim (inner " +
              std::to_string(t.innerDim()) + ")"};
}

/// "latent_channels": the transformer's in_channels (packed latent channels).
inline ModelFact latentChannelsFact(int64_t in_channels) {
  return {"latent_channels", "latent channels", std::to_string(in_channels)};
}

}  // namespace dit
