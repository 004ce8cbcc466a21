// Row kernels of backend/nn/fused_ops.h (see fused_rows_kernel.h). Torch-free and compiled with
// -fno-trapping-math -fassociative-math -fno-signed-zeros -fno-math-errno -ffp-contract=off
// (backend/CMakeLists.txt), as qk_norm_rope_kernel.cpp: the row sums vectorise (their summation
// order is all that reassociation changes), and no product is fused into an FMA. Each function is
// compiled for AVX-512F, AVX2 and baseline x86-64 (GCC target clones); the loader picks the best
// the CPU runs.
#include "backend/nn/fused_rows_kernel.h"

#include <cmath>
#include <cstdint>

namespace dit::nn::detail {
namespace {

template <class T>
[[gnu::always_inline]] inline T* rowOf(T* base, int64_t ld, int64_t r) {
  return base + r * ld;
}

// The per-batch vector of row r (ld 0: shared by every batch entry).
[[gnu::always_inline]] inline const float* batchRow(const float* v, int64_t ld, int64_t r,
                                                    int64_t rowsPerBatch) {
  return v + (r / rowsPerBatch) * ld;
}

}  // namespace

__attribute__((target_clones("avx512f", "avx2", "default"))) void layerNormModulateRowsF32(
    const FusedRows& a) {
  const int64_t C = a.C;
  const float invC = 1.0f / static_cast<float>(C);
  for (int64_t r = a.r0; r < a.r1; ++r) {
    const float* __restrict x = rowOf(a.x, a.ldx, r);
    float* __restrict y = rowOf(a.y, a.ldy, r);
    const float* __restrict sc = batchRow(a.scale, a.ldScale, r, a.rowsPerBatch);
    const float* __restrict sh = batchRow(a.shift, a.ldShift, r, a.rowsPerBatch);
    float sum = 0;
    for (int64_t i = 0; i < C; ++i) sum += x[i];
    const float mean = sum * invC;
    float ss = 0;
    for (int64_t i = 0; i < C; ++i) {
      const float d = x[i] - mean;
      ss += d * d;
    }
    const float rstd = 1.0f / std::sqrt(ss * invC + a.eps);
    const float bias = -rstd * mean;
    for (int64_t i = 0; i < C; ++i) y[i] = (x[i] * rstd + bias) * (1.0f + sc[i]) + sh[i];
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void rmsNormRowsF32(
    const FusedRows& a) {
  const int64_t C = a.C;
  for (int64_t r = a.r0; r < a.r1; ++r) {
    const float* __restrict x = rowOf(a.x, a.ldx, r);
    float* __restrict y = rowOf(a.y, a.ldy, r);
    float ss = 0;
    for (int64_t i = 0; i < C; ++i) ss += x[i] * x[i];
    const float rs = 1.0f / std::sqrt(ss / static_cast<float>(C) + a.eps);
    const float* __restrict w = a.w;
    if (a.res) {
      const float* __restrict res = rowOf(a.res, a.ldRes, r);
      if (a.gate) {
        const float* __restrict g = batchRow(a.gate, a.ldGate, r, a.rowsPerBatch);
        if (w)
          for (int64_t i = 0; i < C; ++i) y[i] = res[i] + g[i] * ((x[i] * rs) * w[i]);
        else
          for (int64_t i = 0; i < C; ++i) y[i] = res[i] + g[i] * (x[i] * rs);
      } else {
        if (w)
          for (int64_t i = 0; i < C; ++i) y[i] = res[i] + (x[i] * rs) * w[i];
        else
          for (int64_t i = 0; i < C; ++i) y[i] = res[i] + x[i] * rs;
      }
    } else if (a.scale) {
      const float* __restrict s = batchRow(a.scale, a.ldScale, r, a.rowsPerBatch);
      if (w)
        for (int64_t i = 0; i < C; ++i) y[i] = ((x[i] * rs) * w[i]) * s[i];
      else
        for (int64_t i = 0; i < C; ++i) y[i] = (x[i] * rs) * s[i];
    } else {
      if (w)
        for (int64_t i = 0; i < C; ++i) y[i] = (x[i] * rs) * w[i];
      else
        for (int64_t i = 0; i < C; ++i) y[i] = x[i] * rs;
    }
  }
}

}  // namespace dit::nn::detail
