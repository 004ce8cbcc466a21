// The row kernels of backend/nn/fused_ops.h (LayerNorm + modulation, RMSNorm with its modulation
// or gated residual, SwiGLU), Torch-free so that they are compiled with their own floating-point
// flags (backend/CMakeLists.txt) without those flags touching any inline function of LibTorch's
// headers. float32 only; every pointer addresses rows of unit stride.
#pragma once

#include <cstdint>

namespace dit::nn::detail {

/// Rows r in [r0, r1) of a [rows, C] problem. Row r of a tensor t is at t + r * ld_t; per-batch
/// vectors (scale, shift, gate: one row per batch entry) are at v + (r / rowsPerBatch) * ld_v
/// (ld_v 0: one vector for every batch entry).
struct FusedRows {
  int64_t r0 = 0, r1 = 0, C = 0, rowsPerBatch = 1;
  float eps = 1e-6f;
  const float* x = nullptr;  ///< the normalized input
  int64_t ldx = 0;
  float* y = nullptr;  ///< the output
  int64_t ldy = 0;
  const float* w = nullptr;  ///< RMSNorm's weight [C] (null: none)
  /// LayerNorm: scale and shift of (1 + scale) * n + shift (scale holds 1 + scale when onePlus is
  /// false). RMSNorm: mul (scale) multiplies the normalized row; gate multiplies it before the
  /// residual is added.
  const float* scale = nullptr;
  int64_t ldScale = 0;
  const float* shift = nullptr;
  int64_t ldShift = 0;
  const float* gate = nullptr;
  int64_t ldGate = 0;
  const float* res = nullptr;  ///< RMSNorm's residual (null: none)
  int64_t ldRes = 0;
};

/// y = (x - mean) * rstd * (1 + scale) + shift, mean and biased variance over the row, rstd =
/// 1 / sqrt(var + eps) (LayerNorm without affine parameters, diffusers' AdaLayerNormZero /
/// Continuous modulation).
void layerNormModulateRowsF32(const FusedRows& a);

/// n = (x * r) * w (w optional), r = 1 / sqrt(mean(x^2) + eps) (diffusers RMSNorm, float32),
/// then y = n * scale (scale set), or y = res + gate * n (res set; gate optional).
void rmsNormRowsF32(const FusedRows& a);

/// y = silu(x) * g with g at shift (ldShift): x / (1 + exp(-x)) * g (SwiGLU's gate times value).
/// Defined in activations.cpp: its exp (cpu_math::expClamped) rounds with an add-and-subtract
/// trick that -fassociative-math (this header's kernels' flags) would fold away.
void siluMulRowsF32(const FusedRows& a);

}  // namespace dit::nn::detail
