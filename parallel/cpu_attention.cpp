// CPU attention, head by head (see cpu_attention.h).
//
// Compiled with -fno-trapping-math and without the target's precompiled header
// (parallel/CMakeLists.txt), like backend/nn/activations.cpp: the row loops below are plain
// float loops that GCC vectorises in each target clone only without trapping-math semantics.
#include "parallel/cpu_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/cpu_math.h"
#include "parallel/profile_scope.h"

namespace dit {
namespace {

// The row kernels are templates on the vector width W (cpu_math::Lanes), instantiated in three
// functions compiled for AVX-512F (W = 16), AVX2 + FMA (W = 8) and baseline x86-64 (W = 4); the
// widest the CPU runs is chosen once (__builtin_cpu_supports).

// Row maximum of x[0, n): W running maxima in one vector, then folded.
template <int W>
[[gnu::always_inline]] inline float rowMax(const float* x, int64_t n) {
  using F = typename cpu_math::Lanes<W>::F;
  F m = F{} - INFINITY;
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    const F v = cpu_math::loadLanes<F>(x + j);
    m = v > m ? v : m;
  }
  float r = -INFINITY;
  for (int l = 0; l < W; ++l) r = std::max(r, m[l]);
  for (; j < n; ++j) r = std::max(r, x[j]);
  return r;
}

// Vector iterations per block of expShiftSum's blockwise sum.
constexpr int64_t kSumBlockVectors = 32;

// y[j] = exp((x[j] - max) * scale) (x and y may be the same row); returns the sum of y. Summed
// blockwise, as ATen's cascade sum does (a plain running sum of a long row, 5003 keys, carries
// its rounding into every probability: issue 48): W lane sums within a block of
// kSumBlockVectors vectors, the blocks' sums added with Kahan compensation, the lanes folded
// pairwise. No rounding then falls on a sum of more than kSumBlockVectors terms, whatever the
// row's length, at no measurable cost (one compensated add per block): 5003 keys sum within
// about 1e-7 relative at every vector width (3e-7 .. 7e-7 before), 65536 keys within 1e-7
// (0.5e-6 .. 1.9e-6 before).
template <int W>
[[gnu::always_inline]] inline float expShiftSum(const float* x, float* y, int64_t n, float max,
                                                float scale) {
  using F = typename cpu_math::Lanes<W>::F;
  F total = F{}, carry = F{};  // the blocks' sum and its Kahan compensation, per lane
  int64_t j = 0;
  while (j + W <= n) {
    const int64_t end = std::min(n - W, j + (kSumBlockVectors - 1) * W);
    F s = F{};
    for (; j <= end; j += W) {
      const F e = cpu_math::expClampedLanes<W>((cpu_math::loadLanes<F>(x + j) - max) * scale);
      cpu_math::storeLanes(y + j, e);
      s += e;
    }
    const F t = s - carry;
    const F next = total + t;
    carry = (next - total) - t;
    total = next;
  }
  // The lanes folded pairwise (log2 W roundings each, a short dependency chain: short rows
  // cost the same as before), then the tail of fewer than W elements.
  float lanes[W];
  cpu_math::storeLanes(lanes, total - carry);
  for (int w = W / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
  float tail = 0;
  for (; j < n; ++j) {
    const float e = cpu_math::expClamped((x[j] - max) * scale);
    y[j] = e;
    tail += e;
  }
  return lanes[0] + tail;
}

// softmax(s * scale) over each of the `rows` rows of a row-major [rows, n] block (leading
// dimension n), in place. exp is within 2e-7 relative (cpu_math::expClamped); the shifted
// arguments are <= 0, so nothing overflows, and every row sums to 1 within float32 rounding.
template <int W>
[[gnu::always_inline]] inline void softmaxRowsF32(float* s, int64_t rows, int64_t n, float scale) {
  using F = typename cpu_math::Lanes<W>::F;
  for (int64_t i = 0; i < rows; ++i) {
    float* row = s + i * n;
    const float m = rowMax<W>(row, n);
    const float inv = 1.0f / expShiftSum<W>(row, row, n, m, scale);
    int64_t j = 0;
    for (; j + W <= n; j += W) cpu_math::storeLanes(row + j, cpu_math::loadLanes<F>(row + j) * inv);
    for (; j < n; ++j) row[j] *= inv;
  }
}

// The same over bfloat16 scores: each row is widened to float32 in `tmp` (n floats), and the
// probabilities are rounded to bfloat16 once (nearest even).
template <int W>
[[gnu::always_inline]] inline void softmaxRowsBf16(uint16_t* s, int64_t rows, int64_t n,
                                                   float scale, float* tmp) {
  using L = cpu_math::Lanes<W>;
  for (int64_t i = 0; i < rows; ++i) {
    uint16_t* row = s + i * n;
    int64_t j = 0;
    for (; j + W <= n; j += W)
      cpu_math::storeLanes(
          tmp + j, cpu_math::bf16BitsToFloatLanes<W>(cpu_math::loadLanes<typename L::H>(row + j)));
    for (; j < n; ++j) tmp[j] = cpu_math::bf16BitsToFloat(row[j]);
    const float m = rowMax<W>(tmp, n);
    const float inv = 1.0f / expShiftSum<W>(tmp, tmp, n, m, scale);
    for (j = 0; j + W <= n; j += W)
      cpu_math::storeLanes(row + j, cpu_math::floatToBf16BitsLanes<W>(
                                        cpu_math::loadLanes<typename L::F>(tmp + j) * inv));
    for (; j < n; ++j) row[j] = cpu_math::floatToBf16Bits(tmp[j] * inv);
  }
}

__attribute__((target("avx512f"))) void softmaxF32Avx512(float* s, int64_t rows, int64_t n,
                                                         float scale) {
  softmaxRowsF32<16>(s, rows, n, scale);
}
__attribute__((target("avx2,fma"))) void softmaxF32Avx2(float* s, int64_t rows, int64_t n,
                                                        float scale) {
  softmaxRowsF32<8>(s, rows, n, scale);
}
void softmaxF32Base(float* s, int64_t rows, int64_t n, float scale) {
  softmaxRowsF32<4>(s, rows, n, scale);
}
__attribute__((target("avx512f"))) void softmaxBf16Avx512(uint16_t* s, int64_t rows, int64_t n,
                                                          float scale, float* tmp) {
  softmaxRowsBf16<16>(s, rows, n, scale, tmp);
}
__attribute__((target("avx2,fma"))) void softmaxBf16Avx2(uint16_t* s, int64_t rows, int64_t n,
                                                         float scale, float* tmp) {
  softmaxRowsBf16<8>(s, rows, n, scale, tmp);
}
void softmaxBf16Base(uint16_t* s, int64_t rows, int64_t n, float scale, float* tmp) {
  softmaxRowsBf16<4>(s, rows, n, scale, tmp);
}

// The widest instruction set this CPU runs: 2 AVX-512F, 1 AVX2 + FMA, 0 baseline.
int isaLevel() {
  static const int level = __builtin_cpu_supports("avx512f")                                   ? 2
                           : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 1
                                                                                               : 0;
  return level;
}

// The row softmax built for instruction set level `isa` (as isaLevel()); the caller makes sure
// the CPU runs it.
void softmaxRowsF32(float* s, int64_t rows, int64_t n, float scale, int isa = isaLevel()) {
  if (isa == 2) return softmaxF32Avx512(s, rows, n, scale);
  if (isa == 1) return softmaxF32Avx2(s, rows, n, scale);
  softmaxF32Base(s, rows, n, scale);
}

void softmaxRowsBf16(uint16_t* s, int64_t rows, int64_t n, float scale, float* tmp) {
  const int isa = isaLevel();
  if (isa == 2) return softmaxBf16Avx512(s, rows, n, scale, tmp);
  if (isa == 1) return softmaxBf16Avx2(s, rows, n, scale, tmp);
  softmaxBf16Base(s, rows, n, scale, tmp);
}

// Query rows per score block: the block [rows, S_k] in float32 stays within about 1 MiB (L2),
// and never fewer than 32 rows (a GEMM that small would waste more than the cache saves).
int64_t queryBlock(int64_t sq, int64_t sk) {
  constexpr int64_t kBlockBytes = int64_t{1} << 20;
  return std::min(std::max<int64_t>(kBlockBytes / (4 * sk), 32), std::max<int64_t>(sq, 1));
}

}  // namespace

void softmaxRowsCpu(float* rows, int64_t nRows, int64_t n, float scale, int isa) {
  if (isa < 0 || isa > 2 || isa > isaLevel())
    throw std::invalid_argument("softmaxRowsCpu: instruction set level " + std::to_string(isa) +
                                " is not available on this CPU (highest " +
                                std::to_string(isaLevel()) + ")");
  softmaxRowsF32(rows, nRows, n, scale, isa);
}

bool cpuMathAttentionApplies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (!q.device().is_cpu() || !k.device().is_cpu() || !v.device().is_cpu()) return false;
  const auto dt = q.scalar_type();
  if ((dt != at::kFloat && dt != at::kBFloat16) || k.scalar_type() != dt || v.scalar_type() != dt)
    return false;
  if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad()))
    return false;
  return q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(2) >= 1;
}

