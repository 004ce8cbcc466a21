// Parallel strategy description and validation (no Torch, no MPI: the GUI uses this too, so the
// editor validates live with exactly the worker's rules and messages).
//
// Semantics: ../shared/DESIGN.md section 3. world = dp x cfg x ring x ulysses x tp; mesh rank
// order has tp innermost: rank = ((((dp_i*cfg + cfg_i)*ring + ring_i)*ulysses + uly_i)*tp + tp_i).
#pragma once

#include <array>
#include <string>
#include <vector>

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

/// Sizes of the model that the rules need (read from transformer/config.json).
struct ModelDims {
  int num_attention_heads = 0;
  int attention_head_dim = 0;
  int mlp_ratio_hidden = 0;  ///< mlp hidden size (inner_dim * 4 for FLUX.1)
  int joint_attention_dim = 0;
  int vae_scale_factor = 8;
  int innerDim() const { return num_attention_heads * attention_head_dim; }
};

/// Sizes of one request that the rules need.
struct RequestDims {
  int width = 0, height = 0;   ///< pixels
  int text_len = 0;            ///< T5 max_sequence_length (text tokens)
  bool true_cfg = false;       ///< negative prompt given and true_cfg_scale > 1
  int num_images = 1;
  int imageTokens(int vae_scale_factor) const {
    return (height / (2 * vae_scale_factor)) * (width / (2 * vae_scale_factor));
  }
};

/// One broken rule: `rule` is a short id ("world", "tp_heads", ...), `message` the sentence shown
/// to the user naming the sizes and degrees.
struct StrategyIssue {
  std::string rule;
  std::string message;
};

/// Checks the degrees alone (product equals world, ranges, anything-mode combinations).
std::vector<StrategyIssue> validateDegrees(const Strategy& s);
/// Adds the rules that need the model (tp divides heads and every sharded dimension/packed block).
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
