// Text-encoder placement, conditioning broadcast and the prompt-embedding cache: see
// prompt_encoding.h.
#include "backend/pipelines/prompt_encoding.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

#include "backend/io/sha256.h"
#include "parallel/context_parallel.h"
#include "parallel/process_group.h"

namespace dit {

namespace {

ProcessGroup* cpGroup(const PipelineOptions& o) {
  return o.parallel.cp && o.parallel.cp->group() && o.parallel.cp->group()->size() > 1
             ? o.parallel.cp->group().get()
             : nullptr;
}
ProcessGroup* tpGroup(const PipelineOptions& o) {
  return o.parallel.tp && o.parallel.tp->size() > 1 ? o.parallel.tp.get() : nullptr;
}

// Scalar types a conditioning tensor may have, by a stable code (the header travels as int64).
constexpr at::ScalarType kTypes[] = {at::kFloat, at::kBFloat16, at::kHalf,
                                     at::kLong,  at::kInt,      at::kDouble};

int64_t typeCode(at::ScalarType t) {
  for (size_t i = 0; i < sizeof kTypes / sizeof kTypes[0]; ++i)
    if (kTypes[i] == t) return static_cast<int64_t>(i);
  throw std::invalid_argument(std::string("broadcastConditioning: unsupported dtype ") +
                              c10::toString(t));
}

// One broadcast step over `g` from its rank 0: header (its length first), then every tensor.
void broadcastOver(ProcessGroup& g, const c10::Device& device, TransformerInputs& inputs,
                   double& tokenizeMs, double& encodeMs) {
  const bool root = g.rank() == 0;
  const auto longOpt = at::TensorOptions().dtype(at::kLong).device(device);
  // Header: n, tokenize_us, encode_us, then per tensor: name length, name bytes, dtype code,
  // ndim, dims.
  std::vector<int64_t> header;
  if (root) {
    if (inputs.empty())
      throw std::invalid_argument(
          "broadcastConditioning: the encoding rank has no conditioning to send");
    header.push_back(static_cast<int64_t>(inputs.size()));
    header.push_back(static_cast<int64_t>(std::llround(tokenizeMs * 1000)));
    header.push_back(static_cast<int64_t>(std::llround(encodeMs * 1000)));
    for (const auto& [name, t] : inputs) {
      header.push_back(static_cast<int64_t>(name.size()));
      for (unsigned char ch : name) header.push_back(ch);
      header.push_back(typeCode(t.scalar_type()));
      header.push_back(t.dim());
      for (int64_t s : t.sizes()) header.push_back(s);
    }
  }
  at::Tensor len = at::full({1}, static_cast<int64_t>(header.size()), longOpt);
  g.broadcast(len, 0)->wait();
  const int64_t n = len.to(at::kCPU).item<int64_t>();
  at::Tensor h = root ? at::tensor(header, at::TensorOptions().dtype(at::kLong)).to(device)
                      : at::zeros({n}, longOpt);
  g.broadcast(h, 0)->wait();
  if (!root) {
    const at::Tensor hc = h.to(at::kCPU).contiguous();
    const int64_t* p = hc.data_ptr<int64_t>();
    const int64_t* end = p + n;
    auto next = [&]() {
      if (p >= end) throw std::runtime_error("broadcastConditioning: truncated header");
      return *p++;
    };
    const int64_t count = next();
    tokenizeMs = static_cast<double>(next()) / 1000.0;
    encodeMs = static_cast<double>(next()) / 1000.0;
    inputs.clear();
    for (int64_t i = 0; i < count; ++i) {
      const int64_t nameLen = next();
      std::string name;
      for (int64_t k = 0; k < nameLen; ++k) name.push_back(static_cast<char>(next()));
      const int64_t code = next();
      if (code < 0 || code >= static_cast<int64_t>(sizeof kTypes / sizeof kTypes[0]))
        throw std::runtime_error("broadcastConditioning: bad dtype code in the header");
      const int64_t ndim = next();
      std::vector<int64_t> shape;
      for (int64_t k = 0; k < ndim; ++k) shape.push_back(next());
      inputs[name] = at::empty(shape, at::TensorOptions().dtype(kTypes[code]).device(device));
    }
  }
  for (auto& [name, t] : inputs) {
    if (root) t = t.contiguous();
    g.broadcast(t, 0)->wait();
  }
}

}  // namespace

std::shared_ptr<ProcessGroup> textEncoderTpGroup(const PipelineOptions& o) {
  return o.text_encoder == TextEncoderPlacement::OwnRank ? nullptr : o.parallel.tp;
}

bool encodesPrompts(const PipelineOptions& o) {
  if (o.text_encoder != TextEncoderPlacement::OwnRank) return true;
  const bool tp0 = !o.parallel.tp || o.parallel.tp->rank() == 0;
  const bool cp0 = !o.parallel.cp || o.parallel.cp->cpRank() == 0;
  return tp0 && cp0;
}

bool loadsTextEncodersAtStart(const PipelineOptions& o) {
  return encodesPrompts(o) && o.text_encoder != TextEncoderPlacement::Once;
}

void broadcastConditioning(const PipelineOptions& o, const c10::Device& device,
                           TransformerInputs& inputs, double& tokenizeMs, double& encodeMs) {
  // First among the tp-rank-0 ranks over the cp group, then inside every tp group.
  ProcessGroup* cp = cpGroup(o);
  ProcessGroup* tp = tpGroup(o);
  if (cp && (!o.parallel.tp || o.parallel.tp->rank() == 0))
    broadcastOver(*cp, device, inputs, tokenizeMs, encodeMs);
  if (tp) broadcastOver(*tp, device, inputs, tokenizeMs, encodeMs);
}

PromptEmbeddingCache::PromptEmbeddingCache(size_t capacity, std::string identity)
    : capacity_(capacity < 1 ? 1 : capacity), identity_(std::move(identity)) {}

std::string PromptEmbeddingCache::key(const std::string& prompt, int maxSequenceLength) const {
  // Lengths first, so no two different (identity, prompt) pairs share a byte string.
  std::string bytes = std::to_string(identity_.size()) + ":" + identity_ + "|" +
                      std::to_string(maxSequenceLength) + "|" + std::to_string(prompt.size()) +
                      ":" + prompt;
  return sha256Hex(bytes);
}

bool PromptEmbeddingCache::find(const std::string& key, const c10::Device& device,
                                TransformerInputs& out) {
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++misses_;
    return false;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);  // most recently used first
  out.clear();
  for (const auto& [name, t] : it->second->second)
    out[name] = t.to(device, t.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  return true;
}

void PromptEmbeddingCache::put(const std::string& key, const TransformerInputs& inputs) {
  TransformerInputs host;
  for (const auto& [name, t] : inputs)
    host[name] = t.to(at::kCPU, t.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  if (auto it = index_.find(key); it != index_.end()) {
    it->second->second = std::move(host);
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.emplace_front(key, std::move(host));
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

}  // namespace dit
