// Tensor-parallel linear layers: the one linear seam of the models.
//
// Follows Megatron-LM megatron/core/tensor_parallel/layers.py (ColumnParallelLinear with
// gather_output, RowParallelLinear with input_is_parallel) and PyTorch's ColwiseParallel /
// RowwiseParallel styles; the shards are described by ShardSpec (tensor_parallel/sharding_plan.h)
// and normally come from ShardingPlan::shardSpec through the weight loader.
//
// Shapes: weight [out_features, in_features] as in torch.nn.Linear; y = x W^T + b over the last
// dimension of x ([..., in] -> [..., out]). Local shards: a colwise layer holds [out/tp, in] and
// bias [out/tp]; a rowwise layer holds [out, in/tp] and the whole bias [out].
// Dtypes: x, weight and bias share one floating dtype and device (no casting here).
//
// Collectives (over the tensor-parallel group; every rank of it must call forward in the same
// order with equally shaped inputs): RowParallelLinear::forward all-reduces (sum) its partial
// product; ColumnParallelLinear::forward with gather_output all-gathers on the last dimension.
// A null group or a group of size 1 makes every layer a plain dense linear with no communication.
//
// The seam: every layer computes its product through the protected virtual `matmul(x, bias)`
// (x W_local^T + bias, one fused GEMM; bias undefined = none). LoRA deltas (llama.cpp
// build_lora_mm: x W^T + s * (x A^T) B^T, with B sharded for colwise and A for rowwise layers) and
// quantized compute (FP8 with scales, GGUF dequantize-then-GEMM) attach later by overriding matmul
// in a subclass or a decorator; forward() decides which bias goes in (none before a rowwise reduce:
// it is added once after) and keeps the collectives in one place, so such a subclass never needs to
// know about tensor parallelism.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/process_group.h"
#include "parallel/tensor_parallel/sharding_plan.h"
#include "parallel/tensor_parallel/weight_storage.h"

namespace dit::tensor_parallel {

/// This rank's slice of the global tensor `full` under `spec` (narrow on spec.dim, one range per
/// packed block, concatenated), contiguous; `full` itself (not copied) when spec is replicated.
/// Throws std::invalid_argument as ShardSpec::ranges does.
at::Tensor shardTensor(const at::Tensor& full, const ShardSpec& spec);

/// A LoRA delta held by one layer for this rank (see tensor_parallel/lora.h): adds
/// scaling * (x A^T) B^T to output columns [rowOffset, rowOffset + B.size(0)) of the layer's local
/// product. A [r, in_local] (this rank's input columns for a rowwise layer, else whole), B
/// [rows_local, r] (this rank's output rows for a colwise layer, else whole); the layer's dtype and
/// device.
struct LoraDelta {
  int64_t rowOffset = 0;
  at::Tensor A, B;
  double scaling = 0;
};

/// Base of every linear layer. `name` is the module path = checkpoint name prefix
/// ("layers.3.self_attn.q_proj"); the layer's parameters are name + ".weight" / ".bias".
class Linear {
 public:
  virtual ~Linear() = default;
  Linear(const Linear&) = delete;
  Linear& operator=(const Linear&) = delete;

  /// y = x W^T + b on x [..., in_features] (the global input width, or the local one for a
  /// RowParallelLinear with input_is_parallel). Returns [..., out] (local or gathered, see the
  /// subclass). Throws std::invalid_argument when x's last dimension does not match.
  virtual at::Tensor forward(const at::Tensor& x) const;

  const std::string& name() const { return name_; }
  /// The local weight shard [out_local, in_local].
  const at::Tensor& weight() const { return weight_; }
  /// The local bias ([out_local] colwise, [out] rowwise/replicated); undefined when the layer has
  /// none.
  const at::Tensor& bias() const { return bias_; }
  /// How the weight was sharded (replicated for a dense layer).
  const ShardSpec& spec() const { return spec_; }
  /// Local input width: the weight's columns, or a block-row storage's decoded width.
  int64_t inFeaturesLocal() const {
    return storage_ && storage_->blockRows() ? storage_->inFeatures : weight_.size(1);
  }
  int64_t outFeaturesLocal() const { return weight_.size(0); }

