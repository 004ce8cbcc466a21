// LoRA placement on tensor-parallel linear layers (see lora.h).
#include "parallel/tensor_parallel/lora.h"

#include <ATen/ATen.h>

#include <set>
#include <stdexcept>

namespace dit::tensor_parallel {

namespace {

std::string shapeStr(at::IntArrayRef s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

// The global size of a dimension held locally as `local` under `spec` (sharded on `dim`).
int64_t globalSize(int64_t local, const ShardSpec& spec, int64_t dim) {
  if (spec.replicated() || spec.dim != dim) return local;
  if (spec.blocks.empty()) return local * spec.parts;
  int64_t s = 0;
  for (int64_t b : spec.blocks) s += b;
  return s;
}

}  // namespace

uint64_t LoraAdapter::bytes() const {
  uint64_t b = 0;
  for (const auto& m : modules)
    b += static_cast<uint64_t>(m.A.numel() * m.A.element_size() + m.B.numel() * m.B.element_size());
  return b;
}

LoraTargets::LoraTargets(std::vector<std::shared_ptr<Linear>> layers) : layers_(std::move(layers)) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    const auto* fused = dynamic_cast<const FusedColumnParallelLinear*>(layers_[i].get());
    std::vector<std::pair<std::string, int>> names;
    if (fused) {
      for (size_t p = 0; p < fused->parts().size(); ++p)
        names.emplace_back(fused->parts()[p].name, static_cast<int>(p));
    } else {
      names.emplace_back(layers_[i]->name(), -1);
    }
    for (const auto& [n, part] : names)
      if (!index_.emplace(n, Where{i, part}).second)
        throw std::invalid_argument("LoRA targets: two layers are named " + n);
  }
}

std::shared_ptr<const PreparedLora> LoraTargets::prepare(const LoraAdapter& adapter) const {
  auto out = std::make_shared<PreparedLora>();
  out->file = adapter.file;
  std::set<std::string> seen;
  std::map<std::pair<void*, size_t>, at::Tensor> sharedA;  // (source A, layer) -> prepared A
  for (const auto& m : adapter.modules) {
    auto it = index_.find(m.name);
    if (it == index_.end())
      throw std::invalid_argument(adapter.file + ": module '" + m.name +
                                  "' does not exist in this model (a LoRA for another model?)");
    if (!seen.insert(m.name).second)
      throw std::invalid_argument(adapter.file + ": module '" + m.name + "' appears twice");
    const Linear& layer = *layers_[it->second.layer];
    // The target's spec, local rows and offset in the layer's local output.
    ShardSpec spec = layer.spec();
    int64_t outLocal = layer.outFeaturesLocal(), offset = 0;
    if (it->second.part >= 0) {
      const auto& part =
          static_cast<const FusedColumnParallelLinear&>(layer).parts()[it->second.part];
      spec = part.spec;
      outLocal = part.outLocal;
      offset = part.offset;
    }
    const int64_t inLocal = layer.inFeaturesLocal();
    const int64_t outGlobal = globalSize(outLocal, spec, 0);
    const int64_t inGlobal = globalSize(inLocal, spec, 1);
    if (!m.A.defined() || !m.B.defined() || m.A.dim() != 2 || m.B.dim() != 2 ||
        m.A.size(1) != inGlobal || m.B.size(0) != outGlobal || m.A.size(0) != m.B.size(1))
      throw std::invalid_argument(
          adapter.file + ": module '" + m.name + "': LoRA A " +
          (m.A.defined() ? shapeStr(m.A.sizes()) : std::string("none")) + " and B " +
          (m.B.defined() ? shapeStr(m.B.sizes()) : std::string("none")) +
          " do not fit the layer's weight [" + std::to_string(outGlobal) + ", " +
          std::to_string(inGlobal) + "] (expected A [r, " + std::to_string(inGlobal) + "], B [" +
          std::to_string(outGlobal) + ", r]; a LoRA for another model?)");
    const auto opts =
        at::TensorOptions().dtype(layer.computeDtype()).device(layer.weight().device());
    // Colwise: B cut by output rows like the weight; rowwise: A cut by input columns.
    at::Tensor A = m.A, B = m.B;
    if (!spec.replicated()) {
      if (spec.dim == 0)
        B = shardTensor(B, spec);
      else
        A = shardTensor(A, spec);
    }
    PreparedLora::Entry e;
    e.layer = it->second.layer;
    e.module = m.name;
    e.delta.rowOffset = offset;
    // One A shared by several parts of a fused layer (a kohya qkv / linear1 lora_down copied to
    // each part) is kept once: the same tensor, its bytes counted once, x A^T computed once.
    const auto shared = std::make_pair(m.A.data_ptr(), it->second.layer);
    if (auto s = sharedA.find(shared); s != sharedA.end() && s->second.sizes() == A.sizes()) {
      e.delta.A = s->second;
    } else {
      e.delta.A = A.to(opts).contiguous();
      if (e.delta.A.data_ptr() == m.A.data_ptr()) e.delta.A = e.delta.A.clone();
      sharedA[shared] = e.delta.A;
      out->bytes += static_cast<uint64_t>(e.delta.A.numel() * e.delta.A.element_size());
    }
    e.delta.B = B.to(opts).contiguous();
    if (e.delta.B.data_ptr() == m.B.data_ptr()) e.delta.B = e.delta.B.clone();
    e.delta.scaling = m.scale;
    out->bytes += static_cast<uint64_t>(e.delta.B.numel() * e.delta.B.element_size());
    out->entries.push_back(std::move(e));
  }
  return out;
}

void LoraTargets::apply(
    const std::vector<std::pair<std::shared_ptr<const PreparedLora>, double>>& loras) {
  std::vector<std::vector<LoraDelta>> perLayer(layers_.size());
  uint64_t bytes = 0;
  std::set<const PreparedLora*> counted;
  for (const auto& [lora, strength] : loras) {
    if (!lora) throw std::invalid_argument("LoRA targets: null adapter");
    for (const auto& e : lora->entries) {
      if (e.layer >= layers_.size())
        throw std::invalid_argument(lora->file + ": prepared for another model");
      LoraDelta d = e.delta;
      d.scaling = e.delta.scaling * strength;
      perLayer[e.layer].push_back(std::move(d));
    }
    if (counted.insert(lora.get()).second) bytes += lora->bytes;
  }
  for (size_t i = 0; i < layers_.size(); ++i)
    if (!perLayer[i].empty() || !layers_[i]->loraDeltas().empty())
      layers_[i]->setLoraDeltas(std::move(perLayer[i]));
  fused_ = false;
  appliedBytes_ = bytes;
}

void LoraTargets::fuse() {
  for (auto& l : layers_) l->fuseLora();
  fused_ = true;
}

void LoraTargets::unfuse() {
  for (auto& l : layers_) l->unfuseLora();
  fused_ = false;
}

}  // namespace dit::tensor_parallel
