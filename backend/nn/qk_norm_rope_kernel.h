// The row kernels of nn::rmsNormRopeCpuOut (qk_norm_rope.h), Torch-free so that they can be
// compiled with their own floating-point flags (backend/CMakeLists.txt) without those flags
// touching any inline function of the LibTorch headers.
#pragma once

#include <cstdint>

namespace dit::nn::detail {

inline constexpr int kNormRopeMaxD = 512;

/// Head vectors x[b, s, h, :] (element strides xs0/xs1/xs2 over B, S, H; unit stride within a
/// vector) -> out[b, s, h, :] (strides os0/os1/os2), D <= kNormRopeMaxD and even.
struct NormRopeRows {
  const char* x;
  int64_t xs0, xs1, xs2;  // element strides of x over B, S, H
  char* out;
  int64_t os0, os1, os2;
  int64_t B, S, H, D;
  const float* w;   // weight widened to float32 [D]
  bool wReduced;    // weight is bfloat16: round x * r to bfloat16 before the product
  const float* cs;  // cos [S, D]
  const float* sn;  // sin [S, D]
  float eps;
};

/// float32 x and out.
void normRopeRowsF32(const NormRopeRows& a);
/// bfloat16 x and out (their bits as uint16_t).
void normRopeRowsBf16(const NormRopeRows& a);

}  // namespace dit::nn::detail
