// The blocks of Flux2Transformer2DModel (diffusers models/transformers/transformer_flux2.py),
// built from the shared layers of backend/nn/: Flux2TransformerBlock (double stream, shared
// modulation, Flux2Attention = the joint attention without biases, SwiGLU feed-forwards) and
// Flux2SingleTransformerBlock (Flux2ParallelSelfAttention: one GEMM for q, k, v and the SwiGLU's
// gate and value, attention || SwiGLU, one GEMM for cat(attention, mlp)). Op order and dtypes are
// diffusers' (the goldens in tests/data/tiny-flux2-A hold it to that).
//
// Shapes: B batch, S sequence (this rank's local tokens under context parallelism), C inner_dim,
// M mlp hidden (mlp_ratio * C), D attention_head_dim; modulation triples [B, 1, C].
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/nn/adaln.h"
#include "backend/nn/attention.h"
#include "backend/nn/feed_forward.h"

namespace dit {

class WeightLoader;

namespace flux2 {

/// One layer's reference K/V of the KV modes (diffusers Flux2KVLayerCache): the reference tokens'
/// keys and values after RMSNorm and RoPE, [B, S_ref, H, D]: every reference token, the heads
/// this rank attends over (its tp heads; under Ulysses only its slice of them,
/// ContextParallel::ulyssesHeads). Undefined until extracted.
struct Flux2LayerKV {
  at::Tensor k, v;
};

/// The reference tokens of a KV "extract" forward as a stream of their own (diffusers
/// Flux2KleinKVPipeline step 0: they sit in the image stream, are modulated with the fixed
/// timestep 0 and attend to each other only, so they never depend on the text, the noisy image or
/// the step). Replicated on every cp rank (not split).
struct Flux2ReferenceStream {
  at::Tensor hidden;                               ///< [B, S_ref, C]
  std::vector<nn::Modulation::Params> mod_img;     ///< double_stream_modulation_img at t = 0
  std::vector<nn::Modulation::Params> mod_single;  ///< single_stream_modulation at t = 0
  at::Tensor cos, sin;                             ///< rotary tables [S_ref, D] of their ids
};

/// diffusers Flux2TransformerBlock (double stream).
class Flux2TransformerBlock {
 public:
  /// Loads block `prefix` ("transformer_blocks.<i>"): attn (Flux2Attention, no biases), ff and
  /// ff_context (Flux2FeedForward).
  Flux2TransformerBlock(WeightLoader& w, const std::string& prefix, int64_t C, int64_t M,
                        int64_t headDim);
  /// hs [B, S_img, C], enc [B, S_txt, C]; mi / mt: the image / text modulation (two triples
  /// each: attention, then feed-forward); rotary cos/sin [S_txt + S_img, D]; `seam`: TaylorSeer
  /// around attn (null = none). Returns {encoder, hidden}; float16 clips the text stream.
  std::pair<at::Tensor, at::Tensor> operator()(at::Tensor hs, at::Tensor enc,
                                               const std::vector<nn::Modulation::Params>& mi,
                                               const std::vector<nn::Modulation::Params>& mt,
                                               const at::Tensor& cos, const at::Tensor& sin,
                                               const nn::AttentionBackend& attention,
                                               const nn::AttentionCacheSeam* seam = nullptr) const;

  /// The KV modes (diffusers Flux2KVAttnProcessor): with `ref` (extract) the reference stream
  /// runs first (self-attention, feed-forward with its own modulation; ref->hidden updated) and
  /// its K/V are stored in `kv`; without (cached) `kv` must hold them. Text and image then run as
  /// operator() with the reference K/V added to their keys. A TaylorSeer prediction replaces the
  /// text and image attention only (the references are computed when extracting).
  std::pair<at::Tensor, at::Tensor> forwardKV(at::Tensor hs, at::Tensor enc,
                                              const std::vector<nn::Modulation::Params>& mi,
                                              const std::vector<nn::Modulation::Params>& mt,
                                              const at::Tensor& cos, const at::Tensor& sin,
                                              const nn::AttentionBackend& attention,
                                              const nn::AttentionCacheSeam* seam, Flux2LayerKV& kv,
                                              Flux2ReferenceStream* ref) const;

  nn::JointAttention attn;  ///< Flux2Attention
  nn::SwiGLUFeedForward ff, ff_context;
};

/// diffusers Flux2SingleTransformerBlock with Flux2ParallelSelfAttention ("attn"): the whole
/// attention module (to_qkv_mlp_proj, attention || SwiGLU, to_out) is what TaylorSeer caches.
class Flux2SingleTransformerBlock {
 public:
  /// Loads block `prefix` ("single_transformer_blocks.<i>"): attn.to_qkv_mlp_proj [3C + 2M, C]
  /// (PackedColwise), attn.to_out [C, C + M] (PackedRowwise), attn.norm_q / norm_k.
  Flux2SingleTransformerBlock(WeightLoader& w, const std::string& prefix, int64_t C, int64_t M,
                              int64_t headDim);
  /// x = cat(text, image) [B, S, C], m: single_stream_modulation (one triple) -> [B, S, C].
  at::Tensor operator()(const at::Tensor& x, const std::vector<nn::Modulation::Params>& m,
                        const at::Tensor& cos, const at::Tensor& sin,
                        const nn::AttentionBackend& attention,
                        const nn::AttentionCacheSeam* seam = nullptr) const;

  /// The KV modes (diffusers Flux2KVParallelSelfAttnProcessor), as Flux2TransformerBlock's.
  at::Tensor forwardKV(const at::Tensor& x, const std::vector<nn::Modulation::Params>& m,
                       const at::Tensor& cos, const at::Tensor& sin,
                       const nn::AttentionBackend& attention, const nn::AttentionCacheSeam* seam,
                       Flux2LayerKV& kv, Flux2ReferenceStream* ref) const;

  nn::LinearPtr to_qkv_mlp_proj, to_out;
  nn::JointAttention attn;  ///< norm_q / norm_k and the attention of projected q, k, v
  int64_t cLocal = 0, mLocal = 0;
};

}  // namespace flux2
}  // namespace dit
