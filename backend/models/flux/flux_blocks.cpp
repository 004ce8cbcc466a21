#include "backend/models/flux/flux_blocks.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>

#include "backend/models/cache/step_cache.h"
#include "backend/nn/activations.h"
#include "backend/nn/qk_norm_rope.h"
#include "parallel/attention.h"
#include "parallel/context_parallel.h"
#include "parallel/torch_compat.h"

namespace dit::flux {
namespace {

// LayerNorm without affine parameters, eps 1e-6 (diffusers norm1/norm/norm_out, norm2).
at::Tensor layerNorm(const at::Tensor& x) { return at::layer_norm(x, {x.size(-1)}, {}, {}, 1e-6); }

// Reduced precision on the CPU where LibTorch's own LayerNorm for it is slow (float16 always;
// bfloat16 on LibTorch 1.x, see torch_compat::kSlowBf16CpuLayerNorm): LayerNorm + modulation then
// run in float32 with one rounding at the end.
bool reducedOnCpu(const at::Tensor& x) {
  return x.is_cpu() && ((x.scalar_type() == at::kBFloat16 && torch_compat::kSlowBf16CpuLayerNorm) ||
                        x.scalar_type() == at::kHalf);
}

// LayerNorm(x) * (1 + scale) + shift with [B, C] modulation broadcast over the sequence
// (diffusers AdaLayerNormZero / AdaLayerNormContinuous). bfloat16/float16 on the CPU: the norm and
// the modulation in float32 with one rounding to x's dtype at the end (one fused addcmul):
// LibTorch 1.13's reduced-precision CPU layer_norm is about 8x slower than its float32 kernel
// (measured: [1, 320, 512] 1.16 ms against 0.14 ms for norm + modulation), and the single
// rounding is at least as accurate as diffusers' three bf16 roundings (norm, mul, add).
at::Tensor modulate(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift) {
  if (reducedOnCpu(x)) {
    const at::Tensor h = layerNorm(x.to(at::kFloat));
    return at::addcmul(shift.unsqueeze(1).to(at::kFloat), h,
                       (1 + scale.unsqueeze(1)).to(at::kFloat))
        .to(x.scalar_type());
  }
  return at::addcmul(shift.unsqueeze(1), layerNorm(x), 1 + scale.unsqueeze(1));
}

}  // namespace

// diffusers RMSNorm (eps 1e-6, affine): variance in float32; half/bfloat16 weights multiply in
// their dtype, float32 weights in float32 then cast back.
at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& w) {
  const auto dt = x.scalar_type();
  at::Tensor xf = x.to(at::kFloat);
  // square / in-place add_ and mul_: the same arithmetic as pow(2) + eps and out-of-place
  // products, with fewer temporaries (one thread, [1, 320, 8, 64] bfloat16: 0.17 -> 0.14 ms on
  // LibTorch 1.13, 0.21 -> 0.15 ms on 2.6). Training (autograd) keeps the out-of-place form.
  if (x.requires_grad() && at::GradMode::is_enabled()) {
    at::Tensor h = xf * at::rsqrt(xf.square().mean(-1, true) + 1e-6);
    if (w.scalar_type() == at::kHalf || w.scalar_type() == at::kBFloat16)
      return h.to(w.scalar_type()) * w;
    return (h * w).to(dt);
  }
  at::Tensor h = xf * at::rsqrt(xf.square().mean(-1, true).add_(1e-6));
  if (w.scalar_type() == at::kHalf || w.scalar_type() == at::kBFloat16)
    return h.to(w.scalar_type()).mul_(w);
  return h.mul_(w).to(dt);
}

at::Tensor timestepProjection(const at::Tensor& t, int64_t dim) {
  const int64_t half = dim / 2;
  auto fo = at::TensorOptions().dtype(at::kFloat).device(t.device());
  at::Tensor ex = at::arange(0, half, fo) * (-std::log(10000.0)) / static_cast<double>(half);
  at::Tensor e = t.to(at::kFloat).unsqueeze(1) * at::exp(ex).unsqueeze(0);
  return at::cat({at::cos(e), at::sin(e)}, -1);
}

