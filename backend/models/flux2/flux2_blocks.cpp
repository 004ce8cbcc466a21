#include "backend/models/flux2/flux2_blocks.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <tuple>
#include <vector>

#include "backend/io/weight_loader.h"
#include "backend/nn/fused_ops.h"
#include "parallel/context_parallel.h"

namespace dit::flux2 {

using nn::Modulation;

namespace {

// to_out's input cat(a, silu(gate) * value) [B, S, C_local + M_local]. float32 on the CPU: the
// SwiGLU written straight into its right-hand part (nn::siluMulCpu), only a copied in.
at::Tensor attnAndSwiGLU(const at::Tensor& a, const at::Tensor& gate, const at::Tensor& value) {
  if (!nn::fusedRowsApply(gate) || !nn::fusedRowsApply(a) || a.dim() != gate.dim())
    return at::cat({a, at::silu(gate) * value}, -1);
  std::vector<int64_t> shape = gate.sizes().vec();
  const int64_t ca = a.size(-1), m = gate.size(-1);
  shape.back() = ca + m;
  at::Tensor buf = at::empty(shape, gate.options().memory_format(at::MemoryFormat::Contiguous));
  nn::siluMulCpu(gate, value, buf.narrow(-1, ca, m));
  buf.narrow(-1, 0, ca).copy_(a);
  return buf;
}

// The part of a reference K or V [B, S_ref, H_local, D] this rank keeps: under Ulysses only the
// heads it attends over after the all-to-all (ContextParallel::ulyssesHeads), else all.
at::Tensor keptHeads(const nn::AttentionBackend& attention, const at::Tensor& t) {
  if (!attention.cp) return t;
  const auto [h0, n] = attention.cp->ulyssesHeads(t.size(2));
  return n == t.size(2) ? t : t.narrow(2, h0, n).contiguous();
}

}  // namespace

Flux2TransformerBlock::Flux2TransformerBlock(WeightLoader& w, const std::string& p, int64_t C,
                                             int64_t M, int64_t hd)
    : attn(w, p + ".attn", C, hd, /*added_kv=*/true, 0, /*bias=*/false),
      ff(w, p + ".ff", C, M),
      ff_context(w, p + ".ff_context", C, M) {}

std::pair<at::Tensor, at::Tensor> Flux2TransformerBlock::operator()(
    at::Tensor hs, at::Tensor enc, const std::vector<Modulation::Params>& mi,
    const std::vector<Modulation::Params>& mt, const at::Tensor& cos, const at::Tensor& sin,
    const nn::AttentionBackend& attention, const nn::AttentionCacheSeam* seam) const {
  const at::Tensor n = Modulation::apply(hs, mi[0]);
  const at::Tensor nc = Modulation::apply(enc, mt[0]);
  at::Tensor attn_output, context_attn_output;
  if (nn::cachePredicts(seam)) {
    auto p = nn::cachePrediction(*seam);
    attn_output = p.at(0).to(hs.scalar_type());
    context_attn_output = p.at(1).to(enc.scalar_type());
  } else {
    std::tie(attn_output, context_attn_output) = attn(n, nc, cos, sin, attention);
    if (seam) nn::cacheRecord(seam, {attn_output, context_attn_output});
  }
  // Gated residuals x + gate * y as one addcmul each (one pass, one temporary fewer).
  hs = at::addcmul(hs, mi[0].gate, attn_output);
  hs = at::addcmul(hs, mi[1].gate, ff(Modulation::apply(hs, mi[1])));
  enc = at::addcmul(enc, mt[0].gate, context_attn_output);
  enc = at::addcmul(enc, mt[1].gate, ff_context(Modulation::apply(enc, mt[1])));
  if (enc.scalar_type() == at::kHalf) enc = enc.clamp(-65504, 65504);
  return {enc, hs};
}

std::pair<at::Tensor, at::Tensor> Flux2TransformerBlock::forwardKV(
    at::Tensor hs, at::Tensor enc, const std::vector<Modulation::Params>& mi,
    const std::vector<Modulation::Params>& mt, const at::Tensor& cos, const at::Tensor& sin,
    const nn::AttentionBackend& attention, const nn::AttentionCacheSeam* seam, Flux2LayerKV& kv,
    Flux2ReferenceStream* ref) const {
  if (ref) {
    // The references: image-stream weights, their own modulation, self-attention only.
    at::Tensor r = ref->hidden;
    const auto& mr = ref->mod_img;
    auto [ar, k, v] = attn.referenceAttention(Modulation::apply(r, mr[0]), ref->cos, ref->sin);
    kv.k = keptHeads(attention, k);
    kv.v = keptHeads(attention, v);
    r = at::addcmul(r, mr[0].gate, ar);
    r = at::addcmul(r, mr[1].gate, ff(Modulation::apply(r, mr[1])));
    ref->hidden = r;
  }
  if (!kv.k.defined())
    throw std::logic_error("Flux2TransformerBlock: the reference K/V cache is empty");
  at::Tensor attn_output, context_attn_output;
  if (nn::cachePredicts(seam)) {
    auto p = nn::cachePrediction(*seam);
    attn_output = p.at(0).to(hs.scalar_type());
    context_attn_output = p.at(1).to(enc.scalar_type());
  } else {
    std::tie(attn_output, context_attn_output) =
        attn(Modulation::apply(hs, mi[0]), Modulation::apply(enc, mt[0]), cos, sin, attention, kv.k,
             kv.v);
    if (seam) nn::cacheRecord(seam, {attn_output, context_attn_output});
  }
  // Gated residuals x + gate * y as one addcmul each (one pass, one temporary fewer).
  hs = at::addcmul(hs, mi[0].gate, attn_output);
  hs = at::addcmul(hs, mi[1].gate, ff(Modulation::apply(hs, mi[1])));
  enc = at::addcmul(enc, mt[0].gate, context_attn_output);
  enc = at::addcmul(enc, mt[1].gate, ff_context(Modulation::apply(enc, mt[1])));
  if (enc.scalar_type() == at::kHalf) enc = enc.clamp(-65504, 65504);
  return {enc, hs};
}

Flux2SingleTransformerBlock::Flux2SingleTransformerBlock(WeightLoader& w, const std::string& p,
                                                         int64_t C, int64_t M, int64_t hd)
    : to_qkv_mlp_proj(w.linear(p + ".attn.to_qkv_mlp_proj", C, 3 * C + 2 * M, false)),
      to_out(w.linear(p + ".attn.to_out", C + M, C, false)),
      attn(w, p + ".attn", C, hd, /*added_kv=*/false, C / w.tpSize() / hd),
      cLocal(C / w.tpSize()),
      mLocal(M / w.tpSize()) {}

at::Tensor Flux2SingleTransformerBlock::operator()(const at::Tensor& x,
                                                   const std::vector<Modulation::Params>& m,
                                                   const at::Tensor& cos, const at::Tensor& sin,
                                                   const nn::AttentionBackend& attention,
                                                   const nn::AttentionCacheSeam* seam) const {
  at::Tensor out;
  if (nn::cachePredicts(seam)) {
    out = nn::cachePrediction(*seam).at(0).to(x.scalar_type());
  } else {
    const at::Tensor h = to_qkv_mlp_proj->forward(Modulation::apply(x, m[0]));
    // Local rows: [q, k, v] (cLocal each), then [gate, value] (mLocal each).
    at::Tensor q = h.narrow(-1, 0, cLocal), k = h.narrow(-1, cLocal, cLocal),
               v = h.narrow(-1, 2 * cLocal, cLocal);
    at::Tensor gate = h.narrow(-1, 3 * cLocal, mLocal),
               value = h.narrow(-1, 3 * cLocal + mLocal, mLocal);
    at::Tensor a = attn.attendProjected(q, k, v, cos, sin, attention);
    out = to_out->forward(attnAndSwiGLU(a, gate, value));
    if (seam) nn::cacheRecord(seam, {out});
  }
  at::Tensor y = at::addcmul(x, m[0].gate, out);
  if (y.scalar_type() == at::kHalf) y = y.clamp(-65504, 65504);
  return y;
}

at::Tensor Flux2SingleTransformerBlock::forwardKV(
    const at::Tensor& x, const std::vector<Modulation::Params>& m, const at::Tensor& cos,
    const at::Tensor& sin, const nn::AttentionBackend& attention,
    const nn::AttentionCacheSeam* seam, Flux2LayerKV& kv, Flux2ReferenceStream* ref) const {
  // Local rows of to_qkv_mlp_proj: [q, k, v] (cLocal each), then [gate, value] (mLocal each).
  // to_out's input cat(attention, silu(gate) * value).
  auto toOutInput = [this](const at::Tensor& a, const at::Tensor& h) {
    return attnAndSwiGLU(a, h.narrow(-1, 3 * cLocal, mLocal),
                         h.narrow(-1, 3 * cLocal + mLocal, mLocal));
  };
  if (ref) {
    const at::Tensor& r = ref->hidden;
    const auto& mr = ref->mod_single;
    const at::Tensor h = to_qkv_mlp_proj->forward(Modulation::apply(r, mr[0]));
    auto [a, k, v] = attn.referenceProjected(h.narrow(-1, 0, cLocal), h.narrow(-1, cLocal, cLocal),
                                             h.narrow(-1, 2 * cLocal, cLocal), ref->cos, ref->sin);
    kv.k = keptHeads(attention, k);
    kv.v = keptHeads(attention, v);
    at::Tensor y = at::addcmul(r, mr[0].gate, to_out->forward(toOutInput(a, h)));
    if (y.scalar_type() == at::kHalf) y = y.clamp(-65504, 65504);
    ref->hidden = y;
  }
  if (!kv.k.defined())
    throw std::logic_error("Flux2SingleTransformerBlock: the reference K/V cache is empty");
  at::Tensor out;
  if (nn::cachePredicts(seam)) {
    out = nn::cachePrediction(*seam).at(0).to(x.scalar_type());
  } else {
    const at::Tensor h = to_qkv_mlp_proj->forward(Modulation::apply(x, m[0]));
    at::Tensor a =
        attn.attendProjected(h.narrow(-1, 0, cLocal), h.narrow(-1, cLocal, cLocal),
                             h.narrow(-1, 2 * cLocal, cLocal), cos, sin, attention, kv.k, kv.v);
    out = to_out->forward(toOutInput(a, h));
    if (seam) nn::cacheRecord(seam, {out});
  }
  at::Tensor y = at::addcmul(x, m[0].gate, out);
  if (y.scalar_type() == at::kHalf) y = y.clamp(-65504, 65504);
  return y;
}

}  // namespace dit::flux2
