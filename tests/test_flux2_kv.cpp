// FLUX.2 [klein] KV modes (issue 46, "computed once"): Flux2KVCache on Flux2Transformer2DModel
// against diffusers' Flux2KleinKVPipeline (tests/data/tiny-flux2-kv-A/golden/kv.safetensors, made
// by make_kv_golden.py in the golden lab; KV.md), and the cached run against the uncached one (the
// same causal attention with the references extracted again every step). One binary:
//  - 1 rank: every step's prediction within 1e-4 of diffusers', the free-running Euler loop's
//    final latents within 5e-4 (EDIT.md's tolerance), cached = uncached within 1e-5, the KV
//    result far from the plain (full attention) forward, the plain forward untouched by an
//    installed-then-removed cache, input errors;
//  - 2 ranks: tp 2, ulysses 2, ring 2 (strict where the tokens divide, the anything modes
//    otherwise): cached = uncached within 1e-5 and = one rank within 1e-5, and = diffusers;
//  - 4 ranks: tp 2 x ulysses 2 (anything) and ring 2 x ulysses 2 likewise;
//  - the pipeline (Flux2KleinKVPipeline, loaded by the family runtime for the -kv folder) from
//    the PNG references: reference latents 1e-4, every step, final latents and image 5e-4, from
//    the stored embeddings and from the prompt text (1 rank), under tp 2 and ulysses 2 (2 ranks).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/family_runtime.h"
#include "backend/io/model_folder.h"
#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"
#include "backend/models/flux2/transformer_flux2.h"
#include "backend/pipelines/flux2/pipeline_flux2_kv.h"
#include "flux2_test_util.h"
#include "golden_util.h"
#include "parallel/context_parallel.h"
#include "parallel/device_mesh.h"
#include "parallel/strategy.h"
#include "strategy_test_util.h"
#include "tp_test_util.h"

using namespace dit;