namespace {

// apply_rotary_emb(use_real=True, use_real_unbind_dim=-1, sequence_dim=1): x [B, S, H, D],
// cos/sin float32 [S, D] with each value repeated for the pair (2j, 2j+1) (FluxPosEmbed's
// repeat_interleave_real), so x * cos + rotate(x) * sin, rotate(x)[2j, 2j+1] = (-x[2j+1], x[2j]),
// is the complex product (x[2j] + i x[2j+1]) (cos[2j] + i sin[2j]) per pair. Computed that way in
// float32 (one ATen kernel instead of negate, interleave, multiply and multiply-add) and cast
// back to x's dtype. It matches diffusers' real form up to the rounding of each product's sum
// (float32: within 5e-7 of |x| ~ 4; one thread, [1, 320, 8, 64]: 0.12 -> 0.07 ms in float32 and
// 0.23 -> 0.09 ms from bfloat16, LibTorch 1.13).
at::Tensor applyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto sz = x.sizes();
  const int64_t S = cos.size(0), half = cos.size(1) / 2;
  const at::Tensor rotation =
      at::complex(cos.reshape({S, half, 2}).select(-1, 0), sin.reshape({S, half, 2}).select(-1, 0));
  const at::Tensor xc =
      at::view_as_complex(x.to(at::kFloat).contiguous().view({sz[0], sz[1], sz[2], sz[3] / 2, 2}));
  const at::Tensor out = xc * rotation.unsqueeze(0).unsqueeze(2);
  return at::view_as_real(out).flatten(3).to(x.scalar_type());
}

// RoPE(RMSNorm(.)) of the text part tx (undefined: none) and the image part x, each [B, S_part,
// H, D], into one [B, S_txt + S_img, H, D] result stored head-major (a transposed view of a
// contiguous [B, H, S, D] tensor, which the attention reads without copies); cos/sin [S, D] for the
// joint sequence. The CPU kernel nn::rmsNormRopeCpuOut (diffusers' roundings, one pass).
at::Tensor normRopeJoint(const at::Tensor& tx, const at::Tensor& tw, const at::Tensor& x,
                         const at::Tensor& w, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t st = tx.defined() ? tx.size(1) : 0, S = st + x.size(1);
  if (cos.size(0) != S || sin.size(0) != S)
    throw std::invalid_argument("FluxAttention: rotary tables hold " + std::to_string(cos.size(0)) +
                                " positions for " + std::to_string(S) + " tokens");
  at::Tensor out = at::empty({x.size(0), x.size(2), S, x.size(3)}, x.options()).transpose(1, 2);
  if (st > 0)
    nn::rmsNormRopeCpuOut(tx, tw, 1e-6, cos.narrow(0, 0, st), sin.narrow(0, 0, st),
                          out.narrow(1, 0, st));
  nn::rmsNormRopeCpuOut(x, w, 1e-6, cos.narrow(0, st, S - st), sin.narrow(0, st, S - st),
                        out.narrow(1, st, S - st));
  return out;
}

// gelu(x, approximate="tanh") = 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3).
// On the CPU in float32 / bfloat16 without gradients: nn::geluTanhCpu, one vectorised pass (0.35
// ms in float32 and 0.48 ms from bfloat16 on [1, 320, 2048], one thread, against 1.4 / 3.2 ms
// for LibTorch 1.13's at::gelu and 1.0 / 1.3 ms for the sigmoid form in ATen ops). Training
// (autograd) and float16 on the CPU: the identical x * sigmoid(2u) in float32 ATen ops, one
// rounding to x's dtype at the end (the two forms differ by < 5e-7 in float32). Other devices:
// at::gelu (fused there).
at::Tensor geluTanh(const at::Tensor& x) {
  if (!x.is_cpu()) return at::gelu(x, "tanh");
  const bool grad = x.requires_grad() && at::GradMode::is_enabled();
  if (!grad && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16))
    return nn::geluTanhCpu(x);
  constexpr double k = 1.5957691216057308;  // 2 sqrt(2/pi)
  const at::Tensor xf = x.to(at::kFloat);   // x itself when float32: never written to below
  if (x.requires_grad() && at::GradMode::is_enabled()) {
    // Training (ditstudio-train): the same operations out of place, since autograd keeps the
    // sigmoid's output for its backward.
    return (at::sigmoid(xf.square().mul(k * 0.044715).add(k).mul(xf)) * xf).to(x.scalar_type());
  }
  at::Tensor y = xf.square().mul_(k * 0.044715).add_(k).mul_(xf).sigmoid_().mul_(xf);
  return y.to(x.scalar_type());
}

}  // namespace

