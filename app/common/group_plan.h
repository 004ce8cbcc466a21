// A process group planned by the placement planner (backend/models/placement_planner.h): its
// strategy and text-encoder placement for its ranks, memory, device, dtype and model sources, as
// ditstudio-server --plan uses it (app/server/pool_config.cpp, planGroup). Header-only and
// Torch-free, like request_values.h: dit_server includes no backend header itself and reaches the
// Torch-free backend core through app/common.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/io/model_folder.h"
#include "backend/models/memory_estimate.h"
#include "backend/models/placement_planner.h"
#include "backend/models/text_encoder_placement.h"
#include "parallel/strategy.h"

namespace dit {

/// What a group is planned for.
struct GroupPlanInput {
  ModelSources sources;                ///< the model and its components as the ranks open them
  int ranks = 1;                       ///< the group's ranks (mpirun -np)
  std::string device = "cpu";          ///< "cpu" | "cuda"
  std::string dtype = "float32";       ///< compute dtype
  std::string memory;                  ///< per rank ("80G", parseMemorySize); "" = see below
  int host_ranks = 0;                  ///< CPU ranks sharing MemAvailable (0 = `ranks`)
  double usable = 0.9;                 ///< share of a rank's memory a plan may fill, (0, 1]
  int width = 0, height = 0;           ///< request size planned for (0: the model's default)
  int text_len = 512;                  ///< text tokens planned for
  std::string text_encoder_placement;  ///< "" = the first of the four that fits; else only it
};

/// The plan's strategy (degrees, world = ranks), its text-encoder placement name and the plan as
/// text (planText).
struct GroupPlanResult {
  Strategy strategy;
  std::string text_encoder_placement;
  std::string text;
};

/// Plans `in` (planPlacement). Memory per rank: `memory`, or on CPU this host's MemAvailable /
/// max(ranks, host_ranks); CUDA needs `memory`. Throws std::invalid_argument with what is
/// missing (a CUDA memory figure, /proc/meminfo unreadable, usable out of range), the model's
/// file error, or, when nothing fits, the plan's message (the smallest memory per rank it needs).
inline GroupPlanResult planGroupPlacement(const GroupPlanInput& in) {
  if (!(in.usable > 0 && in.usable <= 1))
    throw std::invalid_argument("--plan-usable must be in (0, 1]");
  const int count = std::max(1, in.ranks);
  PlannerRanks ranks;
  ranks.count = count;
  ranks.device = in.device;
  ranks.usable_fraction = in.usable;
  if (!in.memory.empty()) {
    ranks.memory_per_rank = parseMemorySize(in.memory);
  } else if (in.device == "cpu") {
    const std::optional<uint64_t> avail = hostMemoryAvailable();
    if (!avail) throw std::invalid_argument("needs --plan-memory: /proc/meminfo cannot be read");
    ranks.memory_per_rank = *avail / static_cast<uint64_t>(std::max(count, in.host_ranks));
  } else {
    throw std::invalid_argument("needs --plan-memory (per GPU, e.g. 80G)");
  }
  const PlannerModel model = plannerModel(ModelFolder::open(in.sources));
  PlannerRequest request;
  request.width = in.width > 0 ? in.width : model.dims.defaultImageSide();
  request.height = in.height > 0 ? in.height : model.dims.defaultImageSide();
  request.text_len = in.text_len;
  request.dtype = in.dtype;
  request.element_bytes = in.dtype == "float32" ? 4 : 2;
  if (!in.text_encoder_placement.empty())
    request.text_encoder_placements = {parseTextEncoderPlacement(in.text_encoder_placement)};
  else
    request.text_encoder_placements = {TextEncoderPlacement::Sharded, TextEncoderPlacement::OwnRank,
                                       TextEncoderPlacement::HostStreamed,
                                       TextEncoderPlacement::Once};
  const Plan plan = planPlacement(model, ranks, request);
  if (!plan.fits) throw std::invalid_argument(plan.message);
  GroupPlanResult r;
  r.strategy = plan.strategy;
  r.strategy.device = in.device;
  r.text_encoder_placement = textEncoderPlacementName(plan.text_encoder);
  r.text = planText(plan);
  return r;
}

}  // namespace dit
