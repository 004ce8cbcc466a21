#include "backend/models/text_encoders/modeling_clip.h"

#include <ATen/ATen.h>

#include <cmath>

#include "backend/io/weight_source.h"
#include "backend/nn/activations.h"

namespace dit {

using nn::activation;

// ---------------------------------------------------------------- CLIP
struct CLIPLayer {
  at::Tensor ln1_w, ln1_b, ln2_w, ln2_b;
  Linear q, k, v, o, fc1, fc2;
};

struct CLIPTextModel::Impl {
  CLIPTextConfig cfg;
  at::Tensor tok, pos, lnf_w, lnf_b;
  std::vector<CLIPLayer> layers;
};

CLIPTextModel::CLIPTextModel(const CLIPTextConfig& cfg, WeightSource& w) : d_(new Impl) {
  d_->cfg = cfg;
  const int64_t h = cfg.hidden_size, f = cfg.intermediate_size;
  // transformers < 5 prefixes CLIPTextModel weights with "text_model."; 5.x does not.
  const std::string p =
      w.contains("text_model.embeddings.token_embedding.weight") ? "text_model." : "";
  d_->tok = w.get(p + "embeddings.token_embedding.weight", {cfg.vocab_size, h});
  d_->pos = w.get(p + "embeddings.position_embedding.weight", {cfg.max_position_embeddings, h});
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    const std::string l = p + "encoder.layers." + std::to_string(i) + ".";
    CLIPLayer L;
    L.ln1_w = w.get(l + "layer_norm1.weight", {h});
    L.ln1_b = w.get(l + "layer_norm1.bias", {h});
    L.ln2_w = w.get(l + "layer_norm2.weight", {h});
    L.ln2_b = w.get(l + "layer_norm2.bias", {h});
    L.q = loadLinear(w, l + "self_attn.q_proj", h, h);
    L.k = loadLinear(w, l + "self_attn.k_proj", h, h);
    L.v = loadLinear(w, l + "self_attn.v_proj", h, h);
    L.o = loadLinear(w, l + "self_attn.out_proj", h, h);
    L.fc1 = loadLinear(w, l + "mlp.fc1", h, f);
    L.fc2 = loadLinear(w, l + "mlp.fc2", f, h);
    d_->layers.push_back(std::move(L));
  }
  d_->lnf_w = w.get(p + "final_layer_norm.weight", {h});
  d_->lnf_b = w.get(p + "final_layer_norm.bias", {h});
}

CLIPTextModel::~CLIPTextModel() = default;

std::pair<at::Tensor, at::Tensor> CLIPTextModel::forward(const at::Tensor& ids) const {
  const auto& c = d_->cfg;
  const int64_t B = ids.size(0), L = ids.size(1), H = c.num_attention_heads,
                D = c.hidden_size / c.num_attention_heads;
  if (L > c.max_position_embeddings)
    throw std::invalid_argument("CLIP input of " + std::to_string(L) + " tokens exceeds " +
                                std::to_string(c.max_position_embeddings));
  const auto dev = d_->tok.device();
  at::Tensor x = at::embedding(d_->tok, ids.to(dev)) + d_->pos.slice(0, 0, L).unsqueeze(0);
  // Causal mask: -inf above the diagonal (transformers uses finfo.min; same softmax result).
  at::Tensor mask = at::full({L, L}, -std::numeric_limits<float>::infinity(),
                             at::TensorOptions().dtype(x.scalar_type()).device(dev))
                        .triu(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (const auto& Ly : d_->layers) {
    at::Tensor r = x;
    at::Tensor hs = at::layer_norm(x, {c.hidden_size}, Ly.ln1_w, Ly.ln1_b, c.layer_norm_eps);
    auto heads = [&](const at::Tensor& t) { return t.view({B, L, H, D}).transpose(1, 2); };
    at::Tensor q = heads(Ly.q(hs)), k = heads(Ly.k(hs)), v = heads(Ly.v(hs));
    at::Tensor s = at::matmul(q, k.transpose(-1, -2)) * scale + mask;
    at::Tensor a = at::matmul(at::softmax(s, -1), v).transpose(1, 2).reshape({B, L, H * D});
    x = r + Ly.o(a);
    r = x;
    hs = at::layer_norm(x, {c.hidden_size}, Ly.ln2_w, Ly.ln2_b, c.layer_norm_eps);
    x = r + Ly.fc2(activation(c.hidden_act, Ly.fc1(hs)));
  }
  x = at::layer_norm(x, {c.hidden_size}, d_->lnf_w, d_->lnf_b, c.layer_norm_eps);
  at::Tensor idx;
  at::Tensor idsd = ids.to(dev);
  if (c.eos_token_id == 2)
    idx = idsd.to(at::kInt).argmax(-1);
  else
    idx = (idsd.to(at::kInt) == static_cast<int>(c.eos_token_id)).to(at::kInt).argmax(-1);
  at::Tensor pooled =
      x.index({at::arange(B, at::TensorOptions().dtype(at::kLong).device(dev)), idx.to(at::kLong)});
  return {x, pooled};
}

}  // namespace dit
