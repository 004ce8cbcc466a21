// The Torch-side interface every denoiser (diffusion transformer) family implements, with the
// per-block hook seam and the parallel groups the model runs under. What a family registers with
// the Torch-side transformer registry (models/torch_registry.h); the Torch-free half of the family
// (config sizes, declared plans) is models/registry.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/io/lora_file.h"      // KohyaLoraMapping
#include "backend/io/weight_loader.h"  // LoadedParameter
#include "parallel/tensor_parallel/lora.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

class ProcessGroup;
class ContextParallel;
class StepCache;

/// The parallel groups a transformer runs under (both optional).
struct TransformerParallelism {
  std::shared_ptr<ProcessGroup> tp;     ///< tensor-parallel group; null or size 1 = none
  std::shared_ptr<ContextParallel> cp;  ///< context-parallel attention; null = none
  int tpRank() const;                   ///< 0 without a group
  int tpSize() const;                   ///< 1 without a group
};

/// Per-block seam (for step caching, profiling, activation dumps): called by the model's forward
/// around every block, in order, on every rank. `kind` is the block list's module name (FLUX:
/// "transformer_blocks" or "single_transformer_blocks"), `index` the block index within it.
/// Tensors are this rank's local (context-parallel) slices; what they hold is documented by the
/// family (FluxTransformer2DModel: double blocks hidden_states [B, S_img_local, C] and
/// encoder_hidden_states [B, S_txt_local, C]; single blocks hidden_states = cat(text, image)
/// [B, S_local, C], encoder_hidden_states undefined).
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

/// Forward inputs by diffusers' argument names ("hidden_states", "encoder_hidden_states",
/// "timestep", ...; the names the family's context-parallel plan splits).
using TransformerInputs = std::map<std::string, at::Tensor>;

class DiffusionTransformer {
 public:
  virtual ~DiffusionTransformer() = default;
  /// One forward pass on inputs replicated on every rank of the groups; returns the prediction
  /// (gathered: the same on every rank). Shapes and dtypes per family (FluxTransformer2DModel:
  /// transformer_flux.h). Throws std::invalid_argument naming a missing required input or an
  /// input the model does not take. Collective over the tp and cp groups when they are set.
  virtual at::Tensor forward(const TransformerInputs& inputs) const = 0;
  /// Installs the per-block seam (not owned; null = none). Must outlive forward() calls.
  virtual void setHooks(TransformerHooks* hooks) = 0;
  /// True when this transformer runs First Block Cache / TaylorSeer through setStepCache.
  virtual bool supportsStepCache() const { return false; }
  /// Attaches the step cache for the next denoising loop (null detaches). Throws std::runtime_error
  /// when supportsStepCache() is false.
  virtual void setStepCache(StepCache* cache);
  /// Every parameter as loaded on this rank (checkpoint name, global shape, stored dtype, the
  /// slice this rank holds).
  virtual const std::vector<LoadedParameter>& parameters() const = 0;
  /// The tensor-parallel plan the model was loaded with.
  virtual const ShardingPlan& shardingPlan() const = 0;
  /// FLOPs of one forward (matmuls + attention) for `imageTokens` image and `textTokens` text
  /// tokens, batch 1, for TFLOP/s figures.
  virtual double forwardFlops(int64_t imageTokens, int64_t textTokens) const = 0;
  /// The model's linear layers by module path, where LoRA adapters are prepared and applied
  /// (tensor_parallel/lora.h). Applying changes what forward() computes; call it between
  /// forwards, on every rank alike. Default: no layers (a family without LoRA support).
  virtual tensor_parallel::LoraTargets& loraTargets();
  /// How this family maps kohya (sd-scripts) module names onto its modules; empty function = the
  /// family takes no kohya files.
  virtual KohyaLoraMapping kohyaLoraMapping() const { return {}; }
};

}  // namespace dit
