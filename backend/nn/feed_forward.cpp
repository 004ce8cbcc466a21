#include "backend/nn/feed_forward.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "backend/io/weight_loader.h"
#include "backend/nn/activations.h"
#include "backend/nn/fused_ops.h"

namespace dit::nn {

// gelu(x, approximate="tanh") = 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3).
// On the CPU in float32 / bfloat16 without gradients: nn::geluTanhCpu, one vectorised pass (0.35
// ms in float32 and 0.48 ms from bfloat16 on [1, 320, 2048], one thread, against 1.4 / 3.2 ms
// for LibTorch 1.13's at::gelu and 1.0 / 1.3 ms for the sigmoid form in ATen ops). Training
// (autograd) and float16 on the CPU: the identical x * sigmoid(2u) in float32 ATen ops, one
// rounding to x's dtype at the end (the two forms differ by < 5e-7 in float32). Other devices:
// at::gelu (fused there).
at::Tensor geluTanh(const at::Tensor& x) {
  if (!x.is_cpu()) return at::gelu(x, "tanh");
  const bool grad = x.requires_grad() && at::GradMode::is_enabled();
  if (!grad && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16))
    return geluTanhCpu(x);
  constexpr double k = 1.5957691216057308;  // 2 sqrt(2/pi)
  const at::Tensor xf = x.to(at::kFloat);   // x itself when float32: never written to below
  if (x.requires_grad() && at::GradMode::is_enabled()) {
    // Training (ditstudio-train): the same operations out of place, since autograd keeps the
    // sigmoid's output for its backward.
    return (at::sigmoid(xf.square().mul(k * 0.044715).add(k).mul(xf)) * xf).to(x.scalar_type());
  }
  at::Tensor y = xf.square().mul_(k * 0.044715).add_(k).mul_(xf).sigmoid_().mul_(xf);
  return y.to(x.scalar_type());
}

FeedForward::FeedForward(WeightLoader& w, const std::string& prefix, int64_t C, int64_t M)
    : proj(w.linear(prefix + ".net.0.proj", C, M)), out(w.linear(prefix + ".net.2", M, C)) {}

at::Tensor FeedForward::operator()(const at::Tensor& x) const {
  return out->forward(geluTanh(proj->forward(x)));
}

SwiGLUFeedForward::SwiGLUFeedForward(WeightLoader& w, const std::string& prefix, int64_t C,
                                     int64_t M)
    : linear_in(w.linear(prefix + ".linear_in", C, 2 * M, false)),
      linear_out(w.linear(prefix + ".linear_out", M, C, false)) {}

at::Tensor SwiGLUFeedForward::operator()(const at::Tensor& x) const {
  auto h = linear_in->forward(x).chunk(2, -1);
  // float32 on the CPU: silu(gate) * value in one pass over the projection's halves in place.
  if (fusedRowsApply(h[0])) return linear_out->forward(siluMulCpu(h[0], h[1]));
  return linear_out->forward(at::silu(h[0]) * h[1]);
}

}  // namespace dit::nn
