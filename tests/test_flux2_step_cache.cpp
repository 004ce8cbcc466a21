// FLUX.2 [klein] step caching through the shared DiT driver alone (DiTModel::setStepCache): First
// Block Cache and TaylorSeer (default and lite) over a few Euler "steps" of the transformer on the
// tiny-flux2-A goldens' case 0, one rank against ulysses 2 and tp 2 (mpirun -np 2). Checks:
//  - the multi-rank final latents equal the one-rank ones within 1e-4, and every rank takes the
//    same compute/skip decision as one rank at every step (the cache's decision counters);
//  - the cache really skipped work: at least one skipped step per mode, and the cached run differs
//    from the uncached one (predictions / reused residuals were used);
//  - a transformer without step-cache support refuses setStepCache (DiffusionTransformer default).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/io/config_json.h"
#include "backend/io/weight_source.h"
#include "backend/models/cache/step_cache.h"
#include "backend/models/flux2/transformer_flux2.h"
#include "flux2_test_util.h"
#include "golden_util.h"
#include "parallel/context_parallel.h"
#include "parallel/device_mesh.h"
#include "parallel/strategy.h"
#include "tp_test_util.h"

using namespace dit;

namespace {

constexpr int kSteps = 8;

const Flux2TransformerConfig& config() { return test::flux2TransformerConfig(); }
std::shared_ptr<WeightSource> weights() { return test::flux2TransformerWeights(); }

struct CachedRun {
  at::Tensor latents;         ///< after kSteps Euler steps
  std::vector<int> computed;  ///< per step: 1 = the cache computed, 0 = skipped / predicted
  std::vector<double> relL1;  ///< First Block Cache's d per step (-1: none)
};

// kSteps Euler steps of the flow-matching ODE from case 0's hidden_states, sigmas 1 -> 0
// (linear), the transformer called once per step in the cache context "cond".
CachedRun denoise(Flux2Transformer2DModel& m, StepCache* cache) {
  const std::string p = "dit.0.in.";
  TransformerInputs in{{"encoder_hidden_states", test::golden(p + "encoder_hidden_states")},
                       {"img_ids", test::golden(p + "img_ids")},
                       {"txt_ids", test::golden(p + "txt_ids")}};
  at::Tensor x = test::golden(p + "hidden_states").to(at::kFloat);
  CachedRun r;
  m.setStepCache(cache);
  if (cache) cache->setContext("cond");
  for (int k = 0; k < kSteps; ++k) {
    const double s0 = 1.0 - static_cast<double>(k) / kSteps,
                 s1 = 1.0 - static_cast<double>(k + 1) / kSteps;
    in["hidden_states"] = x;
    in["timestep"] = at::full({x.size(0)}, s0, at::TensorOptions().dtype(at::kFloat));
    const at::Tensor v = m.forward(in).to(at::kFloat);
    x = x + (s1 - s0) * v;
    if (cache) {
      r.computed.push_back(cache->lastComputed() ? 1 : 0);
      r.relL1.push_back(cache->lastRelL1());
    }
  }
  m.setStepCache(nullptr);
  r.latents = x;
  return r;
}

// FBC's d at every step when every step computes (threshold 0), one rank.
const std::vector<double>& uncachedRelL1() {
  static const std::vector<double> d = [] {
    auto w = weights();
    Flux2Transformer2DModel m(config(), *w);
    StepCacheConfig c;
    c.mode = StepCacheConfig::Mode::FirstBlock;
    c.threshold = 0;
    StepCache cache(c);
    return denoise(m, &cache).relL1;
  }();
  return d;
}

// A First Block Cache threshold halfway between the two middle d values of the all-computed run:
// the step with the smallest d is reached with every earlier step computed (or an earlier one
// skipped), so at least one step skips; the margin to every d is half a gap between them, far
// above the cp/tp rounding of d.
double fbcThreshold() {
  std::vector<double> d(uncachedRelL1().begin() + 1, uncachedRelL1().end());
  std::sort(d.begin(), d.end());
  const size_t h = d.size() / 2;
  return 0.5 * (d[h - 1] + d[h]);
}

std::vector<StepCacheConfig> modes() {
  StepCacheConfig fbc;
  fbc.mode = StepCacheConfig::Mode::FirstBlock;
  fbc.threshold = fbcThreshold();
  StepCacheConfig taylor;
  taylor.mode = StepCacheConfig::Mode::TaylorSeer;
  taylor.max_order = 2;
  taylor.cache_interval = 3;
  taylor.disable_cache_before_step = 2;
  StepCacheConfig lite = taylor;
  lite.use_lite_mode = true;
  lite.max_order = 1;
  return {fbc, taylor, lite};
}

// One rank, every mode (computed once per process, without groups).
const std::vector<CachedRun>& oneRank() {
  static const std::vector<CachedRun> runs = [] {
    auto w = weights();
    Flux2Transformer2DModel m(config(), *w);
    std::vector<CachedRun> out;
    for (const auto& c : modes()) {
      StepCache cache(c);
      out.push_back(denoise(m, &cache));
    }
    return out;
  }();
  return runs;
}

}  // namespace