namespace {

int worldSize() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

const SafetensorsCollection& kvGoldens() {
  static SafetensorsCollection g(test::fixtureDir() + "/golden/kv.safetensors");
  return g;
}

at::Tensor kvGolden(const std::string& name) {
  const auto& info = kvGoldens().info(name);
  return loadTensor(kvGoldens(), name, info.dtype == DType::I64 ? at::kLong : at::kFloat);
}

// The stored prompt embeddings of tiny-flux2-A (what the lab script fed the pipeline).
at::Tensor promptEmbeds(int index) {
  static SafetensorsCollection g(test::fixtureDir() + "/../tiny-flux2-A/golden/golden.safetensors");
  return loadTensor(g, "enc.prompt_embeds." + std::to_string(index), at::kFloat).unsqueeze(0);
}

// One golden run of Flux2KleinKVPipeline (kv_info.json's runs).
struct KvRun {
  int steps = 0;
  at::Tensor embeds, txtIds, refLatents, refIds, latentIds, initial, timesteps, sigmas, stepPred,
      stepLatents, final;
};

KvRun kvRun(int k) {
  static const int prompt[] = {0, 5};
  const std::string p = "run." + std::to_string(k) + ".";
  KvRun r;
  r.embeds = promptEmbeds(prompt[k]);
  r.txtIds = at::zeros({r.embeds.size(1), 4}, at::kLong);
  r.txtIds.select(1, 3).copy_(at::arange(r.embeds.size(1), at::kLong));
  r.refLatents = kvGolden(p + "ref_latents");
  r.refIds = kvGolden(p + "ref_ids").select(0, 0);
  r.latentIds = kvGolden(p + "latent_ids").select(0, 0);
  r.initial = kvGolden(p + "initial_latents");
  r.timesteps = kvGolden(p + "timesteps");
  r.sigmas = kvGolden(p + "sigmas");
  r.stepPred = kvGolden(p + "step_pred");
  r.stepLatents = kvGolden(p + "step_latents");
  r.final = kvGolden(p + "final_latents");
  r.steps = static_cast<int>(r.timesteps.size(0));
  return r;
}

// One transformer call of step i on latents x: the image tokens followed by the reference tokens
// (FlowMatchLatents::reference_tokens' layout) when `withRefs`, else the image tokens alone.
TransformerInputs stepInputs(const KvRun& r, const at::Tensor& x, int i, bool withRefs) {
  const float t = r.timesteps[i].item<float>() / 1000.0f;
  return {{"hidden_states", withRefs ? at::cat({x, r.refLatents}, 1) : x},
          {"encoder_hidden_states", r.embeds},
          {"timestep", at::full({1}, t, at::kFloat)},
          {"img_ids", withRefs ? at::cat({r.latentIds, r.refIds}, 0) : r.latentIds},
          {"txt_ids", r.txtIds}};
}

struct Loop {
  at::Tensor final;
  std::vector<at::Tensor> preds;
  int64_t cacheBytes = 0;  ///< the cache's bytes on this rank after the loop
};

// The pipeline's loop (Euler in float32, as FlowMatchEulerDiscreteScheduler.step) with the model's
// cache installed: `refsAfterFirst` passes the reference tokens again after the first step (the
// cache ignores them when it holds K/V).
Loop denoise(Flux2Transformer2DModel& m, const KvRun& r, Flux2KVCache* cache,
             bool refsAfterFirst = false) {
  m.setKVCache(cache);
  Loop out;
  at::Tensor x = r.initial.clone();
  for (int i = 0; i < r.steps; ++i) {
    const bool withRefs = cache == nullptr || i == 0 || refsAfterFirst || cache->recompute();
    at::Tensor v = m.forward(stepInputs(r, x, i, withRefs)).to(at::kFloat);
    if (v.size(1) != x.size(1)) v = v.narrow(1, 0, x.size(1));
    out.preds.push_back(v);
    const float dt = r.sigmas[i + 1].item<float>() - r.sigmas[i].item<float>();
    x = x + dt * v;
  }
  m.setKVCache(nullptr);
  out.final = x;
  if (cache) out.cacheBytes = cache->bytes();
  return out;
}

// The cached and uncached loops of every run under `par` (one rank when default).
std::vector<std::pair<Loop, Loop>> cachedAndUncached(const TransformerParallelism& par = {}) {
  auto w = test::flux2TransformerWeights();
  Flux2Transformer2DModel m(test::flux2TransformerConfig(), *w, par);
  std::vector<std::pair<Loop, Loop>> res;
  for (int k = 0; k < 2; ++k) {
    const KvRun r = kvRun(k);
    Flux2KVCache cached(r.refLatents.size(1));
    Flux2KVCache uncached(r.refLatents.size(1), /*recompute=*/true);
    Loop a = denoise(m, r, &cached, /*refsAfterFirst=*/k == 1);
    EXPECT_TRUE(cached.filled());
    EXPECT_EQ(cached.imageTokens(), r.initial.size(1));
    Loop b = denoise(m, r, &uncached);
    res.emplace_back(std::move(a), std::move(b));
  }
  return res;
}

const std::vector<std::pair<Loop, Loop>>& oneRank() {
  static const auto r = cachedAndUncached();
  return r;
}

void expectStrategyMatches(const Strategy& s) {
  SCOPED_TRACE(test::strategyLabel(s));
  ASSERT_EQ(worldSize(), s.world);
  DeviceMeshOptions o;
  o.timeout_s = 120;
  DeviceMesh mesh(s, MPI_COMM_WORLD, o);
  const TransformerParallelism par = test::transformerParallelism(s, mesh);
  const auto res = cachedAndUncached(par);
  // The cache holds this rank's tp heads, and under Ulysses only its slice of them.
  const int64_t heads = test::flux2TransformerConfig().num_attention_heads;
  const int64_t tpHeads = heads / s.tp_degree;
  const int64_t kept = par.cp ? par.cp->ulyssesHeads(tpHeads).second : tpHeads;
  for (size_t k = 0; k < res.size(); ++k) {
    SCOPED_TRACE("run " + std::to_string(k));
    const auto& [cached, uncached] = res[k];
    const double du = test::maxAbsDiff(cached.final, uncached.final),
                 d1 = test::maxAbsDiff(cached.final, oneRank()[k].first.final),
                 dg = test::maxAbsDiff(cached.final, kvRun(static_cast<int>(k)).final);
    EXPECT_LE(du, 1e-5);
    EXPECT_LE(d1, 1e-5);
    EXPECT_EQ(cached.cacheBytes, oneRank()[k].first.cacheBytes / heads * kept);
    EXPECT_LE(dg, 5e-4);
    if (mesh.rank() == 0)
      std::printf("[ %s, run %zu ] cached vs uncached %.3g, vs one rank %.3g, vs diffusers %.3g\n",
                  test::strategyLabel(s).c_str(), k, du, d1, dg);
  }
}

}  // namespace

