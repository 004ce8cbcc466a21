// FLUX.2 [klein] transformer (Flux2Transformer2DModel) against the diffusers goldens of
// tests/data/tiny-flux2-A (golden/README.md: dit.N.* computed by diffusers 0.40 on CPU torch 2.6,
// float32), and its declared plans under every strategy that applies. One binary:
//  - 1 rank: config, parameter table = checkpoint, RoPE tables, time embedding, the three
//    transformer cases within 1e-4 (measured ~1e-6), hooks, input errors;
//  - 2 ranks: tp 2 (shard-on-load bytes = the plan's bytesPerRank), ulysses 2 and ring 2 (strict
//    where the token counts divide, the anything modes otherwise) on every case, each equal to the
//    golden within 1e-4 and to the one-rank output within 1e-5;
//  - 4 ranks: tp 2 x ulysses 2 and ring 2 x ulysses 2.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/family_runtime.h"
#include "backend/io/config_json.h"
#include "backend/io/model_folder.h"
#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl_flux2.h"
#include "backend/models/family_registry.h"
#include "backend/models/flux2/flux2_plan.h"
#include "backend/models/flux2/transformer_flux2.h"
#include "backend/pipelines/flux2/pipeline_flux2.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"
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

std::string transformerDir() { return test::flux2TransformerDir(); }
const Flux2TransformerConfig& config() { return test::flux2TransformerConfig(); }
std::shared_ptr<WeightSource> weights() { return test::flux2TransformerWeights(); }

TransformerInputs caseInputs(int n) {
  const std::string p = "dit." + std::to_string(n) + ".in.";
  return {{"hidden_states", test::golden(p + "hidden_states")},
          {"encoder_hidden_states", test::golden(p + "encoder_hidden_states")},
          {"timestep", test::golden(p + "timestep")},
          {"img_ids", test::golden(p + "img_ids")},
          {"txt_ids", test::golden(p + "txt_ids")}};
}

at::Tensor caseOutput(int n) { return test::golden("dit." + std::to_string(n) + ".out"); }

// The one-rank output of every case (computed once per process).
const std::vector<at::Tensor>& oneRankOutputs() {
  static const std::vector<at::Tensor> out = [] {
    auto w = weights();
    Flux2Transformer2DModel m(config(), *w);
    std::vector<at::Tensor> o;
    for (int n = 0; n < 3; ++n) o.push_back(m.forward(caseInputs(n)));
    return o;
  }();
  return out;
}

Strategy strategy(int tp, int ring, int uly, bool ulyAny = false, bool ringAny = false) {
  return test::makeStrategy(tp, ring, uly, ulyAny, ringAny);
}

// Every case under `s` (world = MPI_COMM_WORLD): equal to the golden within 1e-4 and to one rank
// within 1e-5. `cases` = the case numbers whose token counts the strategy accepts.
void expectStrategyMatches(const Strategy& s, const std::vector<int>& cases) {
  SCOPED_TRACE(test::strategyLabel(s));
  ASSERT_EQ(worldSize(), s.world);
  DeviceMeshOptions o;
  o.timeout_s = 120;
  DeviceMesh mesh(s, MPI_COMM_WORLD, o);
  const TransformerParallelism par = test::transformerParallelism(s, mesh);
  auto w = weights();
  Flux2Transformer2DModel model(config(), *w, par);
  if (s.tp_degree > 1) {
    EXPECT_EQ(w->bytesLoaded(),
              model.shardingPlan().bytesPerRank(flux2ParameterTable(config()), s.tp_degree, 4));
  }
  for (int n : cases) {
    SCOPED_TRACE("case " + std::to_string(n));
    const at::Tensor out = model.forward(caseInputs(n));
    EXPECT_LE(test::maxAbsDiff(out, caseOutput(n)), 1e-4);
    EXPECT_LE(test::maxAbsDiff(out, oneRankOutputs()[static_cast<size_t>(n)]), 1e-5);
  }
}

}  // namespace

