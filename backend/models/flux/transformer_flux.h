// FluxTransformer2DModel (diffusers models/transformers/transformer_flux.py): the MMDiT of FLUX.1
// with num_layers double-stream blocks (FluxTransformerBlock) and num_single_layers single-stream
// blocks (FluxSingleTransformerBlock), AdaLN-Zero modulation, QK RMSNorm and 3-axis RoPE
// (FluxPosEmbed). Sizes come from transformer/config.json (flux_config.h). The classes below carry
// diffusers' names, module paths (= checkpoint name prefixes) and output names, so a reader can put
// this file next to transformer_flux.py.
//
// Parallelism (../shared/DESIGN.md section 3) is not in forward():
//  - tensor parallel: the layers are built by the plan (flux_plan.h); ColwiseParallel projections
//    hold their output shard, RowwiseParallel ones all-reduce their partial product over the tp
//    group and add the bias once. Blocks see only "a linear layer" and a local head count.
//  - context parallel: the model's declared plan (FLUX: hidden_states and encoder_hidden_states
//    split on dim 1, img_ids and txt_ids on dim 0, output gathered on dim 1) is applied around
//    forward(); attention runs through the attention backend (local, or ContextParallel over the
//    concatenated text+image sequence of every rank).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/models/flux/flux_config.h"

namespace dit {

class WeightSource;
class ProcessGroup;
class ContextParallel;

struct FluxParallelism {
  std::shared_ptr<ProcessGroup> tp;     ///< tensor-parallel group; null or size 1 = none
  std::shared_ptr<ContextParallel> cp;  ///< context-parallel attention; null = none
  int tpRank() const;
  int tpSize() const;
};

/// Which weights the TP plan shards and how — the declarative FLUX.1 plan (diffusers names,
/// relative to a block). Used for loading, for validation messages and for the memory estimate.
struct TensorParallelRule {
  std::string suffix;  ///< e.g. "attn.to_q"
  enum Style { Colwise, Rowwise, PackedRowwise } style;
  bool singleBlock;  ///< applies to single_transformer_blocks (else transformer_blocks)
};
const std::vector<TensorParallelRule>& fluxTensorParallelPlan();

/// Per-block seam (for step caching, profiling, activation dumps): called by
/// FluxTransformer2DModel::forward around every block, in order, on every rank. `kind` is
/// "transformer_blocks" or "single_transformer_blocks", `index` the block index within its kind.
/// Tensors are this rank's local (context-parallel) slices:
///  - double blocks: hidden_states [B, S_img_local, C], encoder_hidden_states [B, S_txt_local, C];
///  - single blocks: hidden_states = cat(text, image) [B, S_local, C], encoder_hidden_states
///    undefined.
/// Hooks must not change collective order across ranks (a skip decision must be agreed by all
/// ranks of the cp/tp groups). Default implementations do nothing.
class TransformerHooks {
 public:
  virtual ~TransformerHooks() = default;
  virtual void beforeBlock(const char* kind, int index, const at::Tensor& hidden_states,
                           const at::Tensor& encoder_hidden_states);
  virtual void afterBlock(const char* kind, int index, const at::Tensor& hidden_states,
                          const at::Tensor& encoder_hidden_states);
};

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
  ///  Throws std::invalid_argument when the model needs guidance and none is given.
  ///  Collective over the tp and cp groups when they are set.
  at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                     const at::Tensor& pooled_projections, const at::Tensor& timestep,
                     const at::Tensor& img_ids, const at::Tensor& txt_ids,
                     const at::Tensor& guidance) const;

  /// Installs the per-block seam (not owned; null = none). Must outlive forward() calls.
  void setHooks(TransformerHooks* hooks);

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
