#include "backend/nn/activations.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "backend/nn/cpu_math.h"

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

__attribute__((target_clones("avx512f", "avx2", "default"))) void bf16ToF32(
    const uint16_t* __restrict in, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = cpu_math::bf16BitsToFloat(in[i]);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void f32ToBf16(
    const float* __restrict in, uint16_t* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = cpu_math::floatToBf16Bits(in[i]);
}

}  // namespace

at::Tensor geluTanhCpu(const at::Tensor& x) {
  if (!x.device().is_cpu())
    throw std::invalid_argument("geluTanhCpu: the tensor is on " + x.device().str() +
                                ", not the CPU");
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const int64_t n = xc.numel();
  constexpr int64_t kGrain = 16384;
  if (xc.scalar_type() == at::kFloat) {
    const float* a = xc.data_ptr<float>();
    float* b = y.data_ptr<float>();
    at::parallel_for(0, n, kGrain, [&](int64_t s, int64_t e) { geluTanhF32(a + s, b + s, e - s); });
  } else if (xc.scalar_type() == at::kBFloat16) {
    const auto* a = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
    auto* b = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
    at::parallel_for(0, n, kGrain, [&](int64_t s, int64_t e) {
      constexpr int64_t kBlock = 1024;  // float32 staging that stays in L1
      float in[kBlock], out[kBlock];
      for (int64_t i = s; i < e; i += kBlock) {
        const int64_t m = std::min(kBlock, e - i);
        bf16ToF32(a + i, in, m);
        geluTanhF32(in, out, m);
        f32ToBf16(out, b + i, m);
      }
    });
  } else {
    throw std::invalid_argument(std::string("geluTanhCpu: dtype ") +
                                c10::toString(xc.scalar_type()) +
                                " (expected float32 or bfloat16)");
  }
  return y;
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
