// Scaled dot-product attention (see attention.h).
#include "parallel/attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/cpu_attention.h"
#include "parallel/profile_scope.h"
#include "parallel/torch_compat.h"

namespace dit {
namespace {

// Upper bound for one float32 score block [B, H, chunk, S_k] of the math path.
constexpr int64_t kScoreBudgetBytes = int64_t{256} << 20;

std::string shapeStr(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

void checkInputs(const char* fn, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument(std::string(fn) + ": " + what + " (q " + shapeStr(q) + ", k " +
                                shapeStr(k) + ", v " + shapeStr(v) + ")");
  };
  if (!q.defined() || !k.defined() || !v.defined()) fail("undefined tensor");
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) fail("q, k, v must be 4-D [B, H, S, D]");
  if (q.scalar_type() != k.scalar_type() || q.scalar_type() != v.scalar_type())
    fail("q, k, v must share one dtype");
  if (!at::isFloatingType(q.scalar_type())) fail("q, k, v must be floating point");
  if (q.device() != k.device() || q.device() != v.device()) fail("q, k, v must be on one device");
  if (k.size(0) != q.size(0) || v.size(0) != q.size(0) || k.size(1) != q.size(1) ||
      v.size(1) != q.size(1))
    fail("batch and head dimensions must agree");
  if (k.size(3) != q.size(3)) fail("q and k head dims must agree");
  if (v.size(2) != k.size(2)) fail("k and v sequence lengths must agree");
}

int64_t queryChunk(const at::Tensor& q, const at::Tensor& k) {
  const int64_t rowBytes = q.size(0) * q.size(1) * std::max<int64_t>(k.size(2), 1) * 4;
  return std::max<int64_t>(1, kScoreBudgetBytes / std::max<int64_t>(rowBytes, 1));
}

// Float32 math attention with log-sum-exp, chunked over queries.
std::pair<at::Tensor, at::Tensor> mathAttentionWithLseImpl(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v) {
  DIT_PROFILE_SCOPE("dit::attention::math_lse");
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const auto f32 = at::kFloat;
  at::Tensor kt = k.to(f32).transpose(-2, -1);  // [B, H, D, S_k]
  at::Tensor vf = v.to(f32);
  const int64_t sq = q.size(2);
  const int64_t chunk = queryChunk(q, k);
  std::vector<at::Tensor> outs, lses;
  for (int64_t s = 0; s < sq; s += chunk) {
    const int64_t n = std::min(chunk, sq - s);
    at::Tensor qc = q.narrow(2, s, n).to(f32);
    at::Tensor scores = at::matmul(qc, kt).mul_(scale);  // [B, H, n, S_k]
    at::Tensor lse = at::logsumexp(scores, -1);          // [B, H, n]
    scores.sub_(lse.unsqueeze(-1)).exp_();
    outs.push_back(at::matmul(scores, vf));
    lses.push_back(lse);
  }
  at::Tensor out = outs.size() == 1 ? outs[0] : at::cat(outs, 2);
  at::Tensor lse = lses.size() == 1 ? lses[0] : at::cat(lses, 2);
  return {out.to(q.scalar_type()).contiguous(), lse.contiguous()};
}

// Kernels run so far (bit per AttentionKernel), for the benchmark's report.
enum KernelBit : unsigned {
  kMath = 1u << 0,
  kFlashCpu = 1u << 1,
  kFlashCuda = 1u << 2,
  kEfficientCuda = 1u << 3,
  kCudnnCuda = 1u << 4,
  kFusedOther = 1u << 5,
  kMathCpu = 1u << 6,
};
constexpr std::pair<unsigned, const char*> kKernelNames[] = {
    {kMath, "math"},
    {kMathCpu, "math_cpu"},
    {kFlashCpu, "flash_cpu"},
    {kFlashCuda, "flash_cuda"},
    {kEfficientCuda, "efficient_cuda"},
    {kCudnnCuda, "cudnn_cuda"},
    {kFusedOther, "fused_other"},
};
std::atomic<unsigned> g_kernelsUsed{0};

void noteKernel(unsigned bit) { g_kernelsUsed.fetch_or(bit, std::memory_order_relaxed); }

unsigned fusedBit(torch_compat::SdpaBackend b, const at::Tensor& q) {
  using B = torch_compat::SdpaBackend;
  switch (b) {
    case B::Flash:
      return q.is_cpu() ? kFlashCpu : kFlashCuda;
    case B::Efficient:
      return kEfficientCuda;
    case B::Cudnn:
      return kCudnnCuda;
    default:
      return kFusedOther;
  }
}

// The unfused SDPA (LibTorch's math path), chunked over queries to bound the score matrix.
at::Tensor chunkedMathSdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  DIT_PROFILE_SCOPE("dit::attention::chunked_math");
  // LibTorch 1.13's CPU kernels have no float16 matmul/softmax: compute in float32.
  if (q.is_cpu() && q.scalar_type() == at::kHalf)
    return chunkedMathSdpa(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat)).to(at::kHalf);
  const int64_t sq = q.size(2);
  const int64_t chunk = queryChunk(q, k);
  if (chunk >= sq) return torch_compat::sdpa(q, k, v).contiguous();
  std::vector<at::Tensor> outs;
  for (int64_t s = 0; s < sq; s += chunk) {
    const int64_t n = std::min(chunk, sq - s);
    outs.push_back(torch_compat::sdpa(q.narrow(2, s, n), k, v));
  }
  return at::cat(outs, 2);
}

