// Tensor-parallel sharding plans as data: which parameters a model splits across the ranks of its
// tensor-parallel group, and how. Torch-free and MPI-free (dit_parallel_core): the Qt GUI validates
// strategies with it live, the worker validates before any weight is read, the loader derives each
// rank's slice from it and the benchmark/advisor/memory test derive per-rank byte counts from it.
//
// Vocabulary: PyTorch `torch.distributed.tensor.parallel.parallelize_module` plans
// (ColwiseParallel / RowwiseParallel keyed by module path patterns), diffusers' `_tp_plan`, and
// Megatron-LM's ColumnParallelLinear / RowParallelLinear (megatron/core/tensor_parallel/layers.py).
// Semantics: ../shared/DESIGN.md section 3 ("Tensor parallel").
//
// A plan is a list of ShardRule{pattern, style, blocks}. `pattern` is a module path glob over
// dot-separated segments where `*` stands for exactly one segment
// ("layers.*.self_attn.q_proj" matches "layers.12.self_attn.q_proj", not
// "layers.1.2.self_attn.q_proj"). A parameter "P.weight" / "P.bias" belongs to module P.
// The first matching rule wins; a module no rule matches is replicated.
//
// How each style shards a linear layer (weight [out_features, in_features], bias [out_features]):
//  | style         | weight                 | bias                  |
//  | Colwise       | dim 0 (output)         | dim 0                 |
//  | Rowwise       | dim 1 (input)          | replicated (added once after the all-reduce) |
//  | PackedColwise | dim 0, each block      | dim 0, each block     |
//  | PackedRowwise | dim 1, each block      | replicated            |
// Packed styles are for a dimension that is a concatenation of logical blocks, each split
// separately (rank r takes slice r of every block, concatenated): e.g. a single-stream block's
// output projection over cat(attention output C, mlp output M) is PackedRowwise with blocks {C, M};
// a fused SwiGLU gate+up projection is PackedColwise with blocks {M, M}.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "parallel/strategy_issue.h"

namespace dit {

enum class ParallelStyle { Colwise, Rowwise, PackedColwise, PackedRowwise };

/// "ColwiseParallel", "RowwiseParallel", "PackedColwiseParallel", "PackedRowwiseParallel".
const char* parallelStyleName(ParallelStyle s);

/// One parameter a model declares: checkpoint name ("layers.0.self_attn.q_proj.weight"),
/// global shape, stored dtype as in the safetensors header ("F32", "BF16", "F8_E4M3", ...) and the
/// bytes of one stored element.
struct ParameterInfo {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;
  int64_t elementBytes = 0;
  /// Product of `shape` (1 for a scalar).
  int64_t numel() const;
};

/// Every parameter a model declares, in declaration order, by name.
class ParameterTable {
 public:
  /// Adds `p`. Throws std::invalid_argument when the name is empty or already present, a dimension
  /// is negative or elementBytes < 1.
  void add(ParameterInfo p);
  /// nullptr when absent.
  const ParameterInfo* find(const std::string& name) const;
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  size_t size() const { return params_.size(); }
  bool empty() const { return params_.empty(); }
  std::vector<ParameterInfo>::const_iterator begin() const { return params_.begin(); }
  std::vector<ParameterInfo>::const_iterator end() const { return params_.end(); }

 private:
  std::vector<ParameterInfo> params_;
  std::unordered_map<std::string, size_t> index_;
};

/// One rule of a plan (see the file comment). `blocks` only for the packed styles: the sizes of the
/// logical blocks whose sum is the sharded dimension.
struct ShardRule {
  std::string pattern;
  ParallelStyle style = ParallelStyle::Colwise;
  std::vector<int64_t> blocks;
  /// > 0: the rule shards only when tp_degree divides this count (e.g. the key/value heads of a
  /// grouped-query attention); at any other tp_degree the matching modules are replicated on
  /// every rank (not an error). 0: always shards.
  int64_t shardWhenDivides = 0;
  /// Colwise styles only: the output slices are all-gathered on the last dimension, so the
  /// caller receives the whole output (PyTorch's `ColwiseParallel(output_layouts=Replicate())`,
  /// Megatron's `gather_output=True`). For a linear whose output feeds replicated code, such as
  /// an AdaLN modulation: its weight is split (memory / tp) at the cost of one all-gather of
  /// [..., out] per call.
  bool gatherOutput = false;
  /// True when the rule shards at tp_degree `tp` (see shardWhenDivides).
  bool activeAt(int tp) const { return shardWhenDivides <= 0 || shardWhenDivides % tp == 0; }
};

/// How one rank holds one parameter: `dim` = -1 means replicated (whole tensor on every rank);
/// otherwise dimension `dim` is split into `parts` equal slices and this rank holds slice `part`
/// (of every block separately when `blocks` is non-empty).
struct ShardSpec {
  int64_t dim = -1;
  int64_t part = 0, parts = 1;
  std::vector<int64_t> blocks;