  /// Weight storage (weight_storage.h): when set, weight() holds its kByte codes (8-bit codes
  /// [out_local, in_local] or block rows [out_local, row bytes]) and matmul dequantizes them (to
  /// x's dtype) at each call, a tile of at most kDequantTileBytes of float32 rows at a time for
  /// block rows. Null = weight() is the compute tensor. Throws std::invalid_argument when the
  /// codes are not kByte, rowScale does not match (8-bit codes), or block rows have no width.
  void setWeightStorage(std::shared_ptr<const WeightStorage> storage);
  /// Largest float32 tile of dequantized block rows matmul materialises at once (8 MiB).
  static constexpr int64_t kDequantTileBytes = int64_t(8) << 20;
  const WeightStorage* weightStorage() const { return storage_.get(); }
  /// The weight as computed with: weight() itself, or its dequantization in `dtype`.
  at::Tensor computeWeight(at::ScalarType dtype) const;
  /// The dtype the layer computes in: weight()'s, or with a weight storage the bias's (float32
  /// without a bias). LoRA factors are kept in it.
  at::ScalarType computeDtype() const {
    if (!storage_) return weight_.scalar_type();
    return bias_.defined() ? bias_.scalar_type() : at::kFloat;
  }
  /// Replaces this layer's LoRA deltas (empty = none: the base product exactly). Unfuses first.
  /// Throws std::invalid_argument naming the layer when a delta's A is not [r, in_local], B not
  /// [rows, r] within the local output rows, or dtype/device differ from the weight's.
  void setLoraDeltas(std::vector<LoraDelta> deltas);
  const std::vector<LoraDelta>& loraDeltas() const { return lora_; }
  /// Merges the deltas into the local weight (W + sum scaling B A on their rows); the original
  /// weight is kept and restored bit for bit by unfuseLora(). No-op without deltas.
  void fuseLora();
  void unfuseLora();
  bool loraFused() const { return unfusedWeight_.defined(); }

 protected:
  /// weight: 2-D; bias: undefined or 1-D of weight.size(0) when biasIsLocal is true, else of the
  /// global out size (rowwise). Throws std::invalid_argument naming the layer on bad shapes.
  Linear(std::string name, at::Tensor weight, at::Tensor bias, ShardSpec spec);

  /// The seam: x [..., in_local] -> x W_local^T + bias [..., out_local] (at::linear: one fused
  /// GEMM with the bias as its addend; `bias` undefined = none). Override to add LoRA deltas or
  /// quantized compute; forward() chooses the bias (none before a rowwise all-reduce) and does
  /// the collectives.
  virtual at::Tensor matmul(const at::Tensor& x, const at::Tensor& bias) const;

  void checkInput(const at::Tensor& x, int64_t expectedIn) const;
  /// matmul(x, bias) plus the unfused LoRA deltas: what forward() computes before any
  /// collective (a rowwise layer's partial LoRA product joins its partial sum before the reduce).
  at::Tensor product(const at::Tensor& x, const at::Tensor& bias) const;

  std::string name_;
  at::Tensor weight_, bias_;
  ShardSpec spec_;
  std::shared_ptr<const WeightStorage> storage_;

 private:
  std::vector<LoraDelta> lora_;
  at::Tensor unfusedWeight_;  ///< the base weight while LoRA is fused; undefined otherwise
};

/// A dense layer with the whole weight on every rank (torch.nn.Linear): no communication.
class ReplicatedLinear : public Linear {
 public:
  /// weight [out, in]; bias [out] or undefined.
  ReplicatedLinear(std::string name, at::Tensor weight, at::Tensor bias = {});
};

/// Megatron ColumnParallelLinear / PyTorch ColwiseParallel: the weight is split along the output
/// features (dim 0, per block when spec.blocks is given: PackedColwise), the input is replicated,
/// each rank computes its slice of the outputs. With gather_output the slices are all-gathered on
/// the last dimension (and packed blocks put back in global order), giving [..., out] on every
/// rank; otherwise the output stays sharded [..., out_local] (to feed a RowParallelLinear).
class ColumnParallelLinear : public Linear {
 public:
  /// weightShard [out_local, in]; biasShard [out_local] or undefined; spec: dim 0 with
  /// part = group rank and parts = group size (replicated when the group is null / size 1).
  /// Throws std::invalid_argument when the spec disagrees with the group or the shapes.
  ColumnParallelLinear(std::string name, at::Tensor weightShard, at::Tensor biasShard,
                       ShardSpec spec, std::shared_ptr<ProcessGroup> group,
                       bool gatherOutput = false);
  /// x [..., in] replicated. Collective over the group when gather_output and size > 1.
  at::Tensor forward(const at::Tensor& x) const override;
  bool gatherOutput() const { return gatherOutput_; }
  /// True when forward() runs a collective (gather_output over a group of more than one rank).
  bool gathers() const;

