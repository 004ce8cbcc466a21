#include "backend/nn/activations.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace dit::nn {

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