at::Tensor AttentionBackend::operator()(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v) const {
  // [B, S, H, D] -> [B, H, S, D]
  at::Tensor Q = q.transpose(1, 2), K = k.transpose(1, 2), V = v.transpose(1, 2);
  at::Tensor o = cp ? cp->attention(Q, K, V, localLens) : localAttention(Q, K, V);
  return o.transpose(1, 2).reshape({q.size(0), q.size(1), q.size(2) * q.size(3)});
}

AdaLayerNormZero::AdaLayerNormZero(WeightLoader& w, const std::string& prefix, int64_t C)
    : linear_(w.linear(prefix + ".linear", C, 6 * C)) {}

AdaLayerNormZero::Output AdaLayerNormZero::operator()(const at::Tensor& x,
                                                      const at::Tensor& silu_temb) const {
  auto e = linear_->forward(silu_temb).chunk(6, 1);
  Output o;
  o.shift_msa = e[0];
  o.scale_msa = e[1];
  o.gate_msa = e[2];
  o.shift_mlp = e[3];
  o.scale_mlp = e[4];
  o.gate_mlp = e[5];
  o.norm_hidden_states = modulate(x, o.scale_msa, o.shift_msa);
  return o;
}

AdaLayerNormZeroSingle::AdaLayerNormZeroSingle(WeightLoader& w, const std::string& prefix,
                                               int64_t C)
    : linear_(w.linear(prefix + ".linear", C, 3 * C)) {}

AdaLayerNormZeroSingle::Output AdaLayerNormZeroSingle::operator()(
    const at::Tensor& x, const at::Tensor& silu_temb) const {
  auto e = linear_->forward(silu_temb).chunk(3, 1);
  Output o;
  o.shift_msa = e[0];
  o.scale_msa = e[1];
  o.gate_msa = e[2];
  o.norm_hidden_states = modulate(x, o.scale_msa, o.shift_msa);
  return o;
}

AdaLayerNormContinuous::AdaLayerNormContinuous(WeightLoader& w, const std::string& prefix,
                                               int64_t C, bool bias)
    : linear_(w.linear(prefix + ".linear", C, 2 * C, bias)) {}

at::Tensor AdaLayerNormContinuous::operator()(const at::Tensor& x,
                                              const at::Tensor& silu_temb) const {
  auto e = linear_->forward(silu_temb).to(x.scalar_type()).chunk(2, 1);  // scale, shift
  return modulate(x, e[0], e[1]);
}

std::pair<at::Tensor, at::Tensor> FluxPosEmbed::operator()(const at::Tensor& ids) const {
  const at::Tensor pos = ids.to(at::kDouble);
  std::vector<at::Tensor> cosParts, sinParts;
  for (size_t a = 0; a < axes_dim_.size(); ++a) {
    const int64_t dim = axes_dim_[a];
    auto o64 = at::TensorOptions().dtype(at::kDouble).device(ids.device());
    at::Tensor freqs = 1.0 / at::pow(theta_, at::arange(0, dim, 2, o64).slice(0, 0, dim / 2) /
                                                 static_cast<double>(dim));
    at::Tensor f = at::outer(pos.select(1, static_cast<int64_t>(a)), freqs);
    cosParts.push_back(f.cos().repeat_interleave(2, 1).to(at::kFloat));
    sinParts.push_back(f.sin().repeat_interleave(2, 1).to(at::kFloat));
  }
  return {at::cat(cosParts, -1), at::cat(sinParts, -1)};
}

