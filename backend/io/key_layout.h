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
/// `shape` (drops the trailing 1x1 of LDM attention convolutions), times the F32 scalar
/// `scaleKey` when set (ComfyUI scaled fp8: weight = fp8.to(float32) * scale_weight).
struct MappedTensor {
  std::vector<TensorSegment> segments;
  std::vector<int64_t> shape;
  std::string scaleKey;
};

/// A component of a single file, addressed by diffusers parameter names.
struct KeyLayout {
  std::string file;         ///< the safetensors file
  std::string description;  ///< e.g. "BFL FLUX.1 transformer (prefix model.diffusion_model.)"
  std::map<std::string, MappedTensor> tensors;  ///< diffusers name -> stored pieces
};

}  // namespace dit