TEST(Flux2Transformer, ConfigAndDeclaredParametersMatchTheCheckpoint) {
  const auto& c = config();
  EXPECT_EQ(c.num_attention_heads, 2);
  EXPECT_EQ(c.attention_head_dim, 16);
  EXPECT_EQ(c.mlpHidden(), 96);
  EXPECT_FALSE(c.guidance_embeds);
  // Every declared parameter is in the file with its shape, and nothing else is.
  SafetensorsCollection file(transformerDir() + "/diffusion_pytorch_model.safetensors");
  const ParameterTable t = flux2ParameterTable(c);
  EXPECT_EQ(t.size(), file.names().size());
  for (const auto& name : file.names()) {
    const ParameterInfo* p = t.find(name);
    ASSERT_NE(p, nullptr) << name << " is in the checkpoint but not declared";
    EXPECT_EQ(p->shape, file.info(name).shape) << name;
  }
  // Registered by class name on both sides.
  const nlohmann::json j = readConfigJson(transformerDir() + "/config.json");
  const ModelDims d = transformerFamily("Flux2Transformer2DModel", "x").dims(j, "x");
  EXPECT_EQ(d.num_attention_heads, 2);
  EXPECT_EQ(d.parameters->size(), t.size());
}

TEST(Flux2Transformer, BadConfigsRefusedNamingTheKey) {
  nlohmann::json j = readConfigJson(transformerDir() + "/config.json");
  auto refused = [&](const nlohmann::json& bad, const std::string& what) {
    try {
      (void)parseFlux2TransformerConfig(bad, "cfg.json");
      ADD_FAILURE() << "accepted: " << what;
    } catch (const ModelFileError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
    }
  };
  auto b = j;
  b["axes_dims_rope"] = {4, 4, 4, 6};
  refused(b, "axes_dims_rope sum 18 differs from attention_head_dim 16");
  b = j;
  b["num_layers"] = -1;
  refused(b, "num_layers");
  b = j;
  b["mlp_ratio"] = "3";
  refused(b, "mlp_ratio");
  b = j;
  b["num_layers"] = 0;
  b["num_single_layers"] = 0;
  refused(b, "no transformer blocks");
}

TEST(Flux2Transformer, RopeTablesAndTimeEmbeddingMatchDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  auto w = weights();
  Flux2Transformer2DModel m(config(), *w);
  const auto in = caseInputs(0);
  const auto [cos, sin] = m.rotaryTables(in.at("txt_ids"), in.at("img_ids"));
  EXPECT_LE(test::maxAbsDiff(cos, test::golden("dit.0.rope_cos")), 1e-6);
  EXPECT_LE(test::maxAbsDiff(sin, test::golden("dit.0.rope_sin")), 1e-6);
  EXPECT_LE(test::maxAbsDiff(m.timeEmbedding(in.at("timestep")), test::golden("dit.0.temb")), 1e-5);
}

TEST(Flux2Transformer, ForwardMatchesDiffusersOnEveryCase) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  for (int n = 0; n < 3; ++n) {
    const double d = test::maxAbsDiff(oneRankOutputs()[static_cast<size_t>(n)], caseOutput(n));
    std::printf("dit.%d: max |diff| vs diffusers %.3g\n", n, d);
    EXPECT_LE(d, 1e-4) << "case " << n;
  }
  // Loaded through the Torch registry by class name: the same function.
  const nlohmann::json j = readConfigJson(transformerDir() + "/config.json");
  auto w = weights();
  auto t = loadTransformer("Flux2Transformer2DModel", j, transformerDir() + "/config.json", *w);
  EXPECT_TRUE(t->forward(caseInputs(1)).equal(oneRankOutputs()[1]));
}

TEST(Flux2Transformer, InputErrorsNameTheInput) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  auto w = weights();
  Flux2Transformer2DModel m(config(), *w);
  auto in = caseInputs(0);
  in.erase("img_ids");
  try {
    (void)m.forward(in);
    ADD_FAILURE() << "accepted a missing input";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'img_ids' is missing"), std::string::npos) << e.what();
  }
  in = caseInputs(0);
  in["pooled_projections"] = at::zeros({1, 4});
  try {
    (void)m.forward(in);
    ADD_FAILURE() << "accepted an unknown input";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown input 'pooled_projections'"), std::string::npos)
        << e.what();
  }
}

