#include "backend/io/weight_source.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <functional>

#include "backend/io/key_layout.h"
#include "backend/io/model_folder.h"
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

std::shared_ptr<WeightSource> WeightSource::fromLayout(std::shared_ptr<const KeyLayout> layout,
                                                       at::ScalarType dtype, c10::Device device) {
  std::shared_ptr<WeightSource> w(new WeightSource(dtype, device));
  w->st_ = std::make_unique<SafetensorsCollection>(layout->file);
  w->dir_ = layout->file;
  w->layout_ = std::move(layout);
  return w;
}

std::shared_ptr<WeightSource> WeightSource::forComponent(const ModelFolder& model,
                                                         const std::string& name,
                                                         const std::string& stem,
                                                         at::ScalarType dtype, c10::Device device) {
  auto it = model.components.find(name);
  if (it != model.components.end() && it->second.single_file) {
    if (!model.singleFileLayout)
      throw ModelFileError(it->second.path, "single-file component '" + name +
                                                "' without a key layout (the folder was not "
                                                "opened through ModelFolder::open)");
    return fromLayout(model.singleFileLayout(name), dtype, device);
  }
  return fromFolder(model.component(name), stem, dtype, device);
}

std::string WeightSource::float8Format(const std::string& name) const {
  if (!st_ || !contains(name)) return {};
  const std::string t = storage(name).first;
  return t == "F8_E4M3" || t == "F8_E5M2" ? t : std::string();
}

float WeightSource::float8Scale(const std::string& name) const {
  if (!layout_) return 1.0f;
  auto it = layout_->tensors.find(name);
  if (it == layout_->tensors.end() || it->second.scaleKey.empty()) return 1.0f;
  return loadTensor(*st_, it->second.scaleKey, at::kFloat).reshape({}).item<float>();
}

std::string WeightSource::blockFormat(const std::string& name) const {
  if (!st_ || !contains(name)) return {};
  const std::string key = layout_ ? layout_->tensors.at(name).segments.front().key : name;
  const DType t = st_->info(key).dtype;
  if (dtypeIsBlockQuantized(t)) return dtypeName(t);
  // A GGUF file's 16-bit weights stay 16-bit when the compute dtype is float32 (GGUF files are
  // kept as stored: resident bytes about the file's).
  if ((t == DType::F16 || t == DType::BF16) && dtype_ == at::kFloat && st_->reader(key).isGguf())
    return dtypeName(t);
  return {};
}

at::ScalarType WeightSource::loadTypeFor(const std::string& name) const {
  if (keepFloat8_ && !float8Format(name).empty()) return at::kByte;
  if (keepBlocks_ && !blockFormat(name).empty()) return at::kByte;
  return dtype_;
}