TEST(Flux2KV, EveryStepAndTheFinalLatentsMatchDiffusersKVPipeline) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  auto w = test::flux2TransformerWeights();
  Flux2Transformer2DModel m(test::flux2TransformerConfig(), *w);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("run " + std::to_string(k));
    const KvRun r = kvRun(k);
    // Teacher-forced: each step on diffusers' own latents, step 0 extracting, the rest cached.
    Flux2KVCache cache(r.refLatents.size(1));
    m.setKVCache(&cache);
    for (int i = 0; i < r.steps; ++i) {
      const at::Tensor x = i == 0 ? r.initial : r.stepLatents.narrow(0, i - 1, 1);
      const at::Tensor v = m.forward(stepInputs(r, x, i, i == 0));
      ASSERT_EQ(v.sizes(), x.sizes());
      EXPECT_LE(test::maxAbsDiff(v, r.stepPred.narrow(0, i, 1)), 1e-4) << "step " << i;
      EXPECT_TRUE(cache.filled());
    }
    m.setKVCache(nullptr);
    // Free-running: our own loop from the same noise.
    const Loop l = denoise(m, r, &cache);
    const double d = test::maxAbsDiff(l.final, r.final);
    EXPECT_LE(d, 5e-4);
    RecordProperty("run" + std::to_string(k) + "_final_max_abs_diff", std::to_string(d));
    std::printf("[ run %d ] final latents vs diffusers' Flux2KleinKVPipeline: max |diff| %.3g\n", k,
                d);
  }
}

TEST(Flux2KV, CachedEqualsUncachedAndDiffersFromFullAttention) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  auto w = test::flux2TransformerWeights();
  Flux2Transformer2DModel m(test::flux2TransformerConfig(), *w);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("run " + std::to_string(k));
    const KvRun r = kvRun(k);
    const auto& [cached, uncached] = oneRank()[static_cast<size_t>(k)];
    const double d = test::maxAbsDiff(cached.final, uncached.final);
    EXPECT_LE(d, 1e-5);
    // Every block's K and V: references x heads x head dim float32.
    const auto& c = test::flux2TransformerConfig();
    EXPECT_EQ(cached.cacheBytes, 2 * (c.num_layers + c.num_single_layers) * r.refLatents.size(1) *
                                     c.num_attention_heads * c.attention_head_dim * 4);
    std::printf("[ run %d ] cached vs uncached final latents: max |diff| %.3g\n", k, d);
    for (int i = 0; i < r.steps; ++i)
      EXPECT_LE(test::maxAbsDiff(cached.preds[static_cast<size_t>(i)],
                                 uncached.preds[static_cast<size_t>(i)]),
                1e-5);
    // The plain forward (references attending to everything, Flux2KleinPipeline): the causal
    // attention of the KV modes really changes the result (diffusers: 0.13 / 0.12).
    const Loop full = denoise(m, r, nullptr);
    EXPECT_GT(test::maxAbsDiff(full.final, cached.final), 1e-2);
    EXPECT_LE(test::maxAbsDiff(full.final, kvGolden("run." + std::to_string(k) +
                                                    ".full_attention_final_latents")),
              5e-4);
  }
}