TEST(Flux2Transformer, HooksSeeEveryBlock) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  struct Count : TransformerHooks {
    int before = 0, after = 0;
    void beforeBlock(const char*, int, const at::Tensor&, const at::Tensor&) override { ++before; }
    void afterBlock(const char*, int, const at::Tensor&, const at::Tensor&) override { ++after; }
  } hooks;
  auto w = weights();
  Flux2Transformer2DModel m(config(), *w);
  m.setHooks(&hooks);
  EXPECT_TRUE(m.forward(caseInputs(0)).equal(oneRankOutputs()[0]));
  EXPECT_EQ(hooks.before, config().num_layers + config().num_single_layers);
  EXPECT_EQ(hooks.after, hooks.before);
}

TEST(Flux2Transformer, TwoRankStrategiesEqualOneRank) {
  if (worldSize() != 2) GTEST_SKIP() << "runs under mpirun -np 2";
  // Case 0 (16 image + 24 text tokens) divides by 2; cases 1 (15 + 512) and 2 (10 + 17) need the
  // anything modes.
  expectStrategyMatches(strategy(2, 1, 1), {0, 1, 2});
  expectStrategyMatches(strategy(1, 1, 2), {0});
  expectStrategyMatches(strategy(1, 2, 1), {0});
  expectStrategyMatches(strategy(1, 1, 2, /*ulyAny=*/true), {0, 1, 2});
  expectStrategyMatches(strategy(1, 2, 1, false, /*ringAny=*/true), {0, 1, 2});
}

TEST(Flux2Transformer, FourRankStrategiesEqualOneRank) {
  if (worldSize() != 4) GTEST_SKIP() << "runs under mpirun -np 4";
  // tp 2 leaves one head per rank: Ulysses 2 over it needs ulysses_anything (heads not
  // divisible), as the strategy rules say.
  expectStrategyMatches(strategy(2, 1, 2, /*ulyAny=*/true), {0, 1, 2});
  expectStrategyMatches(strategy(1, 2, 2), {0});
}

// FLUX.2's schedule: linspace sigmas, mu from compute_empirical_mu (depends on the step count,
// unlike FLUX.1's calculate_shift), exponential time shift: every (steps, image_seq_len) of the
// grid, including 4300/4301 around the switch.
TEST(Flux2Scheduler, EmpiricalMuScheduleMatchesDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const std::string f = test::fixtureDir() + "/scheduler/scheduler_config.json";
  const SchedulerConfig cfg = parseSchedulerConfig(readConfigJson(f), f);
  const auto& cases = test::goldenJson().at("scheduler").at("cases");
  ASSERT_EQ(cases.size(), 45u);
  for (const auto& c : cases) {
    const int steps = c.at("steps").get<int>(), seq = c.at("image_seq_len").get<int>();
    SCOPED_TRACE("steps " + std::to_string(steps) + " image_seq_len " + std::to_string(seq));
    const double mu = computeEmpiricalMu(seq, steps);
    EXPECT_NEAR(mu, c.at("mu").get<double>(), 1e-12);
    const SchedulerTables t = flowMatchSchedule(cfg, steps, mu);
    const std::string key = "sched." + std::to_string(steps) + "." + std::to_string(seq) + ".";
    const at::Tensor sig = test::golden(key + "sigmas"), ts = test::golden(key + "timesteps");
    ASSERT_EQ(static_cast<int64_t>(t.sigmas.size()), sig.numel());
    ASSERT_EQ(static_cast<int64_t>(t.timesteps.size()), ts.numel());
    for (int64_t i = 0; i < sig.numel(); ++i)
      EXPECT_NEAR(t.sigmas[static_cast<size_t>(i)], sig[i].item<float>(), 1e-6) << "sigma " << i;
    for (int64_t i = 0; i < ts.numel(); ++i)
      EXPECT_NEAR(t.timesteps[static_cast<size_t>(i)], ts[i].item<float>(), 1e-4)
          << "timestep " << i;
  }
}

