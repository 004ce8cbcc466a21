// ggml tensor types as GGUF files store them (ggml/include/ggml.h `enum ggml_type`, block layouts
// of ggml/src/ggml-common.h) and their float32 dequantization, bit for bit as ggml's reference
// `dequantize_row_*` (ggml/src/ggml-quants.c): every multiplication and addition rounded
// separately, in ggml's order (this file's .cpp is built with -ffp-contract=off so no compiler
// fuses them into FMA instructions).
//
// Torch-free and Qt-free: the GUI, the memory estimate and the advisor use the sizes; the weight
// loader and the quantized linear storage (tensor_parallel/weight_storage.h) use the kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dit {

/// The ggml types a GGUF tensor may have that DiT Studio reads: the ids are ggml's (`ggml_type`).
/// FLUX GGUFs (city96, ComfyUI-GGUF) use these; every other id is refused by name
/// (ggmlTypeName) when a file is opened.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  BF16 = 30,
};

/// ggml's name of type id `id` ("Q4_K", "IQ2_XXS", "TQ1_0", ...), also for ids DiT Studio does
/// not read; "type id N" for an id ggml does not define.
std::string ggmlTypeName(uint32_t id);
/// True when `id` is one of GgmlType's values (readable and dequantizable here).
bool ggmlTypeSupported(uint32_t id);
/// Elements per block: 1 (F32, F16, BF16), 32 (Q4_0 ... Q8_0) or 256 (K-quants, QK_K).
int64_t ggmlBlockSize(GgmlType t);
/// Bytes per block (ggml's type_size): F32 4, F16/BF16 2, Q4_0 18, Q4_1 20, Q5_0 22, Q5_1 24,
/// Q8_0 34, Q2_K 84, Q3_K 110, Q4_K 144, Q5_K 176, Q6_K 210.
int64_t ggmlBlockBytes(GgmlType t);
/// Bytes of a row of `n` elements (n must be a multiple of the block size; not checked here).
inline int64_t ggmlRowBytes(GgmlType t, int64_t n) {
  return n / ggmlBlockSize(t) * ggmlBlockBytes(t);
}
/// True for the block-quantized types (every type but F32, F16, BF16).
inline bool ggmlIsQuantized(GgmlType t) {
  return t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16;
}
/// The GgmlType named `name` (ggmlTypeName spelling); false when it names none of them.
bool parseGgmlType(const std::string& name, GgmlType& out);

/// Stored bytes per parameter of a storage type named as the model summary and the weight loader
/// name them: safetensors dtypes ("F32" 4, "BF16"/"F16" 2, "F8_E4M3"/"F8_E5M2" 1, ...) and the
/// ggml types above ("Q8_0" 34/32 = 1.0625, "Q4_K" 144/256 = 0.5625, ...). Returns 0 for a name
/// it does not know. For memory estimates (app/memory_estimate): a 12 B-parameter transformer of
/// Q4_K weights holds 12e9 x 0.5625 = 6.75 GB, 3.4 GB per rank at tp 2.
double storageBytesPerParameter(const std::string& storageName);

/// Dequantizes `n` elements (a whole number of blocks of `t`) from `src` to float32 `dst`, as
/// ggml's `type_traits[t].to_float` (reference C code): bit-identical results. F16 and BF16
/// convert exactly; F32 copies. The caller guarantees `src` holds ggmlRowBytes(t, n) bytes.
void dequantizeGgml(GgmlType t, const uint8_t* src, float* dst, int64_t n);

/// float32 value of IEEE half `h` (exact).
float halfToFloat(uint16_t h);

}  // namespace dit