TEST(Flux2KV, PlainForwardUnchangedAfterTheCacheIsRemoved) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  auto w = test::flux2TransformerWeights();
  Flux2Transformer2DModel m(test::flux2TransformerConfig(), *w);
  const KvRun r = kvRun(0);
  const TransformerInputs in = stepInputs(r, r.initial, 0, true);
  const at::Tensor before = m.forward(in);
  Flux2KVCache cache(r.refLatents.size(1));
  m.setKVCache(&cache);
  EXPECT_EQ(m.kvCache(), &cache);
  (void)m.forward(in);
  m.setKVCache(nullptr);
  const at::Tensor after = m.forward(in);
  EXPECT_TRUE(at::equal(before, after));
  EXPECT_EQ(before.size(1), r.initial.size(1) + r.refLatents.size(1));
  EXPECT_GT(cache.bytes(), 0);
  cache.clear();
  EXPECT_FALSE(cache.filled());
  EXPECT_EQ(cache.bytes(), 0);
}

TEST(Flux2KV, InputErrorsNameTheProblem) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  EXPECT_THROW(Flux2KVCache(0), std::invalid_argument);
  auto w = test::flux2TransformerWeights();
  Flux2Transformer2DModel m(test::flux2TransformerConfig(), *w);
  const KvRun r = kvRun(0);
  auto expectMessage = [&](const TransformerInputs& in, const std::string& part) {
    try {
      (void)m.forward(in);
      ADD_FAILURE() << "no error; expected one with '" << part << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  // Extracting with no more tokens than the references.
  Flux2KVCache big(r.initial.size(1) + r.refLatents.size(1));
  m.setKVCache(&big);
  expectMessage(stepInputs(r, r.initial, 0, true), "reference tokens; hidden_states holds");
  EXPECT_FALSE(big.filled());
  // Cached with a token count that is neither the image's nor image + references.
  Flux2KVCache cache(r.refLatents.size(1));
  m.setKVCache(&cache);
  (void)m.forward(stepInputs(r, r.initial, 0, true));
  ASSERT_TRUE(cache.filled());
  TransformerInputs wrong = stepInputs(r, r.initial.narrow(1, 0, 40), 1, false);
  wrong["img_ids"] = r.latentIds.narrow(0, 0, 40);
  expectMessage(wrong, "a cached forward takes");
  // img_ids that do not match hidden_states.
  wrong["hidden_states"] = r.initial;
  expectMessage(wrong, "img_ids holds 40 positions for 48");
  m.setKVCache(nullptr);
}

TEST(Flux2KV, TwoRankStrategiesMatch) {
  if (worldSize() != 2) GTEST_SKIP() << "runs under mpirun -np 2";
  // run 0: 48 image + 512 text tokens divide by 2; run 1: 99 + 512 do not (anything modes).
  expectStrategyMatches(test::makeStrategy(2, 1, 1));
  expectStrategyMatches(test::makeStrategy(1, 1, 2, /*ulyAny=*/true));
  expectStrategyMatches(test::makeStrategy(1, 2, 1, false, /*ringAny=*/true));
}

TEST(Flux2KV, StrictUlyssesAndRingOnTheEvenRun) {
  if (worldSize() != 2) GTEST_SKIP() << "runs under mpirun -np 2";
  for (const Strategy& s : {test::makeStrategy(1, 1, 2), test::makeStrategy(1, 2, 1)}) {
    SCOPED_TRACE(test::strategyLabel(s));
    DeviceMeshOptions o;
    o.timeout_s = 120;
    DeviceMesh mesh(s, MPI_COMM_WORLD, o);
    auto w = test::flux2TransformerWeights();
    Flux2Transformer2DModel m(test::flux2TransformerConfig(), *w,
                              test::transformerParallelism(s, mesh));
    const KvRun r = kvRun(0);
    Flux2KVCache cache(r.refLatents.size(1));
    const Loop l = denoise(m, r, &cache);
    EXPECT_LE(test::maxAbsDiff(l.final, oneRank()[0].first.final), 1e-5);
  }
}

TEST(Flux2KV, FourRankStrategiesMatch) {
  if (worldSize() != 4) GTEST_SKIP() << "runs under mpirun -np 4";
  expectStrategyMatches(test::makeStrategy(2, 1, 2, /*ulyAny=*/true));
  // ring 2 x ulysses 2 is strict: only run 0's 560 tokens divide by 4.
  DeviceMeshOptions o;
  o.timeout_s = 120;
  const Strategy s = test::makeStrategy(1, 2, 2);
  SCOPED_TRACE(test::strategyLabel(s));
  DeviceMesh mesh(s, MPI_COMM_WORLD, o);
  auto w = test::flux2TransformerWeights();
  Flux2Transformer2DModel m(test::flux2TransformerConfig(), *w,
                            test::transformerParallelism(s, mesh));
  const KvRun r = kvRun(0);
  Flux2KVCache cache(r.refLatents.size(1)), uncached(r.refLatents.size(1), true);
  const Loop a = denoise(m, r, &cache), b = denoise(m, r, &uncached);
  EXPECT_LE(test::maxAbsDiff(a.final, b.final), 1e-5);
  EXPECT_LE(test::maxAbsDiff(a.final, oneRank()[0].first.final), 1e-5);
}

// The whole pipeline on the -kv folder (model_index.json Flux2KleinKVPipeline) from the PNG
// references and the stored prompt embeddings, as make_kv_golden.py called diffusers: the
// references encoded once (1e-4), every step's latents and the final ones, the image (5e-4).
TEST(Flux2KVPipeline, ReferenceRunsMatchDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder m = ModelFolder::open(test::fixtureDir());
  EXPECT_EQ(m.pipeline_class, "Flux2KleinKVPipeline");
  Flux2KleinKVPipeline pipe(m, PipelineOptions{}, nullptr);
  const std::vector<std::vector<std::string>> refs = {
      {"edit_ref_1.png"}, {"edit_ref_2.png", "edit_ref_0.png", "edit_ref_1.png"}};
  const int seeds[] = {42, 1234}, widths[] = {64, 0}, heights[] = {48, 0};
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("run " + std::to_string(k));
    const KvRun r = kvRun(k);
    const std::string p = "run." + std::to_string(k) + ".";
    PipelineInputs in;
    for (const auto& f : refs[static_cast<size_t>(k)])
      in.reference_images.push_back(test::fixtureDir() + "/golden/" + f);
    in.width = widths[k];  // run 1: the first reference's size
    in.height = heights[k];
    in.steps = r.steps;
    in.seed = static_cast<uint64_t>(seeds[k]);
    in.guidance = 1.0;  // Flux2KleinKVPipeline has no CFG
    std::vector<at::Tensor> steps;
    PipelineCallbacks cb;
    cb.onStep = [&](int, int, const at::Tensor& lat, const at::Tensor&, double) {
      steps.push_back(lat.to(at::kFloat).clone());
      return true;
    };
    const GenerationResult res = pipe.generateFromEmbeddings(in, r.embeds, r.embeds, cb);
    ASSERT_NE(pipe.referenceKV(), nullptr);
    EXPECT_TRUE(pipe.referenceKV()->filled());
    EXPECT_EQ(pipe.referenceKV()->numRefTokens(), r.refLatents.size(1));
    EXPECT_LE(test::maxAbsDiff(res.tensors.at("ref_latents"), r.refLatents), 1e-4);
    EXPECT_TRUE(res.initial_latents.equal(r.initial));
    ASSERT_EQ(static_cast<int64_t>(steps.size()), r.steps);
    for (int i = 0; i < r.steps; ++i)
      EXPECT_LE(test::maxAbsDiff(steps[static_cast<size_t>(i)][0], r.stepLatents[i]), 5e-4)
          << "step " << i;
    const double lat = test::maxAbsDiff(res.final_latents, r.final);
    const double img = test::maxAbsDiff(res.image, kvGolden(p + "image"));
    std::printf(
        "[ run %d ] pipeline vs diffusers' Flux2KleinKVPipeline: final latents %.3g, "
        "image %.3g\n",
        k, lat, img);
    EXPECT_LE(lat, 5e-4);
    EXPECT_LE(img, 5e-4);
  }
  pipe.releaseReferenceKV();
  EXPECT_EQ(pipe.referenceKV(), nullptr);
}