namespace {
std::unique_ptr<AutoencoderKLFlux2> loadVae() {
  const std::string dir = test::fixtureDir() + "/vae";
  const nlohmann::json j = readConfigJson(dir + "/config.json");
  auto w =
      WeightSource::fromFolder(dir, "diffusion_pytorch_model", at::kFloat, c10::Device(at::kCPU));
  return std::make_unique<AutoencoderKLFlux2>(parseAutoencoderKLConfig(j, dir + "/config.json"),
                                              j.at("batch_norm_eps").get<double>(), *w);
}
}  // namespace

// AutoencoderKLFlux2: decode, encode (posterior mean and std), the pipeline's conditioning-image
// latents, and the whole packed -> image chain of the pipeline's decode.
TEST(Flux2Vae, DecodeEncodeAndLatentChainMatchDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  auto vae = loadVae();
  EXPECT_EQ(vae->vaeScaleFactor(), 4);
  const double dec = test::maxAbsDiff(vae->autoencoder().decode(test::golden("vae.decode.in")),
                                      test::golden("vae.decode.out"));
  const auto post = vae->autoencoder().encode(test::golden("vae.encode.in"));
  const double mean = test::maxAbsDiff(post.mean, test::golden("vae.encode.mean"));
  const double sd = test::maxAbsDiff(post.std, test::golden("vae.encode.std"));
  const double lat = test::maxAbsDiff(vae->encodeNormalized(test::golden("vae.encode.in")),
                                      test::golden("vae.encode.pipeline_latents"));
  std::printf("vae: decode %.3g, encode mean %.3g std %.3g, pipeline latents %.3g\n", dec, mean, sd,
              lat);
  EXPECT_LE(dec, 1e-4);
  EXPECT_LE(mean, 1e-4);
  EXPECT_LE(sd, 1e-4);
  EXPECT_LE(lat, 1e-4);
  // The chain: packed [1, 12, 16] -> unpacked [1, 16, 3, 4] -> denormalised -> unpatchified
  // [1, 4, 6, 8] -> decoded [1, 3, 24, 32].
  const at::Tensor packed = test::golden("vae.chain.in_packed");
  const at::Tensor unpacked = unpackFlux2Latents(packed, 3, 4);
  EXPECT_TRUE(unpacked.equal(test::golden("vae.chain.unpacked")));
  EXPECT_TRUE(packFlux2Latents(unpacked).equal(packed));
  const at::Tensor den = vae->denormalize(unpacked);
  EXPECT_LE(test::maxAbsDiff(den, test::golden("vae.chain.denormalized")), 1e-6);
  const at::Tensor unp = unpatchifyLatents(den);
  EXPECT_LE(test::maxAbsDiff(unp, test::golden("vae.chain.unpatchified")), 1e-6);
  EXPECT_TRUE(patchifyLatents(unp).equal(den));
  const at::Tensor decoded = vae->decodePacked(packed, 3, 4);
  EXPECT_LE(test::maxAbsDiff(decoded, test::golden("vae.chain.decoded")), 1e-4);
  const at::Tensor image = (decoded[0] / 2 + 0.5).clamp(0, 1);
  EXPECT_LE(test::maxAbsDiff(image, test::golden("vae.chain.image")), 1e-4);
}

namespace {
struct RunSpec {
  int prompt, seed, height, width, steps;
  double guidance;
};
// golden.json runs (README "Whole runs").
RunSpec runSpec(int n) {
  const auto& r = test::goldenJson().at("runs").at(static_cast<size_t>(n));
  return {r.at("prompt_index").get<int>(), r.at("seed").get<int>(),
          r.at("height").get<int>(),       r.at("width").get<int>(),
          r.at("steps").get<int>(),        r.at("guidance_scale").get<double>()};
}
PipelineInputs runInputs(const RunSpec& r) {
  PipelineInputs p;
  p.seed = static_cast<uint64_t>(r.seed);
  p.height = r.height;
  p.width = r.width;
  p.steps = r.steps;
  p.guidance = r.guidance;
  return p;
}
at::Tensor promptEmbeds(int prompt) {
  return test::golden("enc.prompt_embeds." + std::to_string(prompt)).unsqueeze(0);
}
// Checks run n's latents after every step, its final latents and image against the goldens.
void expectRunMatches(int n, const GenerationResult& r, const std::vector<at::Tensor>& steps) {
  const std::string k = "run." + std::to_string(n) + ".";
  const at::Tensor stepGolden = test::golden(k + "step_latents");
  ASSERT_EQ(static_cast<int64_t>(steps.size()), stepGolden.size(0));
  for (size_t i = 0; i < steps.size(); ++i)
    EXPECT_LE(test::maxAbsDiff(steps[i][0], stepGolden[static_cast<int64_t>(i)]), 1e-4)
        << "step " << i;
  const double lat = test::maxAbsDiff(r.final_latents, test::golden(k + "final_latents"));
  const double img = test::maxAbsDiff(r.image, test::golden(k + "image"));
  std::printf("run.%d: final latents %.3g, image %.3g\n", n, lat, img);
  EXPECT_LE(lat, 1e-4);
  EXPECT_LE(img, 1e-4);
}
}  // namespace

