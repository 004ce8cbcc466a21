// Fused elementwise CPU work (see fused_ops.h): argument checks, the rows' layout and the split
// over threads; the row kernels are in fused_rows_kernel.cpp (Torch-free, own compile flags).
#include "backend/nn/fused_ops.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend/nn/activations.h"  // detail::uniformRowStride
#include "backend/nn/fused_rows_kernel.h"
#include "parallel/profile_scope.h"

namespace dit::nn {
namespace {

[[noreturn]] void fail(const char* who, const std::string& why) {
  throw std::invalid_argument(std::string(who) + ": " + why);
}

bool floatCpu(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat &&
         !(t.requires_grad() && at::GradMode::is_enabled());
}

// Rows of t (its last dimension) as (base, row stride); t itself when its rows are uniform, else
// a contiguous copy kept alive in `keep`.
const float* rowsOf(const at::Tensor& t, int64_t& ld, at::Tensor& keep) {
  ld = detail::uniformRowStride(t);
  keep = ld >= 0 ? t : t.contiguous();
  if (ld < 0) ld = t.size(-1);
  return keep.data_ptr<float>();
}

// A per-batch vector [B, C] or [B, 1, C] of x [B, S, C]: base and stride between batch entries (0
// when one vector serves every entry).
const float* batchVector(const char* who, const char* name, const at::Tensor& v,
                         const at::Tensor& x, int64_t& ld, at::Tensor& keep) {
  const int64_t B = x.size(0), C = x.size(-1);
  if (!floatCpu(v)) fail(who, std::string(name) + " must be a float32 CPU tensor");
  at::Tensor t = v;
  if (t.dim() == 3 && t.size(1) == 1) t = t.select(1, 0);
  if (t.dim() != 2 || t.size(1) != C || (t.size(0) != B && t.size(0) != 1))
    fail(who, std::string(name) + " " + std::string(c10::str(v.sizes())) + " must be [B, C] or " +
                  "[B, 1, C] for x " + std::string(c10::str(x.sizes())));
  if (t.stride(1) != 1 && C > 1) t = t.contiguous();
  keep = t;
  ld = t.size(0) == 1 ? 0 : t.stride(0);
  return t.data_ptr<float>();
}

void checkX(const char* who, const at::Tensor& x) {
  if (!fusedRowsApply(x) || x.dim() != 3)
    fail(who, "x must be a 3-D float32 CPU tensor [B, S, C] without gradient");
}

template <class Kernel>
void forRows(int64_t rows, const detail::FusedRows& a, Kernel kernel) {
  constexpr int64_t kGrainRows = 16;
  at::parallel_for(0, rows, kGrainRows, [&](int64_t r0, int64_t r1) {
    detail::FusedRows part = a;
    part.r0 = r0;
    part.r1 = r1;
    kernel(part);
  });
}

}  // namespace

bool fusedRowsApply(const at::Tensor& x) { return floatCpu(x) && x.dim() >= 1; }

at::Tensor layerNormModulateCpu(const at::Tensor& x, const at::Tensor& scale,
                                const at::Tensor& shift, double eps) {
  constexpr const char* who = "layerNormModulateCpu";
  checkX(who, x);
  DIT_PROFILE_SCOPE("dit::norm::layer_norm_modulate");
  detail::FusedRows a;
  at::Tensor kx, ks, kb;
  a.x = rowsOf(x, a.ldx, kx);
  a.scale = batchVector(who, "scale", scale, x, a.ldScale, ks);
  a.shift = batchVector(who, "shift", shift, x, a.ldShift, kb);
  a.C = x.size(2);
  a.rowsPerBatch = std::max<int64_t>(x.size(1), 1);
  a.eps = static_cast<float>(eps);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  a.y = y.data_ptr<float>();
  a.ldy = a.C;
  if (y.numel() > 0) forRows(x.size(0) * x.size(1), a, detail::layerNormModulateRowsF32);
  return y;
}

namespace {

at::Tensor rmsNormRows(const char* who, const at::Tensor& res, const at::Tensor& x,
                       const at::Tensor& w, double eps, const at::Tensor& mul,
                       const at::Tensor& gate) {
  checkX(who, x);
  DIT_PROFILE_SCOPE("dit::norm::rms_norm_fused");
  const int64_t C = x.size(2);
  detail::FusedRows a;
  at::Tensor kx, kw, ks, kg, kr;
  a.x = rowsOf(x, a.ldx, kx);
  if (w.defined()) {
    if (!floatCpu(w) || w.dim() != 1 || w.size(0) != C)
      fail(who, "w must be a float32 CPU tensor [C] = [" + std::to_string(C) + "]");
    kw = w.contiguous();
    a.w = kw.data_ptr<float>();
  }
  if (mul.defined()) a.scale = batchVector(who, "mul", mul, x, a.ldScale, ks);
  if (gate.defined()) a.gate = batchVector(who, "gate", gate, x, a.ldGate, kg);
  if (res.defined()) {
    if (!floatCpu(res) || res.sizes() != x.sizes())
      fail(who,
           "res must be a float32 CPU tensor of x's shape " + std::string(c10::str(x.sizes())));
    a.res = rowsOf(res, a.ldRes, kr);
  }
  a.C = C;
  a.rowsPerBatch = std::max<int64_t>(x.size(1), 1);
  a.eps = static_cast<float>(eps);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  a.y = y.data_ptr<float>();
  a.ldy = C;
  if (y.numel() > 0) forRows(x.size(0) * x.size(1), a, detail::rmsNormRowsF32);
  return y;
}

}  // namespace

at::Tensor rmsNormMulCpu(const at::Tensor& x, const at::Tensor& w, double eps,
                         const at::Tensor& mul) {
  return rmsNormRows("rmsNormMulCpu", at::Tensor(), x, w, eps, mul, at::Tensor());
}

at::Tensor rmsNormResidualCpu(const at::Tensor& res, const at::Tensor& x, const at::Tensor& w,
                              double eps, const at::Tensor& gate) {
  if (!res.defined()) fail("rmsNormResidualCpu", "res is undefined");
  return rmsNormRows("rmsNormResidualCpu", res, x, w, eps, at::Tensor(), gate);
}

at::Tensor siluMulCpu(const at::Tensor& gate, const at::Tensor& value, const at::Tensor& out) {
  constexpr const char* who = "siluMulCpu";
  if (!fusedRowsApply(gate) || !fusedRowsApply(value) || gate.sizes() != value.sizes())
    fail(who, "gate and value must be float32 CPU tensors of one shape without gradient");
  DIT_PROFILE_SCOPE("dit::elementwise::silu_mul");
  const int64_t M = gate.size(-1);
  detail::FusedRows a;
  at::Tensor kx, kg;
  a.x = rowsOf(gate, a.ldx, kx);
  a.shift = rowsOf(value, a.ldShift, kg);
  a.C = M;
  at::Tensor y = out;
  if (y.defined()) {
    if (!floatCpu(y) || y.sizes() != gate.sizes())
      fail(who, "out must be a float32 CPU tensor of gate's shape");
    a.ldy = detail::uniformRowStride(y);
    if (a.ldy < 0)
      fail(who,
           "out must be rows of unit stride with one row stride (such as a narrow of a "
           "contiguous tensor's last dimension)");
    for (const at::Tensor* in : {&gate, &value})
      if (const auto o = at::get_overlap_status(*in, y);
          o == at::MemOverlapStatus::Full || o == at::MemOverlapStatus::Partial)
        fail(who, "out must not overlap gate or value");
  } else {
    y = at::empty(gate.sizes(), gate.options().memory_format(at::MemoryFormat::Contiguous));
    a.ldy = M;
  }
  a.y = y.data_ptr<float>();
  if (y.numel() > 0 && M > 0) forRows(y.numel() / M, a, detail::siluMulRowsF32);
  return y;
}

}  // namespace dit::nn
