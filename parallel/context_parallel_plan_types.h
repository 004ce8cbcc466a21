// Context-parallel plans as data, without Torch or MPI (dit_parallel_core): a model family
// declares its plan next to its tensor-parallel plan (e.g. backend/models/flux/flux_plan.h) and
// registers it with the family (ModelDims::context_parallel_plan); the Torch-side
// ContextParallelRunner (parallel/context_parallel_plan.h) applies it around the model's forward.
//
// Follows diffusers' `_cp_plan` (models/transformers/transformer_flux.py: ContextParallelInput
// {split_dim, expected_dims, split_output} per named forward input and ContextParallelOutput
// {gather_dim, expected_dims}) and hooks/context_parallel.py.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dit {

/// One forward input the plan splits: `name` (the argument's name, e.g. "hidden_states"), the
/// dimension split across the cp group (negative counts from the end) and, when >= 0, the number of
/// dimensions the input must have (diffusers expected_dims; checked).
struct ContextParallelInput {
  std::string name;
  int64_t split_dim = 1;
  int64_t expected_dims = -1;
};

/// Where the model's output is gathered: `gather_dim` (negative counts from the end), the split
/// input whose per-rank sizes the output follows (`sizes_from`, e.g. "hidden_states" for FLUX:
/// one output token per image token) and optionally the expected number of dimensions.
struct ContextParallelOutput {
  int64_t gather_dim = 1;
  std::string sizes_from;
  int64_t expected_dims = -1;
};

/// A model's context-parallel plan. `joint_sequence`: split inputs whose local parts are
/// concatenated (in this order) into the sequence the attention sees, e.g.
/// {"encoder_hidden_states", "hidden_states"} for FLUX (text then image); their split sizes give
/// the attention's localLens.
struct ContextParallelPlan {
  std::vector<ContextParallelInput> inputs;
  ContextParallelOutput output;
  std::vector<std::string> joint_sequence;
};

}  // namespace dit