// Flux2KleinPipeline from the golden prompt embeddings (as the goldens were made): noise drawn
// in the patchified layout, the schedule, CFG only when guidance > 1 (runs 0 and 2), decode.
TEST(Flux2Pipeline, RunsFromEmbeddingsMatchDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder m = ModelFolder::open(test::fixtureDir());
  EXPECT_EQ(m.pipeline_class, "Flux2KleinPipeline");
  EXPECT_EQ(m.transformer_class, "Flux2Transformer2DModel");
  Flux2KleinPipeline pipe(m, PipelineOptions{}, nullptr);
  for (int n = 0; n < 3; ++n) {
    SCOPED_TRACE("run " + std::to_string(n));
    const RunSpec spec = runSpec(n);
    const PipelineInputs in = runInputs(spec);
    EXPECT_EQ(pipe.doClassifierFreeGuidance(in), spec.guidance > 1);
    std::vector<at::Tensor> steps;
    PipelineCallbacks cb;
    cb.onStep = [&](int, int, const at::Tensor& lat, const at::Tensor&, double) {
      steps.push_back(lat.to(at::kFloat).clone());
      return true;
    };
    const GenerationResult r =
        pipe.generateFromEmbeddings(in, promptEmbeds(spec.prompt), promptEmbeds(2), cb);
    const std::string k = "run." + std::to_string(n) + ".";
    EXPECT_TRUE(r.tensors.at("initial_noise").equal(test::golden(k + "initial_noise")));
    EXPECT_TRUE(r.initial_latents.equal(test::golden(k + "initial_latents")));
    EXPECT_EQ(r.params.height, test::golden(k + "image").size(1));  // 30x58 -> 24x56
    EXPECT_EQ(r.params.width, test::golden(k + "image").size(2));
    expectRunMatches(n, r, steps);
  }
}

// Issue 35: Flux2KleinPipeline has no 512-token cap (that is FluxPipeline's T5 rule): a 1024-token
// run goes through the chat template, the tokenizer (padded to 1024) and the Qwen3 encoder and
// gives finite latents; the limit is the text encoder's max_position_embeddings.
TEST(Flux2Pipeline, MaxSequenceLength1024IsKleinsOwnLimit) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder m = ModelFolder::open(test::fixtureDir());
  auto pipe = loadPipeline(m, PipelineOptions{});
  PipelineInputs in;
  in.prompt = "a photo of a cat";
  in.width = 32;
  in.height = 32;
  in.steps = 1;
  in.guidance = 1.0;  // no CFG: one 1024-token prompt (kept short: the suite runs it on CPUs)
  in.seed = 42;
  in.max_sequence_length = 1024;
  EXPECT_EQ(pipe->resolve(in).max_sequence_length, 1024);
  const GenerationResult r = pipe->generate(in);
  EXPECT_EQ(r.steps_done, 1);
  ASSERT_TRUE(r.final_latents.defined());
  EXPECT_TRUE(at::isfinite(r.final_latents).all().item<bool>());
  EXPECT_TRUE(at::isfinite(r.image).all().item<bool>());
  // Its own limit: the Qwen3 positions (40960 in the fixture's config).
  in.max_sequence_length = 40961;
  try {
    pipe->resolve(in);
    ADD_FAILURE() << "40961 tokens accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be greater than 40960 for Flux2KleinPipeline"),
              std::string::npos)
        << e.what();
  }
}