  bool replicated() const { return dim < 0 || parts <= 1; }
  /// The shape this rank holds for a parameter of global shape `global`.
  /// Throws std::invalid_argument when dim is out of range, the sharded size (or a block) is not
  /// divisible by parts, or the blocks do not add up to the sharded size.
  std::vector<int64_t> localShape(const std::vector<int64_t>& global) const;
  /// (start, length) ranges along `dim` of the global tensor that this rank holds, in order
  /// (one range, or one per packed block); concatenating those slices gives the local tensor.
  /// Empty for a replicated spec (the whole tensor). Same errors as localShape.
  std::vector<std::pair<int64_t, int64_t>> ranges(const std::vector<int64_t>& global) const;
};

/// A divisibility requirement of the plan that is not a parameter dimension, e.g.
/// {"num_attention_heads", 24, "each tensor-parallel rank owns a whole number of heads",
/// "tp_heads"}.
struct DivisibilityRequirement {
  std::string name;
  int64_t value = 0;
  std::string why;
  std::string rule = "tp_divisible";  ///< StrategyIssue::rule when violated
};

class ShardingPlan {
 public:
  ShardingPlan() = default;
  explicit ShardingPlan(std::vector<ShardRule> rules);

  /// Appends a rule. Throws std::invalid_argument for an empty pattern or an empty segment, packed
  /// styles without blocks (or with a block < 1), blocks given to a non-packed style, or
  /// gatherOutput on a rowwise style.
  ShardingPlan& add(ShardRule rule);
  /// Declares that tp_degree must divide `value` (checked by validate).
  ShardingPlan& requireDivisible(std::string name, int64_t value, std::string why,
                                 std::string rule = "tp_divisible");
  /// With `on`, a tp_degree that a sharded dimension or a requireDivisible value does not divide
  /// is not an error: the whole component falls back to full replication on every rank of the
  /// tensor-parallel group (resolve() returns the empty plan and says why; validate() no longer
  /// reports those divisibility issues, only stale / shape ones).
  ShardingPlan& replicateWhenNotDivisible(bool on = true);
  bool replicatesWhenNotDivisible() const { return replicateWhenNotDivisible_; }
  /// The plan to load with at tp_degree `tp`: *this, or (replicateWhenNotDivisible and some
  /// divisibility failure) an empty plan = everything replicated, with `reason` set to the
  /// failures ("tp_degree 4 does not divide num_attention_heads 2 (...); the component is
  /// replicated on every rank of the tensor-parallel group"). `reason` is cleared otherwise.
  ShardingPlan resolve(const ParameterTable& params, int tp, std::string* reason) const;

  const std::vector<ShardRule>& rules() const { return rules_; }
  const std::vector<DivisibilityRequirement>& requirements() const { return requirements_; }

  /// True when glob `pattern` matches `modulePath` (`*` = exactly one dot-separated segment).
  static bool globMatch(std::string_view pattern, std::string_view modulePath);
  /// The first rule whose pattern matches the module path, nullptr = replicated.
  const ShardRule* match(std::string_view modulePath) const;

  /// How rank `tpRank` of a group of `tpSize` holds parameter `paramName` of global shape `shape`
  /// (module path = name without its last segment; leaf "weight" follows the style's weight dim,
  /// leaf "bias" is sharded on dim 0 by colwise styles and replicated by rowwise ones, any other
  /// leaf is replicated; a rule inactive at tpSize, see ShardRule::shardWhenDivides, replicates).
  /// tpSize 1 gives a replicated spec. Throws std::invalid_argument when
  /// tpRank is outside [0, tpSize), the sharded dimension does not exist in `shape`, or it (or a
  /// packed block) is not divisible by tpSize / the blocks do not sum to it.
  ShardSpec shardSpec(const std::string& paramName, const std::vector<int64_t>& shape, int tpRank,
                      int tpSize) const;

  /// Every problem with running this plan at tp_degree `tp` on `params`, before any weight is
  /// read: rules matching no parameter ("tp_plan_stale": a stale plan must not pass silently,
  /// checked for any tp), parameters whose sharded dimension is missing or whose blocks do not add
  /// up ("tp_plan_shape"), and for tp > 1 every sharded dimension / packed block not divisible by
  /// tp ("tp_shard"; identical failures grouped into one message naming the rule patterns, the
  /// size and tp_degree) and every requireDivisible value not divisible by tp (its own rule id).
  std::vector<StrategyIssue> validate(const ParameterTable& params, int tp) const;
  /// validate() as if replicateWhenNotDivisible were off (every divisibility failure reported).
  std::vector<StrategyIssue> validateStrict(const ParameterTable& params, int tp) const;

  /// Bytes of weights one rank holds at tp_degree `tp`: sharded parameters numel / tp (per block,
  /// rounded up), replicated ones whole (everything whole when replicateWhenNotDivisible applies),
  /// each element `computeElementBytes` bytes (the dtype the weights are computed in), or the
  /// stored elementBytes when computeElementBytes <= 0.
  uint64_t bytesPerRank(const ParameterTable& params, int tp, int64_t computeElementBytes) const;

  /// One line per rule ("layers.*.self_attn.q_proj: ColwiseParallel", packed blocks listed)
  /// and requirement, for logs.
  std::string describe() const;

 private:
  std::vector<ShardRule> rules_;
  std::vector<DivisibilityRequirement> requirements_;
  bool replicateWhenNotDivisible_ = false;
};

}  // namespace dit
