// RMSNorm + RoPE over head vectors in one pass (see qk_norm_rope.h). Compiled like
// activations.cpp (-fno-trapping-math, no precompiled header; backend/CMakeLists.txt) and with
// -fassociative-math -fno-signed-zeros, so that the sum of squares vectorises (summation order is
// all it changes here: the roundings to bfloat16 are bit operations), and -fno-math-errno (the
// square root of a positive sum needs no errno check); each row kernel is built for
// AVX-512F, AVX2 and baseline x86-64 (GCC target clones).
#include "backend/nn/qk_norm_rope.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "parallel/cpu_math.h"

namespace dit::nn {
namespace {

struct Rows {
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

constexpr int kMaxD = 512;

// One head vector: v (float32, D values already widened) -> o (float32, rounded to bfloat16
// where the dtype asks). kBf16: x and out are bfloat16.
template <bool kBf16, int kD>
[[gnu::always_inline]] inline void normRopeRow(float* v, const Rows& a, const float* cs,
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
[[gnu::always_inline]] inline void normRopeAll(const Rows& a) {
  float v[kMaxD], o[kMaxD];
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
[[gnu::always_inline]] inline void normRopeDispatch(const Rows& a) {
  if (a.D == 64) return normRopeAll<kBf16, 64>(a);
  if (a.D == 128) return normRopeAll<kBf16, 128>(a);
  normRopeAll<kBf16, 0>(a);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void normRopeF32(const Rows& a) {
  normRopeDispatch<false>(a);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void normRopeBf16(const Rows& a) {
  normRopeDispatch<true>(a);
}

}  // namespace

bool rmsNormRopeCpuApplies(const at::Tensor& x, const at::Tensor& weight) {
  if (!x.device().is_cpu() || !weight.device().is_cpu() || x.dim() != 4) return false;
  const auto dt = x.scalar_type();
  if (dt != at::kFloat && dt != at::kBFloat16) return false;
  if (weight.scalar_type() != dt && weight.scalar_type() != at::kFloat) return false;
  if (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())) return false;
  return x.size(3) % 2 == 0 && x.size(3) <= kMaxD;
}

void rmsNormRopeCpuOut(const at::Tensor& x, const at::Tensor& weight, double eps,
                       const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& out) {
  auto fail = [](const std::string& why) {
    throw std::invalid_argument("rmsNormRopeCpuOut: " + why);
  };
  if (!rmsNormRopeCpuApplies(x, weight))
    fail("x must be a 4-D float32 or bfloat16 CPU tensor [B, S, H, D] (D even, at most " +
         std::to_string(kMaxD) + ", no gradient) and weight of its dtype or float32");
  const int64_t B = x.size(0), S = x.size(1), H = x.size(2), D = x.size(3);
  if (weight.dim() != 1 || weight.size(0) != D) fail("weight must be [D]");
  if (cos.scalar_type() != at::kFloat || sin.scalar_type() != at::kFloat || !cos.is_cpu() ||
      !sin.is_cpu() || cos.dim() != 2 || cos.sizes() != sin.sizes() || cos.size(0) != S ||
      cos.size(1) != D)
    fail("cos and sin must be float32 CPU tensors [S, D]");
  if (out.sizes() != x.sizes() || out.scalar_type() != x.scalar_type() || !out.is_cpu())
    fail("out must be a CPU tensor of x's shape and dtype");
  if ((D > 1 && (x.stride(3) != 1 || out.stride(3) != 1)))
    fail("x and out need unit stride along the head dimension");
  if (x.numel() == 0) return;
  const at::Tensor wf = weight.to(at::kFloat).contiguous();
  const at::Tensor c = cos.contiguous(), s = sin.contiguous();
  Rows a{static_cast<const char*>(x.data_ptr()),
         x.stride(0),
         x.stride(1),
         x.stride(2),
         static_cast<char*>(out.data_ptr()),
         out.stride(0),
         out.stride(1),
         out.stride(2),
         B,
         S,
         H,
         D,
         wf.data_ptr<float>(),
         weight.scalar_type() == at::kBFloat16,
         c.data_ptr<float>(),
         s.data_ptr<float>(),
         static_cast<float>(eps)};
  if (x.scalar_type() == at::kBFloat16)
    normRopeBf16(a);
  else
    normRopeF32(a);
}

}  // namespace dit::nn
