#include "backend/nn/activations.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "backend/nn/fused_rows_kernel.h"
#include "parallel/cpu_math.h"

namespace dit::nn {
namespace {

// The kernels below are plain loops over float / uint16_t arrays that GCC vectorises (this file is
// compiled with -fno-trapping-math, backend/CMakeLists.txt: without it GCC 12 keeps the clamp in
// expClamped as a branch in the AVX2 and baseline clones); each is compiled three times
// (AVX-512F, AVX2, baseline) and the loader picks the best the CPU runs.

// out[i] = x / (1 + exp(-2u)) with 2u = k (x + 0.044715 x^3), k = 2 sqrt(2/pi); exp clamped
// (cpu_math::expClamped), where the result is x or 0 to float precision.
__attribute__((target_clones("avx512f", "avx2", "default"))) void geluTanhF32(
    const float* __restrict in, float* __restrict out, int64_t n) {
  constexpr float k = 1.5957691216057308f, kc = 1.5957691216057308f * 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = in[i];
    out[i] = v / (1.0f + cpu_math::expClamped(-(v * (k + kc * v * v))));
  }
}

}  // namespace

// silu(x) * g = x / (1 + exp(-x)) * g over rows (fused_rows_kernel.h); here, not in
// fused_rows_kernel.cpp, because expClamped's rounding trick needs this file's flags (no
// reassociation).
__attribute__((target_clones("avx512f", "avx2", "default"))) void detail::siluMulRowsF32(
    const FusedRows& a) {
  const int64_t n = a.C;
  for (int64_t r = a.r0; r < a.r1; ++r) {
    const float* __restrict x = a.x + r * a.ldx;
    const float* __restrict g = a.shift + r * a.ldShift;
    float* __restrict y = a.y + r * a.ldy;
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + cpu_math::expClamped(-x[i])) * g[i];
  }
}

namespace {

__attribute__((target_clones("avx512f", "avx2", "default"))) void bf16ToF32(
    const uint16_t* __restrict in, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = cpu_math::bf16BitsToFloat(in[i]);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void f32ToBf16(
    const float* __restrict in, uint16_t* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = cpu_math::floatToBf16Bits(in[i]);
}

}  // namespace

int64_t detail::uniformRowStride(const at::Tensor& t) {
  if (t.dim() == 0) return 1;
  const int64_t n = t.size(-1);
  if (n > 1 && t.stride(-1) != 1) return -1;
  int64_t ld = n, next = -1;
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (next < 0) {
      ld = t.stride(d);
      if (ld < n) return -1;
    } else if (t.stride(d) != next) {
      return -1;
    }
    next = t.stride(d) * t.size(d);
  }
  return ld;
}

namespace {

// out rows [rows, n] with row stride ld (unit stride within a row) <- gelu of xc's rows (row
// stride ldx, unit stride within a row).
void geluTanhRows(const at::Tensor& xc, int64_t ldx, void* outBase, int64_t rows, int64_t n,
                  int64_t ld) {
  constexpr int64_t kGrainRows = 8;
  if (xc.scalar_type() == at::kFloat) {
    const float* a = xc.data_ptr<float>();
    auto* b = static_cast<float*>(outBase);
    at::parallel_for(0, rows, kGrainRows, [&](int64_t r0, int64_t r1) {
      if (ld == n && ldx == n) return geluTanhF32(a + r0 * n, b + r0 * n, (r1 - r0) * n);
      for (int64_t r = r0; r < r1; ++r) geluTanhF32(a + r * ldx, b + r * ld, n);
    });
  } else if (xc.scalar_type() == at::kBFloat16) {
    const auto* a = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
    auto* b = static_cast<uint16_t*>(outBase);
    at::parallel_for(0, rows, kGrainRows, [&](int64_t r0, int64_t r1) {
      constexpr int64_t kBlock = 1024;  // float32 staging that stays in L1
      float in[kBlock], out[kBlock];
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t i = 0; i < n; i += kBlock) {
          const int64_t m = std::min(kBlock, n - i);
          bf16ToF32(a + r * ldx + i, in, m);
          geluTanhF32(in, out, m);
          f32ToBf16(out, b + r * ld + i, m);
        }
    });
  } else {
    throw std::invalid_argument(std::string("geluTanhCpu: dtype ") +
                                c10::toString(xc.scalar_type()) +
                                " (expected float32 or bfloat16)");
  }
}

void checkCpu(const at::Tensor& t, const char* what) {
  if (!t.device().is_cpu())
    throw std::invalid_argument(std::string("geluTanhCpu: ") + what + " is on " + t.device().str() +
                                ", not the CPU");
}

}  // namespace

at::Tensor geluTanhCpu(const at::Tensor& x) {
  checkCpu(x, "the tensor");
  // A strided x whose rows are uniform (a narrow of a fused projection's output) is read in place.
  const int64_t ldx = detail::uniformRowStride(x);
  const at::Tensor xc = ldx >= 0 ? x : x.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t n = xc.dim() == 0 ? 1 : xc.size(-1);
  if (xc.numel() > 0)
    geluTanhRows(xc, ldx >= 0 ? ldx : n, y.data_ptr(), xc.numel() / n, n, n);
  else if (xc.scalar_type() != at::kFloat && xc.scalar_type() != at::kBFloat16)
    geluTanhRows(xc, 1, nullptr, 0, 1, 1);  // the dtype error
  return y;
}

void geluTanhCpuOut(const at::Tensor& x, const at::Tensor& out) {
  checkCpu(x, "the input");
  checkCpu(out, "the output");
  if (out.sizes() != x.sizes() || out.scalar_type() != x.scalar_type() || x.dim() < 1)
    throw std::invalid_argument("geluTanhCpuOut: out must have x's shape and dtype (x " +
                                std::string(c10::toString(x.scalar_type())) + ", out " +
                                c10::toString(out.scalar_type()) + ")");
  if (x.numel() == 0) return;
  const int64_t ld = detail::uniformRowStride(out);
  if (ld < 0)
    throw std::invalid_argument(
        "geluTanhCpuOut: out must be rows of unit stride with one row stride (such as a narrow "
        "of a contiguous tensor's last dimension)");
  if (const auto o = at::get_overlap_status(x, out);
      o == at::MemOverlapStatus::Full || o == at::MemOverlapStatus::Partial)
    throw std::invalid_argument("geluTanhCpuOut: out must not overlap x");
  const int64_t ldx = detail::uniformRowStride(x);
  const at::Tensor xc = ldx >= 0 ? x : x.contiguous();
  const int64_t n = x.size(-1);
  geluTanhRows(xc, ldx >= 0 ? ldx : n, out.data_ptr(), x.numel() / n, n, ld);
}

at::Tensor activation(const std::string& name, const at::Tensor& x) {
  if (name == "quick_gelu") return x * at::sigmoid(x * 1.702);
  if (name == "gelu") return at::gelu(x);
  if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast")
    return at::gelu(x, "tanh");
  if (name == "relu") return at::relu(x);
  if (name == "silu" || name == "swish") return at::silu(x);
  throw std::invalid_argument("unsupported activation '" + name + "'");
}

}  // namespace dit::nn
