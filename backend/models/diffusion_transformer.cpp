#include "backend/models/diffusion_transformer.h"

#include "parallel/process_group.h"

namespace dit {

int TransformerParallelism::tpRank() const { return tp ? tp->rank() : 0; }
int TransformerParallelism::tpSize() const { return tp ? tp->size() : 1; }

void TransformerHooks::beforeBlock(const char*, int, const at::Tensor&, const at::Tensor&) {}
void TransformerHooks::afterBlock(const char*, int, const at::Tensor&, const at::Tensor&) {}

}  // namespace dit
