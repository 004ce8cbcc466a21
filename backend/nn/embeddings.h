// Shared embeddings of the diffusion transformers (diffusers models/embeddings.py): sinusoidal
// timestep projection (Timesteps), the two-layer MLP embedders (TimestepEmbedding,
// PixArtAlphaTextProjection), n-axis rotary position embeddings (FluxPosEmbed, Flux2PosEmbed) and
// apply_rotary_emb.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/nn/attention.h"  // LinearPtr

namespace dit {

class WeightLoader;

namespace nn {

/// diffusers Timesteps(dim, flip_sin_to_cos=True, downscale_freq_shift=0) (get_timestep_embedding):
/// t [B] (already x 1000, any float dtype) -> float32 [B, dim], cos half first.
at::Tensor timestepProjection(const at::Tensor& t, int64_t dim = 256);

/// diffusers TimestepEmbedding / PixArtAlphaTextProjection(act_fn "silu"):
/// linear_2(silu(linear_1(x))). x [B, in] -> [B, out], compute dtype.
struct MLPEmbed {
  LinearPtr linear_1, linear_2;
  MLPEmbed() = default;
  /// Loads `<prefix>.linear_1` [out, in] and `<prefix>.linear_2` [out, out] (+ biases when
  /// `bias`). Throws ModelFileError for missing/mismatching tensors.
  MLPEmbed(WeightLoader& w, const std::string& prefix, int64_t in, int64_t out, bool bias = true);
  at::Tensor operator()(const at::Tensor& x) const;
};

/// diffusers FluxPosEmbed(theta 10000, axes_dim) and Flux2PosEmbed(theta, axes_dim; FLUX.2:
/// theta 2000, four axes): per-axis rotary tables from the position ids, computed in float64 and
/// cast to float32, each frequency repeated twice (use_real, repeat_interleave_real).
class RotaryPosEmbed {
 public:
  explicit RotaryPosEmbed(std::vector<int> axes_dim = {}, double theta = 10000.0)
      : axes_dim_(std::move(axes_dim)), theta_(theta) {}
  /// ids [S, n_axes] (any real dtype) -> {cos, sin}, each float32 [S, sum(axes_dim)].
  std::pair<at::Tensor, at::Tensor> operator()(const at::Tensor& ids) const;

 private:
  std::vector<int> axes_dim_;
  double theta_ = 10000.0;
};

/// diffusers apply_rotary_emb(use_real=True, use_real_unbind_dim=-1, sequence_dim=1): x [B, S, H,
/// D], cos/sin float32 [S, D] with each value repeated for the pair (2j, 2j+1) -> [B, S, H, D] in
/// x's dtype, computed in float32 as the complex product per pair.
at::Tensor applyRotaryEmb(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace nn
}  // namespace dit
