// ditstudio-train's model state: see train_state.h.
#include "app/tools/train_state.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"

namespace dit::train {

namespace fs = std::filesystem;

Params detached(const Params& p) {
  Params o;
  for (const auto& [k, t] : p) o[k] = t.detach().clone().contiguous();
  return o;
}

void saveCheckpoint(const fs::path& file, const Checkpoint& c, const Params& vae,
                    const AdamW& vaeOpt, const Params& tr, const AdamW& trOpt, const Params& ema) {
  std::map<std::string, at::Tensor> all;
  for (auto& [k, t] : ema) all["transformer_ema/" + k] = t.contiguous();
  for (auto& [k, t] : vae) all["vae/" + k] = t.detach().contiguous();
  for (auto& [k, t] : vaeOpt.m) all["vae_m/" + k] = t.contiguous();
  for (auto& [k, t] : vaeOpt.v) all["vae_v/" + k] = t.contiguous();
  for (auto& [k, t] : tr) all["transformer/" + k] = t.detach().contiguous();
  for (auto& [k, t] : trOpt.m) all["transformer_m/" + k] = t.contiguous();
  for (auto& [k, t] : trOpt.v) all["transformer_v/" + k] = t.contiguous();
  char buf[64];
  std::map<std::string, std::string> meta{{"phase", c.phase},
                                          {"step", std::to_string(c.step)},
                                          {"vae_opt_step", std::to_string(vaeOpt.step)},
                                          {"transformer_opt_step", std::to_string(trOpt.step)}};
  std::snprintf(buf, sizeof buf, "%.17g", c.shift);
  meta["shift_factor"] = buf;
  std::snprintf(buf, sizeof buf, "%.17g", c.scale);
  meta["scaling_factor"] = buf;
  std::snprintf(buf, sizeof buf, "%.17g", c.position_jitter);
  meta["position_jitter"] = buf;
  meta["mixed_precision"] = c.mixed_precision;
  saveTensors(file.string(), all, meta);
}

bool loadCheckpoint(const fs::path& file, Checkpoint& c, Params& vae, AdamW& vaeOpt, Params& tr,
                    AdamW& trOpt, Params& ema) {
  if (!fs::exists(file)) return false;
  SafetensorsCollection st(file.string());
  const auto names = st.names();
  if (names.empty()) throw std::runtime_error(file.string() + ": empty checkpoint");
  const auto& meta = st.reader(names.front()).metadata();
  c.phase = meta.at("phase");
  c.step = std::stoll(meta.at("step"));
  c.shift = std::stod(meta.at("shift_factor"));
  c.scale = std::stod(meta.at("scaling_factor"));
  vaeOpt.step = std::stoll(meta.at("vae_opt_step"));
  trOpt.step = std::stoll(meta.at("transformer_opt_step"));
  if (meta.count("position_jitter")) c.position_jitter = std::stod(meta.at("position_jitter"));
  if (meta.count("mixed_precision")) c.mixed_precision = meta.at("mixed_precision");
  // Every parameter of both models must come from the file (another architecture would leave
  // some at their random initial values).
  for (const auto& [group, p] : {std::pair<const char*, const Params*>{"vae", &vae},
                                 std::pair<const char*, const Params*>{"transformer", &tr}})
    for (const auto& [k, t] : *p)
      if (!st.contains(std::string(group) + "/" + k))
        throw std::runtime_error(file.string() + ": no '" + group + "/" + k +
                                 "' (a checkpoint of other model sizes?)");
  for (const auto& n : names) {
    const auto slash = n.find('/');
    const std::string group = n.substr(0, slash), key = n.substr(slash + 1);
    at::Tensor t = loadTensor(st, n, at::kFloat);
    auto put = [&](Params& p, bool param) {
      if (param && (!p.count(key) || p[key].sizes() != t.sizes()))
        throw std::runtime_error(file.string() + ": '" + n +
                                 "' does not match the model (other sizes?)");
      p[key] = param ? t.requires_grad_(true) : t;
    };
    if (group == "vae") put(vae, true);
    if (group == "vae_m") put(vaeOpt.m, false);
    if (group == "vae_v") put(vaeOpt.v, false);
    if (group == "transformer") put(tr, true);
    if (group == "transformer_m") put(trOpt.m, false);
    if (group == "transformer_v") put(trOpt.v, false);
    if (group == "transformer_ema") put(ema, false);
  }
  return true;
}

void updateEma(Params& ema, const Params& p, double decay, int64_t step) {
  at::NoGradGuard ng;
  const double n = static_cast<double>(step);
  const double d = std::min(decay, (1.0 + n) / (10.0 + n));
  for (auto& [k, t] : p) ema.at(k).mul_(d).add_(t.detach(), 1.0 - d);
}

double schedule(double lr, int64_t step, int64_t warm, int64_t total) {
  if (step < warm) return lr * (step + 1) / warm;
  const double f = static_cast<double>(step - warm) / std::max<int64_t>(1, total - warm);
  return lr * (1.0 - 0.9 * std::min(1.0, f));
}

}  // namespace dit::train
