// `ditstudio-cli plan`: the placement planner (backend/models/placement_planner.h) for a model
// folder or a known real-size model on the ranks a user has; configs and safetensors headers
// only, nothing loads. Text for people, or JSON with --json.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace dit::cli {

struct PlanOptions {
  std::string model;  ///< --model: a model folder
  std::string known;  ///< --known: a known real-size model's name ("FLUX.2 [dev]")
  int ranks = 1;
  std::string memory;  ///< --memory: per rank, "80G"
  int hosts = 1;
  int width = 0, height = 0;  ///< 0: the model's default image side
  int text_len = 512;
  std::string dtype = "bfloat16";
  std::string device = "cuda";
  double usable = 0.9;
  bool true_cfg = false;
  /// --text-encoder: the placement the plan may use (sharded, own-rank, host-streamed, once), or
  /// auto (each in that order of preference).
  std::string text_encoder = "sharded";
  bool json = false;
  bool list_known = false;
};

/// Adds the `plan` subcommand and its options to `app`; returns it.
CLI::App* addPlanCommand(CLI::App& app, PlanOptions& o);
/// Runs it: prints the plan and returns 0 when it fits, 3 when nothing fits (the message names the
/// smallest memory per rank it needs), 2 for bad input (the error on stderr).
int runPlan(const PlanOptions& o);

}  // namespace dit::cli
