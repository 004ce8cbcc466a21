// The FLUX.1 tensor-parallel plan is the one truth: a rule changed in it changes validation, the
// per-rank byte counts and the loaded model's shards together, and the model still computes the
// same function. Runs under mpirun with 2 ranks (tp_degree 2 over MPI_COMM_WORLD) on the
// tiny-flux-A fixture (float32 checkpoint).
//
// The change: the double blocks' feed-forward (transformer_blocks.*.ff.net.0.proj ColwiseParallel
// + transformer_blocks.*.ff.net.2 RowwiseParallel) becomes replicated. Expected, in closed form
// (C = inner_dim, M = mlp hidden, L = num_layers, float32):
//  - validate(tp 3) no longer names the ff rules (and still names the others);
//  - bytesPerRank(tp 2) grows by L * (C*M + M + M*C) * 4 / 2 (the half of ff.net.0.proj's weight
//    and bias and of ff.net.2's weight a rank no longer leaves to its peer);
//  - the loaded model's transformer_blocks.0.ff.net.0.proj.weight is [M, C] instead of [M/2, C]
//    (replicated spec), and its bytes loaded equal bytesPerRank exactly, for both plans;
//  - the forward output equals the tp 1 output (float32, within 1e-5) for both plans.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/io/model_folder.h"
#include "backend/io/weight_source.h"
#include "backend/models/flux/flux_plan.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"
#include "parallel/device_mesh.h"
#include "parallel/strategy.h"
#include "tp_test_util.h"

using namespace dit;

namespace {

// The FLUX.1 plan with the double blocks' feed-forward rules removed (replicated).
ShardingPlan withoutDoubleBlockFeedForward(const ShardingPlan& base) {
  ShardingPlan p;
  for (const auto& r : base.rules())
    if (r.pattern != "transformer_blocks.*.ff.net.0.proj" &&
        r.pattern != "transformer_blocks.*.ff.net.2")
      p.add(r);
  for (const auto& q : base.requirements()) p.requireDivisible(q.name, q.value, q.why, q.rule);
  return p;
}

// Deterministic inputs, identical on every rank.
struct Inputs {
  at::Tensor hs, enc, pooled, t, imgIds, txtIds, guidance;
};
Inputs inputs(const FluxTransformerConfig& c) {
  auto gen = at::detail::createCPUGenerator(1234);
  const int64_t Simg = 16, Stxt = 8;
  Inputs in;
  in.hs = at::randn({1, Simg, c.in_channels}, gen);
  in.enc = at::randn({1, Stxt, c.joint_attention_dim}, gen);
  in.pooled = at::randn({1, c.pooled_projection_dim}, gen);
  in.t = at::full({1}, 0.7);
  in.imgIds = at::zeros({Simg, 3});
  for (int64_t i = 0; i < Simg; ++i) {
    in.imgIds[i][1] = static_cast<double>(i / 4);
    in.imgIds[i][2] = static_cast<double>(i % 4);
  }
  in.txtIds = at::zeros({Stxt, 3});
  if (c.guidance_embeds) in.guidance = at::full({1}, 3.5);
  return in;
}

at::Tensor run(const FluxTransformer2DModel& m, const Inputs& in) {
  return m.forward(in.hs, in.enc, in.pooled, in.t, in.imgIds, in.txtIds, in.guidance);
}

const LoadedParameter* findLoaded(const FluxTransformer2DModel& m, const std::string& name) {
  for (const auto& p : m.parameters())
    if (p.info.name == name) return &p;
  return nullptr;
}

}  // namespace

TEST(FluxPlan, ValidationFollowsTheRules) {
  const auto& c = test::fixtureTransformerConfig();
  const ShardingPlan base = fluxShardingPlan(c);
  const ShardingPlan changed = withoutDoubleBlockFeedForward(base);
  const ParameterTable params = fluxParameterTable(c);
  EXPECT_EQ(changed.rules().size() + 2, base.rules().size());
  EXPECT_TRUE(base.validate(params, 2).empty());
  EXPECT_TRUE(changed.validate(params, 2).empty());
  const std::string b3 = joinIssues(base.validate(params, 3));
  const std::string c3 = joinIssues(changed.validate(params, 3));
  EXPECT_NE(b3.find("transformer_blocks.*.ff.net.0.proj"), std::string::npos) << b3;
  EXPECT_NE(b3.find("transformer_blocks.*.ff.net.2"), std::string::npos) << b3;
  EXPECT_EQ(c3.find("transformer_blocks.*.ff.net.0.proj"), std::string::npos) << c3;
  EXPECT_EQ(c3.find("transformer_blocks.*.ff.net.2"), std::string::npos) << c3;
  EXPECT_NE(c3.find("single_transformer_blocks.*.proj_mlp"), std::string::npos) << c3;
  EXPECT_NE(c3.find("tp_degree 3 does not divide num_attention_heads"), std::string::npos) << c3;
}

