#include "backend/flux_transformer.h"

#include <ATen/ATen.h>

#include <cmath>

#include "backend/flux_plan.h"
#include "backend/weights.h"
#include "parallel/attention.h"
#include "parallel/context_parallel.h"
#include "parallel/process_group.h"
#include "parallel/strategy.h"

namespace dit {

int FluxParallelism::tpRank() const { return tp ? tp->rank() : 0; }
int FluxParallelism::tpSize() const { return tp ? tp->size() : 1; }

const std::vector<TensorParallelRule>& fluxTensorParallelPlan() {
  using R = TensorParallelRule;
  static const std::vector<R> plan = {
      {"attn.to_q", R::Colwise, false},        {"attn.to_k", R::Colwise, false},
      {"attn.to_v", R::Colwise, false},        {"attn.add_q_proj", R::Colwise, false},
      {"attn.add_k_proj", R::Colwise, false},  {"attn.add_v_proj", R::Colwise, false},
      {"ff.net.0.proj", R::Colwise, false},    {"ff_context.net.0.proj", R::Colwise, false},
      {"attn.to_out.0", R::Rowwise, false},    {"attn.to_add_out", R::Rowwise, false},
      {"ff.net.2", R::Rowwise, false},         {"ff_context.net.2", R::Rowwise, false},
      {"attn.to_q", R::Colwise, true},         {"attn.to_k", R::Colwise, true},
      {"attn.to_v", R::Colwise, true},         {"proj_mlp", R::Colwise, true},
      {"proj_out", R::PackedRowwise, true},
  };
  return plan;
}

std::string checkFluxTensorParallel(const FluxTransformerConfig& c, int tp) {
  // One set of rules and messages for the worker, the CLI, the GUI and the model itself.
  Strategy s;
  s.world = s.tp_degree = tp;
  const ModelDims m = fluxModelDims(c, 8);  // the VAE scale does not enter the model rules
  auto issues = validateDegrees(s);
  if (issues.empty()) issues = validateForModel(s, m);
  return joinIssues(issues);
}

namespace {

// Projections that share an input are fused at load time into one GEMM (weights concatenated
// along the output dimension, after tensor-parallel sharding): to_q/to_k/to_v,
// add_q/k/v_proj, and in single blocks to_q/to_k/to_v/proj_mlp. Numerically the same products.
struct DoubleBlock {
  Linear norm1, norm1c, qkv, aqkv, out, addOut, ff0, ff2, ffc0, ffc2;
  at::Tensor nq, nk, naq, nak;
};
struct SingleBlock {
  Linear norm, qkvm, out;
  at::Tensor nq, nk;
};

Linear fuse(std::initializer_list<Linear> parts) {
  std::vector<at::Tensor> w, b;
  for (const auto& p : parts) {
    w.push_back(p.weight);
    b.push_back(p.bias);
  }
  return Linear{at::cat(w, 0), at::cat(b, 0)};
}
struct MLPEmbed {
  Linear l1, l2;
  at::Tensor operator()(const at::Tensor& x) const { return l2(at::silu(l1(x))); }
};

// diffusers RMSNorm (eps 1e-6, affine): variance in float32.
at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& w) {
  const auto dt = x.scalar_type();
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor h = xf * at::rsqrt(xf.pow(2).mean(-1, true) + 1e-6);
  if (w.scalar_type() == at::kHalf || w.scalar_type() == at::kBFloat16) return h.to(w.scalar_type()) * w;
  return (h * w).to(dt);
}

at::Tensor layerNorm(const at::Tensor& x) {
  return at::layer_norm(x, {x.size(-1)}, {}, {}, 1e-6);
}

// get_timestep_embedding(t, 256, flip_sin_to_cos=True, downscale_freq_shift=0).
at::Tensor timestepProj(const at::Tensor& t, int64_t dim = 256) {
  const int64_t half = dim / 2;
  auto fo = at::TensorOptions().dtype(at::kFloat).device(t.device());
  at::Tensor ex = at::arange(0, half, fo) * (-std::log(10000.0)) / static_cast<double>(half);
  at::Tensor e = t.to(at::kFloat).unsqueeze(1) * at::exp(ex).unsqueeze(0);
  return at::cat({at::cos(e), at::sin(e)}, -1);
}

// apply_rotary_emb(use_real=True, unbind -1, sequence_dim=1): x [B, S, H, D], cos/sin [S, D].
at::Tensor applyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto sz = x.sizes();
  at::Tensor pairs = x.reshape({sz[0], sz[1], sz[2], sz[3] / 2, 2});
  at::Tensor re = pairs.select(-1, 0), im = pairs.select(-1, 1);
  at::Tensor rot = at::stack({-im, re}, -1).flatten(3);
  at::Tensor c = cos.unsqueeze(0).unsqueeze(2), s = sin.unsqueeze(0).unsqueeze(2);
  return (x.to(at::kFloat) * c + rot.to(at::kFloat) * s).to(x.scalar_type());
}

}  // namespace