at::Tensor FeedForward::operator()(const at::Tensor& x) const {
  return out->forward(geluTanh(proj->forward(x)));
}

FluxAttention::FluxAttention(WeightLoader& w, const std::string& p, int64_t C, int64_t headDim,
                             bool added_kv, int64_t headsLocal, bool bias)
    : headDim_(headDim), headsLocal_(headsLocal) {
  if (added_kv) {
    qkv =
        w.fusedColumn(p + ".qkv", {{p + ".to_q", C}, {p + ".to_k", C}, {p + ".to_v", C}}, C, bias);
    add_qkv = w.fusedColumn(
        p + ".add_qkv", {{p + ".add_q_proj", C}, {p + ".add_k_proj", C}, {p + ".add_v_proj", C}}, C,
        bias);
    // The heads this rank computes follow from how the plan sharded to_q.
    headsLocal_ = qkv->parts()[0].outLocal / headDim;
  }
  norm_q = w.param(p + ".norm_q.weight", {headDim});
  norm_k = w.param(p + ".norm_k.weight", {headDim});
  if (added_kv) {
    norm_added_q = w.param(p + ".norm_added_q.weight", {headDim});
    norm_added_k = w.param(p + ".norm_added_k.weight", {headDim});
    to_out = w.linear(p + ".to_out.0", C, C, bias);
    to_add_out = w.linear(p + ".to_add_out", C, C, bias);
  }
}

at::Tensor FluxAttention::heads(const at::Tensor& x) const {
  return x.reshape({x.size(0), x.size(1), headsLocal_, headDim_});
}

std::pair<at::Tensor, at::Tensor> FluxAttention::operator()(
    const at::Tensor& hidden, const at::Tensor& encoder, const at::Tensor& cos,
    const at::Tensor& sin, const AttentionBackend& attention) const {
  const auto dt = hidden.scalar_type();
  auto x3 = qkv->forwardParts(hidden);
  auto c3 = add_qkv->forwardParts(encoder);
  const int64_t txt = encoder.size(1);
  at::Tensor q, k, v;
  if (nn::rmsNormRopeCpuApplies(heads(x3[0]), norm_q) &&
      nn::rmsNormRopeCpuApplies(heads(c3[0]), norm_added_q)) {
    // CPU: RMSNorm + RoPE in one pass per head vector, text and image written straight into
    // their places of the joint sequence, stored head-major ([B, H, S, D]) for the attention.
    q = normRopeJoint(heads(c3[0]), norm_added_q, heads(x3[0]), norm_q, cos, sin);
    k = normRopeJoint(heads(c3[1]), norm_added_k, heads(x3[1]), norm_k, cos, sin);
    const at::Tensor cv = heads(c3[2]).transpose(1, 2), iv = heads(x3[2]).transpose(1, 2);
    v = at::cat({cv, iv}, 2).transpose(1, 2);
  } else {
    q = rmsNorm(heads(x3[0]), norm_q), k = rmsNorm(heads(x3[1]), norm_k), v = heads(x3[2]);
    at::Tensor cq = rmsNorm(heads(c3[0]), norm_added_q), ck = rmsNorm(heads(c3[1]), norm_added_k),
               cv = heads(c3[2]);
    // Joint attention over cat(text, image), as FluxAttnProcessor concatenates.
    q = applyRope(at::cat({cq, q}, 1), cos, sin);
    k = applyRope(at::cat({ck, k}, 1), cos, sin);
    v = at::cat({cv, v}, 1);
  }
  at::Tensor a = attention(q, k, v).to(dt);
  at::Tensor ac = a.narrow(1, 0, txt), ai = a.narrow(1, txt, a.size(1) - txt);
  ai = to_out->forward(ai);
  ac = to_add_out->forward(ac);
  return {ai, ac};
}

