// How a linear layer's weight is held in memory when it is not the compute tensor itself
// (weight-only quantization: activations and the GEMM stay in the compute dtype), in two kinds:
//
//  * 8-bit codes (at::kByte [out_local, in_local]; LibTorch 1.13 has no float8 dtype) decoded
//    through a 256-entry lookup table and multiplied by a per-output-row scale, at each use.
//    ComfyUI's fp8 weights (torch.float8_e4m3fn, optionally "scaled": weight =
//    fp8.to(float32) * scale_weight) are one instance.
//  * Block-quantized rows (GGUF / ggml Q8_0, Q4_K, ...): at::kByte [out_local, row_bytes], each
//    row the bytes of this rank's blocks of one output row; `decodeRow` (set by the weight loader,
//    which knows the format) turns one such row into `inFeatures` float32 values. The layer
//    dequantizes a tile of rows and multiplies (Linear::matmul), so the weight stays quantized in
//    memory and only a tile is ever float32.
//
// The storage describes the format, so nothing here knows a model or a file layout.
//
// Sharding: the codes are sharded like any weight (rows colwise, columns rowwise: for block rows
// the rank's column range, widened to whole blocks where the slice does not fall on a block
// boundary, with decodeRow dropping the columns the rank does not own); rowScale has one entry
// per local output row (colwise: the local rows; rowwise/replicated: all rows), so fused
// column-parallel layers concatenate their parts' scales with their codes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>

namespace dit::tensor_parallel {

struct WeightStorage {
  std::string format;   ///< storage dtype as the checkpoint spells it, e.g. "F8_E4M3", "Q4_K"
  at::Tensor table;     ///< 8-bit codes: float32 [256], the value of each code
  at::Tensor rowScale;  ///< 8-bit codes: float32 [out_local], scale of each output row (1 = none)

  /// Block rows: the local input width (elements one decoded row has); 0 for 8-bit codes.
  int64_t inFeatures = 0;
  /// Block rows: writes the `inFeatures` float32 values of one row from that row's bytes. Called
  /// concurrently from several threads (must not share scratch state).
  std::function<void(const uint8_t* row, float* out)> decodeRow;
  bool blockRows() const { return static_cast<bool>(decodeRow); }

  /// weight [out_local, in_local] in `dtype`: table[codes] * rowScale[:, None], or the decoded
  /// block rows, computed in float32 then cast. `codes`: kByte, 2-D, CPU for block rows. Throws
  /// std::invalid_argument when codes are not 2-D bytes, rowScale does not match their rows, or
  /// block rows are not on the CPU.
  at::Tensor dequantize(const at::Tensor& codes, at::ScalarType dtype) const;
  /// Rows [row0, row0 + rows) of dequantize(codes, dtype) (block rows decode only those, split
  /// over the intra-op threads).
  at::Tensor dequantizeRows(const at::Tensor& codes, int64_t row0, int64_t rows,
                            at::ScalarType dtype) const;
};

}  // namespace dit::tensor_parallel