struct FluxTransformer2DModel::Impl {
  FluxTransformerConfig cfg;
  FluxParallelism par;
  int tp = 1, tpRank = 0, headsLocal = 0;
  Linear xEmb, ctxEmb, normOut, projOut;
  MLPEmbed timeEmb, guidEmb, textEmb;
  bool hasGuidance = false;
  std::vector<DoubleBlock> doubles;
  std::vector<SingleBlock> singles;

  Linear col(WeightSource& w, const std::string& p, int64_t in, int64_t out) const {
    if (tp == 1) return loadLinear(w, p, in, out);
    return Linear{w.shard(p + ".weight", {out, in}, 0, tpRank, tp), w.shard(p + ".bias", {out}, 0, tpRank, tp)};
  }
  Linear row(WeightSource& w, const std::string& p, int64_t in, int64_t out) const {
    if (tp == 1) return loadLinear(w, p, in, out);
    return Linear{w.shard(p + ".weight", {out, in}, 1, tpRank, tp), w.get(p + ".bias", {out})};
  }
  Linear packedRow(WeightSource& w, const std::string& p, const std::vector<int64_t>& blocks, int64_t out) const {
    int64_t in = 0;
    for (auto b : blocks) in += b;
    if (tp == 1) return loadLinear(w, p, in, out);
    return Linear{w.packedShard(p + ".weight", {out, in}, 1, blocks, tpRank, tp), w.get(p + ".bias", {out})};
  }
  // RowwiseParallel output: partial sums AllReduced over the tp group, bias added once.
  at::Tensor rowwise(const Linear& l, const at::Tensor& x) const {
    if (tp == 1) return l(x);
    at::Tensor y = l.noBias(x).contiguous();
    par.tp->allreduce(y);
    return y + l.bias;
  }

  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const std::vector<int64_t>& localLens) const {
    // [B, S, H, D] -> [B, H, S, D]
    at::Tensor Q = q.transpose(1, 2), K = k.transpose(1, 2), V = v.transpose(1, 2);
    at::Tensor o = par.cp ? par.cp->attention(Q, K, V, localLens) : localAttention(Q, K, V);
    return o.transpose(1, 2).reshape({q.size(0), q.size(1), q.size(2) * q.size(3)});
  }

  at::Tensor heads(const at::Tensor& x) const {
    return x.reshape({x.size(0), x.size(1), headsLocal, cfg.attention_head_dim});
  }
};

