// GGUF header parsing (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md; reference
// reader ggml/src/gguf.cpp): versions 2 and 3, little-endian. Torch-free.
//
// SafetensorsReader (safetensors.h) opens GGUF files through this: it maps the file, calls
// parseGguf, and presents each tensor as a TensorInfo in torch order (shape = ggml's `ne`
// reversed: ne[0], the row width, is the last dimension) with its ggml type as a DType (F32, F16,
// BF16 or one of the block types Q4_0 ... Q6_K) and absolute byte offsets — so the checkpoint
// layouts, model summary and weight loading see GGUF tensors as they see safetensors ones.
//
// Every size, count, offset and type is checked before it is used, against the file's size and
// the format's rules; each failure throws ModelFileError naming the file, the key or tensor, and
// the cause (see parseGguf).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dit {

/// GGUF metadata value types (gguf.md `gguf_metadata_value_type`).
enum class GgufValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

/// One metadata value. Scalars: `text` holds the decimal (or string, "true"/"false") rendering,
/// `integer` the value of integer types (and bool). Arrays: `elementType` and `count`; for
/// integer arrays of at most 64 entries `integers` holds the values (e.g. ComfyUI-GGUF's
/// `comfy.gguf.orig_shape.*`); other arrays' values are skipped (checked, not kept).
struct GgufValue {
  GgufValueType type = GgufValueType::UINT8;
  std::string text;
  int64_t integer = 0;
  GgufValueType elementType = GgufValueType::UINT8;
  uint64_t count = 0;
  std::vector<int64_t> integers;
};

/// One tensor info: name, ggml type id, `ne` (ggml order: ne[0] = row width), offset relative to
/// the data section, byte size (ggml's row size x rows).
struct GgufTensorInfo {
  std::string name;
  uint32_t type = 0;
  std::vector<int64_t> ne;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

struct GgufHeader {
  uint32_t version = 0;
  uint64_t alignment = 32;  ///< general.alignment, else 32 (GGUF_DEFAULT_ALIGNMENT)
  uint64_t dataOffset = 0;  ///< absolute offset of the data section (aligned)
  std::vector<std::pair<std::string, GgufValue>> metadata;  ///< in file order
  std::vector<GgufTensorInfo> tensors;                      ///< in file order
  /// The value of `key`, or null.
  const GgufValue* find(const std::string& key) const;
};

/// Limits beyond the file size (a corrupt count is refused before anything is allocated).
inline constexpr uint64_t kMaxGgufTensors = 1'000'000;
inline constexpr uint64_t kMaxGgufKeys = 1'000'000;
inline constexpr uint64_t kMaxGgufStringBytes = 1 << 20;  ///< a key, a tensor name or a value
inline constexpr uint32_t kMaxGgufDims = 4;               ///< GGML_MAX_DIMS

/// True when `size` >= 4 and the bytes start with the magic "GGUF".
bool isGguf(const uint8_t* base, uint64_t size);

/// Parses and validates the header of the GGUF file mapped at [base, base + size) (`path` names
/// it in errors). Throws ModelFileError naming the file and the cause: truncated (any field, key,
/// string or array running past the end), bad magic, version 1 or above 3 (or a byte-swapped,
/// big-endian one), tensor or key count beyond the file or the limits above, a string longer
/// than 1 MiB, an unknown value type, an array of arrays, a duplicate key, general.alignment not
/// a UINT32 power of two, a duplicate tensor name, 0 or more than 4 dimensions, a negative or
/// absurd dimension (elements overflowing 2^62), a ggml type this reader does not dequantize
/// (named: "IQ2_XXS", "TQ1_0", ...), a row width not a multiple of the type's block, a data
/// offset not a multiple of the alignment, a tensor's data past the end of the file, tensors that
/// overlap.
GgufHeader parseGguf(const uint8_t* base, uint64_t size, const std::string& path);

}  // namespace dit
