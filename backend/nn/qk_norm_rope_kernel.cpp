// Row kernels of nn::rmsNormRopeCpuOut (see qk_norm_rope.h for the semantics). Torch-free and
// compiled with -fno-trapping-math -fassociative-math -fno-signed-zeros -fno-math-errno
// -ffp-contract=off (backend/CMakeLists.txt): the sum of squares vectorises (summation order is
// all reassociation changes here; the roundings to bfloat16 are bit operations), the square root
// of a positive sum needs no errno check, and no product is fused into an FMA, so every target
// clone (AVX-512F, AVX2, baseline x86-64) gives the same results.
#include "backend/nn/qk_norm_rope_kernel.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "parallel/cpu_math.h"

namespace dit::nn::detail {
namespace {

// One head vector: v (float32, D values already widened) -> o (float32, rounded to bfloat16
// where the dtype asks). kBf16: x and out are bfloat16.
template <bool kBf16, int kD>
[[gnu::always_inline]] inline void normRopeRow(float* v, const NormRopeRows& a, const float* cs,
                                               const float* sn, float* o) {
  const int64_t D = kD > 0 ? kD : a.D;
  float ss = 0;
  for (int64_t i = 0; i < D; ++i) ss += v[i] * v[i];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(D) + a.eps);
  auto round = [](float f) { return cpu_math::roundToBf16(f); };
  if (a.wReduced) {
    for (int64_t i = 0; i < D; ++i) v[i] = round(round(v[i] * r) * a.w[i]);
  } else {
    for (int64_t i = 0; i < D; ++i) v[i] = v[i] * r * a.w[i];
    if (kBf16)
      for (int64_t i = 0; i < D; ++i) v[i] = round(v[i]);
  }
  for (int64_t j = 0; j < D / 2; ++j) {
    const float x0 = v[2 * j], x1 = v[2 * j + 1], c = cs[2 * j], s = sn[2 * j];
    o[2 * j] = x0 * c - x1 * s;
    o[2 * j + 1] = x0 * s + x1 * c;
  }
}

// kD > 0: the head dim as a compile-time constant (64 and 128, FLUX's sizes: the loops unroll
// without run-time trip counts); 0: any D up to kMaxD.
template <bool kBf16, int kD>
[[gnu::always_inline]] inline void normRopeAll(const NormRopeRows& a) {
  float v[kNormRopeMaxD], o[kNormRopeMaxD];
  using T = std::conditional_t<kBf16, uint16_t, float>;
  const int64_t D = kD > 0 ? kD : a.D;
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t s = 0; s < a.S; ++s) {
      const float* cs = a.cs + s * D;
      const float* sn = a.sn + s * D;
      for (int64_t h = 0; h < a.H; ++h) {
        const T* x = reinterpret_cast<const T*>(a.x) + b * a.xs0 + s * a.xs1 + h * a.xs2;
        T* out = reinterpret_cast<T*>(a.out) + b * a.os0 + s * a.os1 + h * a.os2;
        if constexpr (kBf16) {
          for (int64_t i = 0; i < D; ++i) v[i] = cpu_math::bf16BitsToFloat(x[i]);
        } else {
          for (int64_t i = 0; i < D; ++i) v[i] = x[i];
        }
        normRopeRow<kBf16, kD>(v, a, cs, sn, o);
        if constexpr (kBf16) {
          for (int64_t i = 0; i < D; ++i)
            out[i] = cpu_math::bf16BitsOfRounded(cpu_math::roundToBf16(o[i]));
        } else {
          for (int64_t i = 0; i < D; ++i) out[i] = o[i];
        }
      }
    }
}

template <bool kBf16>
[[gnu::always_inline]] inline void normRopeDispatch(const NormRopeRows& a) {
  if (a.D == 64) return normRopeAll<kBf16, 64>(a);
  if (a.D == 128) return normRopeAll<kBf16, 128>(a);
  normRopeAll<kBf16, 0>(a);
}

}  // namespace

__attribute__((target_clones("avx512f", "avx2", "default"))) void normRopeRowsF32(
    const NormRopeRows& a) {
  normRopeDispatch<false>(a);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void normRopeRowsBf16(
    const NormRopeRows& a) {
  normRopeDispatch<true>(a);
}

}  // namespace dit::nn::detail