TEST(Flux2StepCache, DriverSupportsStepCacheAndOthersRefuse) {
  if (test::worldSize() != 1) GTEST_SKIP() << "one-rank test";
  auto w = weights();
  Flux2Transformer2DModel m(config(), *w);
  EXPECT_TRUE(m.supportsStepCache());
  struct NoCache : DiffusionTransformer {
    at::Tensor forward(const TransformerInputs&) const override { return {}; }
    void setHooks(TransformerHooks*) override {}
    const std::vector<LoadedParameter>& parameters() const override { return p; }
    const ShardingPlan& shardingPlan() const override { return plan; }
    double forwardFlops(int64_t, int64_t) const override { return 0; }
    std::vector<LoadedParameter> p;
    ShardingPlan plan;
  } none;
  EXPECT_FALSE(none.supportsStepCache());
  StepCache cache(StepCacheConfig{});
  EXPECT_THROW(none.setStepCache(&cache), std::runtime_error);
}

TEST(Flux2StepCache, OneRankSkipsStepsAndChangesTheResult) {
  if (test::worldSize() != 1) GTEST_SKIP() << "one-rank test";
  auto w = weights();
  Flux2Transformer2DModel m(config(), *w);
  const at::Tensor uncached = denoise(m, nullptr).latents;
  const char* names[] = {"first-block", "taylorseer", "taylorseer-lite"};
  for (size_t i = 0; i < oneRank().size(); ++i) {
    SCOPED_TRACE(names[i]);
    const CachedRun& r = oneRank()[i];
    ASSERT_EQ(r.computed.size(), static_cast<size_t>(kSteps));
    std::string decisions;
    for (int c : r.computed) decisions += c ? "C" : "s";
    std::printf("%s (%s): decisions %s (C computed, s skipped), max |cached - uncached| %.3g\n",
                names[i], modes()[i].toString().c_str(), decisions.c_str(),
                test::maxAbsDiff(r.latents, uncached));
    int skipped = 0;
    for (int c : r.computed) skipped += c == 0;
    EXPECT_GE(skipped, 1) << "the cache never skipped a step";
    EXPECT_LT(skipped, kSteps);
    EXPECT_EQ(r.computed.front(), 1) << "the first step must compute";
    EXPECT_GT(test::maxAbsDiff(r.latents, uncached), 0.0)
        << "cached latents equal the uncached ones: nothing was reused";
    EXPECT_TRUE(at::isfinite(r.latents).all().item<bool>());
    // Repeatable: the same decisions and bits on a second run.
    StepCache again(modes()[i]);
    const CachedRun r2 = denoise(m, &again);
    EXPECT_EQ(r2.computed, r.computed);
    EXPECT_TRUE(r2.latents.equal(r.latents));
  }
  // TaylorSeer's decisions follow its schedule exactly (2 warm-up steps, then every 3rd computes).
  for (size_t i = 1; i < 3; ++i)
    for (int k = 0; k < kSteps; ++k)
      EXPECT_EQ(oneRank()[i].computed[static_cast<size_t>(k)], modes()[i].taylorComputes(k) ? 1 : 0)
          << "step " << k;
}

TEST(Flux2StepCache, UlyssesAndTensorParallelEqualOneRank) {
  if (test::worldSize() != 2) GTEST_SKIP() << "runs under mpirun -np 2";
  for (const char* kind : {"ulysses", "tp"}) {
    SCOPED_TRACE(kind);
    Strategy s;
    s.world = 2;
    (std::string(kind) == "tp" ? s.tp_degree : s.ulysses_degree) = 2;
    DeviceMeshOptions o;
    o.timeout_s = 120;
    DeviceMesh mesh(s, MPI_COMM_WORLD, o);
    TransformerParallelism par;
    std::shared_ptr<ProcessGroup> cpGroup;
    if (s.tp_degree > 1) par.tp = mesh.group("tp");
    if (s.cpDegree() > 1) {
      ContextParallelOptions co{s.ring_degree, s.ulysses_degree, false, false};
      par.cp = std::make_shared<ContextParallel>(mesh.group("ring"), mesh.group("ulysses"),
                                                 mesh.group("cp"), co);
      cpGroup = par.cp->group();
    }
    auto w = weights();
    Flux2Transformer2DModel m(config(), *w, par);
    const auto ms = modes();
    for (size_t i = 0; i < ms.size(); ++i) {
      SCOPED_TRACE(ms[i].toString());
      StepCache cache(ms[i], cpGroup, par.tp);
      const CachedRun r = denoise(m, &cache);
      EXPECT_EQ(r.computed, oneRank()[i].computed) << "a decision differs from one rank";
      const double diff = test::maxAbsDiff(r.latents, oneRank()[i].latents);
      EXPECT_LE(test::maxOverRanks(diff), 1e-4);
      // Every rank holds the same latents (the gathered output, the same decisions).
      at::Tensor mine = r.latents.contiguous(), other = at::empty_like(mine);
      MPI_Allreduce(mine.data_ptr<float>(), other.data_ptr<float>(), static_cast<int>(mine.numel()),
                    MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
      EXPECT_TRUE(other.equal(mine)) << "ranks disagree";
    }
  }
}

int main(int argc, char** argv) { return dit::test::mpiTestMain(argc, argv); }