  /// Several layers applied to the same replicated input x [..., in], with ONE all-gather over
  /// the concatenation of the gathering layers' local outputs instead of one per layer (as
  /// PyTorch's coalesced collectives, e.g. all_gather_into_tensor_coalesced): FLUX.1's per-block
  /// AdaLN modulations, all linear(silu(temb)), once per forward. Returns one tensor per layer,
  /// in order, equal to layers[i]->forward(x) (layers that do not gather are computed by their
  /// own forward; none may be null). Collective over the gathering layers' group. Throws
  /// std::invalid_argument when the gathering layers do not share one process group.
  static std::vector<at::Tensor> forwardCoalesced(const std::vector<const Linear*>& layers,
                                                  const at::Tensor& x);

 private:
  /// This layer's whole output from an all-gather `g` [..., parts * width] (rank-major chunks of
  /// `width`) in which each rank's local output [..., out_local] sits at `offset` of its chunk.
  at::Tensor fromGathered(const at::Tensor& g, int64_t offset, int64_t width) const;

  std::shared_ptr<ProcessGroup> group_;
  bool gatherOutput_;
};

/// Megatron RowParallelLinear / PyTorch RowwiseParallel: the weight is split along the input
/// features (dim 1; per block when spec.blocks is given: packed rowwise, e.g. a single-stream
/// block's output projection over cat(attn, mlp), where the local input is
/// cat(attn_local, mlp_local)).
/// Each rank computes a partial product x_local W_local^T, the partials are all-reduced (sum)
/// over the group, and the bias is added ONCE after the reduce.
/// With input_is_parallel (the default) x is already this rank's slice [..., in_local] (the
/// sharded output of a ColumnParallelLinear); otherwise x is the whole [..., in] and the layer
/// takes its slice itself (rowwise on a replicated input).
class RowParallelLinear : public Linear {
 public:
  /// weightShard [out, in_local]; bias [out] (whole) or undefined; spec: dim 1, part = group
  /// rank, parts = group size (replicated when the group is null / size 1).
  RowParallelLinear(std::string name, at::Tensor weightShard, at::Tensor bias, ShardSpec spec,
                    std::shared_ptr<ProcessGroup> group, bool inputIsParallel = true);
  /// Collective over the group (one all-reduce) when its size > 1.
  at::Tensor forward(const at::Tensor& x) const override;
  bool inputIsParallel() const { return inputIsParallel_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
  bool inputIsParallel_;
};

/// Several column-parallel projections sharing one input (query/key/value[/mlp-in]) computed as
/// ONE GEMM over the concatenated local shards; forwardParts returns each projection's output.
/// Keeps, per part, the checkpoint name, its ShardSpec and its local output size and offset in
/// the fused weight, so LoRA (or a quantized per-part scale) can find the key projection inside it.
/// Never gathers: the outputs stay sharded (heads split across the tp group).
class FusedColumnParallelLinear : public Linear {
 public:
  struct Part {
    std::string name;   ///< module path of the projection, e.g. "layers.0.self_attn.k_proj"
    at::Tensor weight;  ///< local shard [out_local, in]
    at::Tensor bias;    ///< local shard [out_local] or undefined (all parts alike)
    ShardSpec spec;     ///< how `weight` was sharded
  };
  struct PartInfo {
    std::string name;
    ShardSpec spec;
    int64_t offset = 0;    ///< first row of this part in the fused local weight
    int64_t outLocal = 0;  ///< rows of this part in the fused local weight
  };
  /// `name` names the fused layer (e.g. "layers.0.self_attn.qkv", for logs). Parts
  /// must share in_features, dtype and the presence of a bias. Throws std::invalid_argument.
  FusedColumnParallelLinear(std::string name, std::vector<Part> parts,
                            std::shared_ptr<ProcessGroup> group);
  /// x [..., in] -> one [..., out_local_i] per part, in order. No communication.
  std::vector<at::Tensor> forwardParts(const at::Tensor& x) const;
  const std::vector<PartInfo>& parts() const { return parts_; }
  /// Index of the part with this module path; -1 when absent.
  int partIndex(const std::string& name) const;

 private:
  std::vector<PartInfo> parts_;
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace dit::tensor_parallel
