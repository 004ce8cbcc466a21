#include "backend/io/weight_loader.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "backend/io/tensor_io.h"
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

std::shared_ptr<const tensor_parallel::WeightStorage> WeightLoader::readFloat8(
    const std::string& name, const std::vector<int64_t>& shape, const ShardSpec& spec,
    at::Tensor& codes) {
  const std::string format = src_.float8Format(name);
  if (format.empty()) return nullptr;
  src_.setKeepFloat8(true);
  try {
    codes = read(name, shape, spec);
  } catch (...) {
    src_.setKeepFloat8(false);
    throw;
  }
  src_.setKeepFloat8(false);
  auto s = std::make_shared<tensor_parallel::WeightStorage>();
  s->format = format;
  s->table = float8Table(parseDType(format)).to(codes.device());
  s->rowScale = at::full({codes.size(0)}, src_.float8Scale(name),
                         at::TensorOptions().dtype(at::kFloat).device(codes.device()));
  return s;
}

std::shared_ptr<tensor_parallel::Linear> WeightLoader::linear(const std::string& path, int64_t in,
                                                              int64_t out, bool bias) {
  const std::vector<int64_t> wShape{out, in}, bShape{out};
  const ShardSpec ws = specFor(path + ".weight", wShape);
  const ShardSpec bs = bias ? specFor(path + ".bias", bShape) : ShardSpec{};
  at::Tensor w;
  auto storage = readFloat8(path + ".weight", wShape, ws, w);
  if (!storage) w = read(path + ".weight", wShape, ws);
  at::Tensor b = bias ? read(path + ".bias", bShape, bs) : at::Tensor();
  std::shared_ptr<tensor_parallel::Linear> layer;
  if (ws.replicated())
    layer = std::make_shared<ReplicatedLinear>(path, w, b);
  else if (ws.dim == 0)
    layer = std::make_shared<ColumnParallelLinear>(path, w, b, ws, tp_);
  else
    layer = std::make_shared<RowParallelLinear>(path, w, b, ws, tp_);
  if (storage) layer->setWeightStorage(storage);
  layers_.push_back(layer);
  return layer;
}

std::shared_ptr<FusedColumnParallelLinear> WeightLoader::fusedColumn(
    const std::string& name, const std::vector<std::pair<std::string, int64_t>>& parts, int64_t in,
    bool bias) {
  std::vector<FusedColumnParallelLinear::Part> ps;
  std::vector<std::shared_ptr<const tensor_parallel::WeightStorage>> storages;
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
    auto st = readFloat8(path + ".weight", wShape, ws, p.weight);
    if (!st) p.weight = read(path + ".weight", wShape, ws);
    if (!ps.empty() && static_cast<bool>(st) != static_cast<bool>(storages.back()))
      throw ModelFileError(src_.where(), "cannot fuse " + path + " into " + name +
                                             ": its weight is stored as " +
                                             src_.storage(path + ".weight").first +
                                             ", the other parts' are not (or the reverse)");
    storages.push_back(st);
    if (bias) p.bias = read(path + ".bias", bShape, specFor(path + ".bias", bShape));
    ps.push_back(std::move(p));
  }
  auto fused = std::make_shared<FusedColumnParallelLinear>(name, std::move(ps), tp_);
  if (storages.front()) {  // one storage over the concatenated codes: the parts' row scales
    auto merged = std::make_shared<tensor_parallel::WeightStorage>(*storages.front());
    std::vector<at::Tensor> scales;
    for (const auto& st : storages) scales.push_back(st->rowScale);
    merged->rowScale = scales.size() == 1 ? scales[0] : at::cat(scales, 0);
    fused->setWeightStorage(std::move(merged));
  }
  layers_.push_back(fused);
  return fused;
}

at::Tensor WeightLoader::param(const std::string& name, const std::vector<int64_t>& shape) {
  return read(name, shape, ShardSpec{});
}

std::map<std::string, int64_t> heldBytesByStorage(const std::vector<LoadedParameter>& params,
                                                  int64_t computeBytes,
                                                  const std::string& computeName) {
  std::map<std::string, int64_t> out;
  for (const auto& p : params) {
    int64_t n = 1;
    for (int64_t v : p.info.shape) n *= v;
    if (!p.spec.replicated() && p.spec.parts > 0) n /= p.spec.parts;
    const bool f8 = p.info.dtype == "F8_E4M3" || p.info.dtype == "F8_E5M2";
    out[f8 ? p.info.dtype : computeName] += n * (f8 ? 1 : computeBytes);
  }
  return out;
}

ParameterTable WeightLoader::parameterTable() const {
  ParameterTable t;
  for (const auto& p : loaded_) t.add(p.info);
  return t;
}

}  // namespace dit
