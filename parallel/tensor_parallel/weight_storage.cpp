#include "parallel/tensor_parallel/weight_storage.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <stdexcept>

namespace dit::tensor_parallel {

at::Tensor WeightStorage::dequantize(const at::Tensor& codes, at::ScalarType dtype) const {
  if (!codes.defined() || codes.dim() != 2 || codes.scalar_type() != at::kByte)
    throw std::invalid_argument("WeightStorage(" + format + "): codes must be 2-D bytes");
  return dequantizeRows(codes, 0, codes.size(0), dtype);
}

at::Tensor WeightStorage::dequantizeRows(const at::Tensor& codes, int64_t row0, int64_t rows,
                                         at::ScalarType dtype) const {
  if (!codes.defined() || codes.dim() != 2 || codes.scalar_type() != at::kByte)
    throw std::invalid_argument("WeightStorage(" + format + "): codes must be 2-D bytes");
  if (row0 < 0 || rows < 0 || row0 + rows > codes.size(0))
    throw std::invalid_argument("WeightStorage(" + format + "): rows [" + std::to_string(row0) +
                                ", " + std::to_string(row0 + rows) + ") outside " +
                                std::to_string(codes.size(0)) + " rows");
  if (blockRows()) {
    if (!codes.is_cpu() || !codes.is_contiguous())
      throw std::invalid_argument("WeightStorage(" + format +
                                  "): block rows must be contiguous CPU bytes");
    at::Tensor w = at::empty({rows, inFeatures}, at::kFloat);
    const uint8_t* src = codes.data_ptr<uint8_t>();
    float* dst = w.data_ptr<float>();
    const int64_t rowBytes = codes.size(1), width = inFeatures;
    // Grain: about 64 KiB of output per task.
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, width));
    at::parallel_for(0, rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) decodeRow(src + (row0 + r) * rowBytes, dst + r * width);
    });
    return dtype == at::kFloat ? w : w.to(dtype);
  }
  if (!rowScale.defined() || rowScale.dim() != 1 || rowScale.size(0) != codes.size(0))
    throw std::invalid_argument("WeightStorage(" + format + "): rowScale has " +
                                std::to_string(rowScale.defined() ? rowScale.numel() : 0) +
                                " entries for " + std::to_string(codes.size(0)) + " rows");
  const at::Tensor c = codes.narrow(0, row0, rows);
  at::Tensor w = table.index_select(0, c.reshape({-1}).to(at::kLong)).view(c.sizes());
  w = w * rowScale.narrow(0, row0, rows).unsqueeze(1);
  return w.scalar_type() == dtype ? w : w.to(dtype);
}

}  // namespace dit::tensor_parallel