at::Tensor WeightSource::readMapped(const std::string& name, int64_t dim, int64_t start,
                                    int64_t len) {
  const MappedTensor& m = layout_->tensors.at(name);
  const bool codes = loadTypeFor(name) == at::kByte;
  // Block rows (GGUF kept quantized): byte columns of element columns [start, start + len).
  const DType storedType = st_->info(m.segments.front().key).dtype;
  const bool blocks = codes && (dtypeIsBlockQuantized(storedType) || storedType == DType::F16 ||
                                storedType == DType::BF16);
  auto byteCols = [&](int64_t c) {
    return c / dtypeBlockSize(storedType) * dtypeBlockBytes(storedType);
  };
  const at::ScalarType loadType = codes ? at::kByte : m.scaleKey.empty() ? dtype_ : at::kFloat;
  std::vector<at::Tensor> pieces;
  int64_t off = 0;  // logical row of the current segment
  for (const TensorSegment& seg : m.segments) {
    const TensorInfo& si = st_->info(seg.key);
    const bool wholeRows = seg.row0 == 0 && !si.shape.empty() && seg.rows == si.shape[0];
    if (dim == 0) {
      const int64_t a = std::max(start, off), b = std::min(start + len, off + seg.rows);
      if (a < b) {
        at::Tensor t = si.shape.empty()
                           ? loadTensor(*st_, seg.key, loadType)
                           : loadSlice(*st_, seg.key, 0, seg.row0 + a - off, b - a, loadType);
        pieces.push_back(t);
      }
    } else if (wholeRows) {
      pieces.push_back(loadSlice(*st_, seg.key, 1, start, len, loadType));
    } else {
      // Columns of a row range of a fused tensor: the range's rows are read, then narrowed.
      if (blocks && (start % dtypeBlockSize(storedType) || len % dtypeBlockSize(storedType)))
        throw std::invalid_argument("columns of '" + seg.key + "' do not fall on " +
                                    dtypeName(storedType) + " block boundaries");
      pieces.push_back(
          loadSlice(*st_, seg.key, 0, seg.row0, seg.rows, loadType)
              .narrow(1, blocks ? byteCols(start) : start, blocks ? byteCols(len) : len)
              .contiguous());
    }
    off += seg.rows;
  }
  at::Tensor t = pieces.size() == 1 ? pieces[0] : at::cat(pieces, 0);
  if (blocks) return t.contiguous();  // [rows, row bytes]
  std::vector<int64_t> shape = m.shape;
  if (!shape.empty()) shape[dim] = len;
  t = t.reshape(shape);
  if (!m.scaleKey.empty() && !codes) {
    // ComfyUI scaled fp8: weight = fp8.to(float32) * scale_weight, in float32.
    t = (t * loadTensor(*st_, m.scaleKey, at::kFloat).reshape({})).to(dtype_);
  }
  return t.contiguous();
}

std::shared_ptr<WeightSource> WeightSource::random(uint64_t seed, at::ScalarType dtype,
                                                   c10::Device device, double std) {
  std::shared_ptr<WeightSource> w(new WeightSource(dtype, device));
  w->seed_ = seed;
  w->std_ = std;
  w->dir_ = "<random weights>";
  return w;
}

std::shared_ptr<WeightSource> WeightSource::fromTensors(std::map<std::string, at::Tensor> tensors,
                                                        const std::string& what) {
  at::ScalarType dtype = at::kFloat;
  c10::Device device(at::kCPU);
  if (!tensors.empty()) {
    dtype = tensors.begin()->second.scalar_type();
    device = tensors.begin()->second.device();
  }
  std::shared_ptr<WeightSource> w(new WeightSource(dtype, device));
  w->inMemory_ = true;
  w->memory_ = std::move(tensors);
  w->dir_ = what;
  return w;
}

const at::Tensor& WeightSource::memoryTensor(const std::string& name,
                                             const std::vector<int64_t>& shape) const {
  auto it = memory_.find(name);
  if (it == memory_.end()) throw ModelFileError(dir_, "no tensor '" + name + "'");
  if (it->second.sizes().vec() != shape)
    throw ModelFileError(dir_, "tensor '" + name + "' has shape " +
                                   shapeStr(it->second.sizes().vec()) + " but the config implies " +
                                   shapeStr(shape));
  return it->second;
}

WeightSource::~WeightSource() = default;

std::string WeightSource::where() const { return st_ ? st_->path() : dir_; }

bool WeightSource::contains(const std::string& name) const {
  if (inMemory_) return memory_.count(name) != 0;
  if (layout_) return layout_->tensors.count(name) != 0;
  return !st_ || st_->contains(name);
}

