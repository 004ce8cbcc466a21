// The placement planner: where each component of a model lives on the ranks a user has and how
// it is split, chosen by enumerating the strategies the model's rules allow and picking the
// fastest that fits, with the reason for each choice and the alternatives it rejected. Torch-free
// and Qt-free (dit_backend_core): `ditstudio-cli plan` prints it, the GUI can show it.
//
// It derives nothing itself: the strategies are checked by the strategy rules
// (validateDegrees / validateForModel / validateForRequest on the family's ModelDims and its
// ShardingPlan), and every figure is the one memory model's (estimateRequestMemory for an opened
// folder, estimateKnownModelMemory for a known real-size model) for the same strategy.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "backend/models/family.h"
#include "backend/models/memory_estimate.h"
#include "backend/models/text_encoder_placement.h"
#include "parallel/strategy.h"

namespace dit {

struct ModelFolder;

/// The ranks a plan places the components on.
struct PlannerRanks {
  int count = 1;  ///< ranks in all (GPUs, or CPU ranks), >= 1
  uint64_t memory_per_rank =
      0;          ///< bytes one rank may hold (a GPU's memory; host RAM per CPU rank)
  int hosts = 1;  ///< hosts; count / hosts ranks on each (must divide count)
  /// "cuda": flash / memory-efficient attention (scores not materialized); "cpu": the math kernel.
  std::string device = "cuda";
  /// Share of memory_per_rank a plan may fill; the rest is headroom for the CUDA context, the
  /// allocator's fragmentation and the text encoder's own activations (not in the estimate).
  double usable_fraction = 0.9;
  int ranksPerHost() const { return hosts > 0 ? count / hosts : count; }
  uint64_t usableBytes() const;
};

/// The request a plan is sized for.
struct PlannerRequest {
  int width = 1024, height = 1024;  ///< pixels
  int text_len = 512;               ///< text tokens (max_sequence_length)
  int64_t element_bytes = 2;        ///< compute dtype: 2 bfloat16 / float16, 4 float32
  std::string dtype = "bfloat16";   ///< its name, shown in the plan
  /// The request runs an unconditional branch (true CFG): cfg 2 is then among the strategies.
  bool true_cfg = false;
  /// The text-encoder placements the plan may choose (text_encoder_placement.h), in order of
  /// preference: the first one under which some strategy fits wins, then the fastest strategy
  /// under it. The others are sized and reported as alternatives. Default: sharded only
  /// (`ditstudio-cli plan --text-encoder auto`: sharded, own-rank, host-streamed, once).
  std::vector<TextEncoderPlacement> text_encoder_placements{TextEncoderPlacement::Sharded};
  RequestDims dims() const;
};

/// What the planner plans: an opened model folder or a known real-size model, with the one
/// memory model's estimate for it.
struct PlannerModel {
  std::string name;  ///< "FLUX.2 [dev]", or the folder's family and path
  ModelDims dims;    ///< heads, plans and parameter table (the strategy rules read them)
  /// The estimate per rank for strategy s (estimateRequestMemory / estimateKnownModelMemory).
  std::function<MemoryEstimate(const Strategy& s, const RequestDims& r, int64_t elementBytes,
                               bool scoresMaterialized)>
      estimate;
  /// The text encoders' memory facts at tensor-parallel degree tp (FamilySpec::memory /
  /// KnownModel::memory: bytes per rank, largest layer); null when the model declares none (then
  /// only the sharded placement is sized).
  std::function<FamilyMemoryFacts(int tp, int64_t elementBytes)> text_encoder;
};

/// The opened folder `m` (copied into the estimate's closure). Throws what ModelFolder::dims does.
PlannerModel plannerModel(const ModelFolder& m);
/// The known real-size model `k`.
PlannerModel plannerModel(const KnownModel& k);
/// Every registered family's known real-size models (FamilySpec::known_models), in registry order.
std::vector<KnownModel> knownRealSizeModels();
/// The known model named `name` (exact, case-insensitive). Throws std::invalid_argument listing
/// the known names when there is none.
KnownModel findKnownModel(const std::string& name);

/// Where one component lives and how it is split.
struct ComponentPlacement {
  std::string component;          ///< "transformer", "text encoder", "VAE"
  std::string placement;          ///< e.g. "sharded tp 2 x ulysses 2 (tp innermost)"
  std::string dtype;              ///< "bfloat16"
  uint64_t weights_per_rank = 0;  ///< bytes of this component's weights one rank holds
  std::string reason;             ///< why, in words
};

/// One strategy (or placement) the planner considered and did not choose.
struct PlanAlternative {
  std::string what;      ///< "tp 1 x ulysses 2", or a placement: "text encoder on ranks of its own"
  bool runnable = true;  ///< false: not available in this build (never chosen)
  bool valid = true;     ///< the strategy rules accept it
  bool fits = false;     ///< its peak per rank is within the usable memory
  uint64_t peak = 0;     ///< its peak per rank (0 when invalid or not runnable)
  std::string why;       ///< why it was not chosen
};

/// The planner's answer.
struct Plan {
  std::string model;
  PlannerRanks ranks;
  PlannerRequest request;
  /// A strategy fits: `strategy` is the chosen one. Otherwise `strategy` is the least
  /// memory-hungry valid strategy (when any is valid) and `message` says what it needs.
  bool fits = false;
  bool any_valid = false;  ///< some strategy passes the rules for this model, request and count
  Strategy strategy;
  /// Where the text encoder lives in this plan (one of request.text_encoder_placements).
  TextEncoderPlacement text_encoder = TextEncoderPlacement::Sharded;
  /// The one memory model's estimate per rank for `strategy`, with the text encoder's term as
  /// `text_encoder` places it (own-rank: the encoding rank's, the largest; host-streamed: its
  /// largest layer; once: a stage of its own, text_encode).
  MemoryEstimate memory;
  /// Host memory per rank the text encoder takes under host-streamed (its weights at tp), 0
  /// otherwise.
  uint64_t text_encoder_host_bytes = 0;
  uint64_t usable = 0;  ///< memory_per_rank x usable_fraction
  /// usable - memory.peak() (0 when it does not fit).
  uint64_t headroom = 0;
  std::vector<ComponentPlacement> components;
  std::vector<std::string> reasons;  ///< the choice of strategy, in words
  std::vector<PlanAlternative> alternatives;
  /// When nothing fits: the least memory per rank (before usable_fraction, i.e. what a rank must
  /// have) of the least memory-hungry valid strategy; 0 when it fits or nothing is valid.
  uint64_t smallest_memory_per_rank = 0;
  std::string message;  ///< one line: what was chosen, or why nothing fits and what it needs
};

/// Plans `model` on `ranks` for `request`: every strategy with world = ranks.count (cfg 1, or 2
/// with true CFG; tp x ulysses x ring; the anything variants where strict splits are refused) is
/// checked by the strategy rules and estimated by the memory model, under each of the request's
/// text-encoder placements in turn (the first under which one fits is kept); of those that fit, the
/// one with the fewest and cheapest collectives wins: a tp group that crosses hosts last, then the
/// smallest tp, then cfg 2, then a Ulysses group inside a host, then strict splits, then the
/// largest Ulysses degree (ring across hosts). Throws std::invalid_argument for ranks.count < 1,
/// hosts not dividing count, memory_per_rank 0 or a request without a size.
Plan planPlacement(const PlannerModel& model, const PlannerRanks& ranks,
                   const PlannerRequest& request);

/// The plan as text for people: header, a component table, memory per rank, reasons, rejected
/// alternatives.
std::string planText(const Plan& p);
/// The plan as JSON (bytes as integers; the strategy as {world, tp, ulysses, ring, cfg, ...}).
nlohmann::json planJson(const Plan& p);

/// "80G", "80GiB", "24 GB", "48000M", "1.5T", or plain bytes -> bytes (binary units: G = GiB).
/// Throws std::invalid_argument naming the text when it is not a positive size.
uint64_t parseMemorySize(const std::string& text);

}  // namespace dit
