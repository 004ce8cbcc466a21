// Context-parallel plan runner (see context_parallel_plan.h).
#include "parallel/context_parallel_plan.h"

#include <ATen/ATen.h>

#include <set>
#include <stdexcept>
#include <utility>

namespace dit {

namespace {

std::string str(long long v) { return std::to_string(v); }

int64_t normDim(int64_t dim, int64_t ndim, const std::string& what) {
  const int64_t d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim)
    throw std::invalid_argument("context-parallel plan: " + what + " has " + str(ndim) +
                                " dimensions, no dimension " + str(dim));
  return d;
}

}  // namespace

ContextParallelRunner::ContextParallelRunner(std::shared_ptr<ContextParallel> cp,
                                             ContextParallelPlan plan)
    : cp_(std::move(cp)), plan_(std::move(plan)) {
  std::set<std::string> names;
  for (const auto& in : plan_.inputs) {
    if (in.name.empty())
      throw std::invalid_argument("context-parallel plan: an input without a name");
    if (!names.insert(in.name).second)
      throw std::invalid_argument("context-parallel plan: input '" + in.name + "' listed twice");
  }
  for (const auto& j : plan_.joint_sequence)
    if (!names.count(j))
      throw std::invalid_argument("context-parallel plan: joint_sequence names '" + j +
                                  "', which the plan does not split");
  if (!plan_.output.sizes_from.empty() && !names.count(plan_.output.sizes_from))
    throw std::invalid_argument("context-parallel plan: the output follows '" +
                                plan_.output.sizes_from + "', which the plan does not split");
}

std::map<std::string, at::Tensor> ContextParallelRunner::split(
    const std::map<std::string, at::Tensor>& inputs) {
  std::map<std::string, at::Tensor> out = inputs;
  sizes_.clear();
  for (const auto& in : plan_.inputs) {
    auto it = inputs.find(in.name);
    if (it == inputs.end() || !it->second.defined())
      throw std::invalid_argument("context-parallel plan: input '" + in.name + "' is missing");
    const at::Tensor& t = it->second;
    if (in.expected_dims >= 0 && t.dim() != in.expected_dims)
      throw std::invalid_argument("context-parallel plan: input '" + in.name + "' has " +
                                  str(t.dim()) + " dimensions, the plan expects " +
                                  str(in.expected_dims));
    const int64_t d = normDim(in.split_dim, t.dim(), "input '" + in.name + "'");
    const int64_t len = t.size(d);
    if (!cp_ || cp_->degree() == 1) {
      sizes_[in.name] = {len};
      continue;
    }
    std::vector<int64_t> parts;
    try {
      parts = cp_->partition(len);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("context-parallel plan: input '" + in.name + "' (dimension " +
                                  str(d) + "): " + e.what());
    }
    const auto [start, n] = cp_->localRange(len);
    out[in.name] = t.narrow(d, start, n).contiguous();
    sizes_[in.name] = std::move(parts);
  }
  return out;
}

const std::vector<int64_t>& ContextParallelRunner::sizes(const std::string& name) const {
  auto it = sizes_.find(name);
  if (it == sizes_.end())
    throw std::invalid_argument("context-parallel plan: no sizes for '" + name +
                                "' (not split, or split() not called)");
  return it->second;
}

std::vector<int64_t> ContextParallelRunner::localLens() const {
  std::vector<int64_t> lens(static_cast<size_t>(degree()), 0);
  for (const auto& name : plan_.joint_sequence) {
    const auto& s = sizes(name);
    for (size_t r = 0; r < lens.size(); ++r) lens[r] += s[r];
  }
  return lens;
}

at::Tensor ContextParallelRunner::gather(const at::Tensor& localOutput) const {
  if (!localOutput.defined())
    throw std::invalid_argument("context-parallel plan: the output is undefined");
  const auto& o = plan_.output;
  if (o.expected_dims >= 0 && localOutput.dim() != o.expected_dims)
    throw std::invalid_argument("context-parallel plan: the output has " + str(localOutput.dim()) +
                                " dimensions, the plan expects " + str(o.expected_dims));
  if (!cp_ || cp_->degree() == 1) return localOutput;
  if (o.sizes_from.empty())
    throw std::invalid_argument(
        "context-parallel plan: the output names no split input to follow (sizes_from)");
  const auto& s = sizes(o.sizes_from);
  const int64_t d = normDim(o.gather_dim, localOutput.dim(), "the output");
  // gatherSequence gathers dim 1 of [B, S, ...]: move the gather dim there.
  at::Tensor x = localOutput.unsqueeze(0).movedim(d + 1, 1).contiguous();  // [1, S_local, ...]
  at::Tensor g = cp_->gatherSequence(x, s);
  return g.movedim(1, d + 1).squeeze(0).contiguous();
}

}  // namespace dit
