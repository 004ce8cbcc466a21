// Qwen3Model / qwen3PromptEmbeds: see modeling_qwen3.h.
#include "backend/models/text_encoders/modeling_qwen3.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>

#include "backend/io/weight_loader.h"
#include "backend/io/weight_source.h"
#include "backend/models/text_encoders/qwen3_plan.h"
#include "backend/tokenizers/mistral_tokenizer.h"
#include "backend/tokenizers/qwen2_tokenizer.h"
#include "parallel/process_group.h"
#include "parallel/strategy.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/weight_storage.h"

namespace dit {
namespace {

using LinearPtr = std::shared_ptr<tensor_parallel::Linear>;

// transformers Qwen3RMSNorm: variance in float32, then weight * x.to(input dtype).
at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  const auto xf = x.to(at::kFloat);
  const auto var = xf.pow(2).mean({-1}, true);
  return w * (xf * at::rsqrt(var + eps)).to(x.scalar_type());
}

at::Tensor rotateHalf(const at::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

struct Layer {
  at::Tensor input_layernorm, post_attention_layernorm, q_norm, k_norm;
  LinearPtr q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  at::Tensor kvIndex;  // int64 [local query heads]: local KV head used by each local query head
};

using TensorMap = std::function<at::Tensor(const at::Tensor&)>;

// `l` rebuilt with every tensor passed through `f` (same class, name, shard spec and group).
LinearPtr mapLinear(const LinearPtr& l, const TensorMap& f,
                    const std::shared_ptr<ProcessGroup>& tp) {
  using namespace tensor_parallel;
  const at::Tensor w = f(l->weight());
  const at::Tensor b = l->bias().defined() ? f(l->bias()) : at::Tensor();
  LinearPtr n;
  if (const auto* c = dynamic_cast<const ColumnParallelLinear*>(l.get()))
    n = std::make_shared<ColumnParallelLinear>(l->name(), w, b, l->spec(), tp, c->gatherOutput());
  else if (const auto* r = dynamic_cast<const RowParallelLinear*>(l.get()))
    n = std::make_shared<RowParallelLinear>(l->name(), w, b, l->spec(), tp, r->inputIsParallel());
  else
    n = std::make_shared<ReplicatedLinear>(l->name(), w, b);
  if (const WeightStorage* st = l->weightStorage()) {
    auto copy = std::make_shared<WeightStorage>(*st);
    if (copy->table.defined()) copy->table = f(copy->table);
    if (copy->rowScale.defined()) copy->rowScale = f(copy->rowScale);
    n->setWeightStorage(std::move(copy));
  }
  return n;
}

// The layer with every tensor passed through `f`.
Layer mapLayer(const Layer& L, const TensorMap& f, const std::shared_ptr<ProcessGroup>& tp) {
  auto opt = [&](const at::Tensor& t) { return t.defined() ? f(t) : t; };
  Layer n;
  n.input_layernorm = opt(L.input_layernorm);
  n.post_attention_layernorm = opt(L.post_attention_layernorm);
  n.q_norm = opt(L.q_norm);
  n.k_norm = opt(L.k_norm);
  n.q_proj = mapLinear(L.q_proj, f, tp);
  n.k_proj = mapLinear(L.k_proj, f, tp);
  n.v_proj = mapLinear(L.v_proj, f, tp);
  n.o_proj = mapLinear(L.o_proj, f, tp);
  n.gate_proj = mapLinear(L.gate_proj, f, tp);
  n.up_proj = mapLinear(L.up_proj, f, tp);
  n.down_proj = mapLinear(L.down_proj, f, tp);
  n.kvIndex = opt(L.kvIndex);
  return n;
}

// Bytes of a layer's tensors (weights, norms; the kvIndex too, it travels with the layer).
uint64_t layerBytes(const Layer& L) {
  uint64_t b = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined()) b += static_cast<uint64_t>(t.nbytes());
  };
  for (const at::Tensor* t :
       {&L.input_layernorm, &L.post_attention_layernorm, &L.q_norm, &L.k_norm, &L.kvIndex})
    add(*t);
  for (const LinearPtr* l :
       {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj}) {
    add((*l)->weight());
    add((*l)->bias());
    if (const auto* st = (*l)->weightStorage()) {
      add(st->table);
      add(st->rowScale);
    }
  }
  return b;
}

}  // namespace

