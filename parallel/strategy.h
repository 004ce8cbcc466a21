// Parallel strategy description and validation (no Torch, no MPI: the GUI uses this too, so the
// editor validates live with exactly the worker's rules and messages).
//
// Semantics: ../shared/DESIGN.md section 3. world = dp x cfg x ring x ulysses x tp; mesh rank
// order has tp innermost: rank = ((((dp_i*cfg + cfg_i)*ring + ring_i)*ulysses + uly_i)*tp + tp_i).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "parallel/context_parallel_plan_types.h"
#include "parallel/strategy_issue.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

struct Strategy {
  int world = 1;  ///< number of ranks (mpirun -np)
  int tp_degree = 1;
  int ring_degree = 1;
  int ulysses_degree = 1;
  int cfg_degree = 1;  ///< 1 or 2
  int dp_degree = 1;
  bool ulysses_anything = false;
  bool ring_anything = false;
  std::string device = "cpu";  ///< "cpu" or "cuda"

  int cpDegree() const { return ring_degree * ulysses_degree; }
  std::string describe() const;  ///< e.g. "4 ranks: tp 2 x ulysses 2"
};

/// What the rules need to know about a model; model-agnostic. The model family declares its
/// tensor-parallel plan and its parameters (backend/ builds these from the model's config); the
/// rules here never name a layer.
struct ModelDims {
  int num_attention_heads = 0;  ///< attention heads per layer (Ulysses splits them)
  int attention_head_dim = 0;
  int vae_scale_factor = 8;  ///< pixels per latent pixel
  /// Latent pixels per side of the model's default image (FluxPipeline: 128; a transformer
  /// config's `sample_size` when it declares one).
  int default_sample_size = 128;
  /// The default image side in pixels: default_sample_size x vae_scale_factor.
  int defaultImageSide() const { return default_sample_size * vae_scale_factor; }
  /// The model's tensor-parallel plan; null = the model cannot run with tp_degree > 1.
  std::shared_ptr<const ShardingPlan> tensor_parallel_plan;
  /// Every parameter the model declares (names, global shapes, stored dtypes); needed by
  /// tensor_parallel_plan->validate.
  std::shared_ptr<const ParameterTable> parameters;
  /// The model's context-parallel plan (which forward inputs split on which dim, where the output
  /// gathers); applied by the Torch-side ContextParallelRunner. Null = none declared.
  std::shared_ptr<const ContextParallelPlan> context_parallel_plan;
  /// Hidden width of the blocks' feed-forward (FLUX.1: 4 x inner; FLUX.2: 3 x inner); 0 = unknown.
  int mlp_hidden_dim = 0;
  /// The model pads its text and image sequences to a multiple of this many tokens before the
  /// context-parallel split (diffusers ZImageTransformer2DModel's SEQ_MULTI_OF 32, with learned
  /// pad tokens); 1 = no padding. The token rules check the padded lengths.
  int sequence_multiple = 1;
  /// `tokens` rounded up to sequence_multiple.
  int paddedTokens(int tokens) const {
    const int m = sequence_multiple > 1 ? sequence_multiple : 1;
    return (tokens + m - 1) / m * m;
  }
  int innerDim() const { return num_attention_heads * attention_head_dim; }
};

/// Sizes of one request that the rules need.
struct RequestDims {
  int width = 0, height = 0;  ///< pixels
  int text_len = 0;           ///< T5 max_sequence_length (text tokens)
  /// The request runs an unconditional (CFG) branch, as the family's guider decides
  /// (resolveRequest): e.g. a negative prompt and a true CFG scale > 1, or guidance > 1 on
  /// classic-CFG models.
  bool true_cfg = false;
  /// When the model runs that branch, in words (the family's GuiderSpec::requirement, e.g. "a
  /// negative prompt and true_cfg_scale > 1"), named in the cfg_degree 2 refusal; "" = generic.
  std::string cfg_requirement;
  int num_images = 1;
  /// Reference-image tokens appended to the image tokens in every transformer call (editing:
  /// Flux2KleinPipeline's image=[...], FluxKontextPipeline's image); 0 = none.
  int reference_tokens = 0;
  /// The output's packed tokens.
  int imageTokens(int vae_scale_factor) const {
    return (height / (2 * vae_scale_factor)) * (width / (2 * vae_scale_factor));
  }
  /// The image stream every transformer call runs: output plus reference tokens.
  int imageStreamTokens(int vae_scale_factor) const {
    return imageTokens(vae_scale_factor) + reference_tokens;
  }
};

/// Checks the degrees alone (product equals world, ranges, anything-mode combinations).
std::vector<StrategyIssue> validateDegrees(const Strategy& s);
/// Adds the rules that need the model. With tp_degree > 1: the model's ShardingPlan::validate on
/// its parameters (every sharded dimension and packed block divisible by tp, the plan's own
/// requirements such as heads ("tp_heads"), stale rules), or "tp_plan" when the model declares no
/// plan / no parameters. Ulysses (strict) must divide the heads per tensor-parallel rank.
std::vector<StrategyIssue> validateForModel(const Strategy& s, const ModelDims& m);
/// Adds the rules that need the request (strict ring/Ulysses divisibility of text and image
/// tokens, cfg parallel needs true CFG, width/height multiples).
std::vector<StrategyIssue> validateForRequest(const Strategy& s, const ModelDims& m,
                                              const RequestDims& r);

/// Joins issues into one message ("; "-separated). Empty when there are none.
std::string joinIssues(const std::vector<StrategyIssue>& issues);

/// Mesh coordinates of `rank` in the order {dp, cfg, ring, ulysses, tp}.
std::array<int, 5> meshCoords(const Strategy& s, int rank);

/// tensor_split partition: sizes of `n` split into `parts` (first n % parts get one more).
std::vector<int> evenSplit(int n, int parts);

// Strategy <-> JSON (and nlohmann's to_json/from_json for it) live in app/protocol/protocol.h.

}  // namespace dit
