#include "app/cli/cli_plan.h"

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/io/model_folder.h"
#include "backend/models/memory_estimate.h"
#include "backend/models/placement_planner.h"
#include "backend/models/text_encoder_placement.h"

namespace dit::cli {

CLI::App* addPlanCommand(CLI::App& app, PlanOptions& o) {
  CLI::App* p = app.add_subcommand(
      "plan",
      "plan where each component lives on the ranks you have (strategy, text encoder, VAE), with "
      "memory per rank and the reasons; configs only, nothing loads");
  p->add_option("--model", o.model, "a model folder");
  p->add_option(
      "--known", o.known,
      "a known real-size model instead of a folder, e.g. \"FLUX.2 [dev]\" (--list-known)");
  p->add_flag("--list-known", o.list_known, "print the known real-size models and exit");
  p->add_option("--ranks", o.ranks, "ranks in all (GPUs, or CPU ranks); default 1");
  p->add_option("--memory", o.memory,
                "memory per rank: 80G, 24GiB, 48000M or bytes (binary units: G = GiB); with "
                "--device cpu and no --memory: this host's MemAvailable / (ranks per host)");
  p->add_option("--hosts", o.hosts, "hosts, each with ranks / hosts ranks (default 1)");
  p->add_option("--width", o.width, "image width in pixels (default: the model's default side)");
  p->add_option("--height", o.height, "image height in pixels (default: the model's default side)");
  p->add_option("--text-len", o.text_len, "text tokens (max_sequence_length; default 512)");
  p->add_option("--dtype", o.dtype, "bfloat16 | float16 | float32 (default bfloat16)");
  p->add_option("--device", o.device,
                "cuda (flash attention) | cpu (math attention, host memory); default cuda");
  p->add_option("--usable", o.usable,
                "share of each rank's memory a plan may fill, (0, 1] (default 0.9)");
  p->add_flag("--true-cfg", o.true_cfg, "the request runs true CFG (cfg 2 is considered)");
  p->add_option("--text-encoder", o.text_encoder,
                "the text-encoder placement the plan may use: sharded (default), own-rank, "
                "host-streamed, once, or auto (the first of those under which a strategy fits)");
  p->add_flag("--json", o.json, "print the plan as JSON");
  return p;
}

int runPlan(const PlanOptions& o) {
  try {
    if (o.list_known) {
      for (const KnownModel& k : knownRealSizeModels()) std::cout << k.name << "\n";
      return 0;
    }
    if (o.model.empty() == o.known.empty())
      throw std::invalid_argument("plan needs one of --model FOLDER or --known NAME");
    uint64_t memory = 0;
    if (!o.memory.empty()) {
      memory = parseMemorySize(o.memory);
    } else if (o.device == "cpu") {
      // CPU ranks share this host's available memory (MemAvailable), ranks / hosts of them.
      const std::optional<uint64_t> avail = hostMemoryAvailable();
      if (!avail) throw std::invalid_argument("plan needs --memory: /proc/meminfo cannot be read");
      memory = *avail / static_cast<uint64_t>(std::max(1, o.ranks / std::max(1, o.hosts)));
    } else {
      throw std::invalid_argument("plan needs --memory (per rank, e.g. 80G)");
    }
    if (o.dtype != "bfloat16" && o.dtype != "float16" && o.dtype != "float32")
      throw std::invalid_argument("unknown --dtype '" + o.dtype +
                                  "' (use bfloat16, float16 or float32)");
    if (o.device != "cuda" && o.device != "cpu")
      throw std::invalid_argument("unknown --device '" + o.device + "' (use cuda or cpu)");
    if (!(o.usable > 0 && o.usable <= 1)) throw std::invalid_argument("--usable must be in (0, 1]");
    if (o.text_len < 0) throw std::invalid_argument("--text-len must be >= 0");
    PlannerModel model = o.known.empty() ? plannerModel(ModelFolder::open(o.model))
                                         : plannerModel(findKnownModel(o.known));
    PlannerRanks ranks;
    ranks.count = o.ranks;
    ranks.memory_per_rank = memory;
    ranks.hosts = o.hosts;
    ranks.device = o.device;
    ranks.usable_fraction = o.usable;
    PlannerRequest request;
    request.width = o.width > 0 ? o.width : model.dims.defaultImageSide();
    request.height = o.height > 0 ? o.height : model.dims.defaultImageSide();
    request.text_len = o.text_len;
    if (o.text_encoder == "auto")
      request.text_encoder_placements = {
          TextEncoderPlacement::Sharded, TextEncoderPlacement::OwnRank,
          TextEncoderPlacement::HostStreamed, TextEncoderPlacement::Once};
    else {
      const std::vector<std::string> names = textEncoderPlacementNames();
      if (std::find(names.begin(), names.end(), o.text_encoder) == names.end())
        throw std::invalid_argument("--text-encoder \"" + o.text_encoder +
                                    "\" is not one of sharded, own-rank, host-streamed, once, "
                                    "auto");
      request.text_encoder_placements = {parseTextEncoderPlacement(o.text_encoder)};
    }
    request.dtype = o.dtype;
    request.element_bytes = o.dtype == "float32" ? 4 : 2;
    request.true_cfg = o.true_cfg;
    const Plan plan = planPlacement(model, ranks, request);
    if (o.json)
      std::cout << planJson(plan).dump(2) << std::endl;
    else
      std::cout << planText(plan);
    return plan.fits ? 0 : 3;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 2;
  }
}

}  // namespace dit::cli