struct Qwen3Model::Impl {
  Qwen3Config cfg;
  std::string prefix;
  int maxLayer = 0;
  at::Tensor embed_tokens, norm;
  std::vector<Layer> layers;
  std::vector<LoadedParameter> parameters;
  std::string replicatedReason;
  at::ScalarType dtype = at::kFloat;
  uint64_t bytes = 0;
  std::shared_ptr<ProcessGroup> tp;
  std::optional<c10::Device> streamTo;  ///< host streaming: the device the layers visit
  uint64_t largestLayer = 0;
};

Qwen3Model::Qwen3Model(const Qwen3Config& cfg, WeightSource& source,
                       std::shared_ptr<ProcessGroup> tp, int maxLayer,
                       std::optional<c10::Device> streamTo)
    : d_(std::make_unique<Impl>()) {
  auto& D = *d_;
  D.cfg = cfg;
  D.tp = tp;
  D.streamTo = streamTo;
  if (streamTo && !source.device().is_cpu())
    throw std::invalid_argument(
        "Qwen3Model: host streaming needs its weights read into host memory (a CPU "
        "WeightSource), not " +
        source.device().str());
  D.maxLayer = maxLayer < 0 ? cfg.num_hidden_layers : maxLayer;
  if (D.maxLayer > cfg.num_hidden_layers)
    throw std::invalid_argument("Qwen3Model: maxLayer " + std::to_string(maxLayer) +
                                " outside [0, num_hidden_layers " +
                                std::to_string(cfg.num_hidden_layers) + "]");
  // Qwen3ForCausalLM "model.*", Qwen3Model unprefixed; Qwen2_5_VLForConditionalGeneration and
  // Mistral3ForConditionalGeneration "model.language_model.*" (transformers >= 4.52), earlier
  // saves "model.*" (Qwen2.5-VL) or "language_model.model.*" (Mistral3).
  D.prefix = source.contains("model.language_model.embed_tokens.weight")   ? "model.language_model."
             : source.contains("language_model.model.embed_tokens.weight") ? "language_model.model."
             : source.contains("model.embed_tokens.weight")                ? "model."
                                                                           : "";
  D.dtype = source.dtype();
  const int tpSize = tp ? tp->size() : 1;
  const int tpRank = tp ? tp->rank() : 0;
  const bool withNorm = D.maxLayer == cfg.num_hidden_layers;
  const ParameterTable declared =
      qwen3ParameterTable(cfg, D.maxLayer, withNorm, "F32", 4, D.prefix);
  const ShardingPlan full = qwen3ShardingPlan(cfg, D.prefix);
  auto plan =
      std::make_shared<const ShardingPlan>(full.resolve(declared, tpSize, &D.replicatedReason));
  if (!D.replicatedReason.empty())
    spdlog::warn("Qwen3 text encoder at tp_degree {}: {}", tpSize, D.replicatedReason);
  if (D.maxLayer > 0)  // rules match no parameter when no layer is loaded
    if (auto issues = plan->validate(declared, tpSize); !issues.empty())
      throw std::invalid_argument("Qwen3Model: " + joinIssues(issues));

  WeightLoader w(source, plan, tp);
  const int64_t H = cfg.hidden_size, Dh = cfg.head_dim, M = cfg.intermediate_size;
  const int64_t nq = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  D.embed_tokens = w.param(D.prefix + "embed_tokens.weight", {cfg.vocab_size, H});
  for (int i = 0; i < D.maxLayer; ++i) {
    const std::string l = D.prefix + "layers." + std::to_string(i) + ".";
    Layer L;
    L.input_layernorm = w.param(l + "input_layernorm.weight", {H});
    L.q_proj = w.linear(l + "self_attn.q_proj", H, nq * Dh, cfg.hasQkvBias());
    L.k_proj = w.linear(l + "self_attn.k_proj", H, nkv * Dh, cfg.hasQkvBias());
    L.v_proj = w.linear(l + "self_attn.v_proj", H, nkv * Dh, cfg.hasQkvBias());
    L.o_proj = w.linear(l + "self_attn.o_proj", nq * Dh, H, cfg.attention_bias);
    if (cfg.qk_norm) {
      L.q_norm = w.param(l + "self_attn.q_norm.weight", {Dh});
      L.k_norm = w.param(l + "self_attn.k_norm.weight", {Dh});
    }
    L.post_attention_layernorm = w.param(l + "post_attention_layernorm.weight", {H});
    L.gate_proj = w.linear(l + "mlp.gate_proj", H, M, false);
    L.up_proj = w.linear(l + "mlp.up_proj", H, M, false);
    L.down_proj = w.linear(l + "mlp.down_proj", M, H, false);
    // GQA: global query head g uses KV head g / (nq / nkv). Map this rank's query heads to the
    // KV heads it holds (all of them when k/v are replicated, its slice when sharded).
    const int64_t qLocal = L.q_proj->outFeaturesLocal() / Dh;
    const int64_t kvLocal = L.k_proj->outFeaturesLocal() / Dh;
    const int64_t qOffset = L.q_proj->spec().replicated() ? 0 : int64_t{tpRank} * qLocal;
    const int64_t kvOffset = L.k_proj->spec().replicated() ? 0 : int64_t{tpRank} * kvLocal;
    std::vector<int64_t> idx(static_cast<size_t>(qLocal));
    for (int64_t h = 0; h < qLocal; ++h) {
      idx[static_cast<size_t>(h)] = (qOffset + h) / (nq / nkv) - kvOffset;
      if (idx[static_cast<size_t>(h)] < 0 || idx[static_cast<size_t>(h)] >= kvLocal)
        throw std::logic_error("Qwen3Model: query head " + std::to_string(qOffset + h) +
                               " has no local KV head on tensor-parallel rank " +
                               std::to_string(tpRank));
    }
    L.kvIndex = at::tensor(idx, at::TensorOptions().dtype(at::kLong)).to(D.embed_tokens.device());
    D.layers.push_back(std::move(L));
  }
  if (withNorm) D.norm = w.param(D.prefix + "norm.weight", {H});
  D.parameters = w.parameters();
  // Page-locked host copies when the layers stream to a GPU (asynchronous DMA copies).
  if (streamTo && streamTo->is_cuda()) {
    const TensorMap pin = [](const at::Tensor& t) { return t.is_pinned() ? t : t.pin_memory(); };
    D.embed_tokens = pin(D.embed_tokens);
    if (D.norm.defined()) D.norm = pin(D.norm);
    for (Layer& L : D.layers) L = mapLayer(L, pin, tp);
  }
  for (const Layer& L : D.layers) D.largestLayer = std::max(D.largestLayer, layerBytes(L));
  const int64_t eb = static_cast<int64_t>(c10::elementSize(D.dtype));
  for (const auto& p : D.parameters) {
    int64_t n = 1;
    for (auto s : p.spec.localShape(p.info.shape)) n *= s;
    D.bytes += static_cast<uint64_t>(n * eb);
  }
}

