// What the dual-stream joint-attention families (FLUX.1, FLUX.2 [klein]) share in their
// FamilyRuntime (backend/family_runtime_record.h): the bench's example inputs common to them, and
// the traffic shape read from their transformer config. A family adds only its own inputs (FLUX.1's
// pooled projections, its position ids) and the RowwiseParallel counts of its plan.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>

#include "backend/family_runtime_record.h"
#include "backend/models/diffusion_transformer.h"

namespace dit {

/// The bench inputs every flow-matching dual-stream DiT takes, float32 on the CPU:
/// hidden_states [B, H*W, in_channels] and encoder_hidden_states [B, L, joint_attention_dim],
/// drawn from `gen` in this order: hidden_states, the positive text features, the negative ones
/// (both are drawn, so `gen`'s state afterwards does not depend on `negative`, which picks the
/// one used); timestep [B] = 0.75; guidance [B] = 3.5 when `guidance_embeds`. `gen` goes on to
/// draw the family's own random inputs.
inline TransformerInputs dualStreamExampleInputs(at::Generator& gen, const BenchShape& sh,
                                                 int64_t in_channels, int64_t joint_attention_dim,
                                                 bool guidance_embeds, bool negative) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const int64_t B = sh.batch, L = sh.text_tokens;
  at::Tensor hs = at::randn({B, sh.imageTokens(), in_channels}, gen, f32);
  at::Tensor encPos = at::randn({B, L, joint_attention_dim}, gen, f32);
  at::Tensor encNeg = at::randn({B, L, joint_attention_dim}, gen, f32);
  TransformerInputs in{{"hidden_states", hs},
                       {"encoder_hidden_states", negative ? encNeg : encPos},
                       {"timestep", at::full({B}, 0.75, f32)}};
  if (guidance_embeds) in["guidance"] = at::full({B}, 3.5, f32);
  return in;
}

/// The traffic shape of a transformer config with num_layers, num_single_layers,
/// num_attention_heads, attention_head_dim and out_channels (FluxTransformerConfig,
/// Flux2TransformerConfig), with its plan's RowwiseParallel outputs per stream of a double block
/// and per single block.
template <class TransformerConfig>
DualStreamTrafficShape dualStreamTrafficShape(const TransformerConfig& c,
                                              int64_t rowwise_per_stream,
                                              int64_t rowwise_per_single) {
  DualStreamTrafficShape m;
  m.num_layers = c.num_layers;
  m.num_single_layers = c.num_single_layers;
  m.rowwise_per_stream = rowwise_per_stream;
  m.rowwise_per_single = rowwise_per_single;
  m.heads = c.num_attention_heads;
  m.head_dim = c.attention_head_dim;
  m.out_channels = c.out_channels;
  return m;
}

}  // namespace dit
