// How a linear layer's weight is held in memory when it is not the compute tensor itself: 8-bit
// codes (at::kByte, LibTorch 1.13 has no float8 dtype) decoded through a 256-entry lookup table
// and multiplied by a per-output-row scale, at each use (weight-only quantization: activations
// and the GEMM stay in the compute dtype). ComfyUI's fp8 weights (torch.float8_e4m3fn, optionally
// "scaled": weight = fp8.to(float32) * scale_weight) are one instance; the table describes the
// format, so nothing here knows a model or a file layout.
//
// Sharding: the codes are sharded like any weight (rows colwise, columns rowwise); rowScale has
// one entry per local output row (colwise: the local rows; rowwise/replicated: all rows), so
// fused column-parallel layers concatenate their parts' scales with their codes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace dit::tensor_parallel {

struct WeightStorage {
  std::string format;   ///< storage dtype as safetensors spells it, e.g. "F8_E4M3"
  at::Tensor table;     ///< float32 [256]: the value of each code
  at::Tensor rowScale;  ///< float32 [out_local]: scale of each output row (1 = none)

  /// weight [out_local, in_local] in `dtype` = table[codes] * rowScale[:, None], computed in
  /// float32 then cast. `codes`: kByte [out_local, in_local] on the layer's device. Throws
  /// std::invalid_argument when codes are not 2-D bytes or rowScale does not match their rows.
  at::Tensor dequantize(const at::Tensor& codes, at::ScalarType dtype) const;
};

}  // namespace dit::tensor_parallel
