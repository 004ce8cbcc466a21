// Activation functions by their transformers/diffusers config name (transformers activations.py
// ACT2FN, diffusers models/activations.py get_activation). Shapes and dtype are preserved.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace dit::nn {

/// Applies the activation named `name` elementwise: "quick_gelu" (x * sigmoid(1.702 x)), "gelu"
/// (erf), "gelu_new" / "gelu_pytorch_tanh" / "gelu_fast" (tanh approximation), "relu",
/// "silu" / "swish". Throws std::invalid_argument naming an unsupported activation.
at::Tensor activation(const std::string& name, const at::Tensor& x);

/// gelu(x, approximate="tanh") = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), on the
/// CPU in one pass, computed as the identical x / (1 + exp(-2u)) in float32 (Cephes-style exp,
/// vectorised for AVX-512 / AVX2 / baseline x86-64 by GCC target clones, chosen at load time) and,
/// for bfloat16, rounded once to nearest-even, as at::gelu rounds its float32 result. x: any shape,
/// float32 or bfloat16, on the CPU (made contiguous); returns a new contiguous tensor of x's
/// dtype and shape. No autograd: callers use it where gradients are off. Against float64
/// at::gelu(x, "tanh"): within 1.3e-6 relative where |gelu| > 1e-3 and half an ulp in absolute
/// terms elsewhere; LibTorch's float32 kernel is within 5e-5 relative there (the 1 + tanh
/// cancellation for negative x). One thread, [1, 320, 2048]: 0.35 ms in float32 (at::gelu 1.4,
/// the former sigmoid form in six ATen ops 1.0) and 0.48 ms from bfloat16 (at::gelu 3.2, LibTorch
/// 1.13). Throws std::invalid_argument for another device or dtype.
at::Tensor geluTanhCpu(const at::Tensor& x);

/// geluTanhCpu written into `out` (the same values): out has x's shape and dtype, unit stride along
/// its last dimension and one stride between rows, such as buffer.narrow(-1, offset, n) of a
/// contiguous buffer, so that a result can land inside a concatenation without a copy; out must
/// not overlap x. Nothing to do (and no layout check) when x is empty.
/// Throws std::invalid_argument for another device or dtype, a shape or dtype mismatch, an out
/// whose rows are not laid out that way, or an out that overlaps x.
void geluTanhCpuOut(const at::Tensor& x, const at::Tensor& out);

namespace detail {
/// The stride between t's rows when t is rows of unit stride (its last dimension) with one stride
/// between consecutive rows (all leading dimensions folded; size-1 dimensions ignored), such as a
/// narrow of a contiguous tensor's last dimension; -1 otherwise (or when rows would overlap). The
/// row layout the project's CPU kernels (geluTanhCpuOut, fused_ops.h) read and write in place.
int64_t uniformRowStride(const at::Tensor& t);
}  // namespace detail

}  // namespace dit::nn
