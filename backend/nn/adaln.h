// Shared adaptive layer norms and modulation of the diffusion transformers (diffusers
// models/normalization.py AdaLayerNormZero / AdaLayerNormZeroSingle / AdaLayerNormContinuous and
// transformer_flux2.py Flux2Modulation). Every form computes linear(silu(temb)); the models
// compute silu(temb) once per forward and pass it in (`silu_temb` [B, C]).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/nn/attention.h"  // LinearPtr

namespace dit {

class WeightLoader;

namespace nn {

/// LayerNorm(x) * (1 + scale) + shift (LayerNorm without affine parameters, eps 1e-6) with [B, C]
/// modulation broadcast over the sequence, as diffusers' AdaLayerNormZero / Continuous compute
/// it. x [B, S, C] -> [B, S, C] in x's dtype. bfloat16/float16 on the CPU (where LibTorch's
/// reduced-precision LayerNorm is slow): the norm and the modulation in float32 with one rounding
/// to x's dtype at the end (at least as accurate as diffusers' three roundings).
at::Tensor layerNormModulate(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift);

/// diffusers AdaLayerNormZero (norm_type "layer_norm", elementwise_affine False, eps 1e-6):
/// linear(silu(temb)) chunked into the six modulation vectors, by their diffusers names.
class AdaLayerNormZero {
 public:
  struct Output {
    at::Tensor norm_hidden_states;  ///< LayerNorm(x) * (1 + scale_msa) + shift_msa, [B, S, C]
    at::Tensor shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp;  ///< each [B, C]
  };
  AdaLayerNormZero() = default;
  /// Loads `<prefix>.linear` [6C, C] (+ bias). Throws ModelFileError (WeightLoader).
  AdaLayerNormZero(WeightLoader& w, const std::string& prefix, int64_t C);
  /// x [B, S, C]; silu_temb [B, C]. `emb`: linear(silu_temb) [B, 6C] when the caller computed it
  /// already (e.g. every block's at once, ColumnParallelLinear::forwardCoalesced); undefined =
  /// computed here.
  Output operator()(const at::Tensor& x, const at::Tensor& silu_temb,
                    const at::Tensor& emb = at::Tensor()) const;
  /// The modulation linear (C -> 6C).
  const LinearPtr& linear() const { return linear_; }

 private:
  LinearPtr linear_;
};

/// diffusers AdaLayerNormZeroSingle: linear(silu(temb)) -> shift_msa, scale_msa, gate_msa.
class AdaLayerNormZeroSingle {
 public:
  struct Output {
    at::Tensor norm_hidden_states;              ///< [B, S, C]
    at::Tensor shift_msa, scale_msa, gate_msa;  ///< each [B, C]
  };
  AdaLayerNormZeroSingle() = default;
  /// Loads `<prefix>.linear` [3C, C] (+ bias).
  AdaLayerNormZeroSingle(WeightLoader& w, const std::string& prefix, int64_t C);
  /// `emb`: linear(silu_temb) [B, 3C] when computed already (as AdaLayerNormZero's).
  Output operator()(const at::Tensor& x, const at::Tensor& silu_temb,
                    const at::Tensor& emb = at::Tensor()) const;
  /// The modulation linear (C -> 3C).
  const LinearPtr& linear() const { return linear_; }

 private:
  LinearPtr linear_;
};

/// diffusers AdaLayerNormContinuous (norm_out; elementwise_affine False, eps 1e-6):
/// emb = linear(silu(conditioning)).to(x.dtype); scale, shift = chunk(2);
/// LayerNorm(x) * (1 + scale) + shift.
class AdaLayerNormContinuous {
 public:
  AdaLayerNormContinuous() = default;
  /// Loads `<prefix>.linear` [2C, C] (+ bias [2C] when `bias`; FLUX.2 has none).
  AdaLayerNormContinuous(WeightLoader& w, const std::string& prefix, int64_t C, bool bias = true);
  /// x [B, S, C], silu_temb [B, C] -> [B, S, C].
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& silu_temb) const;

 private:
  LinearPtr linear_;
};

/// diffusers Flux2Modulation (shared modulation, computed once per forward instead of one
/// AdaLayerNormZero per block): linear(silu(temb)) [B, 3 * sets * C] -> unsqueeze(1) -> `sets`
/// named (shift, scale, gate) triples, each [B, 1, C].
class Modulation {
 public:
  struct Params {
    at::Tensor shift, scale, gate;  ///< each [B, 1, C]
  };
  Modulation() = default;
  /// Loads `<prefix>.linear` [3 * sets * C, C] (no bias when !bias; FLUX.2 has none).
  Modulation(WeightLoader& w, const std::string& prefix, int64_t C, int sets, bool bias = false);
  /// silu_temb [B, C] -> `sets` triples, in set order.
  std::vector<Params> operator()(const at::Tensor& silu_temb) const;
  /// (1 + p.scale) * LayerNorm(x) + p.shift in x's dtype, diffusers' Flux2 op order. x [B, S, C].
  static at::Tensor apply(const at::Tensor& x, const Params& p);

 private:
  LinearPtr linear_;
  int sets_ = 0;
};

}  // namespace nn
}  // namespace dit
