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

class WeightSource {
 public:
  /// Weights from `dir` (file stem e.g. "diffusion_pytorch_model" or "model"). Throws
  /// ModelFileError for missing/corrupt files.
  static std::shared_ptr<WeightSource> fromFolder(const std::string& dir, const std::string& stem,
                                                  at::ScalarType dtype, c10::Device device);
  /// Random N(0, std^2) weights (norm weights 1, biases 0), deterministic from `seed`.
  static std::shared_ptr<WeightSource> random(uint64_t seed, at::ScalarType dtype,
                                              c10::Device device, double std = 0.02);
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
  /// element}. Random sources report their compute dtype. Throws ModelFileError when a
  /// checkpoint lacks the tensor.
  std::pair<std::string, int64_t> storage(const std::string& name) const;
  /// Bytes of weights materialised by this source so far (in the compute dtype).
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
  at::Tensor finish(at::Tensor t);
  at::Tensor randomTensor(const std::string& name, std::vector<int64_t> shape);
  std::unique_ptr<SafetensorsCollection> st_;
  std::string dir_;
  at::ScalarType dtype_;
  c10::Device device_;
  uint64_t seed_ = 0;
  double std_ = 0.02;
  uint64_t bytes_ = 0;
  bool recording_ = false;
  std::map<std::string, at::Tensor> recorded_;
};

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
