#include "parallel/tensor_parallel/weight_storage.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace dit::tensor_parallel {

at::Tensor WeightStorage::dequantize(const at::Tensor& codes, at::ScalarType dtype) const {
  if (!codes.defined() || codes.dim() != 2 || codes.scalar_type() != at::kByte)
    throw std::invalid_argument("WeightStorage(" + format + "): codes must be 2-D bytes");
  if (!rowScale.defined() || rowScale.dim() != 1 || rowScale.size(0) != codes.size(0))
    throw std::invalid_argument("WeightStorage(" + format + "): rowScale has " +
                                std::to_string(rowScale.defined() ? rowScale.numel() : 0) +
                                " entries for " + std::to_string(codes.size(0)) + " rows");
  at::Tensor w = table.index_select(0, codes.reshape({-1}).to(at::kLong)).view(codes.sizes());
  w = w * rowScale.unsqueeze(1);
  return w.scalar_type() == dtype ? w : w.to(dtype);
}

}  // namespace dit::tensor_parallel