Qwen3Model::~Qwen3Model() = default;
uint64_t Qwen3Model::weightBytes() const { return d_->bytes; }
bool Qwen3Model::streamed() const { return d_->streamTo.has_value(); }
c10::Device Qwen3Model::computeDevice() const {
  return d_->streamTo ? *d_->streamTo : d_->embed_tokens.device();
}
uint64_t Qwen3Model::largestLayerBytes() const { return d_->largestLayer; }
int Qwen3Model::layersLoaded() const { return d_->maxLayer; }
const std::string& Qwen3Model::replicatedReason() const { return d_->replicatedReason; }
const Qwen3Config& Qwen3Model::config() const { return d_->cfg; }

std::vector<at::Tensor> Qwen3Model::hiddenStates(const at::Tensor& input_ids,
                                                 const at::Tensor& attention_mask,
                                                 const std::vector<int>& indices) const {
  const auto& D = *d_;
  const auto& c = D.cfg;
  if (input_ids.dim() != 2 || input_ids.scalar_type() != at::kLong)
    throw std::invalid_argument("Qwen3Model::hiddenStates: input_ids must be int64 [B, L]");
  if (attention_mask.sizes() != input_ids.sizes() || attention_mask.scalar_type() != at::kLong)
    throw std::invalid_argument(
        "Qwen3Model::hiddenStates: attention_mask must be int64 with input_ids' shape [B, L]");
  if (input_ids.size(1) < 1 || input_ids.size(1) > c.max_position_embeddings)
    throw std::invalid_argument("Qwen3Model::hiddenStates: sequence length " +
                                std::to_string(input_ids.size(1)) + " outside [1, " +
                                std::to_string(c.max_position_embeddings) + "]");
  if (indices.empty()) throw std::invalid_argument("Qwen3Model::hiddenStates: no index asked");
  int top = 0;
  for (int k : indices) {
    const bool ok = k >= 0 && k <= D.maxLayer;
    if (!ok || (k == c.num_hidden_layers && !D.norm.defined()))
      throw std::invalid_argument("Qwen3Model::hiddenStates: index " + std::to_string(k) +
                                  " outside [0, " + std::to_string(D.maxLayer) +
                                  "] (layers loaded: " + std::to_string(D.maxLayer) + " of " +
                                  std::to_string(c.num_hidden_layers) + ")");
    top = std::max(top, k);
  }
  if (input_ids.numel() > 0) {
    const int64_t lo = input_ids.min().item<int64_t>(), hi = input_ids.max().item<int64_t>();
    if (lo < 0 || hi >= c.vocab_size)
      throw std::invalid_argument("Qwen3Model::hiddenStates: token id outside [0, vocab_size " +
                                  std::to_string(c.vocab_size) + ")");
  }
  const auto dev = computeDevice();
  const int64_t B = input_ids.size(0), L = input_ids.size(1), Dh = c.head_dim;
  const int64_t layersToRun = std::min<int64_t>(top, c.num_hidden_layers);

  // Streaming: the lookup on the host table, only the looked-up rows travel.
  at::Tensor x = D.streamTo ? at::embedding(D.embed_tokens, input_ids.to(at::kCPU)).to(dev)
                            : at::embedding(D.embed_tokens, input_ids.to(dev));  // [B, L, H]
  // RoPE tables (transformers Qwen3RotaryEmbedding, default rope): float32.
  const auto fopt = at::TensorOptions().dtype(at::kFloat).device(dev);
  const auto invFreq =
      1.0 / at::pow(c.rope_theta, at::arange(0, Dh, 2, fopt.dtype(at::kLong)).to(at::kFloat) /
                                      static_cast<double>(Dh));
  // Position ids [P, L] (P = 1: the same for every row): Qwen3 0..L-1; Qwen2.5-VL's
  // get_rope_index on text: cumsum(mask) - 1, padding positions 1 (every mrope section alike).
  at::Tensor pos = at::arange(L, fopt).unsqueeze(0);
  if (c.positions_from_mask) {
    const at::Tensor m = attention_mask.to(dev);
    pos = (m.cumsum(1) - 1).masked_fill(m.eq(0), 1).to(at::kFloat);
  }
  const int64_t P = pos.size(0);
  const auto freqs = pos.unsqueeze(-1) * invFreq;  // [P, L, Dh/2]
  const auto emb = at::cat({freqs, freqs}, -1);
  const auto cosT = emb.cos().to(x.scalar_type()).view({P, 1, L, Dh});
  const auto sinT = emb.sin().to(x.scalar_type()).view({P, 1, L, Dh});
  // Causal AND key-padding mask, additive with finfo.min as transformers' eager attention.
  const auto causal = at::ones({L, L}, fopt.dtype(at::kBool)).tril();  // [q, k]
  const auto keyOk = attention_mask.to(dev).ne(0).view({B, 1, 1, L});
  const auto allowed = causal.view({1, 1, L, L}).logical_and(keyOk);  // [B, 1, L, L]
  const auto minVal = std::numeric_limits<float>::lowest();
  const auto addMask = at::zeros({B, 1, L, L}, fopt).masked_fill(allowed.logical_not(), minVal);
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  // SDPA (masked_rows_zero): a query row with no allowed key (left padding) attends to nothing,
  // its attention output is 0; the additive mask alone would spread it over every key (eager).
  at::Tensor rowHasKey;
  if (c.masked_rows_zero) rowHasKey = allowed.any(-1, true).to(x.scalar_type());  // [B, 1, L, 1]

  // Only the asked hidden states are kept (a 40-layer encoder at 512 tokens would otherwise hold
  // every layer's output until the end).
  std::vector<at::Tensor> states(static_cast<size_t>(layersToRun) + 1);
  std::vector<bool> keep(states.size(), false);
  for (int k : indices) keep[static_cast<size_t>(k)] = true;
  if (keep[0]) states[0] = x;
  // Streaming: each layer's weights copied to the device (fresh tensors) for its forward only.
  const TensorMap toDevice = [dev](const at::Tensor& t) {
    return t.to(dev, t.scalar_type(), /*non_blocking=*/true, /*copy=*/true);
  };
  for (int64_t li = 0; li < layersToRun; ++li) {
    Layer visiting;
    if (D.streamTo) visiting = mapLayer(D.layers[static_cast<size_t>(li)], toDevice, D.tp);
    const Layer& Ly = D.streamTo ? visiting : D.layers[static_cast<size_t>(li)];
    at::Tensor residual = x;
    at::Tensor h = rmsNorm(x, Ly.input_layernorm, c.rms_norm_eps);
    auto q = Ly.q_proj->forward(h);
    auto k = Ly.k_proj->forward(h);
    auto v = Ly.v_proj->forward(h);
    q = q.view({B, L, -1, Dh});
    k = k.view({B, L, -1, Dh});
    if (c.qk_norm) {
      q = rmsNorm(q, Ly.q_norm, c.rms_norm_eps);
      k = rmsNorm(k, Ly.k_norm, c.rms_norm_eps);
    }
    q = q.transpose(1, 2);
    k = k.transpose(1, 2);
    v = v.view({B, L, -1, Dh}).transpose(1, 2);
    q = q * cosT + rotateHalf(q) * sinT;
    k = k * cosT + rotateHalf(k) * sinT;
    k = k.index_select(1, Ly.kvIndex);  // repeat_kv for this rank's query heads
    v = v.index_select(1, Ly.kvIndex);
    auto scores = at::matmul(q, k.transpose(-1, -2)) * scale + addMask.to(q.scalar_type());
    auto probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    if (rowHasKey.defined()) probs = probs * rowHasKey;
    auto attn = at::matmul(probs, v).transpose(1, 2).reshape({B, L, -1});
    x = residual + Ly.o_proj->forward(attn);
    residual = x;
    h = rmsNorm(x, Ly.post_attention_layernorm, c.rms_norm_eps);
    h = Ly.down_proj->forward(at::silu(Ly.gate_proj->forward(h)) * Ly.up_proj->forward(h));
    x = residual + h;
    if (keep[static_cast<size_t>(li) + 1]) states[static_cast<size_t>(li) + 1] = x;
  }
  std::vector<at::Tensor> out;
  out.reserve(indices.size());
  for (int k : indices) {
    at::Tensor t = k == c.num_hidden_layers
                       ? rmsNorm(states[static_cast<size_t>(k)], D.norm.to(dev), c.rms_norm_eps)
                       : states[static_cast<size_t>(k)];
    out.push_back(t.to(at::kFloat));
  }
  return out;
}