TEST(FluxPlan, ByteCountsFollowTheRules) {
  const auto& c = test::fixtureTransformerConfig();
  const ShardingPlan base = fluxShardingPlan(c);
  const ShardingPlan changed = withoutDoubleBlockFeedForward(base);
  const ParameterTable params = fluxParameterTable(c);
  const int64_t C = c.innerDim(), M = c.mlpHidden(), L = c.num_layers;
  const int64_t delta = L * (C * M + M + M * C) * 4 / 2;
  EXPECT_EQ(static_cast<int64_t>(changed.bytesPerRank(params, 2, 4)) -
                static_cast<int64_t>(base.bytesPerRank(params, 2, 4)),
            delta);
  // tp 1: nothing is sharded, the plans agree.
  EXPECT_EQ(changed.bytesPerRank(params, 1, 4), base.bytesPerRank(params, 1, 4));
}

TEST(FluxPlan, LoadedShardsAndOutputFollowTheRules) {
  ASSERT_EQ(test::worldSize(), 2) << "run under mpirun -np 2";
  const auto& c = test::fixtureTransformerConfig();
  const auto base = std::make_shared<const ShardingPlan>(fluxShardingPlan(c));
  const auto changed = std::make_shared<const ShardingPlan>(withoutDoubleBlockFeedForward(*base));
  const ParameterTable params = fluxParameterTable(c);
  const int64_t C = c.innerDim(), M = c.mlpHidden();
  const Inputs in = inputs(c);

  // tp 1 reference on every rank (no group).
  auto w1 = test::fixtureTransformerWeights();
  const FluxTransformer2DModel dense(c, *w1);
  const at::Tensor ref = run(dense, in);

  const test::TpOverWorld tp;
  const FluxParallelism& par = tp.par;

  for (const auto& [label, plan] :
       {std::pair{"FLUX.1 plan", base}, std::pair{"ff replicated", changed}}) {
    SCOPED_TRACE(label);
    auto w = test::fixtureTransformerWeights();
    const FluxTransformer2DModel model(c, *w, par, plan);
    // Loaded bytes == the plan's byte count for this rank.
    EXPECT_EQ(w->bytesLoaded(), plan->bytesPerRank(params, 2, 4));
    const LoadedParameter* ff0 = findLoaded(model, "transformer_blocks.0.ff.net.0.proj.weight");
    const LoadedParameter* ff2 = findLoaded(model, "transformer_blocks.0.ff.net.2.weight");
    const LoadedParameter* mlp = findLoaded(model, "single_transformer_blocks.0.proj_mlp.weight");
    ASSERT_TRUE(ff0 && ff2 && mlp);
    const bool replicatedFF = plan == changed;
    EXPECT_EQ(ff0->spec.replicated(), replicatedFF);
    EXPECT_EQ(ff0->spec.localShape(ff0->info.shape),
              (std::vector<int64_t>{replicatedFF ? M : M / 2, C}));
    EXPECT_EQ(ff2->spec.localShape(ff2->info.shape),
              (std::vector<int64_t>{C, replicatedFF ? M : M / 2}));
    // Untouched rules keep sharding.
    EXPECT_EQ(mlp->spec.localShape(mlp->info.shape), (std::vector<int64_t>{M / 2, C}));
    EXPECT_EQ(ff0->info.dtype, "F32");
    // Same function as tp 1.
    const at::Tensor out = run(model, in);
    EXPECT_LE(test::maxAbsDiff(out, ref), 1e-5);
  }
}

// The per-block seam: every block, in order, before and after, with its local tensors.
TEST(FluxPlan, HooksSeeEveryBlockInOrder) {
  const auto& c = test::fixtureTransformerConfig();
  struct Recorder : TransformerHooks {
    std::vector<std::string> calls;
    void beforeBlock(const char* kind, int i, const at::Tensor& h, const at::Tensor& e) override {
      std::ostringstream o;
      o << "before " << kind << ' ' << i << ' ' << h.size(1);
      if (e.defined()) o << ' ' << e.size(1);
      calls.push_back(o.str());
    }
    void afterBlock(const char* kind, int i, const at::Tensor&, const at::Tensor&) override {
      std::ostringstream o;
      o << "after " << kind << ' ' << i;
      calls.push_back(o.str());
    }
  } rec;
  auto w = test::fixtureTransformerWeights();
  FluxTransformer2DModel model(c, *w);
  const Inputs in = inputs(c);
  const at::Tensor plain = run(model, in);
  model.setHooks(&rec);
  const at::Tensor hooked = run(model, in);
  model.setHooks(nullptr);
  EXPECT_TRUE(hooked.equal(plain));
  std::vector<std::string> expect;
  for (int i = 0; i < c.num_layers; ++i) {
    expect.push_back("before transformer_blocks " + std::to_string(i) + " 16 8");
    expect.push_back("after transformer_blocks " + std::to_string(i));
  }
  for (int i = 0; i < c.num_single_layers; ++i) {
    expect.push_back("before single_transformer_blocks " + std::to_string(i) + " 24");
    expect.push_back("after single_transformer_blocks " + std::to_string(i));
  }
  EXPECT_EQ(rec.calls, expect);
}

int main(int argc, char** argv) { return test::mpiTestMain(argc, argv); }
