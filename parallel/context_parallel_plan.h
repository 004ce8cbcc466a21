// The generic runner that applies a context-parallel plan (the plan itself is Torch-free data:
// parallel/context_parallel_plan_types.h).
//
// Follows diffusers' `_cp_plan` (models/transformers/transformer_flux.py: ContextParallelInput
// {split_dim, expected_dims, split_output} per named forward input and ContextParallelOutput
// {gather_dim, expected_dims}) and hooks/context_parallel.py (apply_context_parallel: split the
// listed inputs before the forward, gather the output after it). The model declares which inputs
// are split on which dimension and where the output gathers; the runner does the splitting,
// remembers every rank's sizes, gives the joint attention its per-rank lengths and gathers. Model
// code never calls ContextParallel::partition / localRange / gatherSequence itself.
//
// Partitions follow ContextParallel::partition: tensor_split sizes (the first len % degree cp ranks
// get one more element) in the anything modes; strict modes refuse a length not divisible by the
// cp degree (std::invalid_argument before any collective).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/context_parallel.h"
#include "parallel/context_parallel_plan_types.h"  // the plan as data (Torch-free)

namespace dit {

/// Applies a ContextParallelPlan for one forward call. Usage:
///   ContextParallelRunner run(cp, plan);
///   auto local = run.split({{"hidden_states", x}, {"img_ids", ids}, ...});  // no communication
///   ... model forward on local tensors, attention with run.localLens() ...
///   at::Tensor out = run.gather(localOut);                                 // collective (cp
///   group)
/// With a null cp or degree 1 the runner passes tensors through unchanged.
class ContextParallelRunner {
 public:
  /// Throws std::invalid_argument when the plan names an input twice, joint_sequence or
  /// output.sizes_from names an input the plan does not split. Not collective.
  ContextParallelRunner(std::shared_ptr<ContextParallel> cp, ContextParallelPlan plan);

  /// Splits every planned input present in `inputs` on its split_dim (this rank's part of
  /// cp->partition(len), at cp->localRange(len)); inputs the plan does not list are returned
  /// unchanged. Records every rank's sizes per input. Throws std::invalid_argument when a planned
  /// input is missing or undefined, has the wrong number of dimensions, or (strict modes) its
  /// length is not divisible by the cp degree. Local; no communication.
  std::map<std::string, at::Tensor> split(const std::map<std::string, at::Tensor>& inputs);

  /// Every cp rank's size of input `name` along its split dim (after split()). Throws
  /// std::invalid_argument when the input was not split.
  const std::vector<int64_t>& sizes(const std::string& name) const;
  /// Per cp rank, the sum over joint_sequence of sizes(): the localLens argument of
  /// ContextParallel::attention. Throws std::invalid_argument before split().
  std::vector<int64_t> localLens() const;

  /// Gathers this rank's output along output.gather_dim into the full output (cp-rank order,
  /// uneven sizes allowed), using sizes(output.sizes_from). Throws std::invalid_argument when the
  /// local output's size there differs from this rank's recorded size or the dims differ from
  /// expected_dims. Collective over the cp group (when degree > 1).
  at::Tensor gather(const at::Tensor& localOutput) const;

  const ContextParallelPlan& plan() const { return plan_; }
  int degree() const { return cp_ ? cp_->degree() : 1; }

 private:
  std::shared_ptr<ContextParallel> cp_;
  ContextParallelPlan plan_;
  std::map<std::string, std::vector<int64_t>> sizes_;
};

}  // namespace dit
