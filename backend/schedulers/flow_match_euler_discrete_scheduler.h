// FlowMatchEulerDiscreteScheduler as FluxPipeline drives it (diffusers
// schedulers/scheduling_flow_match_euler_discrete.py + pipelines/flux/pipeline_flux.py).
// Torch-free: tables are plain float32 vectors, computed with the same float32 rounding as
// diffusers (numpy float32 arrays, then torch float32).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace dit {

/// diffusers FlowMatchEulerDiscreteScheduler config (scheduler/scheduler_config.json).
struct SchedulerConfig {
  int num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5, max_shift = 1.15;
  int base_image_seq_len = 256, max_image_seq_len = 4096;
  std::string time_shift_type = "exponential";
};

/// Parses a scheduler config read from `file`. Throws ModelFileError naming the file: a key of
/// the wrong type, a time_shift_type other than "exponential" or "linear".
SchedulerConfig parseSchedulerConfig(const nlohmann::json& j, const std::string& file);

/// FluxPipeline's calculate_shift: the line through (base_seq_len, base_shift) and
/// (max_seq_len, max_shift) evaluated at image_seq_len. Returns mu (unitless).
double calculateShift(int image_seq_len, int base_seq_len, int max_seq_len, double base_shift,
                      double max_shift);

/// Flux2Pipeline / Flux2KleinPipeline's compute_empirical_mu (diffusers
/// pipelines/flux2/pipeline_flux2.py): for image_seq_len > 4300, 0.00016927 L + 0.45666666;
/// otherwise linear in num_steps between the lines m_10 = 8.73809524e-5 L + 1.89833333 (at 10
/// steps) and m_200 = 0.00016927 L + 0.45666666 (at 200 steps). float64, as Python computes it.
double computeEmpiricalMu(int image_seq_len, int num_steps);

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

/// The same tables for a given mu (what set_timesteps(sigmas=linspace(1, 1/N, N), mu=mu) makes
/// with dynamic shifting; mu is ignored with the static shift). fluxSchedule = this with
/// calculateShift; FLUX.2 passes computeEmpiricalMu(image_seq_len, steps). Throws
/// std::invalid_argument when steps < 1.
SchedulerTables flowMatchSchedule(const SchedulerConfig& cfg, int steps, double mu);

}  // namespace dit
