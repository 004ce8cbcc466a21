#include "backend/nn/attention.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <stdexcept>
#include <string>

#include "backend/nn/embeddings.h"
#include "backend/nn/qk_norm_rope.h"
#include "parallel/attention.h"
#include "parallel/context_parallel.h"

namespace dit::nn {

bool cachePredicts(const AttentionCacheSeam* seam) {
  return seam && seam->cache && !seam->cache->taylorComputes();
}

std::vector<at::Tensor> cachePrediction(const AttentionCacheSeam& seam) {
  return seam.cache->predict(seam.module);
}

void cacheRecord(const AttentionCacheSeam* seam, const std::vector<at::Tensor>& outputs) {
  if (seam && seam->cache) seam->cache->update(seam->module, outputs);
}

// diffusers RMSNorm (eps, affine): variance in float32; half/bfloat16 weights multiply in
// their dtype, float32 weights in float32 then cast back.
at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  const auto dt = x.scalar_type();
  at::Tensor xf = x.to(at::kFloat);
  // square / in-place add_ and mul_: the same arithmetic as pow(2) + eps and out-of-place
  // products, with fewer temporaries (one thread, [1, 320, 8, 64] bfloat16: 0.17 -> 0.14 ms on
  // LibTorch 1.13, 0.21 -> 0.15 ms on 2.6). Training (autograd) keeps the out-of-place form.
  if (x.requires_grad() && at::GradMode::is_enabled()) {
    at::Tensor h = xf * at::rsqrt(xf.square().mean(-1, true) + eps);
    if (w.scalar_type() == at::kHalf || w.scalar_type() == at::kBFloat16)
      return h.to(w.scalar_type()) * w;
    return (h * w).to(dt);
  }
  at::Tensor h = xf * at::rsqrt(xf.square().mean(-1, true).add_(eps));
  if (w.scalar_type() == at::kHalf || w.scalar_type() == at::kBFloat16)
    return h.to(w.scalar_type()).mul_(w);
  return h.mul_(w).to(dt);
}

namespace {

// RoPE(RMSNorm(.)) of the text part tx (undefined: none) and the image part x, each [B, S_part,
// H, D], into one [B, S_txt + S_img, H, D] result stored head-major (a transposed view of a
// contiguous [B, H, S, D] tensor, which the attention reads without copies); cos/sin [S, D] for the
// joint sequence. The CPU kernel nn::rmsNormRopeCpuOut (diffusers' roundings, one pass).
at::Tensor normRopeJoint(const at::Tensor& tx, const at::Tensor& tw, const at::Tensor& x,
                         const at::Tensor& w, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t st = tx.defined() ? tx.size(1) : 0, S = st + x.size(1);
  if (cos.size(0) != S || sin.size(0) != S)
    throw std::invalid_argument("JointAttention: rotary tables hold " +
                                std::to_string(cos.size(0)) + " positions for " +
                                std::to_string(S) + " tokens");
  at::Tensor out = at::empty({x.size(0), x.size(2), S, x.size(3)}, x.options()).transpose(1, 2);
  if (st > 0)
    rmsNormRopeCpuOut(tx, tw, 1e-6, cos.narrow(0, 0, st), sin.narrow(0, 0, st),
                      out.narrow(1, 0, st));
  rmsNormRopeCpuOut(x, w, 1e-6, cos.narrow(0, st, S - st), sin.narrow(0, st, S - st),
                    out.narrow(1, st, S - st));
  return out;
}

}  // namespace

at::Tensor AttentionBackend::operator()(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v) const {
  // [B, S, H, D] -> [B, H, S, D]
  at::Tensor Q = q.transpose(1, 2), K = k.transpose(1, 2), V = v.transpose(1, 2);
  at::Tensor o = cp ? cp->attention(Q, K, V, localLens) : localAttention(Q, K, V);
  return o.transpose(1, 2).reshape({q.size(0), q.size(1), q.size(2) * q.size(3)});
}

at::Tensor AttentionBackend::operator()(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& refK,
                                        const at::Tensor& refV) const {
  // [B, S, H, D] -> [B, H, S, D]
  at::Tensor Q = q.transpose(1, 2), K = k.transpose(1, 2), V = v.transpose(1, 2);
  at::Tensor RK = refK.transpose(1, 2), RV = refV.transpose(1, 2);
  at::Tensor o = cp ? cp->attention(Q, K, V, localLens, RK, RV)
                    : localAttention(Q, at::cat({K, RK}, 2), at::cat({V, RV}, 2));
  return o.transpose(1, 2).reshape({q.size(0), q.size(1), q.size(2) * q.size(3)});
}

at::Tensor localSelfAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  at::Tensor o = localAttention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
  return o.transpose(1, 2).reshape({q.size(0), q.size(1), q.size(2) * q.size(3)});
}

