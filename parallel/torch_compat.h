// LibTorch version differences, in one place.
//
// DiT Studio builds against LibTorch 1.13 (Debian 12, CPU), LibTorch 2.6 (Debian 13: CPU
// `libtorch-dev` or CUDA 12.4 `libtorch-cuda-dev`) and PyTorch's LibTorch 2.x CUDA archives. Every
// call whose name or signature differs between those versions goes through this header; no other
// file tests TORCH_VERSION_* (grep for it). Torch-only: do not include from ui/ or dit_core.
//
// The scaled dot-product attention (SDPA) entry points wrapped here follow PyTorch's
// aten/src/ATen/native/transformers/attention.cpp and sdp_utils_cpp.h:
//  - 1.13 has only at::_scaled_dot_product_attention (math, returns {out, attn}).
//  - 2.0+ has at::scaled_dot_product_attention, which dispatches to the backend that
//    at::_fused_sdp_choice names (SDPBackend: math 0, flash 1, efficient 2, cudnn 3 (2.2+),
//    overrideable 4 (2.5+)); on the CPU "flash" is the fused kernel of FlashAttentionKernel.cpp.
//  - 2.0+ CUDA: at::_scaled_dot_product_flash_attention returns {out, logsumexp, ...};
//    2.1+ CUDA: at::_scaled_dot_product_efficient_attention(q, k, v, bias, compute_log_sumexp).
//  - 2.2+ CPU: at::_scaled_dot_product_flash_attention_for_cpu returns {out, logsumexp}.
//
// Autocast (aten/src/ATen/autocast_mode.h): 1.13 to 2.3 set the CPU state with
// set_cpu_enabled / set_autocast_cpu_dtype; 2.4+ with set_autocast_enabled(at::kCPU, ...) /
// set_autocast_dtype(at::kCPU, ...), the old names deprecated (a compile warning).
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <cstdint>
#include <tuple>
#include <utility>

/// True when the LibTorch headers are at least major.minor.
#define DITSTUDIO_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||            \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace dit::torch_compat {

/// The LibTorch version the code was compiled against, e.g. "1.13.0" or "2.6.0".
inline constexpr const char* kTorchVersion = TORCH_VERSION;
inline constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
inline constexpr int kTorchMinor = TORCH_VERSION_MINOR;

/// True where LibTorch's CPU bfloat16 layer_norm is much slower than computing in float32 and
/// rounding once. Measured one thread, [1, 320, 512] LayerNorm + modulation, glibc malloc tuned
/// as the programs do (tuneHostAllocator): LibTorch 1.13 0.90 ms native against 0.12 ms via
/// float32; LibTorch 2.6 0.10 against 0.15 ms, so from 2.x on the model computes it in bfloat16
/// as diffusers does (backend/nn/adaln.cpp). (The tanh-GELU no longer depends on
/// it: nn::geluTanhCpu is faster than both versions' at::gelu.)
inline constexpr bool kSlowBf16CpuLayerNorm = TORCH_VERSION_MAJOR < 2;

/// The SDPA backend PyTorch would run (PyTorch's sdp::SDPBackend, named by role).
enum class SdpaBackend { Math, Flash, Efficient, Cudnn, Other };

/// Which SDPA backend at::scaled_dot_product_attention picks for q, k, v ([B, H, S, D], no mask,
/// no dropout, not causal, default scale). LibTorch 1.x: always Math (no fused kernels).
/// Never throws for valid 4-D inputs; an unknown backend number maps to Other.
inline SdpaBackend sdpaChoice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if DITSTUDIO_TORCH_AT_LEAST(2, 0)
  switch (at::_fused_sdp_choice(q, k, v)) {
    case 0:
      return SdpaBackend::Math;
    case 1:
      return SdpaBackend::Flash;
    case 2:
      return SdpaBackend::Efficient;
    case 3:
      return SdpaBackend::Cudnn;
    default:
      return SdpaBackend::Other;
  }
#else
  (void)q, (void)k, (void)v;
  return SdpaBackend::Math;
#endif
}

