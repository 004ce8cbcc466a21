// Shared feed-forward layers of the diffusion transformers (diffusers models/attention.py
// FeedForward, models/activations.py GELU(approximate="tanh"), transformer_flux2.py
// Flux2FeedForward / Flux2SwiGLU).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "backend/nn/attention.h"  // LinearPtr

namespace dit {

class WeightLoader;

namespace nn {

/// gelu(x, approximate="tanh") in x's dtype, any shape. On the CPU in float32 / bfloat16 without
/// gradients: the vectorised kernel nn::geluTanhCpu (activations.h); training (autograd) and
/// float16 on the CPU: x * sigmoid(2u) in float32 ATen ops, one rounding at the end; other
/// devices: at::gelu.
at::Tensor geluTanh(const at::Tensor& x);

/// diffusers FeedForward(activation_fn "gelu-approximate"): net.0.proj (ColwiseParallel) ->
/// gelu(tanh) -> net.2 (RowwiseParallel). x [B, S, C] -> [B, S, C].
struct FeedForward {
  LinearPtr proj;  ///< net.0.proj (ColwiseParallel in the FLUX plan: weight [M/tp, C])
  LinearPtr out;   ///< net.2 (RowwiseParallel: weight [C, M/tp], all-reduce inside)
  FeedForward() = default;
  /// Loads `<prefix>.net.0.proj` [M, C] and `<prefix>.net.2` [C, M] with biases.
  FeedForward(WeightLoader& w, const std::string& prefix, int64_t C, int64_t M);
  at::Tensor operator()(const at::Tensor& x) const;
};

/// diffusers Flux2FeedForward: linear_in [2M, C] -> Flux2SwiGLU (silu(first half) * second half)
/// -> linear_out [C, M], no biases. Under tp the PackedColwise linear_in gives each rank its rows
/// of both halves, so the local halves still pair up. x [B, S, C] -> [B, S, C].
struct SwiGLUFeedForward {
  LinearPtr linear_in, linear_out;
  SwiGLUFeedForward() = default;
  /// Loads `<prefix>.linear_in` [2M, C] and `<prefix>.linear_out` [C, M] (no biases).
  SwiGLUFeedForward(WeightLoader& w, const std::string& prefix, int64_t C, int64_t M);
  at::Tensor operator()(const at::Tensor& x) const;
};

}  // namespace nn
}  // namespace dit