JointAttention::JointAttention(WeightLoader& w, const std::string& p, int64_t C, int64_t headDim,
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

at::Tensor JointAttention::heads(const at::Tensor& x) const {
  return x.reshape({x.size(0), x.size(1), headsLocal_, headDim_});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> JointAttention::jointQkv(
    const at::Tensor& hidden, const at::Tensor& encoder, const at::Tensor& cos,
    const at::Tensor& sin) const {
  auto x3 = qkv->forwardParts(hidden);
  auto c3 = add_qkv->forwardParts(encoder);
  at::Tensor q, k, v;
  if (rmsNormRopeCpuApplies(heads(x3[0]), norm_q) &&
      rmsNormRopeCpuApplies(heads(c3[0]), norm_added_q)) {
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
    q = applyRotaryEmb(at::cat({cq, q}, 1), cos, sin);
    k = applyRotaryEmb(at::cat({ck, k}, 1), cos, sin);
    v = at::cat({cv, v}, 1);
  }
  return {q, k, v};
}

std::pair<at::Tensor, at::Tensor> JointAttention::jointOutputs(const at::Tensor& a,
                                                               int64_t txt) const {
  at::Tensor ac = a.narrow(1, 0, txt), ai = a.narrow(1, txt, a.size(1) - txt);
  ai = to_out->forward(ai);
  ac = to_add_out->forward(ac);
  return {ai, ac};
}

std::pair<at::Tensor, at::Tensor> JointAttention::operator()(
    const at::Tensor& hidden, const at::Tensor& encoder, const at::Tensor& cos,
    const at::Tensor& sin, const AttentionBackend& attention) const {
  const auto dt = hidden.scalar_type();
  auto [q, k, v] = jointQkv(hidden, encoder, cos, sin);
  return jointOutputs(attention(q, k, v).to(dt), encoder.size(1));
}

std::pair<at::Tensor, at::Tensor> JointAttention::normRope(const at::Tensor& q_in,
                                                           const at::Tensor& k_in,
                                                           const at::Tensor& cos,
                                                           const at::Tensor& sin) const {
  if (rmsNormRopeCpuApplies(heads(q_in), norm_q))
    return {normRopeJoint({}, {}, heads(q_in), norm_q, cos, sin),
            normRopeJoint({}, {}, heads(k_in), norm_k, cos, sin)};
  return {applyRotaryEmb(rmsNorm(heads(q_in), norm_q), cos, sin),
          applyRotaryEmb(rmsNorm(heads(k_in), norm_k), cos, sin)};
}

at::Tensor JointAttention::attendProjected(const at::Tensor& q_in, const at::Tensor& k_in,
                                           const at::Tensor& v_in, const at::Tensor& cos,
                                           const at::Tensor& sin,
                                           const AttentionBackend& attention) const {
  const auto dt = q_in.scalar_type();
  auto [q, k] = normRope(q_in, k_in, cos, sin);
  at::Tensor v = heads(v_in);
  return attention(q, k, v).to(dt);
}

std::pair<at::Tensor, at::Tensor> JointAttention::operator()(
    const at::Tensor& hidden, const at::Tensor& encoder, const at::Tensor& cos,
    const at::Tensor& sin, const AttentionBackend& attention, const at::Tensor& refK,
    const at::Tensor& refV) const {
  const auto dt = hidden.scalar_type();
  auto [q, k, v] = jointQkv(hidden, encoder, cos, sin);
  return jointOutputs(attention(q, k, v, refK, refV).to(dt), encoder.size(1));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> JointAttention::referenceAttention(
    const at::Tensor& ref, const at::Tensor& cos, const at::Tensor& sin) const {
  const auto dt = ref.scalar_type();
  auto x3 = qkv->forwardParts(ref);
  auto [a, k, v] = referenceProjected(x3[0], x3[1], x3[2], cos, sin);
  return {to_out->forward(a.to(dt)), k, v};
}

at::Tensor JointAttention::attendProjected(const at::Tensor& q_in, const at::Tensor& k_in,
                                           const at::Tensor& v_in, const at::Tensor& cos,
                                           const at::Tensor& sin, const AttentionBackend& attention,
                                           const at::Tensor& refK, const at::Tensor& refV) const {
  const auto dt = q_in.scalar_type();
  auto [q, k] = normRope(q_in, k_in, cos, sin);
  return attention(q, k, heads(v_in), refK, refV).to(dt);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> JointAttention::referenceProjected(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& cos,
    const at::Tensor& sin) const {
  const auto dt = q_in.scalar_type();
  auto [q, k] = normRope(q_in, k_in, cos, sin);
  at::Tensor v = heads(v_in);
  return {localSelfAttention(q, k, v).to(dt), k, v};
}

}  // namespace dit::nn
