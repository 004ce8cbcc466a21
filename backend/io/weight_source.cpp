#include "backend/io/weight_source.h"

#include <ATen/ATen.h>

#include <atomic>
#include <functional>

#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"

namespace dit {

static std::string shapeStr(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::shared_ptr<WeightSource> WeightSource::fromFolder(const std::string& dir,
                                                       const std::string& stem,
                                                       at::ScalarType dtype, c10::Device device) {
  std::shared_ptr<WeightSource> w(new WeightSource(dtype, device));
  w->st_ = std::make_unique<SafetensorsCollection>(SafetensorsCollection::openFolder(dir, stem));
  w->dir_ = dir;
  return w;
}

std::shared_ptr<WeightSource> WeightSource::random(uint64_t seed, at::ScalarType dtype,
                                                   c10::Device device, double std) {
  std::shared_ptr<WeightSource> w(new WeightSource(dtype, device));
  w->seed_ = seed;
  w->std_ = std;
  w->dir_ = "<random weights>";
  return w;
}

WeightSource::~WeightSource() = default;

std::string WeightSource::where() const { return st_ ? st_->path() : dir_; }

bool WeightSource::contains(const std::string& name) const { return !st_ || st_->contains(name); }

void WeightSource::checkShape(const std::string& name, const std::vector<int64_t>& shape) const {
  const auto& info = st_->info(name);  // throws naming the file and tensor
  if (info.shape != shape)
    throw ModelFileError(st_->reader(name).path(),
                         "tensor '" + name + "' has shape " + shapeStr(info.shape) +
                             " but the config implies " + shapeStr(shape));
}

namespace {
std::atomic<uint64_t> g_processReads{0};
}  // namespace

uint64_t WeightSource::processReads() { return g_processReads.load(); }

at::Tensor WeightSource::finish(at::Tensor t) {
  if (!device_.is_cpu()) t = t.to(device_, /*non_blocking=*/false);
  bytes_ += static_cast<uint64_t>(t.numel()) * t.element_size();
  g_processReads.fetch_add(1);
  return t;
}

at::Tensor WeightSource::randomTensor(const std::string& name, std::vector<int64_t> shape) {
  // Per-tensor generator seeded from the name, so shards of one tensor agree across ranks.
  const uint64_t s = seed_ ^ std::hash<std::string>{}(name);
  auto gen = at::detail::createCPUGenerator(s);
  const bool isNorm = name.find("norm") != std::string::npos && shape.size() == 1;
  const bool isBias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
  if (isNorm && !isBias) return at::ones(shape, at::TensorOptions().dtype(dtype_));
  if (isBias) return at::zeros(shape, at::TensorOptions().dtype(dtype_));
  return (at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)) * std_).to(dtype_);
}

at::Tensor WeightSource::get(const std::string& name, const std::vector<int64_t>& shape) {
  if (!st_) {
    at::Tensor t = randomTensor(name, shape);
    if (recording_) recorded_[name] = t;
    return finish(t);
  }
  checkShape(name, shape);
  return finish(loadTensor(*st_, name, dtype_));
}

at::Tensor WeightSource::getOptional(const std::string& name, const std::vector<int64_t>& shape) {
  if (st_ && !st_->contains(name)) return {};
  return get(name, shape);
}

at::Tensor WeightSource::shard(const std::string& name, const std::vector<int64_t>& shape,
                               int64_t dim, int64_t part, int64_t parts) {
  if (shape[dim] % parts != 0)
    throw std::invalid_argument("cannot shard '" + name + "': dim " + std::to_string(dim) +
                                " size " + std::to_string(shape[dim]) +
                                " is not divisible by tp_degree " + std::to_string(parts));
  const int64_t len = shape[dim] / parts;
  if (!st_) {
    // Random: generate only the shard (seeded per name and part) so memory stays ~1/tp.
    auto s = shape;
    s[dim] = len;
    return finish(randomTensor(name + "#" + std::to_string(part), s));
  }
  checkShape(name, shape);
  return finish(loadSlice(*st_, name, dim, part * len, len, dtype_));
}

at::Tensor WeightSource::packedShard(const std::string& name, const std::vector<int64_t>& shape,
                                     int64_t dim, const std::vector<int64_t>& blocks, int64_t part,
                                     int64_t parts) {
  if (!st_) {
    auto s = shape;
    s[dim] /= parts;
    return finish(randomTensor(name + "#" + std::to_string(part), s));
  }
  checkShape(name, shape);
  return finish(loadPackedSlice(*st_, name, dim, blocks, part, parts, dtype_));
}

std::pair<std::string, int64_t> WeightSource::storage(const std::string& name) const {
  if (st_) {
    const DType t = st_->info(name).dtype;
    return {dtypeName(t), static_cast<int64_t>(dtypeSize(t))};
  }
  switch (dtype_) {
    case at::kBFloat16:
      return {"BF16", 2};
    case at::kHalf:
      return {"F16", 2};
    default:
      return {"F32", 4};
  }
}

at::Tensor Linear::operator()(const at::Tensor& x) const { return at::linear(x, weight, bias); }
at::Tensor Linear::noBias(const at::Tensor& x) const { return at::linear(x, weight); }

Linear loadLinear(WeightSource& w, const std::string& prefix, int64_t in, int64_t out, bool bias) {
  Linear l;
  l.weight = w.get(prefix + ".weight", {out, in});
  if (bias) l.bias = w.get(prefix + ".bias", {out});
  return l;
}

}  // namespace dit
