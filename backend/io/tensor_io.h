// Conversion between safetensors entries and at::Tensor, including shard-on-load slices.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/io/safetensors.h"

namespace dit {

/// at::ScalarType for a safetensors dtype. F8_E4M3/F8_E5M2 have no LibTorch 1.13 type: they map to
/// at::kFloat and are decoded on load. Throws std::invalid_argument for unsigned 16/32/64-bit
/// types.
at::ScalarType scalarTypeFor(DType t);

/// The float32 value of each of the 256 codes of an 8-bit float type (F8_E4M3 = torch's
/// float8_e4m3fn, F8_E5M2 = float8_e5m2): a [256] CPU tensor. Reading an F8 tensor with dtype
/// at::kByte (loadTensor / loadSlice) returns its raw codes, which this table decodes. Throws
/// std::invalid_argument for other types.
at::Tensor float8Table(DType t);

/// Reads tensor `name` whole, converted to `dtype` (CPU, contiguous, owns its memory).
/// Throws ModelFileError if the tensor is absent.
///
/// GGUF block-quantized tensors (DType Q4_0 ... Q6_K, gguf_types.h): with `dtype` at::kByte the
/// stored blocks themselves, as kByte [rows, row bytes] (rows of ggml's `ne[0]` = the last torch
/// dimension; kept quantized, see tensor_parallel::WeightStorage); any other `dtype` gives ggml's
/// float32 dequantization (bit-exact), cast. loadSlice likewise: dim 0 takes whole rows; dim 1
/// with kByte needs block-aligned columns (std::invalid_argument otherwise), dequantized slices
/// take any columns. F16 / BF16 tensors asked for as kByte are returned the same way (their raw
/// 2-byte values as block rows of 1 element), as the weight loader keeps a GGUF file's 16-bit
/// linear weights.
at::Tensor loadTensor(const SafetensorsCollection& st, const std::string& name,
                      at::ScalarType dtype);

/// Reads only the slice [start, start+length) of dimension `dim` (0 or 1) of tensor `name`; the
/// rest of the tensor is never touched or copied (shard-on-load). For `dim == 1`, tensors must be
/// 2-D. Throws ModelFileError when the slice does not fit the stored shape.
at::Tensor loadSlice(const SafetensorsCollection& st, const std::string& name, int64_t dim,
                     int64_t start, int64_t length, at::ScalarType dtype);

/// Rank `part` of `parts` of a tensor packed as `blocks` along `dim`: each block's own equal
/// piece, concatenated along `dim` (the layout of loadPackedSlice; Megatron-LM's fused-QKV
/// sharding). `slice(start, len)` returns one piece [start, start+len) of `dim`. Throws
/// std::invalid_argument naming `name` when a block does not divide by `parts`.
template <class Slice>
at::Tensor catPackedParts(const std::string& name, int64_t dim, const std::vector<int64_t>& blocks,
                          int64_t part, int64_t parts, Slice slice) {
  std::vector<at::Tensor> pieces;
  int64_t off = 0;
  for (int64_t b : blocks) {
    if (b % parts != 0)
      throw std::invalid_argument("packed block of size " + std::to_string(b) + " in '" + name +
                                  "' is not divisible by " + std::to_string(parts));
    pieces.push_back(slice(off + part * (b / parts), b / parts));
    off += b;
  }
  return at::cat(pieces, dim);
}

/// Packed slice: dimension `dim` is a concatenation of logical blocks of sizes `blocks`; takes the
/// `part`-th of `parts` equal pieces of each block and concatenates them (for fused projections
/// such as FLUX.1 single-block proj_out over cat(attn, mlp)). Every block must divide by `parts`.
at::Tensor loadPackedSlice(const SafetensorsCollection& st, const std::string& name, int64_t dim,
                           const std::vector<int64_t>& blocks, int64_t part, int64_t parts,
                           at::ScalarType dtype);

/// Writes tensors (any device, any dtype among F32/F16/BF16/I64/I32/U8) to a safetensors file.
void saveTensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                 const std::map<std::string, std::string>& metadata = {});

/// Parses "float32" | "bfloat16" | "float16" (also "fp32", "bf16", "fp16"). Throws
/// std::invalid_argument listing the accepted names.
at::ScalarType parseComputeDType(const std::string& s);
const char* computeDTypeName(at::ScalarType t);

/// Whether this CPU has bfloat16 arithmetic in hardware: AVX512-BF16 or AMX-BF16 in
/// /proc/cpuinfo's flags (what oneDNN needs for its fast bf16 GEMMs).
bool cpuHasNativeBFloat16();

/// The dtype a run computes and holds its weights in, for a requested one (issue 10).
struct ComputeDType {
  at::ScalarType dtype = at::kFloat;
  std::string note;  ///< "" when the request stands, else one sentence for the log
};

/// parseComputeDType(requested), except that bfloat16 on a CPU without bf16 hardware
/// (cpuHasNativeBFloat16() false) computes in float32: LibTorch then emulates every bf16 GEMM,
/// measured 38x slower than float32 per step (20.2 s against 0.53 s on an AMD EPYC Zen 3, the
/// 73.4 M-parameter benchmark config), and diffusers in bfloat16 takes 4.6 s there. The weights
/// are then held in float32 (twice the bytes of bfloat16) and `note` says so.
/// DITSTUDIO_CPU_BF16=native in the environment keeps bfloat16 anyway (for comparisons).
/// Any other device: the request stands. Throws std::invalid_argument as parseComputeDType.
ComputeDType resolveComputeDType(const std::string& requested, const std::string& device);

}  // namespace dit
