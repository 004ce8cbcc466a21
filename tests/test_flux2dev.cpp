// FLUX.2 [dev] (diffusers' Flux2Pipeline) against tests/data/tiny-flux2dev-A (golden/README.md:
// transformer, VAE, scheduler and runs from diffusers 0.40 on CPU torch 2.6, float32; the text
// encoder from the fixture's own Mistral reference). One binary:
//  - 1 rank: the folder opens as Flux2Pipeline (Mistral3 config, layers 10/20/30, declared
//    request: guidance read, no CFG, no negative prompt), the transformer with the guidance
//    embedding on the three cases (RoPE tables, temb = timestep + guidance embedding), the
//    schedule (compute_empirical_mu, exponential shift), the three whole runs from the stored
//    prompt embeddings and from the prompt text (final latents and image within 1e-4), bad
//    folders refused naming the file and key;
//  - 2 ranks: tp 2 (the Mistral text encoder sharded too, K/V included), ulysses 2 and ring 2
//    (the anything modes for run 2's 131 tokens) from the prompt text, equal to the goldens;
//  - 4 ranks: tp 2 x ulysses 2 (anything: one head per tp rank), and the text encoder alone at
//    tp 4 (4 query heads, 2 KV heads: K/V replicated) equal to the golden embeddings.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/family_runtime.h"
#include "backend/io/config_json.h"
#include "backend/io/model_folder.h"
#include "backend/io/weight_source.h"
#include "backend/models/family_registry.h"
#include "backend/models/flux2/transformer_flux2.h"
#include "backend/models/text_encoders/modeling_qwen3.h"
#include "backend/pipelines/flow_match_pipeline.h"
#include "backend/pipelines/flux2/pipeline_flux2.h"
#include "backend/pipelines/prompt_encoding.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"
#include "backend/tokenizers/mistral_tokenizer.h"
#include "golden_util.h"
#include "parallel/device_mesh.h"
#include "parallel/strategy.h"
#include "strategy_test_util.h"
#include "tp_test_util.h"

using namespace dit;
namespace fs = std::filesystem;

