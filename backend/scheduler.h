// FlowMatchEulerDiscreteScheduler as FluxPipeline drives it (diffusers
// schedulers/scheduling_flow_match_euler_discrete.py + pipelines/flux/pipeline_flux.py).
// Torch-free: tables are plain float32 vectors, computed with the same float32 rounding as
// diffusers (numpy float32 arrays, then torch float32).
#pragma once

#include <vector>

#include "backend/model_config.h"

namespace dit {

/// FluxPipeline's calculate_shift: the line through (base_seq_len, base_shift) and
/// (max_seq_len, max_shift) evaluated at image_seq_len. Returns mu (unitless).
double calculateShift(int image_seq_len, int base_seq_len, int max_seq_len, double base_shift,
                      double max_shift);

struct SchedulerTables {
  std::vector<float> sigmas;     ///< N+1 values, the last is the terminal 0
  std::vector<float> timesteps;  ///< N values, sigma * num_train_timesteps
  double mu = 0.0;               ///< used only with dynamic shifting
};

/// Sigmas/timesteps for `steps` denoising steps on an image of `image_seq_len` packed tokens:
/// sigmas = linspace(1, 1/N, N) (float64 -> float32), then dynamic shift with mu (exponential or
/// linear time_shift) or the static shift, timesteps = sigma * 1000, terminal 0 appended.
/// Throws std::invalid_argument when steps < 1.
SchedulerTables fluxSchedule(const SchedulerConfig& cfg, int steps, int image_seq_len);

}  // namespace dit
