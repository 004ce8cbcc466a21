// The Torch half of the family record (models/family.h), registered under the same pipeline class:
// how to load a family's pipeline and transformer, what inputs its transformer takes (for the
// benchmark), what its collectives send per step (the benchmark's traffic model), and how to build
// its other components with fresh weights (make-model). A family's `<f>_runtime` includes this
// record only; the table that lists the families (backend/family_runtime.h) includes them, never
// the reverse (tests/layering_check.sh).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "backend/models/diffusion_transformer.h"
#include "backend/pipelines/diffusion_pipeline.h"
#include "parallel/strategy.h"

namespace dit {

class WeightSource;

/// What one rank's collectives send per transformer forward (bytes of payload, counted as the
/// process groups count them: allreduce = 2 (n-1)/n x size), by kind.
struct CollectiveTraffic {
  uint64_t tp_allreduce = 0;        ///< RowwiseParallel outputs, all-reduced over tp
  uint64_t tp_allgather = 0;        ///< ColwiseParallel outputs gathered over tp (gatherOutput)
  uint64_t ulysses_all_to_all = 0;  ///< q, k, v and the output, per attention
  uint64_t ring_kv = 0;             ///< K/V blocks rotated around the ring, per attention
  uint64_t cp_gather = 0;           ///< the output gathered over the context-parallel group
  uint64_t cfg_gather = 0;          ///< the prediction exchanged between the CFG halves
  uint64_t total() const {
    return tp_allreduce + tp_allgather + ulysses_all_to_all + ring_kv + cp_gather + cfg_gather;
  }
};

/// The shape of a benchmark request for the traffic model and the example inputs.
struct BenchShape {
  int64_t batch = 1;
  int64_t image_h = 0, image_w = 0;  ///< transformer token grid (rows, columns)
  int64_t text_tokens = 0;
  int64_t imageTokens() const { return image_h * image_w; }
};

struct FamilyRuntime {
  std::string pipeline_class;  ///< the FamilySpec this completes
  /// Loads every component of `model` (opened by ModelFolder::open). Throws ModelFileError /
  /// std::invalid_argument naming the file or the degree that does not fit.
  std::function<std::unique_ptr<DiffusionPipeline>(const ModelFolder& model,
                                                   const PipelineOptions& opts)>
      loadPipeline;
  /// Parses `config` (the transformer's config.json object, read from `file`) and loads the
  /// transformer's weights from `w` under `par` (each rank reads only its tensor-parallel
  /// slices). Throws ModelFileError or std::invalid_argument (the plan does not fit tp).
  std::function<std::unique_ptr<DiffusionTransformer>(const nlohmann::json& config,
                                                      const std::string& file, WeightSource& w,
                                                      const TransformerParallelism& par)>
      loadTransformer;
  /// Seeded random inputs of the transformer for `shape` (float32, CPU), as the pipeline builds
  /// them: latents [B, S_img, C_in], the text features [B, S_txt, D_txt] (the negative ones when
  /// `negative`), timestep [B] = 0.75, position ids, guidance where the model embeds it.
  std::function<TransformerInputs(const nlohmann::json& config, const std::string& file,
                                  const BenchShape& shape, uint64_t seed, bool negative)>
      exampleInputs;
  /// What rank `rank` sends per forward under `s` for `shape` in elements of `elementBytes`
  /// bytes: the closed form of the family's plans (its RowwiseParallel layers and the streams
  /// they carry, one attention per block, the context-parallel output gather, the CFG exchange).
  std::function<CollectiveTraffic(const nlohmann::json& config, const std::string& file,
                                  const Strategy& s, int rank, const BenchShape& shape,
                                  uint64_t elementBytes)>
      traffic;
  /// Builds component `component` (not the transformer) of `model` with its weights read from
  /// `w` (a recording WeightSource, for make-model) and returns the stem of the component's
  /// weight file ("model", "diffusion_pytorch_model"); "" for a component without weights
  /// (tokenizers, the scheduler). Throws std::invalid_argument for an unknown component.
  std::function<std::string(const ModelFolder& model, const std::string& component,
                            WeightSource& w)>
      buildComponent;
};

/// The sizes a dual-stream joint-attention DiT's traffic depends on (FLUX.1, FLUX.2, Qwen-Image:
/// double-stream blocks whose image and text streams each end in RowwiseParallel layers, then
/// single-stream blocks with one RowwiseParallel output over the joint sequence).
struct DualStreamTrafficShape {
  int64_t num_layers = 0;          ///< double-stream blocks
  int64_t num_single_layers = 0;   ///< single-stream blocks
  int64_t rowwise_per_stream = 2;  ///< RowwiseParallel outputs per stream in a double block
  int64_t rowwise_per_single = 1;  ///< RowwiseParallel outputs per single block
  int64_t heads = 0, head_dim = 0;
  int64_t out_channels = 0;  ///< the transformer's output channels (gathered over cp)
  /// Output features of the gathered ColwiseParallel layers (ShardRule::gatherOutput) applied to
  /// one [B, features] vector per block, e.g. FLUX.1's AdaLN modulations: 12 C per double block
  /// (6 C per stream), 3 C per single block. 0: none.
  int64_t gathered_per_double = 0, gathered_per_single = 0;
};

/// Closed form of what rank `rank` sends per forward under `s` (payload, as the process groups
/// count it):
///  - tp: every RowwiseParallel output all-reduced over tp ([B, tokens of its stream, C];
///    ring-allreduce volume 2 (tp-1)/tp x size); every gathered ColwiseParallel output
///    all-gathered (this rank's [B, features / tp] sent to tp - 1 peers);
///  - Ulysses (u ranks): per attention (one per block) an all-to-all of q, k, v (the parts for the
///    other ranks' heads) and the reverse all-to-all of the output;
///  - ring (r ranks): per attention r-1 rotations of the packed K/V block [2, B, H, S_blk, D];
///  - cp > 1: the final gather of the output [B, S_img_local, out_channels];
///  - cfg 2: one allgather of the prediction [B, S_img, out_channels].
/// Sequence partitions follow tensorSplitSizes (uneven only in the anything modes).
CollectiveTraffic dualStreamTraffic(const DualStreamTrafficShape& m, const Strategy& s, int rank,
                                    const BenchShape& shape, uint64_t elementBytes);

}  // namespace dit