namespace {

int worldSize() { return test::worldSize(); }

const ModelFolder& folder() {
  static const ModelFolder m = ModelFolder::open(test::fixtureDir());
  return m;
}

TransformerInputs caseInputs(int n) {
  const std::string p = "dit." + std::to_string(n) + ".in.";
  return {{"hidden_states", test::golden(p + "hidden_states")},
          {"encoder_hidden_states", test::golden(p + "encoder_hidden_states")},
          {"timestep", test::golden(p + "timestep")},
          {"guidance", test::golden(p + "guidance")},
          {"img_ids", test::golden(p + "img_ids")},
          {"txt_ids", test::golden(p + "txt_ids")}};
}

std::unique_ptr<Flux2Transformer2DModel> loadTransformer() {
  auto w = WeightSource::fromFolder(test::fixtureDir() + "/transformer", "diffusion_pytorch_model",
                                    at::kFloat, c10::Device(at::kCPU));
  return std::make_unique<Flux2Transformer2DModel>(flux2Config(folder()).transformer, *w);
}

struct RunSpec {
  int prompt, seed, height, width, steps, msl;
  double guidance;
  std::string text;
};
RunSpec runSpec(int n) {
  const auto& r = test::goldenJson().at("runs").at(static_cast<size_t>(n));
  return {r.at("prompt_index").get<int>(),
          r.at("seed").get<int>(),
          r.at("height").get<int>(),
          r.at("width").get<int>(),
          r.at("steps").get<int>(),
          r.at("max_sequence_length").get<int>(),
          r.at("guidance_scale").get<double>(),
          r.at("prompt").get<std::string>()};
}
PipelineInputs runInputs(const RunSpec& r, bool withPrompt) {
  PipelineInputs p;
  p.seed = static_cast<uint64_t>(r.seed);
  p.height = r.height;
  p.width = r.width;
  p.steps = r.steps;
  p.guidance = r.guidance;
  p.max_sequence_length = r.msl;
  if (withPrompt) p.prompt = r.text;
  return p;
}

// Run n's step latents (1e-4), final latents and image (1e-4) against the goldens; returns the
// final latents' max abs diff.
double expectRunMatches(int n, const GenerationResult& r, const std::vector<at::Tensor>& steps,
                        const std::string& label) {
  const std::string k = "run." + std::to_string(n) + ".";
  const at::Tensor stepGolden = test::golden(k + "step_latents");
  EXPECT_EQ(static_cast<int64_t>(steps.size()), stepGolden.size(0)) << "transformer calls";
  for (size_t i = 0; i < steps.size() && static_cast<int64_t>(i) < stepGolden.size(0); ++i)
    EXPECT_LE(test::maxAbsDiff(steps[i][0], stepGolden[static_cast<int64_t>(i)]), 1e-4)
        << "step " << i;
  const double lat = test::maxAbsDiff(r.final_latents, test::golden(k + "final_latents"));
  const double img = test::maxAbsDiff(r.image, test::golden(k + "image"));
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("%s run.%d: final latents %.3g, image %.3g\n", label.c_str(), n, lat, img);
  EXPECT_LE(lat, 1e-4);
  EXPECT_LE(img, 1e-4);
  return lat;
}

GenerationResult generate(DiffusionPipeline& pipe, const PipelineInputs& in,
                          std::vector<at::Tensor>& steps) {
  PipelineCallbacks cb;
  cb.onStep = [&](int, int, const at::Tensor& lat, const at::Tensor&, double) {
    steps.push_back(lat.to(at::kFloat).clone());
    return true;
  };
  return pipe.generate(in, cb);
}

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Flux2DevFolder, OpensAsFlux2PipelineAndDeclaresNoCfg) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder& m = folder();
  EXPECT_EQ(m.pipeline_class, "Flux2Pipeline");
  EXPECT_EQ(m.transformer_class, "Flux2Transformer2DModel");
  const Flux2PipelineConfig& c = flux2Config(m);
  EXPECT_TRUE(c.mistral);
  EXPECT_EQ(c.text_encoder_out_layers, (std::vector<int>{10, 20, 30}));
  EXPECT_TRUE(c.transformer.guidance_embeds);
  EXPECT_EQ(c.text_encoder.head_dim, 8);
  EXPECT_FALSE(c.text_encoder.qk_norm);
  EXPECT_EQ(familyOf(m).key, "flux2-klein");  // the FLUX.2 family record, a pipeline variant
  RequestSpec s = requestSpecOf(m);
  EXPECT_EQ(s.family, "FLUX.2 [dev]");
  EXPECT_EQ(s.pipeline, "Flux2Pipeline");
  EXPECT_TRUE(s.at("guidance").read);
  EXPECT_FALSE(s.at("negative_prompt").read);
  EXPECT_NE(s.at("negative_prompt").not_read.find("guidance-distilled"), std::string::npos);
  EXPECT_EQ(s.guider.kind, GuiderSpec::Kind::None);
  EXPECT_EQ(s.default_steps, 50);
  EXPECT_EQ(s.at("max_sequence_length").max, 131072);
  EXPECT_EQ(s.max_sequence_length_rule,
            "Flux2Pipeline (the text encoder's max_position_embeddings)");
  bool factSaysDev = false;
  for (const ModelFact& f : familyOf(m).facts(m)) factSaysDev |= f.value == "FLUX.2 [dev]";
  EXPECT_TRUE(factSaysDev);
}

TEST(Flux2DevTransformer, GuidanceEmbeddingCasesMatchDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  auto m = loadTransformer();
  const auto in = caseInputs(0);
  const auto [cos, sin] = m->rotaryTables(in.at("txt_ids"), in.at("img_ids"));
  EXPECT_LE(test::maxAbsDiff(cos, test::golden("dit.0.rope_cos")), 1e-6);
  EXPECT_LE(test::maxAbsDiff(sin, test::golden("dit.0.rope_sin")), 1e-6);
  // temb = timestep_embedder(proj(1000 t)) + guidance_embedder(proj(1000 g)).
  EXPECT_LE(test::maxAbsDiff(m->timeEmbedding(in.at("timestep"), in.at("guidance")),
                             test::golden("dit.0.temb")),
            1e-5);
  EXPECT_GT(test::maxAbsDiff(test::golden("dit.0.temb"), test::golden("dit.0.temb_timestep_only")),
            1e-2);
  for (int n = 0; n < 3; ++n) {
    const at::Tensor out = m->forward(caseInputs(n));
    const double d = test::maxAbsDiff(out, test::golden("dit." + std::to_string(n) + ".out"));
    std::printf("dit.%d (guidance %.2f): max |diff| vs diffusers %.3g\n", n,
                caseInputs(n).at("guidance").item<float>(), d);
    EXPECT_LE(d, 1e-4) << "case " << n;
    if (n == 0) {  // the guidance term matters
      EXPECT_GT(test::maxAbsDiff(out, test::golden("dit.0.out_guidance_none")), 1e-2);
    }
  }
  auto noGuidance = caseInputs(0);
  noGuidance.erase("guidance");
  EXPECT_NE(errorOf([&] { (void)m->forward(noGuidance); }).find("needs a guidance value"),
            std::string::npos);
}