// Fused kernels that return the log-sum-exp (LibTorch 2.x; see torch_compat.h). Returns false
// when none applies (the caller falls back to the math path). A kernel that rejects its inputs
// is not tried again in this process.
std::atomic<bool> g_flashCpuBroken{false};
std::atomic<bool> g_flashCudaBroken{false};
std::atomic<bool> g_efficientBroken{false};

bool fusedAttentionWithLse(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           std::pair<at::Tensor, at::Tensor>& result) {
  if (q.is_cpu()) {
    if (g_flashCpuBroken || torch_compat::sdpaChoice(q, k, v) != torch_compat::SdpaBackend::Flash)
      return false;
    try {
      if (!torch_compat::flashAttentionCpu(q, k, v, result)) return false;
      noteKernel(kFlashCpu);
      return true;
    } catch (const c10::Error&) {
      g_flashCpuBroken = true;
      return false;
    }
  }
  if (!q.is_cuda()) return false;
  const auto dt = q.scalar_type();
  const int64_t d = q.size(3);
  if ((dt == at::kHalf || dt == at::kBFloat16) && d % 8 == 0 && d <= 256 && v.size(3) == d &&
      !g_flashCudaBroken) {
    try {
      if (torch_compat::flashAttentionCuda(q, k, v, result)) {
        noteKernel(kFlashCuda);
        return true;
      }
    } catch (const c10::Error&) {
      g_flashCudaBroken = true;
    }
  }
  if (d % 8 == 0 && !g_efficientBroken) {
    try {
      if (torch_compat::efficientAttentionCuda(q, k, v, result)) {
        noteKernel(kEfficientCuda);
        return true;
      }
    } catch (const c10::Error&) {
      g_efficientBroken = true;
    }
  }
  return false;
}

}  // namespace

std::pair<at::Tensor, at::Tensor> mathAttentionWithLse(const at::Tensor& q, const at::Tensor& k,
                                                       const at::Tensor& v) {
  checkInputs("mathAttentionWithLse", q, k, v);
  const auto lseOpts = q.options().dtype(at::kFloat);
  if (q.size(2) == 0 || q.size(0) == 0 || q.size(1) == 0)
    return {at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, v.options()),
            at::empty({q.size(0), q.size(1), q.size(2)}, lseOpts)};
  if (k.size(2) == 0)
    return {at::zeros({q.size(0), q.size(1), q.size(2), v.size(3)}, v.options()),
            at::full({q.size(0), q.size(1), q.size(2)}, -INFINITY, lseOpts)};
  return mathAttentionWithLseImpl(q, k, v);
}

