// Tensor-parallel layers (parallel/tensor_parallel/layers.h) and the context-parallel plan runner
// (parallel/context_parallel_plan.h) under mpirun with 2 and 4 ranks: every parallel computation
// equals the dense / unsplit one in float32 within 1e-5. Weights are random with a fixed seed,
// identical on every rank, and sharded with ShardingPlan::shardSpec + shardTensor (narrow).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/attention.h"
#include "parallel/context_parallel.h"
#include "parallel/context_parallel_plan.h"
#include "parallel/device_mesh.h"
#include "parallel/strategy.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/sharding_plan.h"

using dit::ContextParallel;
using dit::ParallelStyle;
using dit::ShardingPlan;
using dit::ShardSpec;
using namespace dit::tensor_parallel;

namespace {

constexpr double kTol = 1e-5;

int worldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int worldSize() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Max over ranks of a local value (every rank's verdict counts).
double maxOverRanks(double v) {
  double out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

double maxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return 1e30;
  return (a - b).abs().max().item<double>();
}

// A tp group over every rank (tp_degree = world).
std::unique_ptr<dit::DeviceMesh> tpMesh() {
  dit::Strategy s;
  s.world = s.tp_degree = worldSize();
  dit::DeviceMeshOptions o;
  o.timeout_s = 120;
  return std::make_unique<dit::DeviceMesh>(s, MPI_COMM_WORLD, o);
}

// A two-layer MLP and a FLUX-like single block, as the plan rules name them.
ShardingPlan testPlan(int64_t C, int64_t M) {
  return ShardingPlan({{"mlp.fc1", ParallelStyle::Colwise, {}},
                       {"mlp.fc2", ParallelStyle::Rowwise, {}},
                       {"single.*.attn.to_q", ParallelStyle::Colwise, {}},
                       {"single.*.attn.to_k", ParallelStyle::Colwise, {}},
                       {"single.*.attn.to_v", ParallelStyle::Colwise, {}},
                       {"single.*.proj_mlp", ParallelStyle::Colwise, {}},
                       {"single.*.proj_out", ParallelStyle::PackedRowwise, {C, M}},
                       {"packed.gate_up", ParallelStyle::PackedColwise, {M, M}}});
}

struct Dense {
  at::Tensor w, b;
};
Dense randomLinear(int64_t in, int64_t out) {
  return {at::randn({out, in}) / std::sqrt(double(in)), at::randn({out})};
}

std::vector<int64_t> shapeOf(const at::Tensor& t) {
  return std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
}

// Shards a dense layer as rank `rank` of `size` under the plan.
struct Shard {
  at::Tensor w, b;
  ShardSpec spec;
};
Shard shard(const ShardingPlan& plan, const std::string& module, const Dense& d, int rank,
            int size) {
  const ShardSpec ws = plan.shardSpec(module + ".weight", shapeOf(d.w), rank, size);
  const ShardSpec bs = plan.shardSpec(module + ".bias", shapeOf(d.b), rank, size);
  return {shardTensor(d.w, ws), shardTensor(d.b, bs), ws};
}

}  // namespace

TEST(TensorParallelLayers, ColumnThenRowEqualsDense) {
  auto mesh = tpMesh();
  auto tp = mesh->group("tp");
  const int64_t C = 16, M = 64;
  at::manual_seed(7);
  const Dense fc1 = randomLinear(C, M), fc2 = randomLinear(M, C);
  const at::Tensor x = at::randn({2, 5, C});
  const ShardingPlan plan = testPlan(C, M);
  const Shard s1 = shard(plan, "mlp.fc1", fc1, tp->rank(), tp->size());
  const Shard s2 = shard(plan, "mlp.fc2", fc2, tp->rank(), tp->size());
  EXPECT_EQ(s1.w.size(0), M / tp->size());
  EXPECT_EQ(s2.w.size(1), M / tp->size());
  EXPECT_EQ(s2.b.size(0), C);  // rowwise bias replicated

  ColumnParallelLinear col("mlp.fc1", s1.w, s1.b, s1.spec, tp);
  RowParallelLinear row("mlp.fc2", s2.w, s2.b, s2.spec, tp);
  const at::Tensor y = row.forward(at::gelu(col.forward(x)));
  const at::Tensor ref = at::linear(at::gelu(at::linear(x, fc1.w, fc1.b)), fc2.w, fc2.b);
  EXPECT_LT(maxOverRanks(maxAbsDiff(y, ref)), kTol);

  // The bias is added once: adding it on every rank before the reduce is off by (tp-1) * b.
  at::Tensor wrong = at::linear(at::gelu(col.forward(x)), s2.w, s2.b).contiguous();
  tp->allreduce(wrong)->wait();
  EXPECT_GT(maxOverRanks(maxAbsDiff(wrong, ref)), 1e-2);
}

TEST(TensorParallelLayers, GatherOutputEqualsDense) {
  auto mesh = tpMesh();
  auto tp = mesh->group("tp");
  const int64_t C = 16, M = 32;
  at::manual_seed(11);
  const Dense fc1 = randomLinear(C, M);
  const at::Tensor x = at::randn({3, C});
  const ShardingPlan plan = testPlan(C, M);
  const Shard s = shard(plan, "mlp.fc1", fc1, tp->rank(), tp->size());
  ColumnParallelLinear gathered("mlp.fc1", s.w, s.b, s.spec, tp, /*gatherOutput=*/true);
  EXPECT_LT(maxOverRanks(maxAbsDiff(gathered.forward(x), at::linear(x, fc1.w, fc1.b))), kTol);
  // Without gather: this rank's slice of the outputs.
  ColumnParallelLinear local("mlp.fc1", s.w, s.b, s.spec, tp);
  const int64_t n = M / tp->size();
  EXPECT_LT(maxOverRanks(maxAbsDiff(local.forward(x),
                                    at::linear(x, fc1.w, fc1.b).narrow(-1, tp->rank() * n, n))),
            kTol);
}

TEST(TensorParallelLayers, PackedColwiseShardsEachBlock) {
  auto mesh = tpMesh();
  auto tp = mesh->group("tp");
  const int64_t C = 16, M = 24;  // gate_up [2M, C] = cat(gate [M], up [M]) (SwiGLU)
  at::manual_seed(13);
  const Dense gu = randomLinear(C, 2 * M);
  const at::Tensor x = at::randn({2, 3, C});
  const ShardingPlan plan = testPlan(C, M);
  const Shard s = shard(plan, "packed.gate_up", gu, tp->rank(), tp->size());
  EXPECT_EQ(s.spec.blocks, (std::vector<int64_t>{M, M}));
  ColumnParallelLinear local("packed.gate_up", s.w, s.b, s.spec, tp);
  const at::Tensor ref = at::linear(x, gu.w, gu.b);
  const int64_t n = M / tp->size(), r = tp->rank();
  // Local output = [gate slice r, up slice r]: SwiGLU can be applied locally.
  const at::Tensor expect = at::cat({ref.narrow(-1, r * n, n), ref.narrow(-1, M + r * n, n)}, -1);
  EXPECT_LT(maxOverRanks(maxAbsDiff(local.forward(x), expect)), kTol);
  auto parts = local.forward(x).split(n, -1);
  const at::Tensor swiglu = at::silu(parts[0]) * parts[1];
  const at::Tensor swigluRef = at::silu(ref.narrow(-1, 0, M)) * ref.narrow(-1, M, M);
  EXPECT_LT(maxOverRanks(maxAbsDiff(swiglu, swigluRef.narrow(-1, r * n, n))), kTol);
  // gather_output puts the blocks back in global order.
  ColumnParallelLinear gathered("packed.gate_up", s.w, s.b, s.spec, tp, true);
  EXPECT_LT(maxOverRanks(maxAbsDiff(gathered.forward(x), ref)), kTol);
}

TEST(TensorParallelLayers, ForwardCoalescedEqualsEachLayersForward) {
  // FLUX.1's AdaLN modulations under tp: several gathered colwise layers (plain and packed) and a
  // layer that does not gather, on one input, with one all-gather: each output equals the layer's
  // own forward and the dense product.
  auto mesh = tpMesh();
  auto tp = mesh->group("tp");
  const int64_t C = 16, M = 24;
  at::manual_seed(17);
  const Dense fc1 = randomLinear(C, M), gu = randomLinear(C, 2 * M), fc1b = randomLinear(C, M);
  const at::Tensor x = at::randn({2, C});
  const ShardingPlan plan = testPlan(C, M);
  const Shard s1 = shard(plan, "mlp.fc1", fc1, tp->rank(), tp->size());
  const Shard sp = shard(plan, "packed.gate_up", gu, tp->rank(), tp->size());
  const Shard s3 = shard(plan, "mlp.fc1", fc1b, tp->rank(), tp->size());
  ColumnParallelLinear a("mlp.fc1", s1.w, s1.b, s1.spec, tp, /*gatherOutput=*/true);
  ColumnParallelLinear packed("packed.gate_up", sp.w, sp.b, sp.spec, tp, true);
  ColumnParallelLinear local("mlp.fc1", s3.w, s3.b, s3.spec, tp);  // stays sharded
  ColumnParallelLinear a2("mlp.fc1", s3.w, s3.b, s3.spec, tp, true);
  EXPECT_EQ(a.gathers(), tp->size() > 1);
  EXPECT_FALSE(local.gathers());
  const auto out = ColumnParallelLinear::forwardCoalesced({&a, &packed, &local, &a2}, x);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_LT(maxOverRanks(maxAbsDiff(out[0], at::linear(x, fc1.w, fc1.b))), kTol);
  EXPECT_LT(maxOverRanks(maxAbsDiff(out[1], at::linear(x, gu.w, gu.b))), kTol);
  EXPECT_LT(maxOverRanks(maxAbsDiff(out[2], local.forward(x))), kTol);
  EXPECT_LT(maxOverRanks(maxAbsDiff(out[3], at::linear(x, fc1b.w, fc1b.b))), kTol);
  EXPECT_THROW(ColumnParallelLinear::forwardCoalesced({&a, nullptr}, x), std::invalid_argument);
}

TEST(TensorParallelLayers, FusedQkvMlpAndPackedRowwiseEqualDense) {
  // A FLUX.1-like single block: to_q/to_k/to_v and proj_mlp fused into one GEMM, attention by
  // heads, proj_out over cat(attn [C], mlp [M]) packed rowwise.
  auto mesh = tpMesh();
  auto tp = mesh->group("tp");
  const int64_t heads = 4, hd = 4, C = heads * hd, M = 4 * C;
  at::manual_seed(17);
  const Dense q = randomLinear(C, C), k = randomLinear(C, C), v = randomLinear(C, C),
              mlp = randomLinear(C, M);
  const Dense out = randomLinear(C + M, C);
  const at::Tensor x = at::randn({1, 6, C});
  const ShardingPlan plan = testPlan(C, M);
  const int r = tp->rank(), n = tp->size();
  const std::string p = "single.0.";

  auto attn = [&](const at::Tensor& Q, const at::Tensor& K, const at::Tensor& V, int64_t h) {
    auto sh = [&](const at::Tensor& t) { return t.reshape({1, 6, h, hd}).transpose(1, 2); };
    return dit::localAttention(sh(Q), sh(K), sh(V)).transpose(1, 2).reshape({1, 6, h * hd});
  };
  const at::Tensor refAttn =
      attn(at::linear(x, q.w, q.b), at::linear(x, k.w, k.b), at::linear(x, v.w, v.b), heads);
  const at::Tensor refMlp = at::gelu(at::linear(x, mlp.w, mlp.b), "tanh");
  const at::Tensor ref = at::linear(at::cat({refAttn, refMlp}, -1), out.w, out.b);

  std::vector<FusedColumnParallelLinear::Part> parts;
  for (const auto& [name, d] : std::vector<std::pair<std::string, Dense>>{
           {"attn.to_q", q}, {"attn.to_k", k}, {"attn.to_v", v}, {"proj_mlp", mlp}}) {
    Shard s = shard(plan, p + name, d, r, n);
    parts.push_back({p + name, s.w, s.b, s.spec});
  }
  FusedColumnParallelLinear fused(p + "qkv_mlp", parts, tp);
  EXPECT_EQ(fused.partIndex(p + "attn.to_k"), 1);
  EXPECT_EQ(fused.partIndex("attn.to_k"), -1);
  EXPECT_EQ(fused.parts()[1].offset, C / n);
  EXPECT_EQ(fused.parts()[3].outLocal, M / n);
  EXPECT_EQ(fused.weight().size(0), (3 * C + M) / n);  // one GEMM
  EXPECT_EQ(fused.spec().blocks, (std::vector<int64_t>{C, C, C, M}));
  const auto y = fused.forwardParts(x);
  ASSERT_EQ(y.size(), 4u);
  // Each part is this rank's slice of the dense projection.
  EXPECT_LT(maxOverRanks(maxAbsDiff(y[1], at::linear(x, k.w, k.b).narrow(-1, r * C / n, C / n))),
            kTol);

  const at::Tensor localAttn = attn(y[0], y[1], y[2], heads / n);  // this rank's heads
  const at::Tensor localMlp = at::gelu(y[3], "tanh");
  const Shard so = shard(plan, p + "proj_out", out, r, n);
  EXPECT_EQ(so.spec.blocks, (std::vector<int64_t>{C, M}));
  RowParallelLinear projOut(p + "proj_out", so.w, so.b, so.spec, tp);
  const at::Tensor yo = projOut.forward(at::cat({localAttn, localMlp}, -1));
  EXPECT_LT(maxOverRanks(maxAbsDiff(yo, ref)), kTol);

  // A plain rowwise cut of proj_out (ignoring the blocks) gives a plausible but wrong result.
  ShardSpec plain{1, r, n, {}};
  RowParallelLinear wrong(p + "proj_out", shardTensor(out.w, plain), out.b, plain, tp);
  EXPECT_GT(maxOverRanks(maxAbsDiff(wrong.forward(at::cat({localAttn, localMlp}, -1)), ref)), 1e-3);
}

TEST(TensorParallelLayers, RowwiseOnReplicatedInputSlicesItself) {
  auto mesh = tpMesh();
  auto tp = mesh->group("tp");
  const int64_t C = 16, M = 32;
  at::manual_seed(19);
  const Dense out = randomLinear(C + M, C);
  const at::Tensor x = at::randn({2, C + M});
  const ShardingPlan plan = testPlan(C, M);
  const Shard s = shard(plan, "single.3.proj_out", out, tp->rank(), tp->size());
  RowParallelLinear row("single.3.proj_out", s.w, s.b, s.spec, tp, /*inputIsParallel=*/false);
  EXPECT_LT(maxOverRanks(maxAbsDiff(row.forward(x), at::linear(x, out.w, out.b))), kTol);
}

TEST(TensorParallelLayers, NullGroupIsDense) {
  at::manual_seed(23);
  const Dense d = randomLinear(8, 12);
  const at::Tensor x = at::randn({4, 8});
  ColumnParallelLinear col("a", d.w, d.b, ShardSpec{}, nullptr, true);
  RowParallelLinear row("b", d.w, d.b, ShardSpec{}, nullptr, false);
  ReplicatedLinear rep("c", d.w, d.b);
  const at::Tensor ref = at::linear(x, d.w, d.b);
  EXPECT_LT(maxAbsDiff(col.forward(x), ref), kTol);
  EXPECT_LT(maxAbsDiff(row.forward(x), ref), kTol);
  EXPECT_LT(maxAbsDiff(rep.forward(x), ref), kTol);
  // A sharded spec without a group, and inputs of the wrong width, are refused.
  EXPECT_THROW(ColumnParallelLinear("a", d.w, d.b, ShardSpec{0, 0, 2, {}}, nullptr),
               std::invalid_argument);
  EXPECT_THROW(rep.forward(at::randn({4, 9})), std::invalid_argument);
}

TEST(TensorParallelLayers, SpecMustMatchGroup) {
  auto mesh = tpMesh();
  auto tp = mesh->group("tp");
  const Dense d = randomLinear(8, 8);
  const int n = tp->size(), r = tp->rank();
  ShardSpec otherRank{0, (r + 1) % n, n, {}};
  EXPECT_THROW(ColumnParallelLinear("a", shardTensor(d.w, otherRank), {}, otherRank, tp),
               std::invalid_argument);
  ShardSpec colSpec{0, r, n, {}};
  EXPECT_THROW(RowParallelLinear("a", shardTensor(d.w, colSpec), {}, colSpec, tp),
               std::invalid_argument);
}

// ---------------------------------------------------------------- context-parallel plan runner

namespace {

struct CpCase {
  int ring = 1, uly = 1;
  bool ringAny = false, ulyAny = false;
  int64_t txt = 8, img = 16;
};

// Toy module: q/k/v projections of cat(text, image), softmax attention over the joint sequence,
// output projection of the image tokens only (FLUX's final layer). Returns [B, S_img, C].
struct Toy {
  int64_t heads = 4, hd = 4;
  Dense q, k, v, o;
  at::Tensor forward(const at::Tensor& txt, const at::Tensor& img,
                     const std::vector<int64_t>& localLens, ContextParallel* cp) const {
    const at::Tensor xs = at::cat({txt, img}, 1);
    const int64_t B = xs.size(0), S = xs.size(1);
    auto sh = [&](const Dense& d) {
      return at::linear(xs, d.w, d.b).view({B, S, heads, hd}).transpose(1, 2).contiguous();
    };
    at::Tensor a = cp ? cp->attention(sh(q), sh(k), sh(v), localLens)
                      : dit::localAttention(sh(q), sh(k), sh(v));
    a = a.transpose(1, 2).reshape({B, S, heads * hd});
    return at::linear(a.narrow(1, txt.size(1), img.size(1)), o.w, o.b);
  }
};

dit::ContextParallelPlan toyPlan() {
  dit::ContextParallelPlan plan;
  plan.inputs = {{"hidden_states", 1, 3}, {"encoder_hidden_states", 1, 3}, {"img_ids", 0, 2}};
  plan.output = {1, "hidden_states", 3};
  plan.joint_sequence = {"encoder_hidden_states", "hidden_states"};
  return plan;
}

double runCpCase(const CpCase& c) {
  dit::Strategy s;
  s.world = worldSize();
  s.ring_degree = c.ring;
  s.ulysses_degree = c.uly;
  s.ring_anything = c.ringAny;
  s.ulysses_anything = c.ulyAny;
  dit::DeviceMeshOptions o;
  o.timeout_s = 120;
  dit::DeviceMesh mesh(s, MPI_COMM_WORLD, o);
  auto cp = std::make_shared<ContextParallel>(
      mesh.group("ring"), mesh.group("ulysses"), mesh.group("cp"),
      dit::ContextParallelOptions{c.ring, c.uly, c.ulyAny, c.ringAny});
  at::manual_seed(29);
  Toy toy;
  const int64_t C = toy.heads * toy.hd;
  toy.q = randomLinear(C, C), toy.k = randomLinear(C, C), toy.v = randomLinear(C, C),
  toy.o = randomLinear(C, C);
  const at::Tensor txt = at::randn({2, c.txt, C}), img = at::randn({2, c.img, C});
  const at::Tensor ids = at::arange(c.img * 3).view({c.img, 3}).to(at::kFloat);
  const at::Tensor ref = toy.forward(txt, img, {c.txt + c.img}, nullptr);

  dit::ContextParallelRunner run(cp, toyPlan());
  auto local = run.split({{"hidden_states", img},
                          {"encoder_hidden_states", txt},
                          {"img_ids", ids},
                          {"guidance", at::ones({2})}});
  const auto imgSizes = dit::tensorSplitSizes(c.img, cp->degree());
  EXPECT_EQ(run.sizes("hidden_states"), imgSizes);
  EXPECT_EQ(run.sizes("img_ids"), imgSizes);
  const auto [start, len] = cp->localRange(c.img);
  EXPECT_TRUE(at::equal(local.at("img_ids"), ids.narrow(0, start, len)));
  EXPECT_TRUE(at::equal(local.at("guidance"), at::ones({2})));  // not in the plan: unchanged
  const auto txtSizes = dit::tensorSplitSizes(c.txt, cp->degree());
  const auto lens = run.localLens();
  for (size_t r = 0; r < lens.size(); ++r) EXPECT_EQ(lens[r], txtSizes[r] + imgSizes[r]);
  const at::Tensor out = run.gather(
      toy.forward(local.at("encoder_hidden_states"), local.at("hidden_states"), lens, cp.get()));
  return maxOverRanks(maxAbsDiff(out, ref));
}

}  // namespace

TEST(ContextParallelRunner, UlyssesAnythingUnevenEqualsUnsplit) {
  if (worldSize() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4";
  EXPECT_LT(runCpCase({.uly = worldSize(), .ulyAny = true, .txt = 7, .img = 13}), kTol);
}

TEST(ContextParallelRunner, RingEqualsUnsplit) {
  if (worldSize() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4";
  EXPECT_LT(runCpCase({.ring = worldSize(), .txt = 8, .img = 16}), kTol);
  EXPECT_LT(runCpCase({.ring = worldSize(), .ringAny = true, .txt = 5, .img = 11}), kTol);
}

TEST(ContextParallelRunner, StrictModeRefusesIndivisibleBeforeAnyCollective) {
  if (worldSize() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4";
  dit::Strategy s;
  s.world = s.ulysses_degree = worldSize();
  dit::DeviceMesh mesh(s);
  auto cp =
      std::make_shared<ContextParallel>(mesh.group("ring"), mesh.group("ulysses"), mesh.group("cp"),
                                        dit::ContextParallelOptions{1, worldSize(), false, false});
  dit::ContextParallelRunner run(cp, toyPlan());
  try {
    run.split({{"hidden_states", at::zeros({1, 4 * worldSize() + 1, 4})},
               {"encoder_hidden_states", at::zeros({1, 4, 4})},
               {"img_ids", at::zeros({4 * worldSize() + 1, 3})}});
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("input 'hidden_states'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run.split({{"hidden_states", at::zeros({1, 4, 4})}}),
               std::invalid_argument);  // missing input
  EXPECT_THROW(run.split({{"hidden_states", at::zeros({4, 4})},
                          {"encoder_hidden_states", at::zeros({1, 4, 4})},
                          {"img_ids", at::zeros({4, 3})}}),
               std::invalid_argument);  // expected_dims 3
}

TEST(ContextParallelRunner, PlanErrorsAndPassThrough) {
  auto plan = toyPlan();
  plan.joint_sequence.push_back("txt_ids");
  EXPECT_THROW(dit::ContextParallelRunner(nullptr, plan), std::invalid_argument);
  plan = toyPlan();
  plan.inputs.push_back({"img_ids", 0, 2});
  EXPECT_THROW(dit::ContextParallelRunner(nullptr, plan), std::invalid_argument);
  dit::ContextParallelRunner run(nullptr, toyPlan());
  const at::Tensor img = at::randn({1, 5, 4});
  auto local = run.split({{"hidden_states", img},
                          {"encoder_hidden_states", at::randn({1, 3, 4})},
                          {"img_ids", at::zeros({5, 3})}});
  EXPECT_TRUE(at::equal(local.at("hidden_states"), img));
  EXPECT_EQ(run.localLens(), (std::vector<int64_t>{8}));
  EXPECT_TRUE(at::equal(run.gather(img), img));
}

namespace {
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      fprintf(stderr, "[rank %d] FAILED %s:%d\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
              r.line_number(), r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (worldRank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(worldRank()));
  }
  int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
