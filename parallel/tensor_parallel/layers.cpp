// Tensor-parallel linear layers (see layers.h).
#include "parallel/tensor_parallel/layers.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

namespace dit::tensor_parallel {

namespace {

std::string str(long long v) { return std::to_string(v); }

std::string shapeStr(at::IntArrayRef s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + str(s[i]);
  return o + "]";
}

int groupSize(const std::shared_ptr<ProcessGroup>& g) { return g ? g->size() : 1; }
int groupRank(const std::shared_ptr<ProcessGroup>& g) { return g ? g->rank() : 0; }

// The collectives of this file, in one place: each waits on its Work before the result is used
// (on NCCL, wait() orders the caller's stream after the collective; it does not block the host).
void allReduceSum(ProcessGroup& group, at::Tensor& t) { group.allreduce(t, ReduceOp::Sum)->wait(); }
at::Tensor allGatherLastDim(ProcessGroup& group, const at::Tensor& t) {
  return group.allgather(t.contiguous(), t.dim() - 1)->result();
}

// The spec a sharded layer must carry for its group: dim `dim`, part = rank, parts = size.
void checkSpec(const std::string& layer, const ShardSpec& spec, int64_t dim,
               const std::shared_ptr<ProcessGroup>& g) {
  const int size = groupSize(g);
  if (size == 1) {
    if (!spec.replicated())
      throw std::invalid_argument(layer + ": sharded into " + str(spec.parts) +
                                  " parts but the tensor-parallel group has 1 rank");
    return;
  }
  if (spec.dim != dim || spec.parts != size || spec.part != groupRank(g))
    throw std::invalid_argument(
        layer + ": shard spec (dim " + str(spec.dim) + ", part " + str(spec.part) + " of " +
        str(spec.parts) + ") does not match the layer (dim " + str(dim) + ") and its group (rank " +
        str(groupRank(g)) + " of " + str(size) + ")");
}

// One float32 input row on the CPU (a modulation or embedding linear applied to silu(temb) [B = 1,
// C]): a GEMM of one row packs the whole weight before multiplying, while a matrix-vector product
// streams it once (the product is bound by the weight's bytes). No autograd (training keeps
// at::linear).
bool oneRowOnCpu(const at::Tensor& x, const at::Tensor& w) {
  return x.dim() >= 1 && x.numel() == x.size(-1) && x.size(-1) > 0 && x.is_cpu() && w.is_cpu() &&
         x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && w.dim() == 2 &&
         !(at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad()));
}

// x [..., in] holding one row, w [out, in] -> [..., out] = w x (+ bias).
at::Tensor matVec(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  const at::Tensor v = x.reshape({x.size(-1)});
  at::Tensor y = bias.defined() ? at::addmv(bias, w, v) : at::mv(w, v);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.size(0);
  return y.view(shape);
}

}  // namespace

at::Tensor shardTensor(const at::Tensor& full, const ShardSpec& spec) {
  if (spec.replicated()) return full;
  const auto sizes = full.sizes();
  const auto ranges = spec.ranges(std::vector<int64_t>(sizes.begin(), sizes.end()));
  std::vector<at::Tensor> pieces;
  for (const auto& [start, len] : ranges) pieces.push_back(full.narrow(spec.dim, start, len));
  return pieces.size() == 1 ? pieces[0].contiguous() : at::cat(pieces, spec.dim).contiguous();
}

Linear::Linear(std::string name, at::Tensor weight, at::Tensor bias, ShardSpec spec)
    : name_(std::move(name)),
      weight_(std::move(weight)),
      bias_(std::move(bias)),
      spec_(std::move(spec)) {
  if (!weight_.defined() || weight_.dim() != 2)
    throw std::invalid_argument(
        name_ + ": weight must be 2-D [out_features, in_features], got " +
        (weight_.defined() ? shapeStr(weight_.sizes()) : std::string("none")));
  if (bias_.defined() && bias_.dim() != 1)
    throw std::invalid_argument(name_ + ": bias must be 1-D, got " + shapeStr(bias_.sizes()));
  // (Byte weights are 8-bit codes with a WeightStorage: their bias is in the compute dtype.)
  if (bias_.defined() && weight_.scalar_type() != at::kByte &&
      bias_.scalar_type() != weight_.scalar_type())
    throw std::invalid_argument(name_ + ": bias dtype differs from the weight's");
}

void Linear::setWeightStorage(std::shared_ptr<const WeightStorage> storage) {
  if (storage && storage->blockRows()) {
    if (weight_.scalar_type() != at::kByte || storage->inFeatures <= 0)
      throw std::invalid_argument(name_ + ": weight storage " + storage->format +
                                  " needs kByte block rows and a positive input width");
    storage_ = std::move(storage);
    return;
  }
  if (storage && (weight_.scalar_type() != at::kByte || !storage->rowScale.defined() ||
                  storage->rowScale.numel() != weight_.size(0)))
    throw std::invalid_argument(name_ + ": weight storage " + storage->format +
                                " needs kByte codes and one scale per weight row");
  storage_ = std::move(storage);
}