at::Tensor localAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  checkInputs("localAttention", q, k, v);
  if (q.size(2) == 0 || q.size(0) == 0 || q.size(1) == 0)
    return at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, v.options());
  if (k.size(2) == 0) return at::zeros({q.size(0), q.size(1), q.size(2), v.size(3)}, v.options());
  const auto backend = torch_compat::sdpaChoice(q, k, v);
  if (backend != torch_compat::SdpaBackend::Math) {
    // Fused kernels never materialise the score matrix: no chunking needed.
    noteKernel(fusedBit(backend, q));
    return torch_compat::sdpa(q, k, v).contiguous();
  }
  if (cpuMathAttentionApplies(q, k, v)) {
    // The project's head-by-head CPU kernel: no [B, H, S_q, S_k] scores, no copies of q/k/v.
    noteKernel(kMathCpu);
    return cpuMathAttention(q, k, v);
  }
  noteKernel(kMath);
  return chunkedMathSdpa(q, k, v);
}

std::pair<at::Tensor, at::Tensor> attentionWithLse(const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v) {
  checkInputs("attentionWithLse", q, k, v);
  if (q.size(2) == 0 || q.size(0) == 0 || q.size(1) == 0 || k.size(2) == 0)
    return mathAttentionWithLse(q, k, v);
  std::pair<at::Tensor, at::Tensor> fused;
  if (fusedAttentionWithLse(q, k, v, fused)) return fused;
  noteKernel(kMath);
  return mathAttentionWithLseImpl(q, k, v);
}

std::vector<std::string> attentionKernelsUsed() {
  const unsigned used = g_kernelsUsed.load(std::memory_order_relaxed);
  std::vector<std::string> names;
  for (const auto& [bit, name] : kKernelNames)
    if (used & bit) names.emplace_back(name);
  return names;
}

void resetAttentionKernelsUsed() { g_kernelsUsed.store(0, std::memory_order_relaxed); }

void mergeAttention(at::Tensor& out, at::Tensor& lse, const at::Tensor& block_out,
                    const at::Tensor& block_lse) {
  DIT_PROFILE_SCOPE("dit::attention::merge");
  if (out.scalar_type() != at::kFloat || lse.scalar_type() != at::kFloat ||
      block_lse.scalar_type() != at::kFloat)
    throw std::invalid_argument("mergeAttention: out, lse and block_lse must be float32");
  if (out.sizes() != block_out.sizes() || lse.sizes() != block_lse.sizes() || out.dim() != 4 ||
      lse.dim() != 3 || out.sizes().slice(0, 3) != lse.sizes())
    throw std::invalid_argument("mergeAttention: shape mismatch (out " + shapeStr(out) + ", lse " +
                                shapeStr(lse) + ", block_out " + shapeStr(block_out) +
                                ", block_lse " + shapeStr(block_lse) + ")");
  // m = max(lse, block_lse), replaced by 0 where both are -inf so that no NaN appears.
  at::Tensor m = at::maximum(lse, block_lse);
  m = at::where(at::isneginf(m), at::zeros_like(m), m);
  at::Tensor a = at::exp(lse - m);
  at::Tensor b = at::exp(block_lse - m);
  at::Tensor s = a + b;
  at::Tensor newLse = m + at::log(s);  // -inf where both were -inf
  at::Tensor sSafe = at::where(s > 0, s, at::ones_like(s));
  a.div_(sSafe);
  b.div_(sSafe);
  out.mul_(a.unsqueeze(-1)).add_(block_out.to(at::kFloat) * b.unsqueeze(-1));
  lse.copy_(newLse);
}

}  // namespace dit
