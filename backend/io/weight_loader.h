// WeightLoader: builds a model's layers from a WeightSource following the model's tensor-parallel
// ShardingPlan (llama.cpp llama_model_loader::create_tensor / check_tensor_dims; sd.cpp
// init(tensor_storage_map, prefix)). Model code asks for "the linear layer at this checkpoint path
// with these sizes"; the plan decides which layer it gets and which slice of the checkpoint each
// rank reads:
//
//   plan rule for the module path   layer                        weight read (shard-on-load)
//   none                            ReplicatedLinear             whole
//   ColwiseParallel                 ColumnParallelLinear         rows   [out/tp] (bias too);
//     with gatherOutput             (output all-gathered: the caller sees the whole output)
//   PackedColwiseParallel           ColumnParallelLinear         rows of each block
//   RowwiseParallel                 RowParallelLinear            columns [in/tp] (bias whole)
//   PackedRowwiseParallel           RowParallelLinear            columns of each block
//
// FP8 checkpoints: a linear weight stored as F8_E4M3 / F8_E5M2 stays 8-bit in memory (its codes,
// sharded as any weight) with a tensor_parallel::WeightStorage (decode table x the ComfyUI
// scale_weight per row) and is dequantized by the layer at each use (weight-only).
//
// GGUF checkpoints: a linear weight stored in ggml blocks (Q8_0, Q4_K, ...) stays quantized in
// memory on CPU devices (its blocks, sharded: colwise whole rows; rowwise the rank's column range,
// cut at block boundaries where the slice allows, else widened to the covering blocks — the rank
// is told so in LoadedParameter::note and on stderr) with a block-row WeightStorage that
// dequantizes a tile of rows at each use. On other devices such weights are dequantized to the
// compute dtype at load (noted likewise). Non-linear parameters stored quantized are dequantized.
//
// Projections sharing their input (q/k/v[/mlp]) are built as one FusedColumnParallelLinear that
// keeps each part's checkpoint name and ShardSpec. Every parameter requested is recorded in
// parameters() with its checkpoint name, global shape, stored dtype and ShardSpec, so LoRA and
// quantized weights can later find where each checkpoint tensor went.
//
// Slices are read with WeightSource::shard / packedShard: only the rank's bytes are copied and the
// pages of other ranks' slices are released (see tensor_io.cpp). The ShardSpec comes from
// ShardingPlan::shardSpec, the same function validation and byte counts use.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/io/weight_source.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

class ProcessGroup;

/// A checkpoint parameter as loaded: its declaration plus how this rank holds it.
struct LoadedParameter {
  ParameterInfo info;  ///< checkpoint name, global shape, stored dtype and element bytes
  ShardSpec spec;      ///< this rank's slice (replicated when dim < 0)
  /// Bytes this rank holds for it when kept quantized (block rows, including whole blocks kept
  /// beyond the slice); 0 when it is held in the compute dtype (or as 8-bit codes).
  int64_t heldBytes = 0;
  /// What the loader did differently from the plan's slice, and why ("" when nothing), e.g. a
  /// rowwise slice of Q4_K that does not fall on a 256-value block boundary.
  std::string note;
};

/// Bytes this rank holds for `params` by storage: 8-bit float weights kept as codes count 1 byte
/// per local element under their stored dtype ("F8_E4M3"), GGUF weights kept quantized their
/// heldBytes under their ggml type ("Q4_K"), everything else `computeBytes` per local element
/// under `computeName` (e.g. "float32"). Local elements = the ShardSpec's slice.
std::map<std::string, int64_t> heldBytesByStorage(const std::vector<LoadedParameter>& params,
                                                  int64_t computeBytes,
                                                  const std::string& computeName);

class WeightLoader {
 public:
  /// `plan` null = everything replicated; `tp` null or size 1 = no tensor parallelism (every
  /// layer is a ReplicatedLinear holding the whole weight).
  WeightLoader(WeightSource& source, std::shared_ptr<const ShardingPlan> plan,
               std::shared_ptr<ProcessGroup> tp);

