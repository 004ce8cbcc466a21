// DiTModel: the one driver of every diffusion-transformer family (DiffusionTransformer). A family
// (FluxTransformer2DModel, Flux2Transformer2DModel) derives from it, loads its layers through
// loader() in its constructor and hands over a DiTSpec (dit_spec.h) with finishLoading(); the
// driver owns:
//  - the declared-vs-loaded parameter check (the plan is validated against the family's
//    ParameterTable before any weight is read; after loading, names and global shapes must equal
//    the table);
//  - input validation from the spec's input list, device/dtype moves;
//  - the context-parallel split/gather (ContextParallelRunner over the spec's cp_plan) and the
//    attention backend (local or ContextParallel);
//  - the block loop over the spec's stages with the TransformerHooks seam;
//  - step caching (backend/models/cache/step_cache.h): First Block Cache with the first block of
//    the first stage as the head block and the last block of the last stage as the tail (image
//    and text residuals reused when the remaining blocks are skipped; finalize always runs), and
//    TaylorSeer on every "<stage>.<i>.attn" module, or in lite mode on "proj_out" with every
//    block skipped on predicted steps. The cache takes its decisions collectively (FBC: sums over
//    the cp group, broadcast over cp and tp; TaylorSeer: from the step index), so every rank
//    skips the same blocks and the collectives stay in order;
//  - FLOP counts (the spec's).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/io/weight_loader.h"
#include "backend/models/diffusion_transformer.h"
#include "backend/models/dit/dit_spec.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

class WeightSource;
class StepCache;

/// Position ids as the driver takes them (DiTInput::Kind::PositionIds): [S, n_axes] unchanged,
/// [1, S, n_axes] -> [S, n_axes] (diffusers drops the batch dim). Throws std::invalid_argument
/// "<who><name> must be [S, axes] or [1, S, axes]" for any other rank.
at::Tensor positionIds2d(const at::Tensor& ids, const std::string& who, const std::string& name);

class DiTModel : public DiffusionTransformer {
 public:
  ~DiTModel() override;

  /// One forward pass on inputs replicated on every rank: validates the names against the spec
  /// (std::invalid_argument "<class>::forward: unknown input 'x'; accepted inputs: ..." or
  /// "... input 'x' is missing"; PositionIds of another rank than [S, n] / [1, S, n] likewise),
  /// splits the planned inputs over the cp group, runs embed, every stage's blocks (hooks and step
  /// cache around them) and finalize, and gathers the output over the cp group. The spec's
  /// optional prepare runs on the whole inputs before the split and its optional output on the
  /// gathered prediction. Returns the family's prediction (same on every rank). Collective over
  /// the tp and cp groups.
  at::Tensor forward(const TransformerInputs& inputs) const override;
  /// Installs the per-block seam (not owned; null = none). Must outlive forward() calls.
  void setHooks(TransformerHooks* hooks) override;
  bool supportsStepCache() const override { return true; }
  /// Installs step caching (not owned; null = none), driven as the file comment says; each
  /// forward() is one step of the cache's current context. Must outlive forward() calls. The
  /// cache must be built over this model's cp and tp groups (StepCache(cfg, cp, tp)) for its
  /// First Block Cache decision to be the same on every rank.
  void setStepCache(StepCache* cache) override;
  const std::vector<LoadedParameter>& parameters() const override;
  const ShardingPlan& shardingPlan() const override;
  double forwardFlops(int64_t imageTokens, int64_t textTokens) const override;
  tensor_parallel::LoraTargets& loraTargets() override;

 protected:
  /// Validates `plan` against `declared` at the tp degree of `par` before any weight is read
  /// (std::invalid_argument naming the rule patterns, sizes and tp_degree), then opens a
  /// WeightLoader over `source` for the family's constructor. `declaredName` names the table in
  /// errors ("fluxParameterTable").
  DiTModel(WeightSource& source, TransformerParallelism par,
           std::shared_ptr<const ShardingPlan> plan, ParameterTable declared,
           std::string declaredName);
  /// The loader while the family's constructor loads its layers (std::logic_error after
  /// finishLoading).
  WeightLoader& loader();
  /// Ends loading: checks that the model loaded exactly the declared parameters (names and global
  /// shapes; std::logic_error naming the first difference), records the parameters and LoRA
  /// targets, closes the loader and installs the spec. Throws std::invalid_argument when a stage
  /// has no run function or embed/finalize are missing.
  void finishLoading(DiTSpec spec);
  const TransformerParallelism& parallelism() const;
  /// The compute dtype (the weight source's; an FP8 checkpoint's weights are kByte codes).
  at::ScalarType computeDtype() const;
  /// The device the weights live on (set by finishLoading from the first loaded layer).
  c10::Device device() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

}  // namespace dit