TEST(Flux2DevScheduler, EmpiricalMuScheduleMatchesDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const SchedulerConfig& cfg = flux2Config(folder()).scheduler;
  const auto& cases = test::goldenJson().at("scheduler").at("cases");
  ASSERT_EQ(cases.size(), 45u);
  for (const auto& c : cases) {
    const int steps = c.at("steps").get<int>(), seq = c.at("image_seq_len").get<int>();
    SCOPED_TRACE("steps " + std::to_string(steps) + " image_seq_len " + std::to_string(seq));
    const double mu = computeEmpiricalMu(seq, steps);
    EXPECT_NEAR(mu, c.at("mu").get<double>(), 1e-7);
    const SchedulerTables t = flowMatchSchedule(cfg, steps, mu);
    const std::string key = "sched." + std::to_string(steps) + "." + std::to_string(seq) + ".";
    const at::Tensor sig = test::golden(key + "sigmas"), ts = test::golden(key + "timesteps");
    ASSERT_EQ(static_cast<int64_t>(t.sigmas.size()), sig.numel());
    for (int64_t i = 0; i < sig.numel(); ++i)
      EXPECT_NEAR(t.sigmas[static_cast<size_t>(i)], sig[i].item<float>(), 1e-6) << "sigma " << i;
    for (int64_t i = 0; i < ts.numel(); ++i)
      EXPECT_NEAR(t.timesteps[static_cast<size_t>(i)], ts[i].item<float>(), 1e-4) << i;
  }
}

// Flux2Pipeline(text_encoder=None) with run.N.prompt_embeds, as the goldens were made: the noise
// in the patchified layout, guidance to the transformer every step, one call per step (no CFG).
TEST(Flux2DevPipeline, RunsFromEmbeddingsMatchDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  Flux2KleinPipeline pipe(folder(), PipelineOptions{}, nullptr);
  EXPECT_TRUE(pipe.info().guidance_embeds);
  for (int n = 0; n < 3; ++n) {
    SCOPED_TRACE("run " + std::to_string(n));
    const RunSpec spec = runSpec(n);
    const PipelineInputs in = runInputs(spec, false);
    EXPECT_FALSE(pipe.doClassifierFreeGuidance(in));
    std::vector<at::Tensor> steps;
    PipelineCallbacks cb;
    cb.onStep = [&](int, int, const at::Tensor& lat, const at::Tensor&, double) {
      steps.push_back(lat.to(at::kFloat).clone());
      return true;
    };
    const std::string k = "run." + std::to_string(n) + ".";
    const GenerationResult r = pipe.generateFromEmbeddings(
        in, test::golden(k + "prompt_embeds").unsqueeze(0), at::Tensor(), cb);
    EXPECT_TRUE(r.tensors.at("initial_noise").equal(test::golden(k + "initial_noise")));
    EXPECT_TRUE(r.initial_latents.equal(test::golden(k + "initial_latents")));
    EXPECT_EQ(r.params.height, test::golden(k + "image").size(1));  // 60x44 -> 56x40
    EXPECT_EQ(r.params.width, test::golden(k + "image").size(2));
    expectRunMatches(n, r, steps, "embeddings");
  }
}

