// FlowMatchEulerDiscreteScheduler as the flow-matching pipelines drive it (diffusers
// schedulers/scheduling_flow_match_euler_discrete.py + pipelines/flux/pipeline_flux.py,
// pipelines/flux2/pipeline_flux2_klein*.py). The tables (sigmas, timesteps, the img2img start
// index) are Torch-free: plain float32 vectors computed with the same float32 rounding as
// diffusers (numpy float32 arrays, then torch float32), linked into dit_backend_core. The
// tensor updates step() / scaleNoise() are defined in the Torch-side
// flow_match_euler_discrete_scheduler_step.cpp (dit_backend); this header only forward-declares
// at::Tensor, so Torch-free code (the GUI) can include it.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace dit {

/// diffusers FlowMatchEulerDiscreteScheduler config (scheduler/scheduler_config.json).
struct SchedulerConfig {
  int num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5, max_shift = 1.15;
  int base_image_seq_len = 256, max_image_seq_len = 4096;
  std::string time_shift_type = "exponential";
  /// diffusers' shift_terminal (Qwen-Image: 0.02): after the shift the schedule is stretched so
  /// that its last sigma equals this value (stretch_shift_to_terminal); 0 = off (null in the file).
  double shift_terminal = 0.0;
};

/// Parses a scheduler config read from `file`. Throws ModelFileError naming the file: a top
/// level that is not a JSON object, a "_class_name" other than FlowMatchEulerDiscreteScheduler
/// (naming the class it declares), a key of the wrong type, a time_shift_type other than
/// "exponential" or "linear", shift_terminal outside [0, 1).
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
/// linear time_shift) or the static shift, then with shift_terminal the stretch
/// 1 - (1 - sigma) / ((1 - sigma[-1]) / (1 - shift_terminal)) (float32, diffusers'
/// stretch_shift_to_terminal), timesteps = sigma * 1000, terminal 0 appended.
/// Throws std::invalid_argument when steps < 1, or steps == 1 with shift_terminal (the stretch
/// divides 0 by 0 there: diffusers' schedule is NaN).
SchedulerTables fluxSchedule(const SchedulerConfig& cfg, int steps, int image_seq_len);

/// The same tables for a given mu (what set_timesteps(sigmas=linspace(1, 1/N, N), mu=mu) makes
/// with dynamic shifting; mu is ignored with the static shift). fluxSchedule = this with
/// calculateShift; FLUX.2 passes computeEmpiricalMu(image_seq_len, steps). Throws
/// std::invalid_argument when steps < 1.
SchedulerTables flowMatchSchedule(const SchedulerConfig& cfg, int steps, double mu);

/// The img2img start index of diffusers' get_timesteps (FluxImg2ImgPipeline,
/// Flux2KleinInpaintPipeline, StableDiffusion3Img2ImgPipeline): init_timestep =
/// min(N * strength, N), t_start = int(max(N - init_timestep, 0)) in Python float (double)
/// arithmetic; the loop runs N - t_start steps. Does not validate strength.
int img2imgStartIndex(int num_inference_steps, double strength);

/// diffusers FlowMatchEulerDiscreteScheduler: the schedule for one generation and the Euler
/// update. setTimesteps is set_timesteps(sigmas = linspace(1, 1/N, N), mu) followed by
/// get_timesteps(N, strength) + set_begin_index(t_start); step(v, i, x) and scaleNoise(x, i, n)
/// take the index into the FULL schedule (0..N-1), as diffusers' step_index after
/// set_begin_index. Not thread-safe; one instance per pipeline call.
class FlowMatchEulerDiscreteScheduler {
 public:
  explicit FlowMatchEulerDiscreteScheduler(SchedulerConfig cfg = {});
  const SchedulerConfig& config() const { return cfg_; }

  /// Builds the tables for `num_inference_steps` steps with shift parameter `mu` (dynamic
  /// shifting; ignored with the static shift) and the first index run for `strength` in (0, 1]
  /// (1 = text-to-image, t_start 0). Throws std::invalid_argument when num_inference_steps < 1,
  /// strength is outside (0, 1] or not finite, or strength leaves no step to run
  /// (N * strength < 1).
  void setTimesteps(int num_inference_steps, double mu, double strength = 1.0);

  /// The FULL schedule: N + 1 sigmas (terminal 0) and N timesteps (sigma * num_train_timesteps).
  const SchedulerTables& tables() const { return tables_; }
  const std::vector<float>& sigmas() const { return tables_.sigmas; }
  const std::vector<float>& timesteps() const { return tables_.timesteps; }
  int numInferenceSteps() const { return static_cast<int>(tables_.timesteps.size()); }
  /// t_start: the first schedule index run (set_begin_index); 0 for text-to-image.
  int beginIndex() const { return begin_index_; }
  /// Steps the loop runs: N - t_start.
  int stepsToRun() const { return numInferenceSteps() - begin_index_; }
  /// sigmas[step_index], step_index in [0, N] (N = the terminal 0). Throws std::out_of_range.
  float sigma(int step_index) const;
  /// timesteps[step_index], step_index in [0, N). Throws std::out_of_range.
  float timestep(int step_index) const;

  /// FlowMatchEulerDiscreteScheduler.step (deterministic, no stochastic sampling): the sample
  /// upcast to float32, prev = sample + (sigma[i+1] - sigma[i]) * model_output with the product
  /// formed in model_output's dtype, the sum in float32, the result cast to model_output's
  /// dtype. model_output and sample: the same shape (e.g. packed latents [B, S, C]) on one
  /// device. Throws std::out_of_range for step_index outside [0, N).
  at::Tensor step(const at::Tensor& model_output, int step_index, const at::Tensor& sample) const;
  /// The x0 estimate at the same step: sample - sigma[i] * model_output, both in float32 (what
  /// the progress previews decode).
  at::Tensor predOriginalSample(const at::Tensor& model_output, int step_index,
                                const at::Tensor& sample) const;
  /// FlowMatchEulerDiscreteScheduler.scale_noise at sigmas[step_index] (step_index in [0, N];
  /// N gives the clean sample): sigma * noise + (1 - sigma) * sample, in the tensors' dtype.
  at::Tensor scaleNoise(const at::Tensor& sample, int step_index, const at::Tensor& noise) const;
  /// The same at an explicit sigma.
  static at::Tensor scaleNoiseAtSigma(const at::Tensor& sample, float sigma,
                                      const at::Tensor& noise);

 private:
  SchedulerConfig cfg_;
  SchedulerTables tables_;
  int begin_index_ = 0;
};

}  // namespace dit
