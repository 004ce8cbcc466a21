// transformers T5EncoderModel (FLUX.1's second text encoder: last hidden state -> prompt_embeds).
// Numerics follow transformers models/t5/modeling_t5.py (eval mode, no dropout).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "backend/models/text_encoders/text_encoder_configs.h"

namespace dit {

class WeightSource;

/// transformers T5EncoderModel (gated-gelu or relu feed-forward, relative position buckets).
class T5EncoderModel {
 public:
  T5EncoderModel(const T5Config& cfg, WeightSource& w);
  ~T5EncoderModel();
  /// input_ids int64 [B, L] -> last_hidden_state [B, L, d_model] (no attention mask, as
  /// FluxPipeline calls it).
  at::Tensor forward(const at::Tensor& input_ids) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

/// T5's relative position bucket (bidirectional), int64 [q, k] for relative = k - q.
at::Tensor t5RelativePositionBucket(const at::Tensor& relative_position, int num_buckets,
                                    int max_distance);

}  // namespace dit