// From the prompt string: chat template, Qwen2 tokenizer, Qwen3 encoder, then the same run
// (loaded through the registry by model_index.json's class name).
TEST(Flux2Pipeline, RunFromPromptMatchesDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder m = ModelFolder::open(test::fixtureDir());
  auto pipe = loadPipeline(m, PipelineOptions{});
  for (int n : {0, 1}) {
    const RunSpec spec = runSpec(n);
    PipelineInputs in = runInputs(spec);
    in.prompt = test::goldenJson().at("runs").at(static_cast<size_t>(n)).at("prompt");
    std::vector<at::Tensor> steps;
    PipelineCallbacks cb;
    cb.onStep = [&](int, int, const at::Tensor& lat, const at::Tensor&, double) {
      steps.push_back(lat.to(at::kFloat).clone());
      return true;
    };
    expectRunMatches(n, pipe->generate(in, cb), steps);
  }
  EXPECT_GT(pipe->weightBytes().at("text_encoder"), 0u);
  // Refused features name themselves (the generic capability refusal); step caching waits for
  // the transformer's step-cache seam.
  PipelineInputs bad = runInputs(runSpec(0));
  bad.cache.mode = StepCacheConfig::Mode::FirstBlock;
  if (!pipe->transformer().supportsStepCache()) {
    try {
      (void)pipe->resolve(bad);
      ADD_FAILURE() << "step caching accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("not supported for FLUX.2"), std::string::npos);
    }
  }
  // Image-to-image runs now: a missing init image is named.
  PipelineInputs missing = runInputs(runSpec(0));
  missing.init_image = "x.png";
  try {
    (void)pipe->resolve(missing);
    ADD_FAILURE() << "a missing init image was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("x.png"), std::string::npos) << e.what();
  }
}

// Flux2KleinInpaintPipeline through the shared loop (golden/INPAINT.md, from diffusers
// 0.40.0.dev0): the size from the init image, the posterior-mode image latents BatchNorm-
// normalised, the binarised mask bilinear-sampled to the token grid, strength's t_start and
// scale_noise, the init image as T = 10 conditioning tokens every step, the per-step blend, CFG
// (runs 0 and 2). Tolerances of INPAINT.md: masks, noise and ids exact, image_latents and
// initial latents 1e-4, step/final latents and image 5e-4.
struct InpaintRun {
  const char* mask;
  double strength;
  int steps, prompt, seed;
  double guidance;
  int t_start;
};
const InpaintRun kInpaintRuns[] = {{"rect", 0.6, 4, 0, 42, 4.0, 1},
                                   {"soft", 1.0, 3, 1, 7, 1.0, 0},
                                   {"white", 0.5, 4, 5, 1234, 2.5, 2}};

const SafetensorsCollection& inpaintGoldens() {
  static SafetensorsCollection g(test::fixtureDir() + "/golden/inpaint.safetensors");
  return g;
}
at::Tensor inpaintGolden(const std::string& name) {
  const auto& info = inpaintGoldens().info(name);
  return loadTensor(inpaintGoldens(), name, info.dtype == DType::I64 ? at::kLong : at::kFloat);
}
PipelineInputs inpaintInputs(const InpaintRun& r, bool withMask = true) {
  PipelineInputs p;
  p.seed = static_cast<uint64_t>(r.seed);
  p.steps = r.steps;
  p.guidance = r.guidance;
  p.strength = r.strength;
  p.init_image = test::fixtureDir() + "/golden/inpaint_image.png";
  if (withMask) p.mask_image = test::fixtureDir() + "/golden/inpaint_mask_" + r.mask + ".png";
  return p;
}

