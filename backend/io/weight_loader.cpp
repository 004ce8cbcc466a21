#include "backend/io/weight_loader.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "parallel/process_group.h"

namespace dit {

using tensor_parallel::ColumnParallelLinear;
using tensor_parallel::FusedColumnParallelLinear;
using tensor_parallel::ReplicatedLinear;
using tensor_parallel::RowParallelLinear;

WeightLoader::WeightLoader(WeightSource& source, std::shared_ptr<const ShardingPlan> plan,
                           std::shared_ptr<ProcessGroup> tp)
    : src_(source), plan_(std::move(plan)), tp_(std::move(tp)) {}

int WeightLoader::tpRank() const { return tp_ ? tp_->rank() : 0; }
int WeightLoader::tpSize() const { return tp_ ? tp_->size() : 1; }

ShardSpec WeightLoader::specFor(const std::string& paramName,
                                const std::vector<int64_t>& shape) const {
  if (!plan_ || tpSize() == 1) return {};
  return plan_->shardSpec(paramName, shape, tpRank(), tpSize());
}

void WeightLoader::record(const std::string& name, const std::vector<int64_t>& shape,
                          const ShardSpec& spec) {
  LoadedParameter p;
  p.info.name = name;
  p.info.shape = shape;
  std::tie(p.info.dtype, p.info.elementBytes) = src_.storage(name);
  p.spec = spec;
  loaded_.push_back(std::move(p));
}

at::Tensor WeightLoader::read(const std::string& name, const std::vector<int64_t>& shape,
                              const ShardSpec& spec) {
  at::Tensor t;
  if (spec.replicated())
    t = src_.get(name, shape);
  else if (spec.blocks.empty())
    t = src_.shard(name, shape, spec.dim, spec.part, spec.parts);
  else
    t = src_.packedShard(name, shape, spec.dim, spec.blocks, spec.part, spec.parts);
  record(name, shape, spec);
  return t;
}

std::shared_ptr<tensor_parallel::Linear> WeightLoader::linear(const std::string& path, int64_t in,
                                                              int64_t out, bool bias) {
  const std::vector<int64_t> wShape{out, in}, bShape{out};
  const ShardSpec ws = specFor(path + ".weight", wShape);
  const ShardSpec bs = bias ? specFor(path + ".bias", bShape) : ShardSpec{};
  at::Tensor w = read(path + ".weight", wShape, ws);
  at::Tensor b = bias ? read(path + ".bias", bShape, bs) : at::Tensor();
  std::shared_ptr<tensor_parallel::Linear> layer;
  if (ws.replicated())
    layer = std::make_shared<ReplicatedLinear>(path, w, b);
  else if (ws.dim == 0)
    layer = std::make_shared<ColumnParallelLinear>(path, w, b, ws, tp_);
  else
    layer = std::make_shared<RowParallelLinear>(path, w, b, ws, tp_);
  layers_.push_back(layer);
  return layer;
}

std::shared_ptr<FusedColumnParallelLinear> WeightLoader::fusedColumn(
    const std::string& name, const std::vector<std::pair<std::string, int64_t>>& parts,
    int64_t in) {
  std::vector<FusedColumnParallelLinear::Part> ps;
  for (const auto& [path, out] : parts) {
    const std::vector<int64_t> wShape{out, in}, bShape{out};
    const ShardSpec ws = specFor(path + ".weight", wShape);
    if (tpSize() > 1 && (ws.replicated() || ws.dim != 0)) {
      const ShardRule* r = plan_ ? plan_->match(path) : nullptr;
      throw std::invalid_argument("cannot fuse " + path + " into " + name +
                                  ": under tensor parallelism every part " +
                                  "must be ColwiseParallel, but the plan gives it " +
                                  (r ? parallelStyleName(r->style) : "no rule (replicated)"));
    }
    FusedColumnParallelLinear::Part p;
    p.name = path;
    p.spec = ws;
    p.weight = read(path + ".weight", wShape, ws);
    p.bias = read(path + ".bias", bShape, specFor(path + ".bias", bShape));
    ps.push_back(std::move(p));
  }
  auto layer = std::make_shared<FusedColumnParallelLinear>(name, std::move(ps), tp_);
  layers_.push_back(layer);
  return layer;
}

at::Tensor WeightLoader::param(const std::string& name, const std::vector<int64_t>& shape) {
  return read(name, shape, ShardSpec{});
}

ParameterTable WeightLoader::parameterTable() const {
  ParameterTable t;
  for (const auto& p : loaded_) t.add(p.info);
  return t;
}

}  // namespace dit