at::Tensor Linear::computeWeight(at::ScalarType dtype) const {
  return storage_ ? storage_->dequantize(weight_, dtype) : weight_;
}

void Linear::checkInput(const at::Tensor& x, int64_t expectedIn) const {
  if (!x.defined() || x.dim() < 1 || x.size(-1) != expectedIn)
    throw std::invalid_argument(name_ + ": input " +
                                (x.defined() ? shapeStr(x.sizes()) : std::string("undefined")) +
                                " does not end in " + str(expectedIn) + " features");
}

at::Tensor Linear::matmul(const at::Tensor& x, const at::Tensor& bias) const {
  if (!storage_ || !storage_->blockRows()) {
    const at::Tensor w = computeWeight(x.scalar_type());
    if (oneRowOnCpu(x, w)) return matVec(x, w, bias);
    return at::linear(x, w, bias);
  }
  // Block rows: dequantize a tile of output rows and multiply, tile after tile (the weight stays
  // quantized; at most kDequantTileBytes of it is float32 at once).
  const int64_t out = weight_.size(0), in = storage_->inFeatures;
  const int64_t tile = std::max<int64_t>(1, kDequantTileBytes / (4 * std::max<int64_t>(1, in)));
  if (tile >= out) return at::linear(x, storage_->dequantize(weight_, x.scalar_type()), bias);
  std::vector<at::Tensor> pieces;
  for (int64_t r0 = 0; r0 < out; r0 += tile) {
    const int64_t n = std::min(tile, out - r0);
    pieces.push_back(at::linear(x, storage_->dequantizeRows(weight_, r0, n, x.scalar_type()),
                                bias.defined() ? bias.narrow(0, r0, n) : at::Tensor()));
  }
  return at::cat(pieces, -1);
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  checkInput(x, inFeaturesLocal());
  return product(x, bias_);
}

at::Tensor Linear::product(const at::Tensor& x, const at::Tensor& bias) const {
  at::Tensor y = matmul(x, bias);
  if (lora_.empty() || loraFused()) return y;
  // x A^T once per distinct A (the parts of a fused layer may share one lora_down).
  std::vector<std::pair<const void*, at::Tensor>> xa;
  for (const auto& d : lora_) {
    at::Tensor h;
    for (const auto& [key, t] : xa)
      if (key == d.A.data_ptr()) h = t;
    if (!h.defined()) {
      h = at::linear(x, d.A);
      xa.emplace_back(d.A.data_ptr(), h);
    }
    // scaling * (x A^T) B^T on this delta's output columns (PEFT Linear.forward, unmerged).
    at::Tensor dy = at::linear(h, d.B) * d.scaling;
    if (d.rowOffset == 0 && d.B.size(0) == y.size(-1))
      y = y + dy;
    else
      y.narrow(-1, d.rowOffset, d.B.size(0)).add_(dy);
  }
  return y;
}

void Linear::setLoraDeltas(std::vector<LoraDelta> deltas) {
  unfuseLora();
  for (const auto& d : deltas) {
    if (!d.A.defined() || !d.B.defined() || d.A.dim() != 2 || d.B.dim() != 2 ||
        d.A.size(1) != inFeaturesLocal() || d.B.size(1) != d.A.size(0) || d.rowOffset < 0 ||
        d.rowOffset + d.B.size(0) > outFeaturesLocal())
      throw std::invalid_argument(
          name_ + ": LoRA factors A " +
          (d.A.defined() ? shapeStr(d.A.sizes()) : std::string("none")) + ", B " +
          (d.B.defined() ? shapeStr(d.B.sizes()) : std::string("none")) + " at row " +
          str(d.rowOffset) + " do not fit the local weight " + shapeStr(weight_.sizes()));
    if (d.A.scalar_type() != computeDtype() || d.B.scalar_type() != computeDtype() ||
        d.A.device() != weight_.device() || d.B.device() != weight_.device())
      throw std::invalid_argument(name_ +
                                  ": LoRA factors differ from the weight in dtype or device");
  }
  lora_ = std::move(deltas);
}

void Linear::fuseLora() {
  if (lora_.empty() || loraFused()) return;
  if (storage_)
    throw std::invalid_argument(name_ + ": cannot fuse LoRA into quantized (" + storage_->format +
                                ") weights; keep it unfused (applied at run time)");
  at::Tensor w = weight_.clone();
  for (const auto& d : lora_)
    w.narrow(0, d.rowOffset, d.B.size(0)).add_(at::mm(d.B, d.A) * d.scaling);
  unfusedWeight_ = weight_;
  weight_ = w;
}

