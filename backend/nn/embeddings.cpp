#include "backend/nn/embeddings.h"

#include <ATen/ATen.h>

#include <cmath>

#include "backend/io/weight_loader.h"

namespace dit::nn {

at::Tensor timestepProjection(const at::Tensor& t, int64_t dim) {
  const int64_t half = dim / 2;
  auto fo = at::TensorOptions().dtype(at::kFloat).device(t.device());
  at::Tensor ex = at::arange(0, half, fo) * (-std::log(10000.0)) / static_cast<double>(half);
  at::Tensor e = t.to(at::kFloat).unsqueeze(1) * at::exp(ex).unsqueeze(0);
  return at::cat({at::cos(e), at::sin(e)}, -1);
}

MLPEmbed::MLPEmbed(WeightLoader& w, const std::string& prefix, int64_t in, int64_t out, bool bias)
    : linear_1(w.linear(prefix + ".linear_1", in, out, bias)),
      linear_2(w.linear(prefix + ".linear_2", out, out, bias)) {}

at::Tensor MLPEmbed::operator()(const at::Tensor& x) const {
  return linear_2->forward(at::silu(linear_1->forward(x)));
}

std::pair<at::Tensor, at::Tensor> RotaryPosEmbed::operator()(const at::Tensor& ids) const {
  const at::Tensor pos = ids.to(at::kDouble);
  std::vector<at::Tensor> cosParts, sinParts;
  for (size_t a = 0; a < axes_dim_.size(); ++a) {
    const int64_t dim = axes_dim_[a];
    auto o64 = at::TensorOptions().dtype(at::kDouble).device(ids.device());
    at::Tensor freqs = 1.0 / at::pow(theta_, at::arange(0, dim, 2, o64).slice(0, 0, dim / 2) /
                                                 static_cast<double>(dim));
    at::Tensor f = at::outer(pos.select(1, static_cast<int64_t>(a)), freqs);
    cosParts.push_back(f.cos().repeat_interleave(2, 1).to(at::kFloat));
    sinParts.push_back(f.sin().repeat_interleave(2, 1).to(at::kFloat));
  }
  return {at::cat(cosParts, -1), at::cat(sinParts, -1)};
}

// x * cos + rotate(x) * sin, rotate(x)[2j, 2j+1] = (-x[2j+1], x[2j]), is the complex product
// (x[2j] + i x[2j+1]) (cos[2j] + i sin[2j]) per pair. Computed that way in float32 (one ATen
// kernel instead of negate, interleave, multiply and multiply-add) and cast back to x's dtype. It
// matches diffusers' real form up to the rounding of each product's sum (float32: within 5e-7 of
// |x| ~ 4; one thread, [1, 320, 8, 64]: 0.12 -> 0.07 ms in float32 and 0.23 -> 0.09 ms from
// bfloat16, LibTorch 1.13).
at::Tensor applyRotaryEmb(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto sz = x.sizes();
  const int64_t S = cos.size(0), half = cos.size(1) / 2;
  const at::Tensor rotation =
      at::complex(cos.reshape({S, half, 2}).select(-1, 0), sin.reshape({S, half, 2}).select(-1, 0));
  const at::Tensor xc =
      at::view_as_complex(x.to(at::kFloat).contiguous().view({sz[0], sz[1], sz[2], sz[3] / 2, 2}));
  const at::Tensor out = xc * rotation.unsqueeze(0).unsqueeze(2);
  return at::view_as_real(out).flatten(3).to(x.scalar_type());
}

}  // namespace dit::nn
