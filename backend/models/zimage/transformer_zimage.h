// ZImageTransformer2DModel (diffusers models/transformers/transformer_z_image.py): the
// single-stream DiT of Z-Image (-Turbo). Per forward: t embedding (adaln_input =
// t_embedder(t * t_scale), no SiLU before the blocks' modulation); the image patchified channel
// LAST ((dy * p + dx) * C + c) and padded, like the caption, to a multiple of 32 tokens whose rows
// become the learned x_pad_token / cap_pad_token after the embedders (ordinary tokens afterwards:
// attended, never masked); noise_refiner (modulated blocks over the image tokens), context_refiner
// (unmodulated blocks over the caption tokens), then the main layers over the joint sequence;
// 3-axis RoPE (caption row k: (1 + k, 0, 0); image token (y, x): (S_cap_pad + 1, y, x); image
// padding (0, 0, 0)) with theta rope_theta, angles in float64 rounded to float32, interleaved
// pairs; blocks with sandwich RMSNorms (attention_norm1/2, ffn_norm1/2), tanh-gated modulation
// (1 + scale), q/k RMSNorm (eps 1e-5) and a SwiGLU feed-forward w2(silu(w1 x) * w3 x); the final
// layer Linear(LayerNorm(x, eps 1e-6, no affine) * (1 + Linear(SiLU(adaln_input)))).
//
// The skeleton (declared-vs-loaded check, input validation, context-parallel split/gather, the
// hooked block loop, step-cache seams, FLOPs) is the shared driver's (models/dit/dit_model.h): the
// spec's prepare hook patchifies and pads before the split, its output hook cuts the padding and
// unpatchifies after the gather. Parallelism is declared (zimage/zimage_plan.h): tp shards whole
// heads and the feed-forward, context parallelism splits the padded sequences; the refiners
// attend over their own stream (DiTState::attentionOver), the main layers over the joint one.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "backend/models/diffusion_transformer.h"
#include "backend/models/dit/dit_model.h"
#include "backend/models/zimage/zimage_config.h"

namespace dit {

class WeightSource;

class ZImageTransformer2DModel : public DiTModel {
 public:
  /// Loads weights through a WeightLoader driven by zimageShardingPlan(cfg) (each rank reads only
  /// its slices under tp), validated against zimageParameterTable at the tp degree before any
  /// weight is read (std::invalid_argument naming the rule: heads or FFN hidden not divisible).
  /// Throws ModelFileError for missing / mismatching tensors.
  ZImageTransformer2DModel(const ZImageTransformerConfig& cfg, WeightSource& w,
                           TransformerParallelism par = {});
  ~ZImageTransformer2DModel() override;

  // forward (DiTModel): inputs replicated on every rank of the groups:
  //  hidden_states [B, in_channels, h, w] (diffusers' x items (C, F = 1, h, w) stacked, F
  //  dropped; h and w multiples of patch_size), encoder_hidden_states [B, n, cap_feat_dim] (the
  //  cap_feats items, all of one length n >= 1: diffusers' batch padding and its key masks are not
  //  needed then), timestep [B] (t = 1 - sigma, the pipeline's (1000 - timestep) / 1000).
  //  Returns [B, in_channels, h, w] in the compute dtype (the raw model output; ZImagePipeline
  //  negates it), the same on every rank. Collective over the tp and cp groups. Throws
  //  std::invalid_argument naming a missing / unknown input or a bad shape (a position beyond
  //  axes_lens included).

  const ZImageTransformerConfig& config() const;
  /// FLOPs of one forward (matmuls + attention), batch 1, for image and caption tokens (each
  /// padded to 32 as the model does).
  static double flops(const ZImageTransformerConfig& c, int64_t img_tokens, int64_t txt_tokens);

  /// Debug aids the goldens check: adaln_input = t_embedder(t * t_scale) [B, min(dim, 256)]
  /// (dit.N.dbg.adaln_input), and the position ids of the padded caption and image
  /// ({txt_ids [S_cap_pad, 3], img_ids [S_img_pad, 3]} int64) for n caption rows and an
  /// h_tokens x w_tokens grid, and the RoPE tables {cos, sin} float32 [S, head_dim] (each value
  /// repeated for its pair) of position ids [S, 3].
  at::Tensor adalnInput(const at::Tensor& t) const;
  static std::pair<at::Tensor, at::Tensor> positionIds(int64_t n, int64_t h_tokens,
                                                       int64_t w_tokens);
  std::pair<at::Tensor, at::Tensor> rotaryTables(const at::Tensor& ids) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

}  // namespace dit