void Linear::unfuseLora() {
  if (!loraFused()) return;
  weight_ = unfusedWeight_;
  unfusedWeight_ = at::Tensor();
}

ReplicatedLinear::ReplicatedLinear(std::string name, at::Tensor weight, at::Tensor bias)
    : Linear(std::move(name), std::move(weight), std::move(bias), ShardSpec{}) {
  if (bias_.defined() && bias_.size(0) != weight_.size(0))
    throw std::invalid_argument(name_ + ": bias " + shapeStr(bias_.sizes()) +
                                " does not match weight " + shapeStr(weight_.sizes()));
}

ColumnParallelLinear::ColumnParallelLinear(std::string name, at::Tensor weightShard,
                                           at::Tensor biasShard, ShardSpec spec,
                                           std::shared_ptr<ProcessGroup> group, bool gatherOutput)
    : Linear(std::move(name), std::move(weightShard), std::move(biasShard), std::move(spec)),
      group_(std::move(group)),
      gatherOutput_(gatherOutput) {
  checkSpec(name_, spec_, 0, group_);
  if (bias_.defined() && bias_.size(0) != weight_.size(0))
    throw std::invalid_argument(name_ + ": bias shard " + shapeStr(bias_.sizes()) +
                                " does not match weight shard " + shapeStr(weight_.sizes()));
}

bool ColumnParallelLinear::gathers() const { return gatherOutput_ && groupSize(group_) > 1; }

at::Tensor ColumnParallelLinear::forward(const at::Tensor& x) const {
  at::Tensor y = Linear::forward(x);  // [..., out_local]
  if (!gathers()) return y;
  const int64_t local = y.size(-1);
  return fromGathered(allGatherLastDim(*group_, y), 0, local);
}

at::Tensor ColumnParallelLinear::fromGathered(const at::Tensor& g, int64_t offset,
                                              int64_t width) const {
  const int64_t parts = spec_.parts, local = outFeaturesLocal();
  if (spec_.blocks.size() <= 1 && offset == 0 && width == local) return g;
  // Every rank's chunk holds this layer's [block0 slice, block1 slice, ...] (one block when not
  // packed) at `offset`; the whole output is each block's slices in rank order, block by block.
  const std::vector<int64_t> blocks =
      spec_.blocks.size() <= 1 ? std::vector<int64_t>{local * parts} : spec_.blocks;
  std::vector<at::Tensor> pieces;
  int64_t o = 0;
  for (int64_t block : blocks) {
    const int64_t len = block / parts;
    for (int64_t r = 0; r < parts; ++r) pieces.push_back(g.narrow(-1, r * width + offset + o, len));
    o += len;
  }
  return at::cat(pieces, -1);
}

std::vector<at::Tensor> ColumnParallelLinear::forwardCoalesced(
    const std::vector<const Linear*>& layers, const at::Tensor& x) {
  std::vector<at::Tensor> out(layers.size());
  std::vector<size_t> gathered;  // indexes of the layers that gather
  std::vector<at::Tensor> locals;
  ProcessGroup* group = nullptr;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!layers[i]) throw std::invalid_argument("forwardCoalesced: layer " + str(i) + " is null");
    const auto* c = dynamic_cast<const ColumnParallelLinear*>(layers[i]);
    if (!c || !c->gathers()) {
      out[i] = layers[i]->forward(x);
      continue;
    }
    if (group && group != c->group_.get())
      throw std::invalid_argument("forwardCoalesced: " + c->name() +
                                  " gathers over another process group than " +
                                  layers[gathered.front()]->name());
    group = c->group_.get();
    gathered.push_back(i);
    locals.push_back(c->Linear::forward(x));  // [..., out_local] (LoRA deltas included)
  }
  if (gathered.empty()) return out;
  at::Tensor g = allGatherLastDim(*group, at::cat(locals, -1));  // [..., parts * width]
  int64_t width = 0;
  for (const auto& l : locals) width += l.size(-1);
  int64_t offset = 0;
  for (size_t k = 0; k < gathered.size(); ++k) {
    const auto* c = static_cast<const ColumnParallelLinear*>(layers[gathered[k]]);
    out[gathered[k]] = c->fromGathered(g, offset, width);
    offset += locals[k].size(-1);
  }
  return out;
}