TEST(Flux2Pipeline, InpaintMatchesDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder m = ModelFolder::open(test::fixtureDir());
  Flux2KleinPipeline pipe(m, PipelineOptions{}, nullptr);
  for (int n = 0; n < 3; ++n) {
    SCOPED_TRACE("inpaint run " + std::to_string(n));
    const InpaintRun& run = kInpaintRuns[n];
    const std::string k = "run." + std::to_string(n) + ".";
    PipelineInputs in = inpaintInputs(run);
    if (n == 1) in.width = in.height = 1000;  // ignored: the size is the init image's
    std::vector<at::Tensor> steps;
    PipelineCallbacks cb;
    cb.onStep = [&](int, int total, const at::Tensor& lat, const at::Tensor&, double) {
      EXPECT_EQ(total, run.steps - run.t_start);
      steps.push_back(lat.to(at::kFloat).clone());
      return true;
    };
    const GenerationResult r =
        pipe.generateFromEmbeddings(in, promptEmbeds(run.prompt), promptEmbeds(2), cb);
    EXPECT_EQ(r.params.width, 64);
    EXPECT_EQ(r.params.height, 48);
    EXPECT_EQ(r.t_start, run.t_start);
    // Exact: the binarised mask, the mask on the token grid, the noise draw.
    EXPECT_TRUE(r.tensors.at("mask_in").equal(inpaintGolden(k + "mask_condition")));
    EXPECT_TRUE(r.tensors.at("mask_latents").equal(inpaintGolden(k + "mask_packed")));
    EXPECT_TRUE(packFlux2Latents(r.tensors.at("initial_noise")).equal(inpaintGolden(k + "noise")));
    EXPECT_LE(test::maxAbsDiff(r.tensors.at("image_in"), inpaintGolden(k + "init_image")), 1e-6);
    const double il =
        test::maxAbsDiff(r.tensors.at("image_latents"), inpaintGolden(k + "image_latents"));
    const double init = test::maxAbsDiff(r.initial_latents, inpaintGolden(k + "initial_latents"));
    EXPECT_LE(il, 1e-4);
    EXPECT_LE(init, 1e-4);
    const at::Tensor stepGolden = inpaintGolden(k + "step_latents");
    ASSERT_EQ(static_cast<int64_t>(steps.size()), stepGolden.size(0));
    for (size_t i = 0; i < steps.size(); ++i)
      EXPECT_LE(test::maxAbsDiff(steps[i][0], stepGolden[static_cast<int64_t>(i)]), 5e-4)
          << "step " << i;
    const double fin = test::maxAbsDiff(r.final_latents, inpaintGolden(k + "final_latents"));
    const double img = test::maxAbsDiff(r.image, inpaintGolden(k + "image"));
    std::printf(
        "inpaint run.%d: image_latents %.3g, initial %.3g, final latents %.3g, image %.3g\n", n, il,
        init, fin, img);
    EXPECT_LE(fin, 5e-4);
    EXPECT_LE(img, 5e-4);
    // Tokens outside the mask end exactly on the clean image latents.
    const at::Tensor keep = r.tensors.at("mask_latents").eq(0).expand_as(r.final_latents);
    const at::Tensor clean = packFlux2Latents(r.tensors.at("image_latents"));
    EXPECT_TRUE(r.final_latents.masked_select(keep).equal(clean.masked_select(keep)));
  }
  // Image-to-image = the same without a mask (diffusers' all-white mask keeps every update):
  // run 2's result exactly.
  const InpaintRun& run = kInpaintRuns[2];
  const GenerationResult masked =
      pipe.generateFromEmbeddings(inpaintInputs(run), promptEmbeds(run.prompt), promptEmbeds(2));
  const GenerationResult i2i = pipe.generateFromEmbeddings(
      inpaintInputs(run, false), promptEmbeds(run.prompt), promptEmbeds(2));
  EXPECT_EQ(i2i.tensors.count("mask_latents"), 0u);
  EXPECT_TRUE(i2i.final_latents.equal(masked.final_latents));
  EXPECT_LE(test::maxAbsDiff(i2i.image, inpaintGolden("run.2.image")), 5e-4);
}

