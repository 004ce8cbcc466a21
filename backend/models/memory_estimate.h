// An up-front memory estimate of one generate request, per rank, so that a request that cannot
// fit is refused with figures before it runs (instead of an allocator failure deep in LibTorch).
// Torch-free (configs, the family's ShardingPlan and safetensors headers only). The one memory
// model: the worker's and the CLI's refusals and the GUI advisor all use it; what differs per
// family comes from its record (FamilySpec::memory).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backend/io/model_folder.h"
#include "backend/models/text_encoder_placement.h"
#include "parallel/strategy.h"

namespace dit {

struct KnownModel;
struct VaeDecoderShape;

/// Bytes one rank needs for one request (upper bounds of the peaks, not a sum of everything).
struct MemoryEstimate {
  uint64_t weights = 0;  ///< transformer (ShardingPlan::bytesPerRank at tp) + text encoders + VAE
  /// The parts of `weights` (they add up to it): the transformer's share at tp, the text
  /// encoders' (sharded by their own plan under the tp group, or whole), the VAE's (whole).
  uint64_t transformer_weights = 0;
  uint64_t text_encoder_weights = 0;
  uint64_t vae_weights = 0;
  uint64_t activations = 0;  ///< transformer block activations at this rank's token count
  uint64_t attention = 0;    ///< transformer attention (output, log-sum-exp, a score block)
  uint64_t vae_decode = 0;   ///< VAE decoder: its peak of live feature maps (vae_decode_memory.h)
  /// The text-encoding stage's own weights when they are not among `weights`: the `once`
  /// text-encoder placement loads the encoder for the prompts and frees it before the steps, so
  /// it is a stage like the others (0 for a resident encoder; text_encoder_placement.h).
  uint64_t text_encode = 0;
  /// What the estimate assumed that changes the picture, e.g. "text encoder replicated on every
  /// tp rank: ..." when a component's plan does not divide by tp; empty otherwise.
  std::string note;
  /// The peak while the request runs: weights + max(text-encoding stage, transformer stage, VAE
  /// stage).
  uint64_t peak() const;
  /// Peak minus the weights: what a request needs on top of a loaded model.
  uint64_t requestBytes() const { return peak() - weights; }
  /// "weights 1.2 GiB + transformer activations 3 MiB + attention 40 MiB (VAE decode 8 MiB) = 1.3
  /// GiB"
  std::string describe() const;
};

/// Estimates one rank's memory for `r` under strategy `s` in a compute dtype of `elementBytes`
/// bytes (4 float32, 2 bf16/fp16). `scoresMaterialized`: the request runs on the CPU, whose
/// attention is the math path (cpuMathAttention, or LibTorch's math SDPA by query blocks): one
/// block of scores (about 1 MiB in float32, 16 MiB in bfloat16; never the whole [heads, q, k]
/// matrix) on top of the output and log-sum-exp that flash / memory-efficient kernels hold; and
/// the VAE decode counts LibTorch's CPU convolution buffers (vae_decode_memory.h). False: CUDA.
/// Transformer tokens per rank = (image tokens + text tokens) / (ring x ulysses); attention heads
/// per rank = heads / (tp x ulysses) (rounded up), queries and keys per block = tokens / ring.
/// Weights: the transformer from the family's ShardingPlan::bytesPerRank (whole when the model
/// has no plan), the other components from their safetensors headers (element counts).
/// Throws ModelFileError when a component's weights cannot be read (headers only).
MemoryEstimate estimateRequestMemory(const ModelFolder& m, const Strategy& s, const RequestDims& r,
                                     int64_t elementBytes, bool scoresMaterialized);

/// `e` (an estimate with the text encoders sharded under tp and resident, as
/// estimateRequestMemory gives it) with the text encoders placed as `pl`
/// (text_encoder_placement.h), for the rank that holds the most:
///  * own-rank: the encoding rank holds the whole encoder (`wholeEncoderBytes`, the family's
///    text-encoder bytes at tp 1);
///  * host-streamed: the device holds the encoder's largest layer at tp (`layerBytesAtTp`); on
///    CPU ranks (`cpuRanks`) the host store is the same memory, so the layer's copy adds to the
///    resident shard;
///  * once: the encoder is a stage of its own (`text_encode`), loaded for a request's prompts
///    and freed before the steps, so it adds to requestBytes() instead of the weights;
///  * sharded: `e` as it is.
/// Returns nullopt, and sets `why` when not null, when the encoders cannot be placed so
/// (host-streamed with `layerBytesAtTp` 0: FLUX.1's CLIP and T5 are not streamed).
std::optional<MemoryEstimate> placeTextEncoder(const MemoryEstimate& e, TextEncoderPlacement pl,
                                               uint64_t wholeEncoderBytes, uint64_t layerBytesAtTp,
                                               bool cpuRanks, std::string* why = nullptr);

/// estimateRequestMemory with the text encoders placed as `pl` (placeTextEncoder, the family's
/// memory facts at tp 1 and at s.tp_degree): what the worker's and the CLI's refusals check, so
/// that e.g. `once` counts the encoder the request loads. `scoresMaterialized` also means CPU
/// ranks. Throws ModelFileError as estimateRequestMemory, std::invalid_argument naming the
/// placement when the model's encoders cannot be placed so.
MemoryEstimate estimateRequestMemory(const ModelFolder& m, const Strategy& s, const RequestDims& r,
                                     int64_t elementBytes, bool scoresMaterialized,
                                     TextEncoderPlacement pl);

/// The transformer and VAE stages of the estimate without a model folder (the advisor's known
/// models): activations, attention and VAE decode as estimateRequestMemory computes them from
/// `dims` (heads, head dim, vae_scale_factor) and the VAE decoder's shape (`vaeShape`; when null
/// or empty, the standard AutoencoderKL widths with `vaeDecoderChannels` at full resolution);
/// weights left at 0 for the caller.
MemoryEstimate estimateTransformerMemory(const ModelDims& dims, const Strategy& s,
                                         const RequestDims& r, int64_t elementBytes,
                                         bool scoresMaterialized, int vaeDecoderChannels = 128,
                                         const VaeDecoderShape* vaeShape = nullptr);

/// estimateRequestMemory for a known real-size model (FamilySpec::known_models: no files): the
/// transformer and VAE stages of estimateTransformerMemory, the transformer's weights from its
/// declared plan at s.tp_degree, the text encoders and VAE from KnownModel::memory (sharded by
/// their own plans) and vae_parameters, or other_parameters whole on every rank when the model
/// declares no `memory` (then text_encoder_weights holds other_parameters, VAE included, and the
/// note says so).
MemoryEstimate estimateKnownModelMemory(const KnownModel& k, const Strategy& s,
                                        const RequestDims& r, int64_t elementBytes,
                                        bool scoresMaterialized);

/// Bytes of the text encoders one rank holds at tensor-parallel degree `tp` in a compute dtype of
/// `elementBytes` bytes, from the family's record (FamilySpec::memory): e.g. FLUX.2 [klein]'s
/// Qwen3 layers the pipeline runs, sharded by qwen3ShardingPlan (the whole encoder when tp does
/// not divide it, and `note`, when not null, says so); FLUX.1's CLIP and T5 whole on every rank.
/// Throws ModelFileError when a component's weights cannot be read (headers only).
uint64_t textEncoderBytesPerRank(const ModelFolder& m, int tp, int64_t elementBytes,
                                 std::string* note = nullptr);

/// MemAvailable of /proc/meminfo in bytes (nullopt when it cannot be read).
std::optional<uint64_t> hostMemoryAvailable();

/// "1.5 GiB", "12 MiB", "512 B" (binary units, 3 significant digits).
std::string formatBytes(uint64_t bytes);

/// "" when `ranksOnHost` ranks each needing `perRank` bytes fit in `available` bytes, else the
/// refusal: "not enough memory for 16384x16384: each of the 2 ranks on this host needs about
/// <describe()> but only 3.1 GiB of host memory is available (MemAvailable); use a smaller size,
/// more ranks (ring/ulysses/tp) or a machine with more memory". `what` names the budget
/// ("host memory", "device memory").
std::string memoryRefusal(const MemoryEstimate& e, uint64_t perRank, int ranksOnHost,
                          uint64_t available, const RequestDims& r, const std::string& what);

}  // namespace dit