at::Tensor cpuMathAttention(const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in) {
  if (!cpuMathAttentionApplies(q_in, k_in, v_in))
    throw std::invalid_argument(
        "cpuMathAttention: q, k, v must be 4-D float32 or bfloat16 CPU tensors of one dtype, "
        "with at least one key and no gradient");
  const int64_t B = q_in.size(0), H = q_in.size(1), Sq = q_in.size(2), D = q_in.size(3);
  const int64_t Sk = k_in.size(2), Dv = v_in.size(3);
  if (k_in.size(0) != B || v_in.size(0) != B || k_in.size(1) != H || v_in.size(1) != H ||
      k_in.size(3) != D || v_in.size(2) != Sk)
    throw std::invalid_argument(
        "cpuMathAttention: q [B, H, S_q, D], k and v [B, H, S_k, D] "
        "must agree in B, H, D and S_k");
  // The GEMMs take any row stride but need unit stride along the head dimension.
  auto unitLast = [](const at::Tensor& t) { return t.stride(3) == 1 ? t : t.contiguous(); };
  const at::Tensor q = unitLast(q_in), k = unitLast(k_in), v = unitLast(v_in);
  DIT_PROFILE_SCOPE("dit::attention::cpu_math");  // the copies above count as layout
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));

  at::Tensor out = at::empty({B, Sq, H, Dv}, q.options());  // [B, S_q, H, Dv]
  if (out.numel() == 0) return out.transpose(1, 2);
  // The row softmax over the intra-op threads (the GEMMs around it use the BLAS's own threads).
  auto softmaxRows = [&](at::Tensor& sc) {
    const int64_t rows = sc.numel() / Sk;
    constexpr int64_t kGrainRows = 16;
    if (bf16) {
      auto* p = reinterpret_cast<uint16_t*>(sc.data_ptr<at::BFloat16>());
      at::parallel_for(0, rows, kGrainRows, [&](int64_t r0, int64_t r1) {
        std::vector<float> tmp(static_cast<size_t>(Sk));
        softmaxRowsBf16(p + r0 * Sk, r1 - r0, Sk, scale, tmp.data());
      });
    } else {
      float* p = sc.data_ptr<float>();
      at::parallel_for(0, rows, kGrainRows, [&](int64_t r0, int64_t r1) {
        softmaxRowsF32(p + r0 * Sk, r1 - r0, Sk, scale);
      });
    }
  };
  if (bf16) {
    // bfloat16 GEMMs go to oneDNN, whose per-call cost is high for one head's small products:
    // all heads of a query block at once (batched matmul), scores [H, n, S_k] in bfloat16.
    constexpr int64_t kBatchedScoreBytes = int64_t{16} << 20;
    const int64_t blk = std::min(std::max<int64_t>(kBatchedScoreBytes / (2 * H * Sk), 1), Sq);
    for (int64_t b = 0; b < B; ++b) {
      const at::Tensor kt = k.select(0, b).transpose(1, 2), vb = v.select(0, b);  // [H, D, S_k]
      const at::Tensor ob = out.select(0, b).transpose(0, 1);                     // [H, S_q, Dv]
      for (int64_t s = 0; s < Sq; s += blk) {
        const int64_t n = std::min(blk, Sq - s);
        at::Tensor sc = at::matmul(q.select(0, b).narrow(1, s, n), kt).contiguous();
        softmaxRows(sc);
        ob.narrow(1, s, n).copy_(at::matmul(sc, vb));
      }
    }
    return out.transpose(1, 2);
  }
  const int64_t blk = queryBlock(Sq, Sk);
  at::Tensor scores = at::empty({std::min(blk, Sq), Sk}, q.options());
  for (int64_t b = 0; b < B; ++b) {
    const at::Tensor qb = q.select(0, b), kb = k.select(0, b), vb = v.select(0, b);
    const at::Tensor ob = out.select(0, b);  // [S_q, H, Dv]
    for (int64_t h = 0; h < H; ++h) {
      const at::Tensor qh = qb.select(0, h), kt = kb.select(0, h).t(), vh = vb.select(0, h);
      const at::Tensor oh = ob.select(1, h);  // [S_q, Dv], row stride H * Dv
      for (int64_t s = 0; s < Sq; s += blk) {
        const int64_t n = std::min(blk, Sq - s);
        at::Tensor sc = n == scores.size(0) ? scores : scores.narrow(0, 0, n);
        at::mm_out(sc, qh.narrow(0, s, n), kt);
        softmaxRows(sc);
        at::Tensor os = oh.narrow(0, s, n);
        at::mm_out(os, sc, vh);
      }
    }
  }
  return out.transpose(1, 2);
}

}  // namespace dit