// From the prompt text through the registry (model_index.json's Flux2Pipeline): format_input +
// SYSTEM_MESSAGE, the tekken tokenizer (left padding to max_sequence_length), the Mistral encoder
// (layers 10, 20, 30 of 32 loaded), then the same runs.
TEST(Flux2DevPipeline, RunsFromPromptMatchDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  auto pipe = loadPipeline(folder(), PipelineOptions{});
  for (int n = 0; n < 3; ++n) {
    SCOPED_TRACE("run " + std::to_string(n));
    std::vector<at::Tensor> steps;
    expectRunMatches(n, generate(*pipe, runInputs(runSpec(n), true), steps), steps, "prompt");
  }
  // The Mistral layers 1..30 of 32 (no final norm), fp32.
  const int64_t H = 24, layer = 2 * H + (32 + 2 * 16 + 32) * H + 3 * 48 * H;
  EXPECT_EQ(pipe->weightBytes().at("text_encoder"),
            static_cast<uint64_t>((704 * H + 30 * layer) * 4));
  // A negative prompt / true_cfg_scale are accepted with a warning (guidance-distilled).
  PipelineInputs in = runInputs(runSpec(0), true);
  in.negative_prompt = "blurry";
  in.options["true_cfg_scale"] = 4.0;
  std::string all;
  for (const std::string& w : pipe->requestWarnings(in)) all += w + "\n";
  EXPECT_NE(all.find("a negative prompt has no effect for FLUX.2 [dev]"), std::string::npos) << all;
  EXPECT_NE(all.find("true_cfg_scale has no effect for FLUX.2 [dev]"), std::string::npos) << all;
}

