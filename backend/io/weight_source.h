// WeightSource: where a model component's parameters come from — a diffusers safetensors
// folder (single file or sharded index), or random initialisation from the config alone
// (--random-weights, for benchmarking FLUX.1-dev-sized models without the checkpoint).
// Every request names the full expected shape, so a checkpoint that disagrees with its config
// fails with a message naming the tensor, the stored shape and the expected shape.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/io/safetensors.h"  // SafetensorsCollection (held by unique_ptr; inline constructor)

namespace dit {

struct KeyLayout;
struct ModelFolder;

class WeightSource {
 public:
  /// Weights from `dir` (file stem e.g. "diffusion_pytorch_model" or "model"). Throws
  /// ModelFileError for missing/corrupt files.
  static std::shared_ptr<WeightSource> fromFolder(const std::string& dir, const std::string& stem,
                                                  at::ScalarType dtype, c10::Device device);
  /// Weights of one component of a single file (BFL / LDM / ComfyUI layouts,
  /// models/checkpoint_layouts.h) addressed by diffusers names through `layout`: a name maps to row
  /// ranges of stored tensors (fused qkv / linear1 rows, BFL's swapped final-layer halves, 1x1 conv
  /// attention), so get / shard / packedShard read only the rows asked for. F8 tensors are decoded
  /// (times their ComfyUI `scale_weight` when the layout names one) in float32, then cast to
  /// `dtype`. Throws ModelFileError for a missing or corrupt file.
  static std::shared_ptr<WeightSource> fromLayout(std::shared_ptr<const KeyLayout> layout,
                                                  at::ScalarType dtype, c10::Device device);
  /// Weights of component `name` of `model`: fromLayout when the component comes from a single
  /// file (ModelFolder::components, open(ModelSources)), else fromFolder(model.component(name),
  /// stem). Throws ModelFileError naming the file.
  static std::shared_ptr<WeightSource> forComponent(const ModelFolder& model,
                                                    const std::string& name,
                                                    const std::string& stem, at::ScalarType dtype,
                                                    c10::Device device);
  /// Random N(0, std^2) weights (norm weights 1, biases 0), deterministic from `seed`.
  static std::shared_ptr<WeightSource> random(uint64_t seed, at::ScalarType dtype,
                                              c10::Device device, double std = 0.02);
  /// Weights held in memory by full diffusers name (ditstudio-train): get() returns the stored
  /// tensor itself (no copy), so parameters with requires_grad keep their autograd history
  /// through the model's load-time ops (fused q/k/v concatenation) and gradients reach them.
  /// shard / packedShard slice it (views). Shapes are checked; a missing name throws
  /// ModelFileError naming `what`.
  static std::shared_ptr<WeightSource> fromTensors(std::map<std::string, at::Tensor> tensors,
                                                   const std::string& what = "<in memory>");
  ~WeightSource();

  /// Whole tensor `name` of shape `shape` (throws ModelFileError on absence or shape mismatch).
  at::Tensor get(const std::string& name, const std::vector<int64_t>& shape);
  /// Optional tensor: undefined Tensor if absent from the checkpoint (random: always present).
  at::Tensor getOptional(const std::string& name, const std::vector<int64_t>& shape);
  /// Piece `part` of `parts` equal pieces along `dim` (0 or 1) — ColwiseParallel (dim 0) /
  /// RowwiseParallel (dim 1) shard-on-load: only the slice's bytes are read.
  at::Tensor shard(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                   int64_t part, int64_t parts);
  /// Packed shard: `dim` is a concatenation of `blocks`; each block is split separately.
  at::Tensor packedShard(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                         const std::vector<int64_t>& blocks, int64_t part, int64_t parts);
  bool contains(const std::string& name) const;
  /// How `name` is stored: {safetensors dtype spelling ("F32", "BF16", "F8_E4M3", ...), bytes per
  /// element} (1 for the ggml block types: LoadedParameter::heldBytes has their exact size).
  /// Random sources report their compute dtype. Throws ModelFileError when a
  /// checkpoint lacks the tensor.
  std::pair<std::string, int64_t> storage(const std::string& name) const;
  /// While on, tensors stored as 8-bit floats (F8_E4M3 / F8_E5M2) are returned as their raw kByte
  /// codes (no decoding, no scale): the weight loader keeps FP8 linear weights in 8 bits and
  /// dequantizes them at use (tensor_parallel/weight_storage.h). Off by default.
  void setKeepFloat8(bool on) { keepFloat8_ = on; }
  /// While on, tensors stored in ggml blocks (GGUF Q4_0 ... Q6_K) are returned as their raw
  /// blocks, kByte [rows, row bytes] (get / shard / packedShard along dim 0, slice along either
  /// dim with block-aligned columns); off, they are dequantized (ggml's float32 values) and cast
  /// to the compute dtype. The weight loader keeps GGUF linear weights quantized this way
  /// (tensor_parallel/weight_storage.h). Off by default.
  void setKeepBlocks(bool on) { keepBlocks_ = on; }
  /// The ggml type name ("Q8_0", "Q4_K", ...) when `name` is stored block-quantized, "F16" /
  /// "BF16" when it is a 16-bit tensor of a GGUF file and the compute dtype is float32 (kept in
  /// 16 bits the same way), else "".
  std::string blockFormat(const std::string& name) const;
  /// Columns (dim 1) or rows (dim 0) [start, start + len) of tensor `name` of global shape
  /// `shape`, whatever the shard plan: the weight loader reads block-aligned column ranges of
  /// quantized weights with it. Same errors as shard.
  at::Tensor slice(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                   int64_t start, int64_t len);
  /// "F8_E4M3" / "F8_E5M2" when `name` is stored as an 8-bit float, else "".
  std::string float8Format(const std::string& name) const;
  /// The scale that multiplies `name`'s decoded 8-bit values (ComfyUI scaled fp8
  /// `<module>.scale_weight`); 1 when it has none.
  float float8Scale(const std::string& name) const;
  /// Bytes of weights materialised by this source so far (in the compute dtype; 1 per element
  /// for 8-bit codes kept with setKeepFloat8).
  uint64_t bytesLoaded() const { return bytes_; }
  /// Tensors (whole or sliced) materialised by every WeightSource of this process so far: how
  /// often model weights were read, e.g. to show that switching LoRAs reads no base weight again.
  static uint64_t processReads();
  at::ScalarType dtype() const { return dtype_; }
  c10::Device device() const { return device_; }
  std::string where() const;
  /// Random sources only: keep every generated tensor (full names) so a checkpoint can be
  /// written from them (ditstudio-make-model).
  void setRecording(bool on) { recording_ = on; }
  const std::map<std::string, at::Tensor>& recorded() const { return recorded_; }