at::Tensor FluxAttention::attendProjected(const at::Tensor& q_in, const at::Tensor& k_in,
                                          const at::Tensor& v_in, const at::Tensor& cos,
                                          const at::Tensor& sin,
                                          const AttentionBackend& attention) const {
  const auto dt = q_in.scalar_type();
  at::Tensor q, k;
  if (nn::rmsNormRopeCpuApplies(heads(q_in), norm_q)) {
    q = normRopeJoint({}, {}, heads(q_in), norm_q, cos, sin);
    k = normRopeJoint({}, {}, heads(k_in), norm_k, cos, sin);
  } else {
    q = applyRope(rmsNorm(heads(q_in), norm_q), cos, sin);
    k = applyRope(rmsNorm(heads(k_in), norm_k), cos, sin);
  }
  at::Tensor v = heads(v_in);
  return attention(q, k, v).to(dt);
}

FluxTransformerBlock::FluxTransformerBlock(WeightLoader& w, const std::string& p, int64_t C,
                                           int64_t M, int64_t headDim)
    : norm1(w, p + ".norm1", C),
      norm1_context(w, p + ".norm1_context", C),
      attn(w, p + ".attn", C, headDim, /*added_kv=*/true),
      ff{w.linear(p + ".ff.net.0.proj", C, M), w.linear(p + ".ff.net.2", M, C)},
      ff_context{w.linear(p + ".ff_context.net.0.proj", C, M),
                 w.linear(p + ".ff_context.net.2", M, C)} {}

std::pair<at::Tensor, at::Tensor> FluxTransformerBlock::operator()(
    const at::Tensor& hidden_in, const at::Tensor& encoder_in, const at::Tensor& silu_temb,
    const at::Tensor& cos, const at::Tensor& sin, const AttentionBackend& attention,
    const AttentionCacheSeam* seam) const {
  const auto n = norm1(hidden_in, silu_temb);
  const auto nc = norm1_context(encoder_in, silu_temb);
  at::Tensor attn_output, context_attn_output;
  if (seam && seam->cache && !seam->cache->taylorComputes()) {
    auto p = seam->cache->predict(seam->module);
    attn_output = p.at(0).to(hidden_in.scalar_type());
    context_attn_output = p.at(1).to(encoder_in.scalar_type());
  } else {
    std::tie(attn_output, context_attn_output) =
        attn(n.norm_hidden_states, nc.norm_hidden_states, cos, sin, attention);
    if (seam && seam->cache) seam->cache->update(seam->module, {attn_output, context_attn_output});
  }
  // Gated residuals x + gate * y as one addcmul each (one pass, one temporary fewer).
  at::Tensor hidden = at::addcmul(hidden_in, n.gate_msa.unsqueeze(1), attn_output);
  hidden =
      at::addcmul(hidden, n.gate_mlp.unsqueeze(1), ff(modulate(hidden, n.scale_mlp, n.shift_mlp)));
  at::Tensor encoder = at::addcmul(encoder_in, nc.gate_msa.unsqueeze(1), context_attn_output);
  encoder = at::addcmul(encoder, nc.gate_mlp.unsqueeze(1),
                        ff_context(modulate(encoder, nc.scale_mlp, nc.shift_mlp)));
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
                                                  const AttentionBackend& attention,
                                                  const AttentionCacheSeam* seam) const {
  const auto n = norm(x, silu_temb);
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
    mlp_hidden_states = geluTanh(mlpIn);
  }
  at::Tensor attn_output;
  if (seam && seam->cache && !seam->cache->taylorComputes()) {
    attn_output = seam->cache->predict(seam->module).at(0).to(x.scalar_type());
  } else {
    attn_output = attn.attendProjected(parts[0], parts[1], parts[2], cos, sin, attention);
    if (seam && seam->cache) seam->cache->update(seam->module, {attn_output});
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
