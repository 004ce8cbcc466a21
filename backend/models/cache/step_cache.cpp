#include "backend/models/cache/step_cache.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>

#include "parallel/process_group.h"

namespace dit {

StepCache::StepCache(StepCacheConfig cfg, std::shared_ptr<ProcessGroup> cp,
                     std::shared_ptr<ProcessGroup> tp)
    : cfg_(std::move(cfg)), cp_(std::move(cp)), tp_(std::move(tp)) {}
StepCache::~StepCache() = default;

StepCache::State& StepCache::cur() { return states_[context_]; }
const StepCache::State& StepCache::cur() const {
  static const State empty;
  auto it = states_.find(context_);
  return it == states_.end() ? empty : it->second;
}

void StepCache::setContext(const std::string& name) { context_ = name; }

void StepCache::beginForward() {
  State& s = cur();
  ++s.step;
  s.computed = true;
  s.relL1 = -1;
  if (taylorSeer()) s.computed = cfg_.taylorComputes(s.step);
}

int StepCache::step() const { return cur().step; }

bool StepCache::shouldComputeRemaining(const at::Tensor& r) {
  State& s = cur();
  at::Tensor rf = r.to(at::kFloat);
  if (!s.headResidual.defined()) {
    s.headResidual = rf;
    s.computed = true;
    return true;
  }
  // Local sums of |r - r_ref| and |r_ref| and the element count; summed over the cp group so
  // the means are global, then made bit-identical on every rank by broadcasts from rank 0.
  at::Tensor stats = at::stack({(rf - s.headResidual).abs().sum().to(at::kDouble),
                                s.headResidual.abs().sum().to(at::kDouble),
                                at::scalar_tensor(static_cast<double>(rf.numel()),
                                                  at::TensorOptions().dtype(at::kDouble))})
                         .to(r.device());
  for (const auto& g : {cp_, tp_}) {
    if (!g || g->size() <= 1) continue;
    if (g == cp_) g->allreduce(stats)->wait();
    g->broadcast(stats, 0)->wait();
  }
  stats = stats.cpu();
  const double num = stats[0].item<double>(), den = stats[1].item<double>();
  const double d = den > 0 ? num / den : INFINITY;
  s.relL1 = d;
  s.computed = d > cfg_.threshold;
  if (s.computed) s.headResidual = rf;  // r_ref: the last computed step's residual
  return s.computed;
}

void StepCache::storeTailResiduals(const at::Tensor& image, const at::Tensor& text) {
  State& s = cur();
  s.imageResidual = image;
  s.textResidual = text;
}

const at::Tensor& StepCache::imageResidual() const { return cur().imageResidual; }
const at::Tensor& StepCache::textResidual() const { return cur().textResidual; }

bool StepCache::taylorComputes() const { return cur().computed; }

void StepCache::update(const std::string& module, const std::vector<at::Tensor>& outputs) {
  State& s = cur();
  Factors& f = s.taylor[module];
  const int i = s.step;
  std::vector<std::vector<at::Tensor>> next(outputs.size());
  for (size_t o = 0; o < outputs.size(); ++o) {
    next[o].push_back(outputs[o].to(at::kFloat));  // taylor_factors_dtype float32
    if (f.last >= 0 && o < f.F.size()) {
      const double delta = static_cast<double>(i - f.last);
      for (int j = 0; j < cfg_.max_order && j < static_cast<int>(f.F[o].size()); ++j)
        next[o].push_back((next[o][j] - f.F[o][j]) / delta);
    }
  }
  f.F = std::move(next);
  f.last = i;
}

std::vector<at::Tensor> StepCache::predict(const std::string& module) const {
  const State& s = cur();
  auto it = s.taylor.find(module);
  if (it == s.taylor.end() || it->second.last < 0)
    throw std::logic_error("TaylorSeer: no computed step recorded for " + module);
  const Factors& f = it->second;
  const double dx = static_cast<double>(s.step - f.last);
  std::vector<at::Tensor> out;
  for (const auto& F : f.F) {
    at::Tensor y = at::zeros_like(F[0]);
    double fact = 1;
    for (size_t j = 0; j < F.size(); ++j) {
      if (j > 0) fact *= static_cast<double>(j);
      y = y + F[j] * std::pow(dx, static_cast<double>(j)) / fact;
    }
    out.push_back(y);
  }
  return out;
}

bool StepCache::lastComputed() const { return cur().computed; }
double StepCache::lastRelL1() const { return cur().relL1; }

}  // namespace dit
