// Z-Image (diffusers ZImageTransformer2DModel, models/transformers/transformer_z_image.py)
// declared as data, without Torch: its parameters, its tensor-parallel plan, its context-parallel
// plan and the ModelDims the strategy rules read. diffusers declares no parallel plan for Z-Image;
// these are our own, in the shape of the FLUX.2 ones (flux2/flux2_plan.h): Megatron-style
// column/row pairs per attention and feed-forward, the sequence split after padding.
#pragma once

#include <string>

#include "backend/models/zimage/zimage_config.h"
#include "parallel/context_parallel_plan_types.h"
#include "parallel/strategy.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

/// Every parameter of ZImageTransformer2DModel for `c` with diffusers' checkpoint names and global
/// shapes (weight [out_features, in_features]): all_x_embedder.<p>-<f> and
/// all_final_layer.<p>-<f> (linear, adaLN_modulation.1), cap_embedder.0 (RMSNorm) / .1,
/// t_embedder.mlp.0 / .2, x_pad_token and cap_pad_token [1, dim]; per block of noise_refiner,
/// context_refiner and layers: attention.to_q/to_k/to_v/to_out.0 (no bias), attention.norm_q /
/// norm_k [head_dim], attention_norm1/2 and ffn_norm1/2 [dim], feed_forward.w1/w3 [M, dim] and w2
/// [dim, M] (no bias), and adaLN_modulation.0 [4 dim, min(dim, 256)] + bias on the modulated
/// blocks (noise_refiner, layers). Stored as `dtype` with `elementBytes` bytes per element.
ParameterTable zimageParameterTable(const ZImageTransformerConfig& c,
                                    const std::string& dtype = "F32", int64_t elementBytes = 4);

/// Our Z-Image tensor-parallel plan (diffusers has none): in every block of noise_refiner,
/// context_refiner and layers, attention.to_q/to_k/to_v ColwiseParallel (whole heads per rank:
/// the q/k RMSNorm is per head), attention.to_out.0 RowwiseParallel, feed_forward.w1 and w3
/// ColwiseParallel (the SwiGLU's gate and value rows pair up locally), feed_forward.w2
/// RowwiseParallel. Embedders, pad tokens, the adaLN modulations and the final layer are
/// replicated. tp_degree must divide n_heads ("tp_heads"); the plan's validation also needs it to
/// divide the feed-forward hidden size int(dim / 3 * 8).
ShardingPlan zimageShardingPlan(const ZImageTransformerConfig& c);

/// Our Z-Image context-parallel plan over the inputs ZImageTransformer2DModel's forward builds
/// from the caller's (after patchify and 32-padding): hidden_states [B, S_img_pad, 4 C] and
/// encoder_hidden_states [B, S_cap_pad, cap_feat_dim] split on dim 1, img_ids / txt_ids
/// [S, 3] and x_pad_mask / cap_pad_mask [S] on dim 0; the joint sequence of the main layers is
/// cat(caption, image) (attention is order-free: diffusers' image-first order gives the same
/// result); the output [B, S_img_pad, 4 C] gathers on dim 1 following hidden_states.
ContextParallelPlan zimageContextParallelPlan();

/// ModelDims for strategy validation: heads, head dim, FFN hidden, plans, parameter table and
/// sequence_multiple 32 (the token rules check the padded lengths).
ModelDims zimageModelDims(const ZImageTransformerConfig& c, int vaeScaleFactor);

}  // namespace dit