void WeightSource::checkShape(const std::string& name, const std::vector<int64_t>& shape) const {
  if (layout_) {
    auto it = layout_->tensors.find(name);
    if (it == layout_->tensors.end())
      throw ModelFileError(layout_->file,
                           "the " + layout_->description + " has no tensor for '" + name + "'");
    if (it->second.shape != shape)
      throw ModelFileError(layout_->file, "tensor '" + it->second.segments.front().key + "' (as '" +
                                              name + "') has shape " + shapeStr(it->second.shape) +
                                              " but the config implies " + shapeStr(shape));
    return;
  }
  const auto& info = st_->info(name);  // throws naming the file and tensor
  if (info.shape != shape)
    throw ModelFileError(st_->reader(name).path(),
                         "tensor '" + name + "' has shape " + shapeStr(info.shape) +
                             " but the config implies " + shapeStr(shape));
}

namespace {
std::atomic<uint64_t> g_processReads{0};
std::atomic<int> g_allowNonFinite{-1};  // -1: not set, read DITSTUDIO_ALLOW_NONFINITE_WEIGHTS
}  // namespace

void setAllowNonFiniteWeights(bool allow) { g_allowNonFinite = allow ? 1 : 0; }

bool allowNonFiniteWeights() {
  const int v = g_allowNonFinite.load();
  if (v >= 0) return v != 0;
  const char* e = std::getenv("DITSTUDIO_ALLOW_NONFINITE_WEIGHTS");
  return e && *e && std::string(e) != "0";
}

void WeightSource::checkFinite(const std::string& name, const at::Tensor& t) const {
  if (!st_ || !t.is_floating_point() || allowNonFiniteWeights()) return;
  // Once over the copy just made (in the compute dtype: a float32 value that overflows float16
  // or bfloat16 on conversion is caught too).
  // One reduction, no temporary of the tensor's size (loading keeps its peak memory near the
  // shard, tests/test_load_memory.cpp): NaN and Inf propagate into the sum. A non-finite sum of
  // finite values (overflow) is told apart by the exact check below.
  if (std::isfinite(t.sum().item<double>())) return;
  const at::Tensor bad = at::logical_not(at::isfinite(t));
  const int64_t n = bad.sum().item<int64_t>();
  if (n == 0) return;
  const int64_t first = bad.reshape({-1}).nonzero()[0][0].item<int64_t>();
  const double v = t.reshape({-1})[first].item<double>();
  throw ModelFileError(
      st_->reader(layout_ ? layout_->tensors.at(name).segments.at(0).key : name).path(),
      "tensor '" + name + "' holds " + std::to_string(n) + " non-finite value" +
          (n == 1 ? "" : "s") + " (first: " +
          (std::isnan(v) ? std::string("nan")
           : v > 0       ? "inf"
                         : "-inf") +
          " at flat index " + std::to_string(first) + " of this rank's part" +
          (t.scalar_type() == at::kFloat
               ? ""
               : ", after conversion to " + std::string(c10::toString(t.scalar_type()))) +
          "); refusing weights that would make NaN images. Pass "
          "--allow-nonfinite-weights (or set DITSTUDIO_ALLOW_NONFINITE_WEIGHTS=1) "
          "to load them anyway");
}

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
  // Drawn and scaled in place (the values of randn(shape, gen) * std): no second full-size
  // temporary per tensor, whose freed holes would grow the heap past the weights while loading.
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  t.normal_(0.0, 1.0, gen);
  t.mul_(std_);
  return t.to(dtype_);
}

at::Tensor WeightSource::get(const std::string& name, const std::vector<int64_t>& shape) {
  if (inMemory_) return finish(memoryTensor(name, shape));
  if (!st_) {
    at::Tensor t = randomTensor(name, shape);
    if (recording_) recorded_[name] = t;
    return finish(t);
  }
  checkShape(name, shape);
  at::Tensor t = layout_ ? readMapped(name, 0, 0, shape.empty() ? 1 : shape[0])
                         : loadTensor(*st_, name, loadTypeFor(name));
  checkFinite(name, t);
  return finish(t);
}

at::Tensor WeightSource::getOptional(const std::string& name, const std::vector<int64_t>& shape) {
  if ((st_ || inMemory_) && !contains(name)) return {};
  return get(name, shape);
}