// The family runtime loads the KV pipeline for the -kv folder; generate() from the prompt TEXT
// (our tokenizer and Qwen3 encoder: EDIT.md measured that path within 3e-6 of the stored
// embeddings) matches the golden, and the cache is released when generate() returns.
TEST(Flux2KVPipeline, LoadedByTheFamilyRunsFromThePromptText) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder m = ModelFolder::open(test::fixtureDir());
  auto pipe = loadPipeline(m, PipelineOptions{});
  auto* kv = dynamic_cast<Flux2KleinKVPipeline*>(pipe.get());
  ASSERT_NE(kv, nullptr);
  const KvRun r = kvRun(0);
  PipelineInputs in;
  in.prompt = "a photo of a cat";  // enc.prompt_embeds.0
  in.reference_images = {test::fixtureDir() + "/golden/edit_ref_1.png"};
  in.width = 64;
  in.height = 48;
  in.steps = r.steps;
  in.seed = 42;
  in.guidance = 1.0;
  const GenerationResult res = pipe->generate(in);
  const double lat = test::maxAbsDiff(res.final_latents, r.final);
  std::printf("[ run 0 from the prompt text ] final latents vs diffusers %.3g\n", lat);
  EXPECT_LE(lat, 5e-4);
  EXPECT_LE(test::maxAbsDiff(res.image, kvGolden("run.0.image")), 5e-4);
  EXPECT_EQ(kv->referenceKV(), nullptr);  // released by generate()
}