// Bad folders: wrong text-encoder shapes name the config keys, a missing chat template names the
// file, a Flux2Pipeline transformer without the guidance embedding is refused.
TEST(Flux2DevPipeline, BadFoldersRefusedNamingFileAndKey) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  {
    const fs::path d = test::copyFixture("shapes");
    auto j = readConfigJson((d / "text_encoder/config.json").string());
    j["text_config"]["intermediate_size"] = 40;
    std::ofstream(d / "text_encoder/config.json") << j.dump(2);
    const std::string msg =
        errorOf([&] { (void)loadPipeline(ModelFolder::open(d.string()), PipelineOptions{}); });
    EXPECT_NE(msg.find("model.language_model.layers.0.mlp.gate_proj.weight"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("has shape [48, 24] but the config implies [40, 24]"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("'intermediate_size' (40) rows, 'hidden_size' (24) columns"),
              std::string::npos)
        << msg;
    j["text_config"]["intermediate_size"] = 48;
    j["text_config"]["head_dim"] = 6;
    std::ofstream(d / "text_encoder/config.json") << j.dump(2);
    const std::string msg2 =
        errorOf([&] { (void)loadPipeline(ModelFolder::open(d.string()), PipelineOptions{}); });
    EXPECT_NE(msg2.find("'num_attention_heads' (4) x 'head_dim' (6) = 24 rows"), std::string::npos)
        << msg2;
  }
  {
    const fs::path d = test::copyFixture("template");
    fs::remove(d / "tokenizer/chat_template.jinja");
    auto cfg = readConfigJson((d / "tokenizer/tokenizer_config.json").string());
    cfg.erase("chat_template");
    std::ofstream(d / "tokenizer/tokenizer_config.json") << cfg.dump(2);
    const std::string msg =
        errorOf([&] { (void)loadPipeline(ModelFolder::open(d.string()), PipelineOptions{}); });
    EXPECT_NE(msg.find("tokenizer/chat_template.jinja: no chat template"), std::string::npos)
        << msg;
  }
  {
    const fs::path d = test::copyFixture("guidance");
    auto j = readConfigJson((d / "transformer/config.json").string());
    j["guidance_embeds"] = false;
    std::ofstream(d / "transformer/config.json") << j.dump(2);
    const std::string msg = errorOf([&] { (void)ModelFolder::open(d.string()); });
    EXPECT_NE(msg.find("transformer/config.json: config key 'guidance_embeds' is false"),
              std::string::npos)
        << msg;
  }
}

namespace {
// Every run from the prompt under `s` (world = MPI_COMM_WORLD), against the goldens.
void expectPipelineStrategy(const Strategy& s, const std::vector<int>& runs) {
  SCOPED_TRACE(test::strategyLabel(s));
  ASSERT_EQ(worldSize(), s.world);
  DeviceMeshOptions o;
  o.timeout_s = 120;
  DeviceMesh mesh(s, MPI_COMM_WORLD, o);
  PipelineOptions opts;
  opts.parallel = test::transformerParallelism(s, mesh);
  auto pipe = loadPipeline(folder(), opts);
  double worst = 0;
  for (int n : runs) {
    SCOPED_TRACE("run " + std::to_string(n));
    std::vector<at::Tensor> steps;
    worst = std::max(worst, expectRunMatches(n, generate(*pipe, runInputs(runSpec(n), true), steps),
                                             steps, test::strategyLabel(s)));
  }
  if (s.tp_degree > 1) {
    // The text encoder is sharded too: q/k/v/gate/up/down halve (2 KV heads: k/v split).
    const int64_t H = 24, layer = 2 * H + (32 + 2 * 16 + 32) * H / 2 + 3 * 48 * H / 2;
    EXPECT_EQ(pipe->weightBytes().at("text_encoder"),
              static_cast<uint64_t>((704 * H + 30 * layer) * 4));
  }
}
}  // namespace

TEST(Flux2DevStrategies, TwoRanksEqualDiffusers) {
  if (worldSize() != 2) GTEST_SKIP() << "runs under mpirun -np 2";
  // Runs 0 and 1 (48 + 64, 64 + 64 tokens) divide by 2; run 2 (35 + 96) needs the anything
  // modes.
  expectPipelineStrategy(test::makeStrategy(2, 1, 1), {0, 1, 2});
  expectPipelineStrategy(test::makeStrategy(1, 1, 2), {0, 1});
  expectPipelineStrategy(test::makeStrategy(1, 2, 1), {0, 1});
  expectPipelineStrategy(test::makeStrategy(1, 1, 2, /*ulyAny=*/true), {2});
  expectPipelineStrategy(test::makeStrategy(1, 2, 1, false, /*ringAny=*/true), {2});
}

TEST(Flux2DevStrategies, FourRanksEqualDiffusers) {
  if (worldSize() != 4) GTEST_SKIP() << "runs under mpirun -np 4";
  // tp 2 leaves one head per rank: Ulysses 2 over it needs ulysses_anything.
  expectPipelineStrategy(test::makeStrategy(2, 1, 2, /*ulyAny=*/true), {0, 1, 2});
}

// The Mistral encoder alone at tp 4: 4 query heads split, the 2 KV heads replicated (tp does not
// divide them), the same embeddings.
TEST(Flux2DevStrategies, TextEncoderTp4ReplicatesKV) {
  if (worldSize() != 4) GTEST_SKIP() << "runs under mpirun -np 4";
  Strategy s = test::makeStrategy(4, 1, 1);
  DeviceMeshOptions o;
  o.timeout_s = 120;
  DeviceMesh mesh(s, MPI_COMM_WORLD, o);
  const Flux2PipelineConfig& c = flux2Config(folder());
  auto w = WeightSource::fromFolder(test::fixtureDir() + "/text_encoder", "model", at::kFloat,
                                    c10::Device(at::kCPU));
  const Qwen3Model model(c.text_encoder, *w, mesh.group("tp"), 30);
  EXPECT_TRUE(model.replicatedReason().empty()) << model.replicatedReason();
  const MistralTokenizer tok = MistralTokenizer::fromFolder(test::fixtureDir() + "/tokenizer");
  double worst = 0;
  for (int i : {0, 1, 5, 12}) {
    const auto pe = mistralPromptEmbeds(
        tok, model, test::goldenJson()["tokenization"]["prompts"][static_cast<size_t>(i)]["prompt"],
        64);
    worst = std::max(worst, test::maxAbsDiff(pe[0], test::golden("enc.msl64.prompt_embeds." +
                                                                 std::to_string(i))));
  }
  EXPECT_LE(worst, 2e-5);
  // q/o/gate/up/down quartered, k/v whole (2 KV heads do not split 4 ways).
  const int64_t H = 24, layer = 2 * H + (32 + 32) * H / 4 + 2 * 16 * H + 3 * 48 * H / 4;
  EXPECT_EQ(model.weightBytes(), static_cast<uint64_t>((704 * H + 30 * layer) * 4));
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::printf("text encoder tp 4: prompt embeddings max abs diff %.3g\n", worst);
}

// ---- Issue 47: the text encoder placed (own-rank, host-streamed, once) and the prompt cache ----

namespace {

// Run n from the prompt under `opts` (already holding the strategy's groups): final latents and
// image within 1e-4 of the goldens, the prompt embeddings the transformer got within 2e-5.
GenerationResult expectPlacedRun(DiffusionPipeline& pipe, int n, const std::string& label) {
  SCOPED_TRACE(label + " run " + std::to_string(n));
  std::vector<at::Tensor> steps;
  GenerationResult r = generate(pipe, runInputs(runSpec(n), true), steps);
  expectRunMatches(n, r, steps, label);
  const double pe = test::maxAbsDiff(r.tensors.at("prompt_embeds")[0],
                                     test::golden("run." + std::to_string(n) + ".prompt_embeds"));
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::printf("%s run.%d: prompt embeddings %.3g\n", label.c_str(), n, pe);
  EXPECT_LE(pe, 2e-5);
  return r;
}

// The Mistral layers 1..30 of 32 (no final norm), fp32, whole.
constexpr uint64_t kMistralWholeBytes =
    (704 * 24 + 30 * (2 * 24 + (32 + 2 * 16 + 32) * 24 + 3 * 48 * 24)) * 4;

// Under `s`, the text encoder on one rank of each tp x cp group: every run from the prompt
// equals the goldens on every rank; only the encoding rank holds the encoder (whole).
void expectOwnRank(const Strategy& s, const std::vector<int>& runs) {
  SCOPED_TRACE(test::strategyLabel(s) + " own-rank");
  ASSERT_EQ(worldSize(), s.world);
  DeviceMeshOptions o;
  o.timeout_s = 120;
  DeviceMesh mesh(s, MPI_COMM_WORLD, o);
  PipelineOptions opts;
  opts.parallel = test::transformerParallelism(s, mesh);
  opts.text_encoder = TextEncoderPlacement::OwnRank;
  auto pipe = loadPipeline(folder(), opts);
  const bool encoder = mesh.coord("tp") == 0 && mesh.coord("cp") == 0;
  EXPECT_EQ(encoder, encodesPrompts(opts));
  const auto bytes = pipe->weightBytes();
  if (encoder)
    EXPECT_EQ(bytes.at("text_encoder"), kMistralWholeBytes);  // whole: not sharded under tp
  else
    EXPECT_EQ(bytes.count("text_encoder"), 0u) << "a rank that does not encode loaded the encoder";
  for (int n : runs) expectPlacedRun(*pipe, n, test::strategyLabel(s) + " own-rank");
}

}  // namespace

// The encoder on rank 0 only, tp 2 over the transformer (rank 1 never loads it).
TEST(Flux2DevPlacement, OwnRankTwoRanksEqualDiffusers) {
  if (worldSize() != 2) GTEST_SKIP() << "runs under mpirun -np 2";
  expectOwnRank(test::makeStrategy(2, 1, 1), {0, 2});
}

// Three ranks: the encoder on rank 0, its embeddings broadcast over a Ulysses 3 group (anything:
// 2 heads, 112 / 131 tokens).
TEST(Flux2DevPlacement, OwnRankThreeRanksEqualDiffusers) {
  if (worldSize() != 3) GTEST_SKIP() << "runs under mpirun -np 3";
  expectOwnRank(test::makeStrategy(1, 1, 3, /*ulyAny=*/true), {0, 2});
}

// The encoder kept in host memory and streamed to the device one decoder layer at a time: the
// same numbers as the resident encoder (and the goldens).
TEST(Flux2DevPlacement, HostStreamedEqualsDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  PipelineOptions opts;
  opts.text_encoder = TextEncoderPlacement::HostStreamed;
  auto pipe = loadPipeline(folder(), opts);
  EXPECT_EQ(pipe->weightBytes().at("text_encoder"), kMistralWholeBytes);  // in host memory
  expectPlacedRun(*pipe, 0, "host-streamed");
  expectPlacedRun(*pipe, 2, "host-streamed");
  // The layers stream over a separate copy: the embeddings equal the resident encoder's exactly.
  const Flux2PipelineConfig& c = flux2Config(folder());
  auto w = WeightSource::fromFolder(test::fixtureDir() + "/text_encoder", "model", at::kFloat,
                                    c10::Device(at::kCPU));
  const Qwen3Model resident(c.text_encoder, *w, nullptr, 30);
  const Qwen3Model streamed(c.text_encoder, *w, nullptr, 30, c10::Device(at::kCPU));
  EXPECT_TRUE(streamed.streamed());
  EXPECT_FALSE(resident.streamed());
  // One decoder layer: norms + q/k/v/o + gate/up/down, fp32, plus its int64 KV index.
  EXPECT_EQ(streamed.largestLayerBytes(),
            static_cast<uint64_t>((2 * 24 + (32 + 2 * 16 + 32) * 24 + 3 * 48 * 24) * 4 + 4 * 8));
  const MistralTokenizer tok = MistralTokenizer::fromFolder(test::fixtureDir() + "/tokenizer");
  const std::string prompt = runSpec(0).text;
  EXPECT_TRUE(mistralPromptEmbeds(tok, streamed, prompt, 64)
                  .equal(mistralPromptEmbeds(tok, resident, prompt, 64)));
}

// Run once per prompt and freed: nothing of the encoder stays between requests; it is loaded
// again for the next prompt, with the same numbers.
TEST(Flux2DevPlacement, OnceLoadsPerRequestAndFrees) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  PipelineOptions opts;
  opts.text_encoder = TextEncoderPlacement::Once;
  auto pipe = loadPipeline(folder(), opts);
  auto& flow = dynamic_cast<FlowMatchPipeline&>(*pipe);
  EXPECT_FALSE(flow.textEncodersLoaded());
  EXPECT_EQ(pipe->weightBytes().count("text_encoder"), 0u);
  for (int n : {0, 1}) {
    expectPlacedRun(*pipe, n, "once");
    EXPECT_FALSE(flow.textEncodersLoaded()) << "freed before the steps";
    EXPECT_EQ(pipe->weightBytes().count("text_encoder"), 0u);
  }
  // The truncation warning still works (the tokenizer stays).
  PipelineInputs in = runInputs(runSpec(0), true);
  in.prompt = std::string(400, 'a') + " cat";
  in.max_sequence_length = 16;
  std::string all;
  for (const std::string& w : pipe->requestWarnings(in)) all += w + "\n";
  EXPECT_NE(all.find("the prompt was truncated"), std::string::npos) << all;
}