FluxTransformer2DModel::FluxTransformer2DModel(const FluxTransformerConfig& cfg, WeightSource& w,
                                               FluxParallelism par)
    : d_(new Impl) {
  auto& D = *d_;
  D.cfg = cfg;
  D.par = par;
  D.tp = par.tpSize();
  D.tpRank = par.tpRank();
  if (auto msg = checkFluxTensorParallel(cfg, D.tp); !msg.empty()) throw std::invalid_argument(msg);
  D.headsLocal = cfg.num_attention_heads / D.tp;
  const int64_t C = cfg.innerDim(), M = cfg.mlpHidden();
  D.xEmb = loadLinear(w, "x_embedder", cfg.in_channels, C);
  D.ctxEmb = loadLinear(w, "context_embedder", cfg.joint_attention_dim, C);
  D.timeEmb = {loadLinear(w, "time_text_embed.timestep_embedder.linear_1", 256, C),
               loadLinear(w, "time_text_embed.timestep_embedder.linear_2", C, C)};
  D.hasGuidance = cfg.guidance_embeds;
  if (D.hasGuidance)
    D.guidEmb = {loadLinear(w, "time_text_embed.guidance_embedder.linear_1", 256, C),
                 loadLinear(w, "time_text_embed.guidance_embedder.linear_2", C, C)};
  D.textEmb = {loadLinear(w, "time_text_embed.text_embedder.linear_1", cfg.pooled_projection_dim, C),
               loadLinear(w, "time_text_embed.text_embedder.linear_2", C, C)};
  const int64_t hd = cfg.attention_head_dim;
  for (int i = 0; i < cfg.num_layers; ++i) {
    const std::string p = "transformer_blocks." + std::to_string(i) + ".";
    DoubleBlock b;
    b.norm1 = loadLinear(w, p + "norm1.linear", C, 6 * C);
    b.norm1c = loadLinear(w, p + "norm1_context.linear", C, 6 * C);
    b.qkv = fuse({D.col(w, p + "attn.to_q", C, C), D.col(w, p + "attn.to_k", C, C),
                  D.col(w, p + "attn.to_v", C, C)});
    b.aqkv = fuse({D.col(w, p + "attn.add_q_proj", C, C), D.col(w, p + "attn.add_k_proj", C, C),
                   D.col(w, p + "attn.add_v_proj", C, C)});
    b.nq = w.get(p + "attn.norm_q.weight", {hd});
    b.nk = w.get(p + "attn.norm_k.weight", {hd});
    b.naq = w.get(p + "attn.norm_added_q.weight", {hd});
    b.nak = w.get(p + "attn.norm_added_k.weight", {hd});
    b.out = D.row(w, p + "attn.to_out.0", C, C);
    b.addOut = D.row(w, p + "attn.to_add_out", C, C);
    b.ff0 = D.col(w, p + "ff.net.0.proj", C, M);
    b.ff2 = D.row(w, p + "ff.net.2", M, C);
    b.ffc0 = D.col(w, p + "ff_context.net.0.proj", C, M);
    b.ffc2 = D.row(w, p + "ff_context.net.2", M, C);
    D.doubles.push_back(std::move(b));
  }
  for (int i = 0; i < cfg.num_single_layers; ++i) {
    const std::string p = "single_transformer_blocks." + std::to_string(i) + ".";
    SingleBlock b;
    b.norm = loadLinear(w, p + "norm.linear", C, 3 * C);
    b.qkvm = fuse({D.col(w, p + "attn.to_q", C, C), D.col(w, p + "attn.to_k", C, C),
                   D.col(w, p + "attn.to_v", C, C), D.col(w, p + "proj_mlp", C, M)});
    b.nq = w.get(p + "attn.norm_q.weight", {hd});
    b.nk = w.get(p + "attn.norm_k.weight", {hd});
    b.out = D.packedRow(w, p + "proj_out", {C, M}, C);
    D.singles.push_back(std::move(b));
  }
  D.normOut = loadLinear(w, "norm_out.linear", C, 2 * C);
  D.projOut = loadLinear(w, "proj_out", C, cfg.out_channels);
}

FluxTransformer2DModel::~FluxTransformer2DModel() = default;
const FluxTransformerConfig& FluxTransformer2DModel::config() const { return d_->cfg; }

