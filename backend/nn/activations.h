// Activation functions by their transformers/diffusers config name (transformers activations.py
// ACT2FN, diffusers models/activations.py get_activation). Shapes and dtype are preserved.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace dit::nn {

/// Applies the activation named `name` elementwise: "quick_gelu" (x * sigmoid(1.702 x)), "gelu"
/// (erf), "gelu_new" / "gelu_pytorch_tanh" / "gelu_fast" (tanh approximation), "relu",
/// "silu" / "swish". Throws std::invalid_argument naming an unsupported activation.
at::Tensor activation(const std::string& name, const at::Tensor& x);

}  // namespace dit::nn