RowParallelLinear::RowParallelLinear(std::string name, at::Tensor weightShard, at::Tensor bias,
                                     ShardSpec spec, std::shared_ptr<ProcessGroup> group,
                                     bool inputIsParallel)
    : Linear(std::move(name), std::move(weightShard), std::move(bias), std::move(spec)),
      group_(std::move(group)),
      inputIsParallel_(inputIsParallel) {
  checkSpec(name_, spec_, 1, group_);
  if (bias_.defined() && bias_.size(0) != weight_.size(0))
    throw std::invalid_argument(name_ + ": bias " + shapeStr(bias_.sizes()) +
                                " does not match weight shard " + shapeStr(weight_.sizes()) +
                                " (a rowwise layer keeps the whole bias)");
}

at::Tensor RowParallelLinear::forward(const at::Tensor& x) const {
  at::Tensor xl = x;
  if (!inputIsParallel_ && !spec_.replicated()) {
    if (!x.defined() || x.dim() < 1)
      throw std::invalid_argument(name_ + ": input must have at least one dimension");
    // Take this rank's slice(s) of the replicated input, as the weight was cut.
    ShardSpec s = spec_;
    s.dim = x.dim() - 1;
    xl = shardTensor(x, s);
  }
  checkInput(xl, inFeaturesLocal());
  if (groupSize(group_) == 1) return product(xl, bias_);
  // Partial sums (LoRA's partial product included): no bias yet.
  at::Tensor y = product(xl, at::Tensor()).contiguous();
  allReduceSum(*group_, y);
  return bias_.defined() ? y + bias_ : y;  // once, after the reduce
}

namespace {

using Part = FusedColumnParallelLinear::Part;

const std::vector<Part>& checkedParts(const std::string& name, const std::vector<Part>& parts) {
  if (parts.empty()) throw std::invalid_argument(name + ": a fused layer needs at least one part");
  for (const auto& p : parts) {
    if (!p.weight.defined() || p.weight.dim() != 2)
      throw std::invalid_argument(name + ": part " + p.name + " needs a 2-D weight");
    if (p.weight.size(1) != parts[0].weight.size(1))
      throw std::invalid_argument(name + ": part " + p.name + " has " + str(p.weight.size(1)) +
                                  " input features, part " + parts[0].name + " " +
                                  str(parts[0].weight.size(1)));
    if (p.weight.scalar_type() != parts[0].weight.scalar_type())
      throw std::invalid_argument(name + ": parts " + parts[0].name + " and " + p.name +
                                  " differ in dtype");
    if (p.bias.defined() != parts[0].bias.defined())
      throw std::invalid_argument(name + ": parts " + parts[0].name + " and " + p.name +
                                  " must all have a bias or none");
    if (p.bias.defined() && (p.bias.dim() != 1 || p.bias.size(0) != p.weight.size(0)))
      throw std::invalid_argument(name + ": part " + p.name + " has bias " +
                                  shapeStr(p.bias.sizes()) + " for weight " +
                                  shapeStr(p.weight.sizes()));
  }
  return parts;
}

at::Tensor catField(const std::vector<Part>& parts, bool bias) {
  std::vector<at::Tensor> t;
  for (const auto& p : parts) {
    const at::Tensor& v = bias ? p.bias : p.weight;
    if (!v.defined()) return {};
    t.push_back(v);
  }
  return t.size() == 1 ? t[0] : at::cat(t, 0);
}

// The fused local weight is cat(part shards): as a whole it is a PackedColwise shard whose
// blocks are the parts' global output sizes.
ShardSpec fusedSpec(const std::vector<Part>& parts, const std::shared_ptr<ProcessGroup>& g) {
  ShardSpec s;
  const int size = groupSize(g);
  if (size == 1) return s;
  s.dim = 0;
  s.part = groupRank(g);
  s.parts = size;
  for (const auto& p : parts) s.blocks.push_back(p.weight.size(0) * size);
  return s;
}

}  // namespace

FusedColumnParallelLinear::FusedColumnParallelLinear(std::string name, std::vector<Part> parts,
                                                     std::shared_ptr<ProcessGroup> group)
    : Linear(name, catField(checkedParts(name, parts), false), catField(parts, true),
             fusedSpec(parts, group)),
      group_(std::move(group)) {
  int64_t offset = 0;
  for (const auto& p : parts) {
    checkSpec(name_ + " part " + p.name, p.spec, 0, group_);
    parts_.push_back({p.name, p.spec, offset, p.weight.size(0)});
    offset += p.weight.size(0);
  }
}

std::vector<at::Tensor> FusedColumnParallelLinear::forwardParts(const at::Tensor& x) const {
  at::Tensor y = Linear::forward(x);  // one GEMM [..., sum(out_local)]
  std::vector<at::Tensor> out;
  for (const auto& p : parts_) out.push_back(y.narrow(-1, p.offset, p.outLocal));
  return out;
}

int FusedColumnParallelLinear::partIndex(const std::string& name) const {
  for (size_t i = 0; i < parts_.size(); ++i)
    if (parts_[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace dit::tensor_parallel
