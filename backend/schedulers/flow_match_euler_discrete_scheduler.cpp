#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "backend/io/config_json.h"

namespace dit {

SchedulerConfig parseSchedulerConfig(const nlohmann::json& j, const std::string& f) {
  requireConfigObject(j, f);
  // Another scheduler's config (DDIM, Euler, UniPC ...) would silently run as this one.
  requireDeclaredAs(j, "_class_name", {"FlowMatchEulerDiscreteScheduler"}, f);
  SchedulerConfig c;
  getConfigValue(j, "num_train_timesteps", c.num_train_timesteps, f, {1, 1000000});
  getConfigValue(j, "shift", c.shift, f, {1e-6, 1e6});
  getConfigValue(j, "use_dynamic_shifting", c.use_dynamic_shifting, f);
  getConfigValue(j, "base_shift", c.base_shift, f, {-100, 100});
  getConfigValue(j, "max_shift", c.max_shift, f, {-100, 100});
  getConfigValue(j, "base_image_seq_len", c.base_image_seq_len, f, {1, 1 << 30});
  getConfigValue(j, "max_image_seq_len", c.max_image_seq_len, f, {1, 1 << 30});
  getConfigValue(j, "time_shift_type", c.time_shift_type, f);
  if (auto it = j.find("shift_terminal"); it != j.end() && !it->is_null())
    getConfigValue(j, "shift_terminal", c.shift_terminal, f, {0.0, 0.999999});
  if (c.use_dynamic_shifting && c.max_image_seq_len <= c.base_image_seq_len)
    throw ModelFileError(f, "max_image_seq_len " + std::to_string(c.max_image_seq_len) +
                                " must exceed base_image_seq_len " +
                                std::to_string(c.base_image_seq_len) +
                                " (dynamic shifting divides by their difference)");
  if (c.time_shift_type != "exponential" && c.time_shift_type != "linear")
    throw ModelFileError(f, "unsupported time_shift_type '" + c.time_shift_type + "'");
  return c;
}

double calculateShift(int image_seq_len, int base_seq_len, int max_seq_len, double base_shift,
                      double max_shift) {
  const double m = (max_shift - base_shift) / (max_seq_len - base_seq_len);
  const double b = base_shift - m * base_seq_len;
  return image_seq_len * m + b;
}

double computeEmpiricalMu(int image_seq_len, int num_steps) {
  const double a1 = 8.73809524e-05, b1 = 1.89833333;
  const double a2 = 0.00016927, b2 = 0.45666666;
  if (image_seq_len > 4300) return a2 * image_seq_len + b2;
  const double m_200 = a2 * image_seq_len + b2;
  const double m_10 = a1 * image_seq_len + b1;
  const double a = (m_200 - m_10) / 190.0;
  const double b = m_200 - 200.0 * a;
  return a * num_steps + b;
}

SchedulerTables fluxSchedule(const SchedulerConfig& cfg, int steps, int image_seq_len) {
  return flowMatchSchedule(cfg, steps,
                           calculateShift(image_seq_len, cfg.base_image_seq_len,
                                          cfg.max_image_seq_len, cfg.base_shift, cfg.max_shift));
}

SchedulerTables flowMatchSchedule(const SchedulerConfig& cfg, int steps, double mu) {
  if (steps < 1)
    throw std::invalid_argument("steps must be at least 1, got " + std::to_string(steps));
  SchedulerTables t;
  t.mu = mu;
  const double lo = 1.0 / steps;
  for (int i = 0; i < steps; ++i) {
    // np.linspace(1.0, 1/N, N) in float64, then .astype(np.float32) in set_timesteps.
    const double s64 = steps == 1 ? 1.0 : 1.0 + (lo - 1.0) * (static_cast<double>(i) / (steps - 1));
    const float s = static_cast<float>(s64);
    float shifted;
    if (cfg.use_dynamic_shifting) {
      // time_shift(mu, 1.0, t) on a float32 array: python-float scalars keep float32.
      const float inv = 1.0f / s - 1.0f;
      if (cfg.time_shift_type == "exponential") {
        const float e = static_cast<float>(std::exp(t.mu));
        shifted = e / (e + inv);
      } else {
        const float m = static_cast<float>(t.mu);
        shifted = m / (m + inv);
      }
    } else {
      const float sh = static_cast<float>(cfg.shift);
      shifted = sh * s / (1.0f + (sh - 1.0f) * s);
    }
    t.sigmas.push_back(shifted);
  }
  if (cfg.shift_terminal > 0) {
    if (steps == 1)
      throw std::invalid_argument(
          "one step is not possible with the scheduler's shift_terminal " +
          std::to_string(cfg.shift_terminal) +
          " (its stretch divides 0 by 0: diffusers' schedule is NaN); use 2 or more steps");
    // stretch_shift_to_terminal on the float32 array (NumPy 2 keeps Python scalars float32).
    const float scale = (1.0f - t.sigmas.back()) / (1.0f - static_cast<float>(cfg.shift_terminal));
    for (float& s : t.sigmas) s = 1.0f - (1.0f - s) / scale;
  }
  for (float s : t.sigmas) t.timesteps.push_back(s * static_cast<float>(cfg.num_train_timesteps));
  t.sigmas.push_back(0.0f);
  return t;
}

int img2imgStartIndex(int num_inference_steps, double strength) {
  // get_timesteps: Python floats, int() truncates toward zero (the value is >= 0 here).
  const double n = static_cast<double>(num_inference_steps);
  const double init = std::min(n * strength, n);
  return static_cast<int>(std::max(n - init, 0.0));
}

FlowMatchEulerDiscreteScheduler::FlowMatchEulerDiscreteScheduler(SchedulerConfig cfg)
    : cfg_(std::move(cfg)) {}

void FlowMatchEulerDiscreteScheduler::setTimesteps(int num_inference_steps, double mu,
                                                   double strength) {
  if (!std::isfinite(strength) || strength <= 0 || strength > 1)
    throw std::invalid_argument("strength must be in (0, 1], got " + std::to_string(strength));
  SchedulerTables t = flowMatchSchedule(cfg_, num_inference_steps, mu);  // throws for N < 1
  const int start = img2imgStartIndex(num_inference_steps, strength);
  if (start >= num_inference_steps)
    throw std::invalid_argument("strength " + std::to_string(strength) + " with " +
                                std::to_string(num_inference_steps) +
                                " steps runs no denoising step (steps * strength < 1)");
  tables_ = std::move(t);
  begin_index_ = start;
}

float FlowMatchEulerDiscreteScheduler::sigma(int i) const {
  if (i < 0 || static_cast<size_t>(i) >= tables_.sigmas.size())
    throw std::out_of_range("FlowMatchEulerDiscreteScheduler: sigma index " + std::to_string(i) +
                            " outside [0, " + std::to_string(numInferenceSteps()) +
                            "] (setTimesteps not called?)");
  return tables_.sigmas[static_cast<size_t>(i)];
}

float FlowMatchEulerDiscreteScheduler::timestep(int i) const {
  if (i < 0 || i >= numInferenceSteps())
    throw std::out_of_range("FlowMatchEulerDiscreteScheduler: step index " + std::to_string(i) +
                            " outside [0, " + std::to_string(numInferenceSteps()) +
                            ") (setTimesteps not called?)");
  return tables_.timesteps[static_cast<size_t>(i)];
}

}  // namespace dit
