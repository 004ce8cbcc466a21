#include "backend/models/diffusion_transformer.h"

#include <stdexcept>

#include "parallel/process_group.h"

namespace dit {

int TransformerParallelism::tpRank() const { return tp ? tp->rank() : 0; }
int TransformerParallelism::tpSize() const { return tp ? tp->size() : 1; }

void TransformerHooks::beforeBlock(const char*, int, const at::Tensor&, const at::Tensor&) {}
void TransformerHooks::afterBlock(const char*, int, const at::Tensor&, const at::Tensor&) {}

void DiffusionTransformer::setStepCache(StepCache*) {
  throw std::runtime_error(
      "this transformer does not support step caching (First Block Cache, TaylorSeer): "
      "supportsStepCache() is false");
}

tensor_parallel::LoraTargets& DiffusionTransformer::loraTargets() {
  static thread_local tensor_parallel::LoraTargets none;
  none = tensor_parallel::LoraTargets();
  return none;
}

}  // namespace dit