namespace {

// The chat-templated prompt tokenized to max_sequence_length and run through `model`; the hidden
// states at `layers` concatenated per position -> [1, L, n_layers * H] float32. diffusers:
// torch.stack([hidden_states[k] for k in layers], dim=1).permute(0, 2, 1, 3).reshape(B, L,
// n_layers * H). `who` names the caller in the std::invalid_argument it throws.
template <class Tokenizer>
at::Tensor stackedPromptEmbeds(const char* who, const Tokenizer& tokenizer, const Qwen3Model& model,
                               const std::string& prompt, int max_sequence_length,
                               const std::vector<int>& layers) {
  if (max_sequence_length < 1)
    throw std::invalid_argument(std::string(who) + ": max_sequence_length must be >= 1, got " +
                                std::to_string(max_sequence_length));
  if (layers.empty()) throw std::invalid_argument(std::string(who) + ": no layers asked");
  const auto enc = tokenizer.encode(tokenizer.applyChatTemplate(prompt), max_sequence_length);
  const auto opt = at::TensorOptions().dtype(at::kLong);
  const auto n = static_cast<int64_t>(enc.input_ids.size());
  const auto ids = at::tensor(enc.input_ids, opt).view({1, n});
  const auto mask = at::tensor(enc.attention_mask, opt).view({1, n});
  return at::cat(model.hiddenStates(ids, mask, layers), -1);
}

}  // namespace

at::Tensor qwen3PromptEmbeds(const Qwen2Tokenizer& tokenizer, const Qwen3Model& model,
                             const std::string& prompt, int max_sequence_length,
                             const std::vector<int>& layers) {
  return stackedPromptEmbeds("qwen3PromptEmbeds", tokenizer, model, prompt, max_sequence_length,
                             layers);
}

at::Tensor mistralPromptEmbeds(const MistralTokenizer& tokenizer, const Qwen3Model& model,
                               const std::string& prompt, int max_sequence_length,
                               const std::vector<int>& layers) {
  return stackedPromptEmbeds("mistralPromptEmbeds", tokenizer, model, prompt, max_sequence_length,
                             layers);
}

}  // namespace dit