// FlowMatchEulerDiscreteScheduler with strength (get_timesteps) and scale_noise against the
// inpaint runs' full schedules and start latents.
TEST(Flux2Pipeline, SchedulerStrengthAndScaleNoiseMatchDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder m = ModelFolder::open(test::fixtureDir());
  for (int n = 0; n < 3; ++n) {
    SCOPED_TRACE("inpaint run " + std::to_string(n));
    const InpaintRun& run = kInpaintRuns[n];
    const std::string k = "run." + std::to_string(n) + ".";
    FlowMatchEulerDiscreteScheduler s(flux2Config(m).scheduler);
    s.setTimesteps(run.steps, computeEmpiricalMu(48, run.steps), run.strength);
    EXPECT_EQ(s.beginIndex(), run.t_start);
    EXPECT_EQ(s.stepsToRun(), run.steps - run.t_start);
    const at::Tensor ts = inpaintGolden(k + "timesteps"), sg = inpaintGolden(k + "sigmas");
    ASSERT_EQ(ts.numel(), s.numInferenceSteps());
    ASSERT_EQ(sg.numel(), s.numInferenceSteps() + 1);
    for (int i = 0; i < s.numInferenceSteps(); ++i)
      EXPECT_NEAR(s.timestep(i), ts[i].item<float>(), 1e-4) << i;
    for (int i = 0; i <= s.numInferenceSteps(); ++i)
      EXPECT_NEAR(s.sigma(i), sg[i].item<float>(), 1e-6) << i;
    EXPECT_NEAR(s.timestep(s.beginIndex()), inpaintGolden(k + "latent_timestep").item<float>(),
                1e-4);
    // scale_noise on the stored tensors is the stored start, bit for bit (INPAINT.md 6).
    const at::Tensor x = s.scaleNoise(inpaintGolden(k + "image_latents_packed"), s.beginIndex(),
                                      inpaintGolden(k + "noise"));
    EXPECT_TRUE(x.equal(inpaintGolden(k + "initial_latents")));
  }
  FlowMatchEulerDiscreteScheduler s(flux2Config(m).scheduler);
  EXPECT_THROW((void)s.timestep(0), std::out_of_range);  // no setTimesteps yet
  EXPECT_THROW(s.setTimesteps(4, 1.0, 0.0), std::invalid_argument);
  EXPECT_THROW(s.setTimesteps(4, 1.0, 1.5), std::invalid_argument);
  s.setTimesteps(4, 1.0, 0.2);  // int(4 - 0.8) = 3: one step runs
  EXPECT_EQ(s.beginIndex(), 3);
  EXPECT_EQ(s.stepsToRun(), 1);
  EXPECT_THROW((void)s.timestep(4), std::out_of_range);
}

// cfg 2: the conditional and unconditional calls on two ranks, the same image; tp 2 from the
// prompt: the text encoder and the transformer sharded, the same image.
TEST(Flux2Pipeline, CfgParallelAndTensorParallelRunsEqualOneRank) {
  if (worldSize() != 2) GTEST_SKIP() << "runs under mpirun -np 2";
  const ModelFolder m = ModelFolder::open(test::fixtureDir());
  for (const char* mode : {"cfg", "tp"}) {
    SCOPED_TRACE(mode);
    Strategy s;
    s.world = 2;
    (std::string(mode) == "cfg" ? s.cfg_degree : s.tp_degree) = 2;
    DeviceMeshOptions o;
    o.timeout_s = 120;
    DeviceMesh mesh(s, MPI_COMM_WORLD, o);
    PipelineOptions opts;
    if (s.cfg_degree == 2) opts.cfg = mesh.group("cfg");
    if (s.tp_degree == 2) opts.parallel.tp = mesh.group("tp");
    auto pipe = loadPipeline(m, opts);
    const RunSpec spec = runSpec(0);
    PipelineInputs in = runInputs(spec);
    in.prompt = test::goldenJson().at("runs").at(0).at("prompt");
    std::vector<at::Tensor> steps;
    PipelineCallbacks cb;
    cb.onStep = [&](int, int, const at::Tensor& lat, const at::Tensor&, double) {
      steps.push_back(lat.to(at::kFloat).clone());
      return true;
    };
    expectRunMatches(0, pipe->generate(in, cb), steps);
  }
}

TEST(Flux2Transformer, TensorParallelRefusedWhenHeadsDoNotDivide) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ShardingPlan plan = flux2ShardingPlan(config());
  const auto issues = plan.validate(flux2ParameterTable(config()), 4);
  ASSERT_FALSE(issues.empty());
  std::string all;
  for (const auto& i : issues) all += i.message + "\n";
  EXPECT_NE(all.find("num_attention_heads"), std::string::npos) << all;
}

int main(int argc, char** argv) { return dit::test::mpiTestMain(argc, argv); }