/// softmax(q k^T / sqrt(D)) v for q: [B, H, S_q, D], k: [B, H, S_k, D], v: [B, H, S_k, Dv];
/// returns [B, H, S_q, Dv] in q's dtype (not necessarily contiguous). LibTorch 1.x: the math
/// at::_scaled_dot_product_attention; 2.x: at::scaled_dot_product_attention (the backend of
/// sdpaChoice). Throws c10::Error where ATen rejects the inputs.
inline at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if DITSTUDIO_TORCH_AT_LEAST(2, 0)
  return at::scaled_dot_product_attention(q, k, v);
#else
  return std::get<0>(at::_scaled_dot_product_attention(q, k, v));
#endif
}

/// Output and log-sum-exp of a fused kernel: {out [B, H, S_q, Dv] in q's dtype, contiguous;
/// lse float32 [B, H, S_q], contiguous}.
using OutAndLse = std::pair<at::Tensor, at::Tensor>;

/// CPU flash attention with log-sum-exp (LibTorch 2.2+:
/// at::_scaled_dot_product_flash_attention_for_cpu). Returns false (result untouched) on older
/// LibTorch. Throws c10::Error where the kernel rejects the inputs.
inline bool flashAttentionCpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              OutAndLse& result) {
#if DITSTUDIO_TORCH_AT_LEAST(2, 2)
  auto r = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v);
  result = {std::get<0>(r).contiguous(),
            std::get<1>(r).to(at::kFloat).narrow(2, 0, q.size(2)).contiguous()};
  return true;
#else
  (void)q, (void)k, (void)v, (void)result;
  return false;
#endif
}

/// CUDA flash attention (fp16/bf16) with log-sum-exp (LibTorch 2.0+:
/// at::_scaled_dot_product_flash_attention). Returns false on LibTorch 1.x. Throws c10::Error
/// where the kernel rejects the inputs (dtype, head dim, architecture).
inline bool flashAttentionCuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               OutAndLse& result) {
#if DITSTUDIO_TORCH_AT_LEAST(2, 0)
  auto r = at::_scaled_dot_product_flash_attention(q.contiguous(), k.contiguous(), v.contiguous());
  result = {std::get<0>(r).contiguous(),
            std::get<1>(r).to(at::kFloat).narrow(2, 0, q.size(2)).contiguous()};
  return true;
#else
  (void)q, (void)k, (void)v, (void)result;
  return false;
#endif
}

/// CUDA memory-efficient attention with log-sum-exp (LibTorch 2.1+:
/// at::_scaled_dot_product_efficient_attention with compute_log_sumexp; its lse is padded along
/// S_q to a multiple of 32 and is narrowed here). Returns false on older LibTorch. Throws
/// c10::Error where the kernel rejects the inputs.
inline bool efficientAttentionCuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   OutAndLse& result) {
#if DITSTUDIO_TORCH_AT_LEAST(2, 1)
  auto r = at::_scaled_dot_product_efficient_attention(q.contiguous(), k.contiguous(),
                                                       v.contiguous(), /*attn_bias=*/{},
                                                       /*compute_log_sumexp=*/true);
  result = {std::get<0>(r).contiguous(),
            std::get<1>(r).to(at::kFloat).narrow(2, 0, q.size(2)).contiguous()};
  return true;
#else
  (void)q, (void)k, (void)v, (void)result;
  return false;
#endif
}

/// LibTorch's CPU autocast to bfloat16 for the guard's lifetime (Python's
/// torch.autocast("cpu", dtype=torch.bfloat16)): matrix products run in bfloat16, and so do
/// their backward passes; on leaving (also by an exception) autocast is off again and its cast
/// cache cleared. `enable` false: a no-op. Not nestable.
class CpuAutocast {
 public:
  explicit CpuAutocast(bool enable) : on_(enable) {
    if (!on_) return;
#if DITSTUDIO_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
#else
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(true);
#endif
  }
  ~CpuAutocast() {
    if (!on_) return;
#if DITSTUDIO_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_enabled(at::kCPU, false);
#else
    at::autocast::set_cpu_enabled(false);
#endif
    at::autocast::clear_cache();
  }
  CpuAutocast(const CpuAutocast&) = delete;
  CpuAutocast& operator=(const CpuAutocast&) = delete;

 private:
  const bool on_;
};

}  // namespace dit::torch_compat
