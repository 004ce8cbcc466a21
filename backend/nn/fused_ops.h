// Fused elementwise work of the transformer blocks on the CPU: one pass over each row where the
// ATen forms take three to six (each writing a full temporary): LayerNorm + modulation, RMSNorm
// with its modulation or gated residual, SwiGLU's silu(gate) * value. float32 CPU tensors without
// autograd only (fusedRowsApply); everything else keeps the ATen forms, which the callers hold.
// The results equal the ATen forms up to the summation order of the row statistics (the products
// are rounded in the same order, no FMA contraction): see backend/nn/fused_rows_kernel.cpp.
//
// Shapes: x [B, S, C] (any rows of unit stride with one stride between consecutive rows, such as
// a narrow of a contiguous tensor's sequence or last dimension); per-batch vectors [B, C] or
// [B, 1, C] (unit stride along C; B may be 1 for every batch entry). Results are new contiguous
// tensors unless an `out` is given.
#pragma once

#include <ATen/core/Tensor.h>

namespace dit::nn {

/// Whether the fused kernels below take x (and the other tensors): every one a float32 CPU tensor
/// with no gradient recorded, x with at least one dimension.
bool fusedRowsApply(const at::Tensor& x);

/// LayerNorm(x) * (1 + scale) + shift (LayerNorm without affine parameters, eps; diffusers
/// AdaLayerNormZero / AdaLayerNormContinuous / Flux2Modulation's application). x [B, S, C];
/// scale, shift [B, C] or [B, 1, C]. Throws std::invalid_argument when !fusedRowsApply or the
/// shapes disagree.
at::Tensor layerNormModulateCpu(const at::Tensor& x, const at::Tensor& scale,
                                const at::Tensor& shift, double eps = 1e-6);

/// rmsNorm(x, w, eps) * mul (diffusers RMSNorm, float32; then the modulation's scale): x [B, S, C],
/// w [C] float32 or undefined, mul [B, C] / [B, 1, C] or undefined. Throws std::invalid_argument
/// as layerNormModulateCpu.
at::Tensor rmsNormMulCpu(const at::Tensor& x, const at::Tensor& w, double eps,
                         const at::Tensor& mul = at::Tensor());

/// res + gate * rmsNorm(x, w, eps) (a gated residual of a normalized branch output; gate
/// undefined: res + rmsNorm(x, w, eps)). res, x [B, S, C]; w [C] float32; gate [B, C] /
/// [B, 1, C]. Returns a new tensor (res is not written). Throws std::invalid_argument as above.
at::Tensor rmsNormResidualCpu(const at::Tensor& res, const at::Tensor& x, const at::Tensor& w,
                              double eps, const at::Tensor& gate = at::Tensor());

/// silu(gate) * value (SwiGLU): gate, value [..., M] (rows of unit stride, e.g. narrows of one
/// projection's output) -> a new [..., M] tensor, or written into `out` (rows of unit stride, e.g.
/// a narrow of the next projection's input buffer; it must not overlap gate or value). Throws
/// std::invalid_argument as above.
at::Tensor siluMulCpu(const at::Tensor& gate, const at::Tensor& value,
                      const at::Tensor& out = at::Tensor());

}  // namespace dit::nn