  /// The linear layer at module path `path` (parameters `path.weight` [out, in], `path.bias` [out]
  /// when `bias`), chosen and sharded by the plan rule matching `path` (table above). Throws
  /// ModelFileError for a missing tensor or a stored shape other than [out, in] / [out] (naming
  /// both), std::invalid_argument when the plan's slice does not divide the dimension.
  std::shared_ptr<tensor_parallel::Linear> linear(const std::string& path, int64_t in, int64_t out,
                                                  bool bias = true);

  /// Several projections that share their input, computed as one GEMM: `parts` = {module path,
  /// out features} each with weight [out_i, in] and, when `bias`, bias [out_i]. Every part must be
  /// ColwiseParallel (or PackedColwise) under tp > 1, or replicated when tp is 1 — otherwise the
  /// parts' outputs would not line up (std::invalid_argument naming the part and its style).
  /// `name` names the fused layer in logs.
  std::shared_ptr<tensor_parallel::FusedColumnParallelLinear> fusedColumn(
      const std::string& name, const std::vector<std::pair<std::string, int64_t>>& parts,
      int64_t in, bool bias = true);

  /// A non-linear parameter (norm weight, embedding table), always replicated. Same errors as
  /// WeightSource::get.
  at::Tensor param(const std::string& name, const std::vector<int64_t>& shape);

  /// Every linear layer built so far (linear() and fusedColumn()), in load order: what LoRA
  /// adapters attach to (tensor_parallel::LoraTargets).
  const std::vector<std::shared_ptr<tensor_parallel::Linear>>& layers() const { return layers_; }

  /// Every parameter loaded so far, in load order.
  const std::vector<LoadedParameter>& parameters() const { return loaded_; }
  /// The same as a ParameterTable (declared names, global shapes, stored dtypes).
  ParameterTable parameterTable() const;

  int tpRank() const;
  int tpSize() const;
  const ShardingPlan* plan() const { return plan_.get(); }
  WeightSource& source() { return src_; }

 private:
  ShardSpec specFor(const std::string& paramName, const std::vector<int64_t>& shape) const;
  at::Tensor read(const std::string& name, const std::vector<int64_t>& shape,
                  const ShardSpec& spec);
  /// An 8-bit float weight kept as its codes: reads them (sharded by `spec`) into `codes` and
  /// returns the storage (table of the format, rowScale = the tensor's scale for each local row).
  /// Null (and `codes` untouched) when `name` is not stored as an 8-bit float.
  std::shared_ptr<const tensor_parallel::WeightStorage> readFloat8(
      const std::string& name, const std::vector<int64_t>& shape, const ShardSpec& spec,
      at::Tensor& codes);
  /// Throws ModelFileError naming the file and tensor when an 8-bit float weight kept as codes
  /// holds a NaN / Inf code (F8_E4M3 0x7f / 0xff, F8_E5M2 exponent 31) or its scale is not finite
  /// or makes the largest code overflow float32 (the float32 copies are checked by WeightSource).
  void checkFloat8(const std::string& name, const std::string& format, const at::Tensor& codes,
                   const at::Tensor& table, float scale) const;
  /// Throws ModelFileError naming the file and tensor when a weight kept in ggml blocks decodes
  /// (through `storage.decodeRow`, float32) to NaN or Inf.
  void checkBlocks(const std::string& name, const std::string& format, const at::Tensor& codes,
                   const tensor_parallel::WeightStorage& storage) const;
  void record(const std::string& name, const std::vector<int64_t>& shape, const ShardSpec& spec);
  /// A weight stored in ggml blocks kept quantized (see above): reads this rank's blocks into
  /// `codes` (kByte [out_local, bytes]) and returns the block-row storage. Null (and `codes`
  /// untouched) when `name` is not block-quantized or the source is not on the CPU.
  std::shared_ptr<const tensor_parallel::WeightStorage> readBlocks(
      const std::string& name, const std::vector<int64_t>& shape, const ShardSpec& spec,
      at::Tensor& codes);

  WeightSource& src_;
  std::shared_ptr<const ShardingPlan> plan_;
  std::shared_ptr<ProcessGroup> tp_;
  std::vector<LoadedParameter> loaded_;
  std::vector<std::shared_ptr<tensor_parallel::Linear>> layers_;
};

}  // namespace dit
