// FluxTransformer2DModel (diffusers models/transformers/transformer_flux.py): 19/38-block MMDiT
// of FLUX.1 with double-stream (FluxTransformerBlock) and single-stream
// (FluxSingleTransformerBlock) blocks, AdaLN-Zero modulation, QK RMSNorm and 3-axis RoPE
// (FluxPosEmbed). Sizes come from transformer/config.json.
//
// Parallelism (../shared/DESIGN.md section 3):
//  - tensor parallel (tp group of size > 1): the FLUX.1 plan — double blocks to_q/to_k/to_v,
//    add_q/k/v_proj, ff.net.0.proj, ff_context.net.0.proj ColwiseParallel; to_out.0,
//    to_add_out, ff.net.2, ff_context.net.2 RowwiseParallel; single blocks to_q/k/v and proj_mlp
//    colwise, proj_out packed RowwiseParallel over blocks [inner_dim, mlp_hidden]. Weights are
//    read shard-on-load; everything else is replicated. One AllReduce per rowwise output.
//  - context parallel (cp): text and image tokens are split along the sequence, each rank keeps
//    its rotary positions, attention runs through ContextParallel, output gathered.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "backend/models/flux/flux_config.h"

namespace dit {

class WeightSource;
class ProcessGroup;
class ContextParallel;

struct FluxParallelism {
  std::shared_ptr<ProcessGroup> tp;  ///< tensor-parallel group; null or size 1 = none
  std::shared_ptr<ContextParallel> cp;  ///< context-parallel attention; null = none
  int tpRank() const;
  int tpSize() const;
};

/// Which weights the TP plan shards and how — the declarative FLUX.1 plan (diffusers names,
/// relative to a block). Used for loading, for validation messages and for the memory estimate.
struct TensorParallelRule {
  std::string suffix;       ///< e.g. "attn.to_q"
  enum Style { Colwise, Rowwise, PackedRowwise } style;
  bool singleBlock;         ///< applies to single_transformer_blocks (else transformer_blocks)
};
const std::vector<TensorParallelRule>& fluxTensorParallelPlan();

class FluxTransformer2DModel {
 public:
  /// Loads weights (shards under tp). Throws ModelFileError (missing/mismatching tensors) and
  /// std::invalid_argument (tp degree that does not divide heads or a sharded dimension, naming
  /// the layer, size and degree) before reading any weight.
  FluxTransformer2DModel(const FluxTransformerConfig& cfg, WeightSource& w, FluxParallelism par = {});
  ~FluxTransformer2DModel();

  /// One forward pass, inputs replicated on every rank of the group:
  ///  hidden_states [B, S_img, in_channels], encoder_hidden_states [B, S_txt, joint_attention_dim],
  ///  pooled_projections [B, pooled_projection_dim], timestep [B] (sigma, i.e. t / 1000),
  ///  img_ids [S_img, 3], txt_ids [S_txt, 3] (float), guidance [B] (undefined when the model has
  ///  no guidance embedder). Returns [B, S_img, out_channels] (gathered; same on every rank).
  ///  Compute dtype = weights' dtype; RoPE tables float64 -> float32 as in diffusers.
  at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                     const at::Tensor& pooled_projections, const at::Tensor& timestep,
                     const at::Tensor& img_ids, const at::Tensor& txt_ids,
                     const at::Tensor& guidance) const;

  const FluxTransformerConfig& config() const;
  /// FLOPs of one forward for the given token counts (matmuls + attention), for TFLOP/s.
  static double flops(const FluxTransformerConfig& c, int64_t img_tokens, int64_t txt_tokens);

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

/// Checks tensor parallel against the config with the strategy rules of parallel/strategy.h
/// (validateForModel): tp divides heads, each colwise output dim, each rowwise input dim, each
/// packed block. Returns "" when fine, else the messages naming the layers, sizes and degree.
std::string checkFluxTensorParallel(const FluxTransformerConfig& c, int tp);

}  // namespace dit
