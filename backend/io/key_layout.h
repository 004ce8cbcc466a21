// A component of a single-file checkpoint addressed by diffusers parameter names: each parameter
// as the stored row ranges it is made of (fused rows addressed as ranges so a tensor-parallel rank
// reads only its own rows), optionally times a stored scale. Torch-free and family-free: the
// layouts themselves are built by backend/models/checkpoint_layouts.h; WeightSource::fromLayout
// reads through them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dit {

/// Rows [row0, row0 + rows) of dimension 0 of stored tensor `key`.
struct TensorSegment {
  std::string key;
  int64_t row0 = 0;
  int64_t rows = 0;
};

/// One diffusers parameter as stored: the concatenation along dim 0 of `segments`, reshaped to
/// `shape` (drops the trailing 1x1 of LDM attention convolutions), times the scalar `scaleKey`
/// (F32, BF16 or F16, applied in float32) when set (ComfyUI scaled fp8: weight =
/// fp8.to(float32) * scale_weight).
struct MappedTensor {
  std::vector<TensorSegment> segments;
  std::vector<int64_t> shape;
  std::string scaleKey;
};

/// The spellings ComfyUI (and InvokeAI, reading ComfyUI's files) use for the per-layer tensors of
/// scaled fp8 weights besides the weight itself: the weight scale (`<layer>.scale_weight`, newer
/// `<layer>.weight_scale`), the activation scale (`.scale_input`, newer `.input_scale`: used only
/// to quantize activations for fp8 matrix products, it does not change the weight) and the
/// per-layer quantization config (`.comfy_quant`: JSON bytes such as {"format": "float8_e4m3fn"}).
inline constexpr const char* kWeightScaleSuffixes[] = {".scale_weight", ".weight_scale"};
inline constexpr const char* kFp8AuxiliarySuffixes[] = {
    ".scale_weight", ".weight_scale", ".scale_input", ".input_scale", ".comfy_quant"};

/// True when `key` is one of the scaled-fp8 auxiliary tensors above or the file's `scaled_fp8`
/// marker (not a parameter of the model).
inline bool isFp8AuxiliaryKey(const std::string& key) {
  auto ends = [&](const std::string& s) {
    return key.size() >= s.size() && key.compare(key.size() - s.size(), s.size(), s) == 0;
  };
  if (key == "scaled_fp8" || ends(".scaled_fp8")) return true;
  for (const char* s : kFp8AuxiliarySuffixes)
    if (ends(s)) return true;
  return false;
}

/// A component of a single file, addressed by diffusers parameter names.
struct KeyLayout {
  std::string file;         ///< the safetensors file
  std::string description;  ///< e.g. "BFL FLUX.1 transformer (prefix model.diffusion_model.)"
  std::map<std::string, MappedTensor> tensors;  ///< diffusers name -> stored pieces
};

}  // namespace dit
