// LoRA on (tensor-parallel) linear layers, model-neutral: the adapter container and its placement
// on a model's layers through the Linear seam (layers.h, Linear::setLoraDeltas).
//
// Follows PEFT's LoRA arithmetic (peft/tuners/lora/layer.py Linear.forward / get_delta_weight):
// y = base(x) + scaling * (x A^T) B^T with A = lora_A [r, in], B = lora_B [out, r] and
// scaling = strength * alpha / r; several adapters add. Under tensor parallelism each rank holds
// only its slice (llama.cpp / vLLM punica style):
//   colwise layer (weight rows split, incl. packed blocks and the parts of a fused column layer):
//     B split by output rows exactly as the weight, A whole;
//   rowwise layer (weight columns split): A split by input columns exactly as the weight, B
//     whole; the partial LoRA product is added to the partial base product BEFORE the layer's own
//     all-reduce, so the sum over ranks is the whole delta;
//   replicated layer: A and B whole.
// Context, CFG and data parallel ranks hold the same weights and apply the same deltas.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/tensor_parallel/layers.h"

namespace dit::tensor_parallel {

/// One module's LoRA factors, whole (unsharded), in the model's module naming.
struct LoraModule {
  std::string name;  ///< module path of the target projection ("layers.0.self_attn.q_proj")
  at::Tensor A;      ///< lora_A / lora_down [rank, in_features], float (CPU or device)
  at::Tensor B;      ///< lora_B / lora_up [out_features, rank]
  double alpha = 0;  ///< alpha as the file gives it (or rank)
  int64_t rank = 0;
  double scale = 0;  ///< scaling at strength 1 (alpha / rank, or alpha / sqrt(rank) for rsLoRA)
};

/// A parsed LoRA file: model-neutral list of modules (the format decoding happened before).
struct LoraAdapter {
  std::string file;    ///< where it came from (for error messages)
  std::string format;  ///< "diffusers" | "kohya" (informational)
  std::vector<LoraModule> modules;
  /// Bytes of all factors.
  uint64_t bytes() const;
};

/// One adapter placed on one model's layers for this rank: the local factor shards, already in
/// each layer's dtype and device. Built by LoraTargets::prepare; immutable, cheap to keep cached
/// and to re-apply at any strength.
struct PreparedLora {
  struct Entry {
    size_t layer = 0;    ///< index into LoraTargets::layers()
    std::string module;  ///< module path (for logs)
    LoraDelta delta;     ///< scaling = scale at strength 1
  };
  std::string file;
  std::vector<Entry> entries;
  uint64_t bytes = 0;  ///< bytes of the local shards this rank holds
};

/// The linear layers of one model, indexed by module path (a fused column layer is indexed by the
/// path of each of its parts).
class LoraTargets {
 public:
  LoraTargets() = default;
  /// Throws std::invalid_argument when two layers (or parts) share a module path.
  explicit LoraTargets(std::vector<std::shared_ptr<Linear>> layers);

  /// Checks every module of `adapter` against the layers and cuts this rank's shards (cast to the
  /// layer's dtype, moved to its device). Nothing is applied. Throws std::invalid_argument naming
  /// adapter.file and the first module that does not fit: "<file>: module 'x' does not exist in
  /// this model", or its A/B shapes against the layer's global [out, in].
  std::shared_ptr<const PreparedLora> prepare(const LoraAdapter& adapter) const;

  /// Replaces the deltas on every layer by these adapters at these strengths (scaling = strength *
  /// scale per module); an empty list restores the base layers exactly (no delta at all). Unfuses
  /// first if fused. Layers not named by any adapter get no delta.
  void apply(const std::vector<std::pair<std::shared_ptr<const PreparedLora>, double>>& loras);
  /// apply({}).
  void clear() { apply({}); }

  /// Merges the current deltas into the weights (W' = W + sum scaling B A, per layer); forward
  /// then costs one GEMM again. The original weights are kept and put back bit for bit by
  /// unfuse() (or by the next apply()).
  void fuse();
  void unfuse();
  bool fused() const { return fused_; }

  /// Bytes of the LoRA shards currently applied on this rank (each PreparedLora counted once).
  uint64_t appliedBytes() const { return appliedBytes_; }
  const std::vector<std::shared_ptr<Linear>>& layers() const { return layers_; }
  bool empty() const { return layers_.empty(); }

 private:
  struct Where {
    size_t layer = 0;
    int part = -1;  ///< index in a FusedColumnParallelLinear, -1 = the whole layer
  };
  std::vector<std::shared_ptr<Linear>> layers_;
  std::map<std::string, Where> index_;
  bool fused_ = false;
  uint64_t appliedBytes_ = 0;
};

}  // namespace dit::tensor_parallel