at::Tensor WeightSource::shard(const std::string& name, const std::vector<int64_t>& shape,
                               int64_t dim, int64_t part, int64_t parts) {
  if (shape[dim] % parts != 0)
    throw std::invalid_argument("cannot shard '" + name + "': dim " + std::to_string(dim) +
                                " size " + std::to_string(shape[dim]) +
                                " is not divisible by tp_degree " + std::to_string(parts));
  const int64_t len = shape[dim] / parts;
  if (inMemory_) return finish(memoryTensor(name, shape).narrow(dim, part * len, len));
  if (!st_) {
    // Random: generate only the shard (seeded per name and part) so memory stays ~1/tp.
    auto s = shape;
    s[dim] = len;
    return finish(randomTensor(name + "#" + std::to_string(part), s));
  }
  checkShape(name, shape);
  at::Tensor t = layout_ ? readMapped(name, dim, part * len, len)
                         : loadSlice(*st_, name, dim, part * len, len, loadTypeFor(name));
  checkFinite(name, t);
  return finish(t);
}

at::Tensor WeightSource::slice(const std::string& name, const std::vector<int64_t>& shape,
                               int64_t dim, int64_t start, int64_t len) {
  if (dim < 0 || dim >= static_cast<int64_t>(shape.size()) || start < 0 || len < 0 ||
      start + len > shape[dim])
    throw std::invalid_argument("cannot slice '" + name + "': [" + std::to_string(start) + ", " +
                                std::to_string(start + len) + ") of dim " + std::to_string(dim));
  if (inMemory_) return finish(memoryTensor(name, shape).narrow(dim, start, len));
  if (!st_) {
    auto s = shape;
    s[dim] = len;
    return finish(randomTensor(name + "@" + std::to_string(start), s));
  }
  checkShape(name, shape);
  at::Tensor t = layout_ ? readMapped(name, dim, start, len)
                         : loadSlice(*st_, name, dim, start, len, loadTypeFor(name));
  checkFinite(name, t);
  return finish(t);
}

at::Tensor WeightSource::packedShard(const std::string& name, const std::vector<int64_t>& shape,
                                     int64_t dim, const std::vector<int64_t>& blocks, int64_t part,
                                     int64_t parts) {
  if (inMemory_) {
    const at::Tensor& t = memoryTensor(name, shape);
    return finish(catPackedParts(name, dim, blocks, part, parts, [&](int64_t start, int64_t len) {
      return t.narrow(dim, start, len);
    }));
  }
  if (!st_) {
    auto s = shape;
    s[dim] /= parts;
    return finish(randomTensor(name + "#" + std::to_string(part), s));
  }
  checkShape(name, shape);
  if (layout_) {
    at::Tensor t = catPackedParts(name, dim, blocks, part, parts, [&](int64_t start, int64_t len) {
      return readMapped(name, dim, start, len);
    });
    checkFinite(name, t);
    return finish(t);
  }
  at::Tensor t = loadPackedSlice(*st_, name, dim, blocks, part, parts, loadTypeFor(name));
  checkFinite(name, t);
  return finish(t);
}

std::pair<std::string, int64_t> WeightSource::storage(const std::string& name) const {
  if (layout_) {
    auto it = layout_->tensors.find(name);
    if (it == layout_->tensors.end())
      throw ModelFileError(layout_->file,
                           "the " + layout_->description + " has no tensor for '" + name + "'");
    const DType t = st_->info(it->second.segments.front().key).dtype;
    return {dtypeName(t), std::max<int64_t>(1, static_cast<int64_t>(dtypeSize(t)))};
  }
  if (inMemory_ && !memory_.count(name)) throw ModelFileError(dir_, "no tensor '" + name + "'");
  if (st_) {
    const DType t = st_->info(name).dtype;
    return {dtypeName(t), std::max<int64_t>(1, static_cast<int64_t>(dtypeSize(t)))};
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
