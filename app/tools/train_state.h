// ditstudio-train's model state: parameters, AdamW, initial weights, the moving average, the
// learning-rate schedule and the checkpoint (parameters + optimiser state + where training is).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "app/demo/shapes_dataset.h"
#include "backend/io/weight_source.h"

namespace dit::train {

using Params = std::map<std::string, at::Tensor>;

/// AdamW state of one phase (PyTorch torch.optim.AdamW, weight decay on matrices only).
struct AdamW {
  Params m, v;
  int64_t step = 0;
  void update(Params& p, double lr, double wd, double b1 = 0.9, double b2 = 0.999,
              double eps = 1e-8) {
    at::NoGradGuard ng;
    ++step;
    const double c1 = 1 - std::pow(b1, step), c2 = 1 - std::pow(b2, step);
    for (auto& [k, t] : p) {
      const at::Tensor g = t.grad();
      if (!g.defined()) continue;
      if (!m.count(k)) m[k] = at::zeros_like(t), v[k] = at::zeros_like(t);
      m[k].mul_(b1).add_(g, 1 - b1);
      v[k].mul_(b2).addcmul_(g, g, 1 - b2);
      if (wd > 0 && t.dim() >= 2) t.mul_(1 - lr * wd);
      t.addcdiv_(m[k] / c1, (v[k] / c2).sqrt_().add_(eps), -lr);
      t.mutable_grad().reset();
    }
  }
};

/// Initial parameters: the names and shapes the model asks for (a recording random source),
/// then matrices / conv kernels ~ N(0, 1 / fan_in), norms 1, biases 0; `zero` names (AdaLN-Zero
/// modulation, the final projection) start at 0 as in DiT.
template <class Build>
Params initParams(uint64_t seed, Build build, const std::vector<std::string>& zero = {}) {
  auto w = WeightSource::random(seed, at::kFloat, at::kCPU, 1.0);
  w->setRecording(true);
  build(*w);
  Params p;
  for (const auto& [k, t0] : w->recorded()) {
    at::Tensor t = t0.clone();
    if (t.dim() >= 2) t.div_(std::sqrt(static_cast<double>(t[0].numel())));
    for (const auto& z : zero)
      if (k.find(z) != std::string::npos) t.zero_();
    p[k] = t.requires_grad_(true);
  }
  return p;
}

/// Detached, contiguous copies of `p` (no gradient).
Params detached(const Params& p);

struct Checkpoint {
  std::string phase;  // "vae", "transformer", "decoder"
  int64_t step = 0;
  double shift = 0, scale = 1;
  /// --position-jitter of the transformer's scenes (checkpoints written before the option: 3).
  double position_jitter = demo::kDefaultPositionJitter;
  /// --mixed-precision of the transformer phase (checkpoints written before the option: "no").
  std::string mixed_precision = "no";
};

/// Writes the checkpoint (safetensors: the parameters and optimiser moments by group, the phase,
/// step, latent statistics and options as metadata). Throws on a failed write.
void saveCheckpoint(const std::filesystem::path& file, const Checkpoint& c, const Params& vae,
                    const AdamW& vaeOpt, const Params& tr, const AdamW& trOpt, const Params& ema);
/// Reads `file` into the state when it exists (false: no checkpoint). Throws std::runtime_error
/// naming the file when it does not match the models (other sizes, a missing parameter).
bool loadCheckpoint(const std::filesystem::path& file, Checkpoint& c, Params& vae, AdamW& vaeOpt,
                    Params& tr, AdamW& trOpt, Params& ema);

/// Exponential moving average of `p` in `ema` after optimiser step `step` (0-based), as diffusers
/// EMAModel.step with its default warm-up: decay min(`decay`, (1 + step) / (10 + step)) at each
/// update (step 0 is the first: 0.1). `ema` starts as a copy of the initial weights.
void updateEma(Params& ema, const Params& p, double decay, int64_t step);

/// Linear warm-up over `warm` steps, then linear decay to 10% at `total`.
double schedule(double lr, int64_t step, int64_t warm, int64_t total);

}  // namespace dit::train
