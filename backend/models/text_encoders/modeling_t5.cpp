#include "backend/models/text_encoders/modeling_t5.h"

#include <ATen/ATen.h>

#include <cmath>

#include "backend/io/weight_source.h"
#include "backend/nn/activations.h"

namespace dit {

using nn::activation;

// ---------------------------------------------------------------- T5
struct T5Layer {
  at::Tensor ln0, ln1;
  at::Tensor q, k, v, o;    // no biases in T5
  at::Tensor wi0, wi1, wo;  // wi1 undefined for non-gated
};

struct T5EncoderModel::Impl {
  T5Config cfg;
  at::Tensor emb, rel_bias, lnf;
  std::vector<T5Layer> layers;
};

T5EncoderModel::T5EncoderModel(const T5Config& cfg, WeightSource& w) : d_(new Impl) {
  d_->cfg = cfg;
  const int64_t dm = cfg.d_model, inner = cfg.num_heads * cfg.d_kv, ff = cfg.d_ff;
  d_->emb = w.contains("shared.weight")
                ? w.get("shared.weight", {cfg.vocab_size, dm})
                : w.get("encoder.embed_tokens.weight", {cfg.vocab_size, dm});
  for (int i = 0; i < cfg.num_layers; ++i) {
    const std::string b = "encoder.block." + std::to_string(i) + ".layer.";
    T5Layer L;
    L.ln0 = w.get(b + "0.layer_norm.weight", {dm});
    L.q = w.get(b + "0.SelfAttention.q.weight", {inner, dm});
    L.k = w.get(b + "0.SelfAttention.k.weight", {inner, dm});
    L.v = w.get(b + "0.SelfAttention.v.weight", {inner, dm});
    L.o = w.get(b + "0.SelfAttention.o.weight", {dm, inner});
    if (i == 0)
      d_->rel_bias = w.get(b + "0.SelfAttention.relative_attention_bias.weight",
                           {cfg.relative_attention_num_buckets, cfg.num_heads});
    L.ln1 = w.get(b + "1.layer_norm.weight", {dm});
    if (cfg.is_gated_act) {
      L.wi0 = w.get(b + "1.DenseReluDense.wi_0.weight", {ff, dm});
      L.wi1 = w.get(b + "1.DenseReluDense.wi_1.weight", {ff, dm});
    } else {
      L.wi0 = w.get(b + "1.DenseReluDense.wi.weight", {ff, dm});
    }
    L.wo = w.get(b + "1.DenseReluDense.wo.weight", {dm, ff});
    d_->layers.push_back(std::move(L));
  }
  d_->lnf = w.get("encoder.final_layer_norm.weight", {dm});
}

T5EncoderModel::~T5EncoderModel() = default;

// T5LayerNorm: RMS norm with variance in float32, no mean subtraction, no bias.
static at::Tensor t5Norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor var = x.to(at::kFloat).pow(2).mean(-1, true);
  at::Tensor h = x.to(at::kFloat) * at::rsqrt(var + eps);
  return w * h.to(w.scalar_type());
}

at::Tensor t5RelativePositionBucket(const at::Tensor& rel, int num_buckets, int max_distance) {
  num_buckets /= 2;
  at::Tensor ret = (rel > 0).to(at::kLong) * num_buckets;
  at::Tensor n = rel.abs();
  const int max_exact = num_buckets / 2;
  at::Tensor is_small = n < max_exact;
  at::Tensor large = max_exact + (at::log(n.to(at::kFloat) / max_exact) /
                                  std::log(static_cast<double>(max_distance) / max_exact) *
                                  (num_buckets - max_exact))
                                     .to(at::kLong);
  large = at::min(large, at::full_like(large, num_buckets - 1));
  return ret + at::where(is_small, n, large);
}

at::Tensor T5EncoderModel::forward(const at::Tensor& ids) const {
  const auto& c = d_->cfg;
  const auto dev = d_->emb.device();
  const int64_t B = ids.size(0), L = ids.size(1), H = c.num_heads, D = c.d_kv;
  at::Tensor x = at::embedding(d_->emb, ids.to(dev));
  auto lo = at::TensorOptions().dtype(at::kLong).device(dev);
  at::Tensor ctx = at::arange(L, lo).unsqueeze(1), mem = at::arange(L, lo).unsqueeze(0);
  at::Tensor bucket = t5RelativePositionBucket(mem - ctx, c.relative_attention_num_buckets,
                                               c.relative_attention_max_distance);
  at::Tensor bias =
      at::embedding(d_->rel_bias, bucket).permute({2, 0, 1}).unsqueeze(0);  // [1,H,L,L]
  for (const auto& Ly : d_->layers) {
    at::Tensor h = t5Norm(x, Ly.ln0, c.layer_norm_epsilon);
    auto heads = [&](const at::Tensor& t) { return t.view({B, L, H, D}).transpose(1, 2); };
    at::Tensor q = heads(at::linear(h, Ly.q)), k = heads(at::linear(h, Ly.k)),
               v = heads(at::linear(h, Ly.v));
    at::Tensor s = at::matmul(q, k.transpose(-1, -2)) + bias;  // T5: no 1/sqrt(d) scaling
    at::Tensor p = at::softmax(s.to(at::kFloat), -1).to(q.scalar_type());
    at::Tensor a = at::matmul(p, v).transpose(1, 2).reshape({B, L, H * D});
    x = x + at::linear(a, Ly.o);
    h = t5Norm(x, Ly.ln1, c.layer_norm_epsilon);
    at::Tensor f;
    if (c.is_gated_act)
      f = activation(c.dense_act_fn, at::linear(h, Ly.wi0)) * at::linear(h, Ly.wi1);
    else
      f = activation(c.dense_act_fn, at::linear(h, Ly.wi0));
    x = x + at::linear(f, Ly.wo);
  }
  return t5Norm(x, d_->lnf, c.layer_norm_epsilon);
}

}  // namespace dit
