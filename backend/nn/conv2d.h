// 2-D convolution for the VAEs, with a workaround for a wrong CPU bfloat16 kernel.
//
// LibTorch 2.6 on Debian 13 (libtorch2.6 2.6.0+dfsg-7 on the system oneDNN, libdnnl 3.7.2), on a
// CPU with AVX512-BF16 and no AMX (measured on an AMD EPYC), computes a bfloat16 at::conv2d with
// an NCHW input and an output-channel count that is NOT a multiple of 16 wrongly: the oneDNN kernel
// it picks returns values 20% to 600% off in mean relative error, against 0.15% (bfloat16 rounding)
// for the same inputs in float32. Measured over out channels {1, 3, 4, 5, 8, 12, 20, 24, 40} x in
// channels {3, 8, 16, 64, 128} x kernel 3 / 5 x stride 1 / 2 x padding 0 / 1 x 8..40 px, one and
// two threads: every such case wrong; out channels {16, 48, 128}, 1x1 kernels, channels-last input
// and LibTorch with oneDNN off (torch.backends.mkldnn) right. PyTorch's own Python on the same
// LibTorch shows it (diffusers' bf16 VAE decode there: 26% error after the first 16 -> 8 upsampler
// conv of the tiny Qwen-Image fixture; every real VAE's conv_out has 3 out channels); upstream
// pytorch/pytorch#163347 reports the same kind of wrong CPU bf16 conv, fixed by disabling oneDNN.
// LibTorch 1.13 (Debian 12, oneDNN 2.6) is right.
//
// conv2d() below therefore pads such a convolution's filters with zero filters up to a multiple of
// 16 (a kernel shape that is right) and keeps the first channels: the same bfloat16 result a right
// kernel gives, no float32 copy of the activations. It does so only where a one-time check of this
// process's LibTorch finds the kernel wrong, so other LibTorch builds run at::conv2d unchanged.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <vector>

namespace dit::nn {

/// True where this process's LibTorch computes a CPU bfloat16 convolution with 8 output channels
/// wrongly (see above): checked once, on first use, with one fixed 16 -> 8 channel 3x3
/// convolution of an 8x8 input against float32 (wrong: mean relative error above 1%; bfloat16
/// rounding gives 0.15%, the wrong kernel 68%). Touches no random generator.
inline bool cpuBf16NarrowConvIsWrong() {
  static const bool wrong = [] {
    at::NoGradGuard noGrad;
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    const at::Tensor x =
        at::sin(at::arange(16 * 8 * 8, f32) * 0.37).view({1, 16, 8, 8}).to(at::kBFloat16);
    const at::Tensor w =
        (at::cos(at::arange(8 * 16 * 9, f32) * 0.11) / 12).view({8, 16, 3, 3}).to(at::kBFloat16);
    const int64_t one[2] = {1, 1};
    const at::Tensor ref = at::conv2d(x.to(at::kFloat), w.to(at::kFloat), {}, at::IntArrayRef(one),
                                      at::IntArrayRef(one));
    const at::Tensor got =
        at::conv2d(x, w, {}, at::IntArrayRef(one), at::IntArrayRef(one)).to(at::kFloat);
    return ((got - ref).abs().mean() / ref.abs().mean()).item<double>() > 0.01;
  }();
  return wrong;
}

/// at::conv2d(x, w, b, stride, padding) (groups 1, dilation 1), except that a CPU bfloat16
/// convolution whose output-channel count is not a multiple of 16 runs with zero filters added up
/// to one where cpuBf16NarrowConvIsWrong() (then the result is contiguous). b may be undefined.
inline at::Tensor conv2d(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                         at::IntArrayRef stride, at::IntArrayRef padding) {
  const int64_t out = w.size(0);
  if (out % 16 == 0 || !x.is_cpu() || x.scalar_type() != at::kBFloat16 ||
      !cpuBf16NarrowConvIsWrong())
    return at::conv2d(x, w, b, stride, padding);
  const int64_t extra = (out + 15) / 16 * 16 - out;
  std::vector<int64_t> ws = w.sizes().vec();
  ws[0] = extra;
  const at::Tensor wp = at::cat({w, at::zeros(ws, w.options())}, 0);
  const at::Tensor bp = b.defined() ? at::cat({b, at::zeros({extra}, b.options())}, 0) : b;
  return at::conv2d(x, wp, bp, stride, padding).narrow(1, 0, out).contiguous();
}

}  // namespace dit::nn
