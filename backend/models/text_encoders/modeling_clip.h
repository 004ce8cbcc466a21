// transformers CLIPTextModel (FLUX.1's first text encoder: pooled output -> pooled_projections).
// Numerics follow transformers models/clip/modeling_clip.py (eval mode, no dropout).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "backend/models/text_encoders/text_encoder_configs.h"

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

}  // namespace dit