at::Tensor FluxTransformer2DModel::forward(const at::Tensor& hidden_states,
                                           const at::Tensor& encoder_hidden_states,
                                           const at::Tensor& pooled, const at::Tensor& timestep,
                                           const at::Tensor& img_ids, const at::Tensor& txt_ids,
                                           const at::Tensor& guidance) const {
  const auto& D = *d_;
  const auto& cfg = D.cfg;
  const auto dt = D.xEmb.weight.scalar_type();
  const auto dev = D.xEmb.weight.device();
  const int64_t B = hidden_states.size(0);
  const int64_t Simg = hidden_states.size(1), Stxt = encoder_hidden_states.size(1);

  // Context parallel: this rank's slice of the text and of the image tokens.
  std::vector<int64_t> txtSizes{Stxt}, imgSizes{Simg}, localLens{Stxt + Simg};
  at::Tensor hs = hidden_states.to(dev, dt), enc = encoder_hidden_states.to(dev, dt);
  at::Tensor tIds = txt_ids.to(dev), iIds = img_ids.to(dev);
  if (D.par.cp) {
    txtSizes = D.par.cp->partition(Stxt);
    imgSizes = D.par.cp->partition(Simg);
    localLens.clear();
    for (size_t r = 0; r < txtSizes.size(); ++r) localLens.push_back(txtSizes[r] + imgSizes[r]);
    auto [ts, tl] = D.par.cp->localRange(Stxt);
    auto [is, il] = D.par.cp->localRange(Simg);
    enc = enc.narrow(1, ts, tl);
    tIds = tIds.narrow(0, ts, tl);
    hs = hs.narrow(1, is, il);
    iIds = iIds.narrow(0, is, il);
  }
  const int64_t txtLocal = enc.size(1);

  // Conditioning: CombinedTimestep(Guidance)TextProjEmbeddings.
  at::Tensor t = timestep.to(dev, dt) * 1000;
  at::Tensor temb = D.timeEmb(timestepProj(t).to(dt));
  if (D.hasGuidance) {
    if (!guidance.defined()) throw std::invalid_argument("this transformer needs a guidance value (guidance_embeds)");
    at::Tensor g = guidance.to(dev, dt) * 1000;
    temb = temb + D.guidEmb(timestepProj(g).to(dt));
  }
  temb = temb + D.textEmb(pooled.to(dev, dt));
  at::Tensor stemb = at::silu(temb);

  hs = D.xEmb(hs);
  enc = D.ctxEmb(enc);

  // FluxPosEmbed(theta=10000, axes_dim): float64 tables cast to float32.
  at::Tensor ids = at::cat({tIds, iIds}, 0).to(at::kDouble);
  std::vector<at::Tensor> cosParts, sinParts;
  for (size_t a = 0, n = cfg.axes_dims_rope.size(); a < n; ++a) {
    const int64_t dim = cfg.axes_dims_rope[a];
    auto o64 = at::TensorOptions().dtype(at::kDouble).device(dev);
    at::Tensor freqs = 1.0 / at::pow(10000.0, at::arange(0, dim, 2, o64).slice(0, 0, dim / 2) / static_cast<double>(dim));
    at::Tensor f = at::outer(ids.select(1, static_cast<int64_t>(a)), freqs);
    cosParts.push_back(f.cos().repeat_interleave(2, 1).to(at::kFloat));
    sinParts.push_back(f.sin().repeat_interleave(2, 1).to(at::kFloat));
  }
  const at::Tensor cos = at::cat(cosParts, -1), sin = at::cat(sinParts, -1);

  auto mod = [](const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift) {
    return layerNorm(x) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
  };
  auto gelu = [](const at::Tensor& x) { return at::gelu(x, "tanh"); };

  for (const auto& b : D.doubles) {
    auto e = b.norm1(stemb).chunk(6, 1);
    auto ec = b.norm1c(stemb).chunk(6, 1);
    at::Tensor nh = mod(hs, e[1], e[0]);
    at::Tensor nc = mod(enc, ec[1], ec[0]);
    const int64_t Cl = static_cast<int64_t>(D.headsLocal) * cfg.attention_head_dim;
    auto x3 = b.qkv(nh).split(Cl, -1);
    auto c3 = b.aqkv(nc).split(Cl, -1);
    at::Tensor q = rmsNorm(D.heads(x3[0]), b.nq), k = rmsNorm(D.heads(x3[1]), b.nk),
               v = D.heads(x3[2]);
    at::Tensor cq = rmsNorm(D.heads(c3[0]), b.naq), ck = rmsNorm(D.heads(c3[1]), b.nak),
               cv = D.heads(c3[2]);
    q = applyRope(at::cat({cq, q}, 1), cos, sin);
    k = applyRope(at::cat({ck, k}, 1), cos, sin);
    v = at::cat({cv, v}, 1);
    at::Tensor a = D.attend(q, k, v, localLens).to(dt);
    at::Tensor ac = a.narrow(1, 0, txtLocal), ai = a.narrow(1, txtLocal, a.size(1) - txtLocal);
    ai = D.rowwise(b.out, ai);
    ac = D.rowwise(b.addOut, ac);
    hs = hs + e[2].unsqueeze(1) * ai;
    hs = hs + e[5].unsqueeze(1) * D.rowwise(b.ff2, gelu(b.ff0(mod(hs, e[4], e[3]))));
    enc = enc + ec[2].unsqueeze(1) * ac;
    enc = enc + ec[5].unsqueeze(1) * D.rowwise(b.ffc2, gelu(b.ffc0(mod(enc, ec[4], ec[3]))));
    if (dt == at::kHalf) enc = enc.clamp(-65504, 65504);
  }
  at::Tensor x = at::cat({enc, hs}, 1);
  for (const auto& b : D.singles) {
    auto e = b.norm(stemb).chunk(3, 1);
    at::Tensor nx = mod(x, e[1], e[0]);
    const int64_t Cl = static_cast<int64_t>(D.headsLocal) * cfg.attention_head_dim;
    auto parts = b.qkvm(nx).split_with_sizes({Cl, Cl, Cl, b.qkvm.weight.size(0) - 3 * Cl}, -1);
    at::Tensor mlp = gelu(parts[3]);
    at::Tensor q = applyRope(rmsNorm(D.heads(parts[0]), b.nq), cos, sin);
    at::Tensor k = applyRope(rmsNorm(D.heads(parts[1]), b.nk), cos, sin);
    at::Tensor v = D.heads(parts[2]);
    at::Tensor a = D.attend(q, k, v, localLens).to(dt);
    x = x + e[2].unsqueeze(1) * D.rowwise(b.out, at::cat({a, mlp}, 2));
    if (dt == at::kHalf) x = x.clamp(-65504, 65504);
  }
  hs = x.narrow(1, txtLocal, x.size(1) - txtLocal);
  auto e = D.normOut(stemb).to(dt).chunk(2, 1);  // AdaLayerNormContinuous: scale, shift
  hs = layerNorm(hs) * (1 + e[0].unsqueeze(1)) + e[1].unsqueeze(1);
  at::Tensor out = D.projOut(hs);
  if (D.par.cp) out = D.par.cp->gatherSequence(out.contiguous(), imgSizes);
  (void)B;
  return out;
}

double FluxTransformer2DModel::flops(const FluxTransformerConfig& c, int64_t img, int64_t txt) {
  const double C = c.innerDim(), M = c.mlpHidden(), S = static_cast<double>(img + txt);
  const double attn = 4.0 * S * S * C;
  const double dbl = 2.0 * S * C * C * 4 + 2.0 * S * C * M * 2 + attn;  // qkv+out, ff up+down
  const double sgl = 2.0 * S * C * C * 3 + 2.0 * S * C * M + 2.0 * S * (C + M) * C + attn;
  return c.num_layers * dbl + c.num_single_layers * sgl;
}

}  // namespace dit
