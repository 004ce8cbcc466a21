// Text encoders of FLUX.1: CLIPTextModel (pooled output -> pooled_projections) and
// T5EncoderModel (last hidden state -> prompt_embeds). Numerics follow transformers
// models/clip/modeling_clip.py and models/t5/modeling_t5.py (eval mode, no dropout).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "backend/model_config.h"

namespace dit {

class WeightSource;

/// transformers CLIPTextModel. Weights under "text_model.*" (transformers < 5) or unprefixed (5.x).
class CLIPTextModel {
 public:
  /// Throws ModelFileError on missing tensors or shape mismatch.
  CLIPTextModel(const CLIPTextConfig& cfg, WeightSource& w);
  ~CLIPTextModel();
  /// input_ids int64 [B, L] (L <= max_position_embeddings).
  /// Returns {last_hidden_state [B, L, hidden] , pooled [B, hidden]} in the weights' dtype.
  /// Pooling: legacy configs (eos_token_id == 2) take the position of the largest id (argmax);
  /// otherwise the first position equal to eos_token_id — as transformers does.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& input_ids) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

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
