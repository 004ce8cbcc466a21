#include "backend/models/flux/flux_blocks.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <stdexcept>
#include <string>
#include <tuple>

#include "backend/io/weight_loader.h"
#include "backend/nn/activations.h"

namespace dit::flux {

FluxTransformerBlock::FluxTransformerBlock(WeightLoader& w, const std::string& p, int64_t C,
                                           int64_t M, int64_t headDim)
    : norm1(w, p + ".norm1", C),
      norm1_context(w, p + ".norm1_context", C),
      attn(w, p + ".attn", C, headDim, /*added_kv=*/true),
      ff(w, p + ".ff", C, M),
      ff_context(w, p + ".ff_context", C, M) {}

std::pair<at::Tensor, at::Tensor> FluxTransformerBlock::operator()(
    const at::Tensor& hidden_in, const at::Tensor& encoder_in, const at::Tensor& silu_temb,
    const at::Tensor& cos, const at::Tensor& sin, const nn::AttentionBackend& attention,
    const nn::AttentionCacheSeam* seam, const at::Tensor& emb,
    const at::Tensor& emb_context) const {
  const auto n = norm1(hidden_in, silu_temb, emb);
  const auto nc = norm1_context(encoder_in, silu_temb, emb_context);
  at::Tensor attn_output, context_attn_output;
  if (nn::cachePredicts(seam)) {
    auto p = nn::cachePrediction(*seam);
    attn_output = p.at(0).to(hidden_in.scalar_type());
    context_attn_output = p.at(1).to(encoder_in.scalar_type());
  } else {
    std::tie(attn_output, context_attn_output) =
        attn(n.norm_hidden_states, nc.norm_hidden_states, cos, sin, attention);
    if (seam) nn::cacheRecord(seam, {attn_output, context_attn_output});
  }
  // Gated residuals x + gate * y as one addcmul each (one pass, one temporary fewer).
  at::Tensor hidden = at::addcmul(hidden_in, n.gate_msa.unsqueeze(1), attn_output);
  hidden = at::addcmul(hidden, n.gate_mlp.unsqueeze(1),
                       ff(nn::layerNormModulate(hidden, n.scale_mlp, n.shift_mlp)));
  at::Tensor encoder = at::addcmul(encoder_in, nc.gate_msa.unsqueeze(1), context_attn_output);
  encoder = at::addcmul(encoder, nc.gate_mlp.unsqueeze(1),
                        ff_context(nn::layerNormModulate(encoder, nc.scale_mlp, nc.shift_mlp)));
  if (encoder.scalar_type() == at::kHalf) encoder = encoder.clamp(-65504, 65504);
  return {encoder, hidden};
}

namespace {
// to_q's local rows / head dim: the heads this rank computes, as the plan sharded them.
int64_t localHeads(const tensor_parallel::FusedColumnParallelLinear& qkv, int64_t headDim) {
  return qkv.parts()[0].outLocal / headDim;
}
}  // namespace

FluxSingleTransformerBlock::FluxSingleTransformerBlock(WeightLoader& w, const std::string& p,
                                                       int64_t C, int64_t M, int64_t headDim)
    : norm(w, p + ".norm", C),
      qkv_mlp(w.fusedColumn(p + ".qkv_mlp",
                            {{p + ".attn.to_q", C},
                             {p + ".attn.to_k", C},
                             {p + ".attn.to_v", C},
                             {p + ".proj_mlp", M}},
                            C)),
      attn(w, p + ".attn", C, headDim, /*added_kv=*/false, localHeads(*qkv_mlp, headDim)),
      proj_out(w.linear(p + ".proj_out", C + M, C)) {}

at::Tensor FluxSingleTransformerBlock::operator()(const at::Tensor& x, const at::Tensor& silu_temb,
                                                  const at::Tensor& cos, const at::Tensor& sin,
                                                  const nn::AttentionBackend& attention,
                                                  const nn::AttentionCacheSeam* seam,
                                                  const at::Tensor& emb) const {
  const auto n = norm(x, silu_temb, emb);
  auto parts = qkv_mlp->forwardParts(n.norm_hidden_states);
  // proj_out's input cat(attn, mlp) [B, S, C_local + M_local]: on the CPU kernel's path the GELU
  // is written straight into its right-hand part and only the attention output is copied in.
  const at::Tensor& mlpIn = parts[3];
  const bool intoCat = mlpIn.is_cpu() && !(mlpIn.requires_grad() && at::GradMode::is_enabled()) &&
                       (mlpIn.scalar_type() == at::kFloat || mlpIn.scalar_type() == at::kBFloat16);
  at::Tensor catBuf, mlp_hidden_states;
  if (intoCat) {
    const int64_t ca = parts[0].size(2), m = mlpIn.size(2);
    catBuf = at::empty({mlpIn.size(0), mlpIn.size(1), ca + m}, mlpIn.options());
    nn::geluTanhCpuOut(mlpIn, catBuf.narrow(2, ca, m));
  } else {
    mlp_hidden_states = nn::geluTanh(mlpIn);
  }
  at::Tensor attn_output;
  if (nn::cachePredicts(seam)) {
    attn_output = nn::cachePrediction(*seam).at(0).to(x.scalar_type());
  } else {
    attn_output = attn.attendProjected(parts[0], parts[1], parts[2], cos, sin, attention);
    if (seam) nn::cacheRecord(seam, {attn_output});
  }
  if (intoCat) {
    const at::Tensor attnPart = catBuf.narrow(2, 0, parts[0].size(2));
    if (attn_output.sizes() != attnPart.sizes())  // e.g. a cache seam's prediction of another shape
      throw std::invalid_argument("FluxSingleTransformerBlock: attention output " +
                                  std::string(c10::str(attn_output.sizes())) + ", expected " +
                                  std::string(c10::str(attnPart.sizes())));
    attnPart.copy_(attn_output);
  } else {
    catBuf = at::cat({attn_output, mlp_hidden_states}, 2);
  }
  at::Tensor out = at::addcmul(x, n.gate_msa.unsqueeze(1), proj_out->forward(catBuf));
  if (out.scalar_type() == at::kHalf) out = out.clamp(-65504, 65504);
  return out;
}

}  // namespace dit::flux