// The pipeline under tp 2 and ulysses 2 (anything: 99 + 512 tokens) on the 3-reference run.
TEST(Flux2KVPipeline, TwoRankPipelinesMatch) {
  if (worldSize() != 2) GTEST_SKIP() << "runs under mpirun -np 2";
  const ModelFolder m = ModelFolder::open(test::fixtureDir());
  const KvRun r = kvRun(1);
  for (const Strategy& s : {test::makeStrategy(2, 1, 1), test::makeStrategy(1, 1, 2, true)}) {
    SCOPED_TRACE(test::strategyLabel(s));
    DeviceMeshOptions o;
    o.timeout_s = 120;
    DeviceMesh mesh(s, MPI_COMM_WORLD, o);
    PipelineOptions opts;
    opts.parallel = test::transformerParallelism(s, mesh);
    Flux2KleinKVPipeline pipe(m, opts, nullptr);
    PipelineInputs in;
    for (const char* f : {"edit_ref_2.png", "edit_ref_0.png", "edit_ref_1.png"})
      in.reference_images.push_back(test::fixtureDir() + "/golden/" + f);
    in.steps = r.steps;
    in.seed = 1234;
    in.guidance = 1.0;
    const GenerationResult res = pipe.generateFromEmbeddings(in, r.embeds, r.embeds);
    const double lat = test::maxAbsDiff(res.final_latents, r.final);
    if (mesh.rank() == 0)
      std::printf("[ %s, pipeline run 1 ] final latents vs diffusers %.3g\n",
                  test::strategyLabel(s).c_str(), lat);
    EXPECT_LE(lat, 5e-4);
    EXPECT_LE(test::maxAbsDiff(res.image, kvGolden("run.1.image")), 5e-4);
  }
}

int main(int argc, char** argv) { return dit::test::mpiTestMain(argc, argv); }
