// Float32 helpers for the project's own CPU kernels (nn::geluTanhCpu, cpuMathAttention).
// Always inlined (GCC 14 does not inline expClamped on its own) and free of branches so that the
// loops calling them vectorise; those loops are compiled per instruction set with GCC target
// clones (AVX-512F, AVX2, baseline x86-64) in a file built with -fno-trapping-math.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace dit::cpu_math {

/// exp(z) in float32 for z clamped to [-87, 88] (below: about 1.6e-38 instead of a smaller value
/// or 0; above: about 1.7e38 instead of a larger value or inf). Follows Cephes expf: z = n ln2 + r
/// with n = round(z / ln2) (the 1.5 * 2^23 rounding trick) and ln2 split in two (Cody-Waite),
/// exp(r) by a degree-6 polynomial, times 2^n built in the exponent bits. Relative error within
/// 2e-7 over the range.
[[gnu::always_inline]] inline float expClamped(float z) {
  // std::max / std::min, one each: GCC 14 keeps a ?: select here as a branch (the loop then
  // stays scalar); GCC 12 if-converts these only under -fno-trapping-math (see the callers).
  z = std::max(z, -87.0f);
  z = std::min(z, 88.0f);
  const float nf = (z * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = z - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(nf) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/// W float32 lanes as GCC vector extensions: W = 16 is one AVX-512 register, 8 one AVX2 register,
/// 4 one SSE register. Kernels are templates on W, instantiated inside functions compiled for the
/// matching instruction set (a wider vector than the target's registers is lowered poorly by GCC).
template <int W>
struct Lanes {
  typedef float F __attribute__((vector_size(4 * W)));
  typedef int32_t I __attribute__((vector_size(4 * W)));
  typedef uint32_t U __attribute__((vector_size(4 * W)));
  typedef uint16_t H __attribute__((vector_size(2 * W)));
};

/// Loads / stores W lanes at any alignment.
template <class V, class T>
[[gnu::always_inline]] inline V loadLanes(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V, class T>
[[gnu::always_inline]] inline void storeLanes(T* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

/// expClamped lane by lane (the same operations, so the same results).
template <int W>
[[gnu::always_inline]] inline typename Lanes<W>::F expClampedLanes(typename Lanes<W>::F z) {
  using F = typename Lanes<W>::F;
  using I = typename Lanes<W>::I;
  const F lo = F{} - 87.0f, hi = F{} + 88.0f, magic = F{} + 12582912.0f;
  z = z < lo ? lo : z;
  z = z > hi ? hi : z;
  const F nf = (z * 1.44269504088896341f + magic) - magic;
  F r = z - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  F p = F{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const I bits = (__builtin_convertvector(nf, I) + 127) << 23;
  F scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/// bfloat16 bits -> float32 on W lanes (exact).
template <int W>
[[gnu::always_inline]] inline typename Lanes<W>::F bf16BitsToFloatLanes(typename Lanes<W>::H h) {
  const typename Lanes<W>::U b = __builtin_convertvector(h, typename Lanes<W>::U) << 16;
  typename Lanes<W>::F f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

/// float32 -> bfloat16 bits on W lanes, rounded to nearest even as floatToBf16Bits (NaN kept).
template <int W>
[[gnu::always_inline]] inline typename Lanes<W>::H floatToBf16BitsLanes(typename Lanes<W>::F f) {
  using U = typename Lanes<W>::U;
  U b;
  std::memcpy(&b, &f, sizeof b);
  const U rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  const U isNan = (b & 0x7FFFFFFFu) > 0x7F800000u;  // all ones or 0
  const U out = (isNan & ((b >> 16) | 0x40u)) | (~isNan & rounded);
  return __builtin_convertvector(out, typename Lanes<W>::H);
}

/// The bits of a float32 (b) rounded to the nearest bfloat16, ties to even: its top 16 bits
/// (meaningless for a NaN; callers keep NaNs apart with isNanBits).
[[gnu::always_inline]] inline uint32_t roundedBf16Bits(uint32_t b) {
  return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
}
/// Whether float32 bits b are a NaN.
[[gnu::always_inline]] inline bool isNanBits(uint32_t b) { return (b & 0x7FFFFFFFu) > 0x7F800000u; }

/// f rounded to the nearest bfloat16 (ties to even), as a float32 (the bits below the top 16
/// cleared); a NaN is returned as is. Branch-free 32-bit integer operations (vectorises fully).
[[gnu::always_inline]] inline float roundToBf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  const uint32_t r = isNanBits(b) ? b : roundedBf16Bits(b) << 16;  // NaN: unchanged
  float o;
  std::memcpy(&o, &r, sizeof o);
  return o;
}

/// The bfloat16 bits of a float32 that already is a bfloat16 value (roundToBf16's result).
[[gnu::always_inline]] inline uint16_t bf16BitsOfRounded(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return static_cast<uint16_t>(b >> 16);
}

/// bfloat16 bits -> float32 (exact).
[[gnu::always_inline]] inline float bf16BitsToFloat(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

/// float32 -> bfloat16 bits, rounded to nearest even as c10::BFloat16's constructor; a NaN stays
/// a (quiet) NaN.
[[gnu::always_inline]] inline uint16_t floatToBf16Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  const uint32_t nan = static_cast<uint32_t>(isNanBits(b));  // 0 or 1
  return static_cast<uint16_t>(nan * ((b >> 16) | 0x40u) + (1u - nan) * roundedBf16Bits(b));
}

}  // namespace dit::cpu_math