// The prompt-embedding cache: a queue of variations of one prompt (other seeds) encodes it once;
// the cached embeddings are the encoded ones exactly; another max_sequence_length is another key;
// the least recently used entry leaves when the cache is full.
TEST(Flux2DevPlacement, PromptCacheEncodesEachPromptOnce) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  PipelineOptions opts;
  opts.prompt_cache = 2;
  opts.text_encoder = TextEncoderPlacement::Once;  // a hit does not even load the encoder
  auto pipe = loadPipeline(folder(), opts);
  auto& flow = dynamic_cast<FlowMatchPipeline&>(*pipe);
  const GenerationResult first = expectPlacedRun(*pipe, 0, "cache miss");
  EXPECT_EQ(first.prompts_encoded, 1);
  EXPECT_EQ(first.prompt_cache_hits, 0);
  const GenerationResult again = expectPlacedRun(*pipe, 0, "cache hit");
  EXPECT_EQ(again.prompts_encoded, 0);
  EXPECT_EQ(again.prompt_cache_hits, 1);
  EXPECT_TRUE(again.tensors.at("prompt_embeds").equal(first.tensors.at("prompt_embeds")));
  EXPECT_TRUE(again.final_latents.equal(first.final_latents));
  // A variation (another seed, fewer steps) of the same prompt: still one encode in all.
  PipelineInputs v = runInputs(runSpec(0), true);
  v.seed += 7;
  v.steps = 1;
  const GenerationResult variation = pipe->generate(v);
  EXPECT_EQ(variation.prompt_cache_hits, 1);
  EXPECT_TRUE(variation.tensors.at("prompt_embeds").equal(first.tensors.at("prompt_embeds")));
  EXPECT_EQ(flow.promptCacheHits(), 2u);
  EXPECT_EQ(flow.promptCacheMisses(), 1u);
  // Another max_sequence_length: another key (miss), as is another prompt; then the first
  // prompt at 64 was the least recently used of three and is gone.
  v.max_sequence_length = 32;
  EXPECT_EQ(pipe->generate(v).prompts_encoded, 1);
  v.prompt = runSpec(2).text;
  v.max_sequence_length = 64;
  EXPECT_EQ(pipe->generate(v).prompts_encoded, 1);
  v.prompt = runSpec(0).text;
  EXPECT_EQ(pipe->generate(v).prompts_encoded, 1);
  EXPECT_EQ(flow.promptCacheMisses(), 4u);
}

int main(int argc, char** argv) { return dit::test::mpiTestMain(argc, argv); }