 private:
  WeightSource(at::ScalarType dtype, c10::Device device) : dtype_(dtype), device_(device) {}
  void checkShape(const std::string& name, const std::vector<int64_t>& shape) const;
  /// Throws ModelFileError naming the file and tensor when the checkpoint tensor `t` (as
  /// copied, in the compute dtype) holds NaN or Inf, unless allowNonFiniteWeights().
  void checkFinite(const std::string& name, const at::Tensor& t) const;
  at::Tensor finish(at::Tensor t);
  at::Tensor randomTensor(const std::string& name, std::vector<int64_t> shape);
  /// Layout sources: rows / columns [start, start + len) of dim `dim` of mapped tensor `name`.
  at::Tensor readMapped(const std::string& name, int64_t dim, int64_t start, int64_t len);
  std::unique_ptr<SafetensorsCollection> st_;
  std::shared_ptr<const KeyLayout> layout_;
  std::string dir_;
  at::ScalarType dtype_;
  c10::Device device_;
  uint64_t seed_ = 0;
  double std_ = 0.02;
  uint64_t bytes_ = 0;
  bool recording_ = false;
  bool keepFloat8_ = false;
  bool keepBlocks_ = false;
  /// dtype_, or kByte for an 8-bit float tensor while keepFloat8_ is on, or for a block tensor
  /// while keepBlocks_ is on.
  at::ScalarType loadTypeFor(const std::string& name) const;
  std::map<std::string, at::Tensor> recorded_;
  bool inMemory_ = false;
  std::map<std::string, at::Tensor> memory_;  ///< fromTensors
  const at::Tensor& memoryTensor(const std::string& name, const std::vector<int64_t>& shape) const;
};

/// Weights read from checkpoints are refused when they hold NaN or Inf (naming the file and the
/// tensor; checked on each copy in the compute dtype, so values that overflow float16/bfloat16
/// on conversion count too). setAllowNonFiniteWeights(true) (the programs' flag
/// --allow-nonfinite-weights) or DITSTUDIO_ALLOW_NONFINITE_WEIGHTS=1 in the environment (when
/// the flag was not used) turns the check off. Process-wide; random weights are never checked.
void setAllowNonFiniteWeights(bool allow);
bool allowNonFiniteWeights();

/// A linear layer's parameters (weight [out, in], optional bias [out]).
struct Linear {
  at::Tensor weight, bias;
  at::Tensor operator()(const at::Tensor& x) const;
  /// x @ weight^T without the bias (rowwise partial sums; bias is added once after AllReduce).
  at::Tensor noBias(const at::Tensor& x) const;
};

/// Loads `prefix.weight` [out, in] and `prefix.bias` [out] (bias optional when `bias` false).
Linear loadLinear(WeightSource& w, const std::string& prefix, int64_t in, int64_t out,
                  bool bias = true);

}  // namespace dit
