// The blocks of FluxTransformer2DModel, named and structured as diffusers names them
// (models/transformers/transformer_flux.py), built from the shared layers of backend/nn/
// (attention, AdaLN, feed-forward). Each class holds its layers under the module path of the
// checkpoint ("transformer_blocks.3.attn.to_q" ...) and computes exactly what diffusers computes,
// in the same op order and dtypes (the goldens in tests/data/tiny-flux-A/golden hold it to that).
//
// Shapes: B batch, S sequence (this rank's local tokens under context parallelism), C inner_dim =
// num_attention_heads * attention_head_dim, M mlp hidden (4 C), D attention_head_dim. Compute
// dtype = the weights' dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>

#include "backend/nn/adaln.h"
#include "backend/nn/attention.h"
#include "backend/nn/feed_forward.h"

namespace dit {

class WeightLoader;

namespace flux {

/// diffusers FluxAttention (+ FluxAttnProcessor): the shared joint attention with biases.
using FluxAttention = nn::JointAttention;

/// diffusers FluxTransformerBlock (double stream): norm1 / norm1_context (AdaLayerNormZero),
/// attn (FluxAttention with added kv), ff / ff_context (FeedForward), residual gates; float16
/// clips the text stream to +-65504 as diffusers does.
class FluxTransformerBlock {
 public:
  /// Loads every layer of block `prefix` ("transformer_blocks.<i>") through the loader.
  FluxTransformerBlock(WeightLoader& w, const std::string& prefix, int64_t C, int64_t M,
                       int64_t headDim);
  /// hidden [B, S_img, C], encoder [B, S_txt, C], silu_temb [B, C], rotary cos/sin
  /// [S_txt + S_img, D] -> {encoder, hidden} (diffusers returns encoder_hidden_states first).
  /// `seam`: TaylorSeer around attn (null = none). `emb`, `emb_context`: norm1's / norm1_context's
  /// modulation [B, 6C] when computed before the blocks (undefined = computed here).
  std::pair<at::Tensor, at::Tensor> operator()(const at::Tensor& hidden, const at::Tensor& encoder,
                                               const at::Tensor& silu_temb, const at::Tensor& cos,
                                               const at::Tensor& sin,
                                               const nn::AttentionBackend& attention,
                                               const nn::AttentionCacheSeam* seam = nullptr,
                                               const at::Tensor& emb = at::Tensor(),
                                               const at::Tensor& emb_context = at::Tensor()) const;

  nn::AdaLayerNormZero norm1, norm1_context;
  FluxAttention attn;
  nn::FeedForward ff, ff_context;
};

/// diffusers FluxSingleTransformerBlock: norm (AdaLayerNormZeroSingle), attn (pre_only
/// FluxAttention) in parallel with proj_mlp + gelu(tanh), proj_out over cat(attention, mlp)
/// (PackedRowwiseParallel over blocks {C, M}), gated residual; float16 clips to +-65504.
/// attn.to_q/to_k/to_v and proj_mlp share their input and run as one fused GEMM (qkv_mlp). On the
/// CPU (float32 / bfloat16, no autograd) the GELU is written straight into proj_out's input
/// buffer and only the attention output is copied in.
class FluxSingleTransformerBlock {
 public:
  /// Loads every layer of block `prefix` ("single_transformer_blocks.<i>") through the loader.
  FluxSingleTransformerBlock(WeightLoader& w, const std::string& prefix, int64_t C, int64_t M,
                             int64_t headDim);
  /// x = cat(text, image) [B, S, C] -> [B, S, C]. Throws std::invalid_argument when a cache
  /// seam's prediction has another shape than the attention output. `emb`: norm's modulation
  /// [B, 3C] when computed before the blocks (undefined = computed here).
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& silu_temb, const at::Tensor& cos,
                        const at::Tensor& sin, const nn::AttentionBackend& attention,
                        const nn::AttentionCacheSeam* seam = nullptr,
                        const at::Tensor& emb = at::Tensor()) const;

  nn::AdaLayerNormZeroSingle norm;
  nn::FusedLinearPtr qkv_mlp;  ///< attn.to_q, attn.to_k, attn.to_v, proj_mlp as one GEMM
  FluxAttention attn;
  nn::LinearPtr proj_out;  ///< PackedRowwiseParallel over {C, M} in the FLUX plan
};

}  // namespace flux
}  // namespace dit
