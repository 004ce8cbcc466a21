// RMSNorm + RoPE over head vectors in one pass (see qk_norm_rope.h): argument checks and the split
// over threads; the row kernels are in qk_norm_rope_kernel.cpp (Torch-free, own compile flags).
#include "backend/nn/qk_norm_rope.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend/nn/qk_norm_rope_kernel.h"
#include "parallel/profile_scope.h"

namespace dit::nn {

using detail::kNormRopeMaxD;

bool rmsNormRopeCpuApplies(const at::Tensor& x, const at::Tensor& weight) {
  if (!x.device().is_cpu() || !weight.device().is_cpu() || x.dim() != 4) return false;
  const auto dt = x.scalar_type();
  if (dt != at::kFloat && dt != at::kBFloat16) return false;
  if (weight.scalar_type() != dt && weight.scalar_type() != at::kFloat) return false;
  if (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())) return false;
  return x.size(3) % 2 == 0 && x.size(3) <= kNormRopeMaxD;
}

void rmsNormRopeCpuOut(const at::Tensor& x, const at::Tensor& weight, double eps,
                       const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& out) {
  auto fail = [](const std::string& why) {
    throw std::invalid_argument("rmsNormRopeCpuOut: " + why);
  };
  if (!rmsNormRopeCpuApplies(x, weight))
    fail("x must be a 4-D float32 or bfloat16 CPU tensor [B, S, H, D] (D even, at most " +
         std::to_string(kNormRopeMaxD) + ", no gradient) and weight of its dtype or float32");
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
  if (const auto o = at::get_overlap_status(x, out);
      o == at::MemOverlapStatus::Full || o == at::MemOverlapStatus::Partial)
    fail("out must not overlap x");
  if (x.numel() == 0) return;
  DIT_PROFILE_SCOPE("dit::rope::qk_rmsnorm_rope");  // q/k RMSNorm and RoPE in one pass
  const at::Tensor wf = weight.to(at::kFloat).contiguous();
  const at::Tensor c = cos.contiguous(), s = sin.contiguous();
  detail::NormRopeRows a{static_cast<const char*>(x.data_ptr()),
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
  // Split over the sequence: each thread takes whole positions (every batch entry and head).
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  constexpr int64_t kGrainPositions = 16;
  at::parallel_for(0, S, kGrainPositions, [&](int64_t s0, int64_t s1) {
    detail::NormRopeRows part = a;
    const int64_t es = bf16 ? 2 : 4;
    part.x += s0 * x.stride(1) * es;
    part.out += s0 * out.stride(1) * es;
    part.cs += s0 * D;
    part.sn += s0 * D;
    part.S = s1 - s0;
    if (bf16)
      detail::normRopeRowsBf16(part);
    else
      detail::normRopeRowsF32(part);
  });
}

}  // namespace dit::nn
