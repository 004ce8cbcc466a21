// QwenImageTransformer2DModel (diffusers models/transformers/transformer_qwenimage.py): the
// dual-stream MMDiT of Qwen-Image on the shared driver (models/dit/dit_model.h), its layers from
// backend/nn/:
//  - img_in Linear; the text stream through txt_norm (RMSNorm, eps 1e-6) then txt_in Linear;
//  - temb = TimestepEmbedding(Timesteps(256, flip_sin_to_cos, scale 1000)(sigma)): the sinusoid of
//    (sigma x freqs) x 1000, cos half first, then linear_1 -> SiLU -> linear_2;
//  - 60 QwenImageTransformerBlocks (num_layers): per stream a modulation Linear(SiLU(temb)) ->
//    (shift, scale, gate) for the attention and for the MLP, LayerNorm(no affine, eps 1e-6)
//    * (1 + scale) + shift; the joint attention over cat(text, image) with biases and q/k
//    RMSNorm (nn::JointAttention, as FLUX.1's); gated residuals; FeedForward gelu-tanh 4x;
//  - RoPE (QwenEmbedRope, theta 10000, scale_rope): three axes (frame, height, width); image
//    token (y, x) of an h x w grid at (0, y - (h - h // 2), x - (w - w // 2)) (centred, negative
//    positions), text row k at max(h // 2, w // 2) + k on all three axes; angles in float32,
//    applied to interleaved pairs;
//  - norm_out (AdaLayerNormContinuous: scale, shift) and proj_out on the image stream.
// Parallelism: the WeightLoader builds the layers from qwenImageShardingPlan (diffusers' _tp_plan),
// the driver splits hidden_states / encoder_hidden_states / the position ids by
// qwenImageContextParallelPlan (diffusers' _cp_plan).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <utility>

#include "backend/models/diffusion_transformer.h"
#include "backend/models/dit/dit_model.h"
#include "backend/models/qwenimage/qwenimage_config.h"

namespace dit {

class WeightSource;

class QwenImageTransformer2DModel : public DiTModel {
 public:
  /// Loads weights through a WeightLoader driven by qwenImageShardingPlan(cfg), validated against
  /// qwenImageParameterTable at the tp degree before any weight is read (std::invalid_argument
  /// naming the rule). Throws ModelFileError for missing / mismatching tensors.
  QwenImageTransformer2DModel(const QwenImageTransformerConfig& cfg, WeightSource& w,
                              TransformerParallelism par = {});
  ~QwenImageTransformer2DModel() override;

  /// One forward pass with diffusers' arguments, replicated on every rank of the groups:
  ///  hidden_states [B, S_img, in_channels] (packed latents), encoder_hidden_states
  ///  [B, S_txt, joint_attention_dim], timestep [B] (sigma = scheduler timestep / 1000),
  ///  img_shapes int64 [3] / [1, 3] / [B, 3] = (frames, h, w) of the token grid (the first row is
  ///  used for the whole batch, as diffusers' QwenEmbedRope does; frames x h x w must be S_img),
  ///  and optionally encoder_hidden_states_mask [B, S_txt] (1 = real row). Masked text rows are
  ///  excluded from the attention as diffusers' key mask excludes them: each batch item whose
  ///  mask has zeros runs with its real rows only (their RoPE positions kept), which gives the same
  ///  image prediction since masked rows are never keys. Returns [B, S_img, patch_size^2 x
  ///  out_channels] in the compute dtype (gathered; the same on every rank). Collective over the
  ///  tp and cp groups. Throws std::invalid_argument naming a missing, unknown or mis-shaped input,
  ///  or a padded (masked) batch while a step cache is installed.
  at::Tensor forward(const TransformerInputs& inputs) const override;
  void setStepCache(StepCache* cache) override;

  const QwenImageTransformerConfig& config() const;
  /// FLOPs of one forward (matmuls + attention), batch 1.
  static double flops(const QwenImageTransformerConfig& c, int64_t img_tokens, int64_t txt_tokens);

  /// Position ids of the image tokens of a frames x h x w grid, float32 [frames * h * w, 3]:
  /// (f, y - (h - h // 2), x - (w - w // 2)), row-major.
  static at::Tensor imageIds(int64_t frames, int64_t h, int64_t w);
  /// Position ids of L text rows, float32 [L, 3]: max(h // 2, w // 2) + k on every axis.
  static at::Tensor textIds(int64_t L, int64_t h, int64_t w);
  /// The rotary factors of position ids [S, 3]: {cos, sin} float32 [S, head_dim / 2] (one value
  /// per rotated pair: axes frame, height, width concatenated), as QwenEmbedRope's complex
  /// table's real and imaginary parts.
  std::pair<at::Tensor, at::Tensor> rotaryFactors(const at::Tensor& ids) const;
  /// The time embedding temb [B, inner_dim] for timestep [B] (sigma).
  at::Tensor timeEmbedding(const at::Tensor& timestep) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

}  // namespace dit
