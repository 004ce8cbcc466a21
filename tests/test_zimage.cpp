// Z-Image (ZImagePipeline + ZImageTransformer2DModel) against the diffusers goldens of
// tests/data/tiny-zimage-A (golden/README.md: computed by diffusers 0.40 on CPU torch 2.6, float32;
// the text encoder by a plain-PyTorch Qwen3 cross-checked as the README says), and its declared
// plans under every strategy the fixture's sizes allow. One binary:
//  - 1 rank: config and declared parameters = the checkpoint; tokenization exact (16 prompts +
//    max_sequence_length 64); text encoder hidden states and prompt embeds within 1e-4 + 1e-5 rel;
//    the transformer's debug tensors (adaln_input, position ids, RoPE) and every case item within
//    1e-4; the scheduler grid (static shift) within 1e-6; VAE decode / encode / chain within 1e-4;
//    the four whole runs (from embeddings and from prompt strings; CFG with the negative prompt,
//    cfg_truncation and cfg_normalization) within 1e-4 step by step; bf16 finishes finite;
//    impossible strategies refused naming the rule;
//  - 2 ranks: tp 2, ulysses 2, ring 2, ulysses-anything 2, ring-anything 2 on every case (each
//    equal to the golden within 1e-4 and to one rank within 1e-4); cfg 2 and tp 2 whole runs;
//  - 3 ranks: ulysses-anything 3 (2 heads over 3 ranks) and ring-anything 3;
//  - 4 ranks: ulysses 2 x ring 2, tp 2 x ulysses-anything 2, tp 2 x ring 2.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/family_runtime.h"
#include "backend/io/config_json.h"
#include "backend/io/model_folder.h"
#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl.h"
#include "backend/models/family_registry.h"
#include "backend/models/memory_estimate.h"
#include "backend/models/text_encoder_placement.h"
#include "backend/models/text_encoders/modeling_qwen3.h"
#include "backend/models/zimage/transformer_zimage.h"
#include "backend/models/zimage/zimage_plan.h"
#include "backend/nn/lora_loader.h"
#include "backend/pipelines/flow_match_pipeline.h"
#include "backend/pipelines/zimage/pipeline_zimage.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"
#include "backend/tokenizers/qwen2_tokenizer.h"
#include "golden_util.h"
#include "parallel/device_mesh.h"
#include "parallel/strategy.h"
#include "strategy_test_util.h"
#include "tp_test_util.h"

using namespace dit;

namespace {

int worldSize() { return test::worldSize(); }

std::string dirOf(const std::string& component) { return test::fixtureDir() + "/" + component; }

const ZImageTransformerConfig& config() {
  static const ZImageTransformerConfig c = parseZImageTransformerConfig(
      readConfigJson(dirOf("transformer") + "/config.json"), dirOf("transformer") + "/config.json");
  return c;
}

std::shared_ptr<WeightSource> weights() {
  return WeightSource::fromFolder(dirOf("transformer"), "diffusion_pytorch_model", at::kFloat,
                                  c10::Device(at::kCPU));
}

const nlohmann::json& caseJson(int n) {
  return test::goldenJson().at("transformer").at("cases").at(static_cast<size_t>(n));
}
constexpr int kCases = 5;
int caseItems(int n) { return caseJson(n).at("batch").get<int>(); }

// Batch item j of case n as our forward takes it: x (C, 1, h, w) -> [1, C, h, w], cap_feats
// (n, D) -> [1, n, D], t [1].
TransformerInputs itemInputs(int n, int j) {
  const std::string p = "dit." + std::to_string(n) + ".in.";
  return {
      {"hidden_states", test::golden(p + "x." + std::to_string(j)).squeeze(1).unsqueeze(0)},
      {"encoder_hidden_states", test::golden(p + "cap_feats." + std::to_string(j)).unsqueeze(0)},
      {"timestep", test::golden(p + "t").narrow(0, j, 1)}};
}
at::Tensor itemOutput(int n, int j) {
  return test::golden("dit." + std::to_string(n) + ".out." + std::to_string(j))
      .squeeze(1)
      .unsqueeze(0);
}

// The one-rank output of every case item (computed once per process).
const std::vector<std::vector<at::Tensor>>& oneRankOutputs() {
  static const std::vector<std::vector<at::Tensor>> out = [] {
    auto w = weights();
    ZImageTransformer2DModel m(config(), *w);
    std::vector<std::vector<at::Tensor>> o(kCases);
    for (int n = 0; n < kCases; ++n)
      for (int j = 0; j < caseItems(n); ++j)
        o[static_cast<size_t>(n)].push_back(m.forward(itemInputs(n, j)));
    return o;
  }();
  return out;
}

// Every case item under `s` (world = MPI_COMM_WORLD): equal to the golden and to one rank within
// 1e-4 (the largest differences over the ranks are printed by rank 0).
void expectStrategyMatches(const Strategy& s) {
  SCOPED_TRACE(test::strategyLabel(s));
  ASSERT_EQ(worldSize(), s.world);
  ASSERT_TRUE(validateForModel(s, zimageModelDims(config(), 4)).empty())
      << joinIssues(validateForModel(s, zimageModelDims(config(), 4)));
  DeviceMeshOptions o;
  o.timeout_s = 120;
  DeviceMesh mesh(s, MPI_COMM_WORLD, o);
  auto w = weights();
  ZImageTransformer2DModel model(config(), *w, test::transformerParallelism(s, mesh));
  if (s.tp_degree > 1) {
    EXPECT_EQ(w->bytesLoaded(),
              model.shardingPlan().bytesPerRank(zimageParameterTable(config()), s.tp_degree, 4));
  }
  double worstGolden = 0, worstOne = 0;
  for (int n = 0; n < kCases; ++n)
    for (int j = 0; j < caseItems(n); ++j) {
      SCOPED_TRACE("case " + std::to_string(n) + " item " + std::to_string(j));
      const at::Tensor out = model.forward(itemInputs(n, j));
      const double g = test::maxAbsDiff(out, itemOutput(n, j));
      const double one =
          test::maxAbsDiff(out, oneRankOutputs()[static_cast<size_t>(n)][static_cast<size_t>(j)]);
      EXPECT_LE(g, 1e-4);
      EXPECT_LE(one, 1e-4);
      worstGolden = std::max(worstGolden, g);
      worstOne = std::max(worstOne, one);
    }
  worstGolden = test::maxOverRanks(worstGolden);
  worstOne = test::maxOverRanks(worstOne);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("[zimage] %s: max |out - golden| %.3g, max |out - one rank| %.3g\n",
                test::strategyLabel(s).c_str(), worstGolden, worstOne);
}

// Text-encoder tolerance of the README: atol 1e-4 + rtol 1e-5.
void expectClose(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const at::Tensor af = a.to(at::kFloat).cpu(), bf = b.to(at::kFloat).cpu();
  const at::Tensor excess = (af - bf).abs() - (1e-4 + 1e-5 * bf.abs());
  EXPECT_LE(excess.max().item<double>(), 0.0)
      << what << ": max |diff| " << test::maxAbsDiff(af, bf);
}

const nlohmann::json& promptJson(int i) {
  return test::goldenJson().at("tokenization").at("prompts").at(static_cast<size_t>(i));
}
std::string promptText(int i) { return promptJson(i).at("prompt").get<std::string>(); }

const nlohmann::json& runJson(int n) {
  return test::goldenJson().at("runs").at(static_cast<size_t>(n));
}

// golden.json runs[n] as the pipeline's inputs (README "Whole runs").
PipelineInputs runInputs(int n) {
  const auto& r = runJson(n);
  PipelineInputs p;
  p.prompt = r.at("prompt").get<std::string>();
  if (r.at("negative_prompt_passed").get<bool>()) {
    p.negative_prompt = promptText(r.at("negative_prompt_index").get<int>());
    p.negative_prompt_given = true;
  }
  p.seed = r.at("seed").get<uint64_t>();
  p.height = r.at("height").get<int>();
  p.width = r.at("width").get<int>();
  p.steps = r.at("steps").get<int>();
  p.guidance = r.at("guidance_scale").get<double>();
  p.options["cfg_truncation"] = r.at("cfg_truncation").get<double>();
  const auto& norm = r.at("cfg_normalization");
  p.options["cfg_normalization"] =
      norm.is_boolean() ? (norm.get<bool>() ? 1.0 : 0.0) : norm.get<double>();
  return p;
}

// The run's latents after each step, final latents and image within 1e-4; the initial latents
// (torch's CPU generator) exactly.
void expectRunMatches(int n, const GenerationResult& r, const std::vector<at::Tensor>& steps) {
  const std::string k = "run." + std::to_string(n) + ".";
  EXPECT_TRUE(r.initial_latents.equal(test::golden(k + "initial_latents")));
  const at::Tensor gs = test::golden(k + "step_latents");
  ASSERT_EQ(static_cast<int64_t>(steps.size()), gs.size(0));
  for (int64_t i = 0; i < gs.size(0); ++i)
    EXPECT_LE(test::maxAbsDiff(steps[static_cast<size_t>(i)], gs[i].unsqueeze(0)), 1e-4)
        << "step " << i;
  EXPECT_LE(test::maxAbsDiff(r.final_latents, test::golden(k + "final_latents")), 1e-4);
  EXPECT_LE(test::maxAbsDiff(r.image, test::golden(k + "image")), 1e-4);
}

PipelineCallbacks recordSteps(std::vector<at::Tensor>& steps) {
  PipelineCallbacks cb;
  cb.onStep = [&steps](int, int, const at::Tensor& lat, const at::Tensor&, double) {
    steps.push_back(lat.to(at::kFloat).cpu().clone());
    return true;
  };
  return cb;
}

}  // namespace

// ---- One rank ----

TEST(ZImageTransformer, ConfigAndDeclaredParametersMatchTheCheckpoint) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const auto& c = config();
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_heads, 2);
  EXPECT_EQ(c.headDim(), 32);
  EXPECT_EQ(c.ffnHidden(), 170);
  EXPECT_EQ(c.adalnDim(), 64);
  EXPECT_EQ(c.patchFeatures(), 16);
  EXPECT_EQ(c.ffnHidden(), test::goldenJson().at("transformer").at("ffn_hidden").get<int>());
  // Declared = stored: every checkpoint tensor is declared with its shape and vice versa (the
  // model's load checks loaded = declared).
  const ParameterTable t = zimageParameterTable(c);
  SafetensorsCollection file(dirOf("transformer") + "/diffusion_pytorch_model.safetensors");
  EXPECT_EQ(file.names().size(), t.size());
  for (const auto& name : file.names()) {
    const ParameterInfo* p = t.find(name);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_EQ(p->shape, file.info(name).shape) << name;
  }
  auto w = weights();
  ZImageTransformer2DModel m(c, *w);
  EXPECT_EQ(m.parameters().size(), t.size());
  // The registry knows the family by both class names.
  const ModelFolder folder = ModelFolder::open(test::fixtureDir());
  EXPECT_EQ(folder.pipeline_class, "ZImagePipeline");
  EXPECT_EQ(folder.transformer_class, "ZImageTransformer2DModel");
  EXPECT_EQ(familyOf(folder).display_name, "Z-Image");
  EXPECT_EQ(folder.config->dims.sequence_multiple, 32);
  EXPECT_EQ(folder.config->dims.vae_scale_factor, 4);
}

TEST(ZImageTransformer, BadConfigsRefusedNamingTheKey) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const nlohmann::json good = readConfigJson(dirOf("transformer") + "/config.json");
  auto refused = [&](const char* key, const nlohmann::json& v, const std::string& needle) {
    nlohmann::json j = good;
    j[key] = v;
    try {
      parseZImageTransformerConfig(j, "cfg.json");
      ADD_FAILURE() << key << " accepted";
    } catch (const ModelFileError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused("axes_dims", nlohmann::json::array({8, 12, 14}), "axes_dims sum");
  refused("n_heads", 3, "not divisible by n_heads");
  refused("all_patch_size", nlohmann::json::array({2, 4}), "one entry");
  refused("siglip_feat_dim", 1152, "siglip_feat_dim");
  refused("qk_norm", false, "qk_norm");
  refused("dim", "wide", "dim");
}

TEST(ZImageTransformer, DebugTensorsMatchDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  auto w = weights();
  ZImageTransformer2DModel m(config(), *w);
  for (int n : {0, 2}) {
    SCOPED_TRACE("case " + std::to_string(n));
    const std::string d = "dit." + std::to_string(n) + ".dbg.";
    EXPECT_LE(test::maxAbsDiff(m.adalnInput(test::golden("dit." + std::to_string(n) + ".in.t")),
                               test::golden(d + "adaln_input")),
              1e-5);
    for (int j = 0; j < caseItems(n); ++j) {
      const auto& item = caseJson(n).at("items").at(static_cast<size_t>(j));
      const auto hw = item.at("tokens_hw");
      auto [txt, img] = ZImageTransformer2DModel::positionIds(
          item.at("n_cap").get<int64_t>(), hw.at(0).get<int64_t>(), hw.at(1).get<int64_t>());
      EXPECT_TRUE(txt.equal(test::golden(d + "cap_pos_ids." + std::to_string(j))));
      EXPECT_TRUE(img.equal(test::golden(d + "x_pos_ids." + std::to_string(j))));
      if (j == 0) {
        // The unified freqs of item 0: [image rows, caption rows]; ours repeat each value for
        // its pair.
        auto [cos, sin] = m.rotaryTables(at::cat({img, txt}, 0));
        const int64_t S = cos.size(0);
        const at::Tensor gc = test::golden(d + "unified_rope_cos")[0].narrow(0, 0, S);
        const at::Tensor gsn = test::golden(d + "unified_rope_sin")[0].narrow(0, 0, S);
        EXPECT_LE(test::maxAbsDiff(cos.slice(1, 0, cos.size(1), 2), gc), 1e-6);
        EXPECT_LE(test::maxAbsDiff(sin.slice(1, 0, sin.size(1), 2), gsn), 1e-6);
        EXPECT_TRUE(cos.slice(1, 0, cos.size(1), 2).equal(cos.slice(1, 1, cos.size(1), 2)));
      }
    }
  }
}

TEST(ZImageTransformer, ForwardMatchesDiffusersOnEveryCase) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  double worst = 0;
  for (int n = 0; n < kCases; ++n)
    for (int j = 0; j < caseItems(n); ++j) {
      SCOPED_TRACE("case " + std::to_string(n) + " item " + std::to_string(j));
      const double d = test::maxAbsDiff(
          oneRankOutputs()[static_cast<size_t>(n)][static_cast<size_t>(j)], itemOutput(n, j));
      EXPECT_LE(d, 1e-4);
      worst = std::max(worst, d);
    }
  std::printf("[zimage] transformer cases: max |out - golden| %.3g\n", worst);
  // A batch of two items of one caption length equals the items one by one.
  auto w = weights();
  ZImageTransformer2DModel m(config(), *w);
  TransformerInputs a = itemInputs(1, 0);
  TransformerInputs b = a;
  b["timestep"] = at::full({1}, 0.3f);
  TransformerInputs both{
      {"hidden_states", at::cat({a["hidden_states"], a["hidden_states"] * 0.5}, 0)},
      {"encoder_hidden_states",
       at::cat({a["encoder_hidden_states"], a["encoder_hidden_states"]}, 0)},
      {"timestep", at::cat({a["timestep"], b["timestep"]}, 0)}};
  b["hidden_states"] = a["hidden_states"] * 0.5;
  const at::Tensor out = m.forward(both);
  EXPECT_LE(test::maxAbsDiff(out[0], m.forward(a)[0]), 1e-5);
  EXPECT_LE(test::maxAbsDiff(out[1], m.forward(b)[0]), 1e-5);
}

TEST(ZImageTransformer, InputErrorsNameTheInput) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  auto w = weights();
  ZImageTransformer2DModel m(config(), *w);
  auto message = [&](TransformerInputs in) {
    try {
      m.forward(in);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  TransformerInputs in = itemInputs(0, 0);
  in.erase("timestep");
  EXPECT_NE(message(in).find("'timestep' is missing"), std::string::npos) << message(in);
  in = itemInputs(0, 0);
  in["img_ids"] = at::zeros({3, 3});
  EXPECT_NE(message(in).find("unknown input 'img_ids'"), std::string::npos) << message(in);
  in = itemInputs(0, 0);
  in["hidden_states"] = at::zeros({1, 4, 5, 6});
  EXPECT_NE(message(in).find("hidden_states must be"), std::string::npos) << message(in);
  in = itemInputs(0, 0);
  in["encoder_hidden_states"] = at::zeros({1, 3, 31});
  EXPECT_NE(message(in).find("encoder_hidden_states must be"), std::string::npos) << message(in);
  in = itemInputs(0, 0);
  in["hidden_states"] = at::zeros({1, 4, 2, 200});  // 100 tokens wide > axes_lens 64
  EXPECT_NE(message(in).find("axes_lens"), std::string::npos) << message(in);
}

TEST(ZImageText, TokenizationIsExact) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder folder = ModelFolder::open(test::fixtureDir());
  const Qwen2Tokenizer tok = Qwen2Tokenizer::fromFolder(folder.component("tokenizer"));
  ZImagePromptEncoder enc(folder, PipelineOptions{});
  for (int i = 0; i < 16; ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    EXPECT_EQ(tok.applyChatTemplate(promptText(i), true),
              promptJson(i).at("chat_text").get<std::string>());
    auto [ids, mask] = enc.tokenize(promptText(i), 512);
    EXPECT_TRUE(ids.equal(test::golden("tok.input_ids." + std::to_string(i))));
    EXPECT_TRUE(mask.equal(test::golden("tok.attention_mask." + std::to_string(i))));
    EXPECT_EQ(static_cast<int64_t>(enc.untruncatedTokens(promptText(i))),
              test::golden("tok.untruncated." + std::to_string(i)).numel());
  }
  auto [ids, mask] = enc.tokenize(promptText(12), 64);
  EXPECT_TRUE(ids.equal(test::golden("tok.msl64.input_ids")));
  EXPECT_TRUE(mask.equal(test::golden("tok.msl64.attention_mask")));
}

TEST(ZImageText, EncoderMatchesTheReference) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder folder = ModelFolder::open(test::fixtureDir());
  ZImagePromptEncoder enc(folder, PipelineOptions{});
  // hidden_states 0, 1, 3 (= [-2]) and 4 (final norm) of prompt 0, all 512 rows.
  {
    auto w =
        WeightSource::fromFolder(dirOf("text_encoder"), "model", at::kFloat, c10::Device(at::kCPU));
    const Qwen3Model full(zimageConfig(folder).text_encoder, *w);
    auto [ids, mask] = enc.tokenize(promptText(0), 512);
    const auto hs = full.hiddenStates(ids.unsqueeze(0), mask.unsqueeze(0), {0, 1, 3, 4});
    const int idx[] = {0, 1, 3, 4};
    for (size_t k = 0; k < 4; ++k)
      expectClose(hs[k][0], test::golden("enc.hidden_states.0." + std::to_string(idx[k])),
                  "hidden_states " + std::to_string(idx[k]));
  }
  for (int i = 0; i < 16; ++i)
    expectClose(enc.encode(promptText(i), 512),
                test::golden("enc.prompt_embeds." + std::to_string(i)),
                "prompt_embeds " + std::to_string(i));
  expectClose(enc.encode(promptText(12), 64), test::golden("enc.msl64.prompt_embeds"), "msl64");
}

TEST(ZImageScheduler, StaticShiftGridMatchesDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const std::string f = dirOf("scheduler") + "/scheduler_config.json";
  const SchedulerConfig cfg = parseSchedulerConfig(readConfigJson(f), f);
  EXPECT_FALSE(cfg.use_dynamic_shifting);
  EXPECT_EQ(cfg.shift, 3.0);
  const auto& cases = test::goldenJson().at("scheduler").at("cases");
  ASSERT_EQ(cases.size(), 64u);
  for (const auto& c : cases) {
    const int steps = c.at("steps").get<int>(), seq = c.at("image_seq_len").get<int>();
    SCOPED_TRACE("steps " + std::to_string(steps) + " image_seq_len " + std::to_string(seq));
    const double mu = calculateShift(seq, cfg.base_image_seq_len, cfg.max_image_seq_len,
                                     cfg.base_shift, cfg.max_shift);
    EXPECT_NEAR(mu, c.at("mu").get<double>(), 1e-12);
    const SchedulerTables t = flowMatchSchedule(cfg, steps, mu);
    const std::string key = "sched." + std::to_string(steps) + "." + std::to_string(seq) + ".";
    const at::Tensor sig = test::golden(key + "sigmas"), ts = test::golden(key + "timesteps");
    ASSERT_EQ(static_cast<int64_t>(t.sigmas.size()), sig.numel());
    ASSERT_EQ(static_cast<int64_t>(t.timesteps.size()), ts.numel());
    for (int64_t i = 0; i < sig.numel(); ++i)
      EXPECT_NEAR(t.sigmas[static_cast<size_t>(i)], sig[i].item<float>(), 1e-6) << "sigma " << i;
    // timesteps = sigmas x 1000 in float32: the README's 1e-6 on the sigmas is 1e-3 here (a
    // 1-ulp sigma difference at 0.8 is 2 ulps = 1.2e-4 of its timestep near 800).
    for (int64_t i = 0; i < ts.numel(); ++i)
      EXPECT_NEAR(t.timesteps[static_cast<size_t>(i)], ts[i].item<float>(), 1e-3)
          << "timestep " << i;
  }
}

TEST(ZImageVae, DecodeEncodeAndChainMatchDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const std::string dir = dirOf("vae");
  auto w =
      WeightSource::fromFolder(dir, "diffusion_pytorch_model", at::kFloat, c10::Device(at::kCPU));
  const AutoencoderKLConfig cfg =
      parseAutoencoderKLConfig(readConfigJson(dir + "/config.json"), dir + "/config.json");
  AutoencoderKL vae(cfg, *w);
  EXPECT_LE(
      test::maxAbsDiff(vae.decode(test::golden("vae.decode.in")), test::golden("vae.decode.out")),
      1e-4);
  const DiagonalGaussianDistribution post = vae.encode(test::golden("vae.encode.in"));
  EXPECT_LE(test::maxAbsDiff(post.mean, test::golden("vae.encode.mean")), 1e-4);
  EXPECT_LE(test::maxAbsDiff(post.std, test::golden("vae.encode.std")), 1e-4);
  // The pipeline's decode: latents / scaling_factor + shift_factor, decode, (x / 2 + 0.5) clamp.
  const ModelFolder folder = ModelFolder::open(test::fixtureDir());
  ZImagePipeline pipe(folder, PipelineOptions{}, nullptr);
  const at::Tensor lat = test::golden("vae.chain.latents");
  EXPECT_LE(test::maxAbsDiff(lat / cfg.scaling_factor + cfg.shift_factor,
                             test::golden("vae.chain.scaled")),
            1e-6);
  EXPECT_LE(test::maxAbsDiff(pipe.decode(lat, 24, 32), test::golden("vae.chain.image")), 1e-4);
}

TEST(ZImagePipeline, RunsFromEmbeddingsMatchDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder folder = ModelFolder::open(test::fixtureDir());
  ZImagePipeline pipe(folder, PipelineOptions{}, nullptr);
  for (int n = 0; n < 4; ++n) {
    SCOPED_TRACE("run " + std::to_string(n));
    const auto& r = runJson(n);
    const PipelineInputs in = runInputs(n);
    EXPECT_EQ(pipe.guider(in).enabled(), r.at("cfg").get<bool>());
    const int negIndex =
        r.at("negative_prompt_index").is_null() ? 2 : r.at("negative_prompt_index").get<int>();
    std::vector<at::Tensor> steps;
    const GenerationResult res = pipe.generateFromEmbeddings(
        in, test::golden("enc.prompt_embeds." + std::to_string(r.at("prompt_index").get<int>())),
        test::golden("enc.prompt_embeds." + std::to_string(negIndex)), recordSteps(steps));
    expectRunMatches(n, res, steps);
  }
}

TEST(ZImagePipeline, RunsFromPromptsMatchDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder folder = ModelFolder::open(test::fixtureDir());
  auto pipe = loadPipeline(folder, PipelineOptions{});
  double worst = 0;
  for (int n = 0; n < 4; ++n) {
    SCOPED_TRACE("run " + std::to_string(n));
    std::vector<at::Tensor> steps;
    const GenerationResult res = pipe->generate(runInputs(n), recordSteps(steps));
    expectRunMatches(n, res, steps);
    worst = std::max(
        worst, test::maxAbsDiff(res.image, test::golden("run." + std::to_string(n) + ".image")));
  }
  std::printf("[zimage] whole runs from prompts: max |image - golden| %.3g\n", worst);
  // Run 3's prompt is truncated at 512 tokens: said once.
  const auto warnings = pipe->requestWarnings(runInputs(3));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("truncated"), std::string::npos) << warnings[0];
}

// Issue 47: the Qwen3 text encoder streamed from host memory one decoder layer at a time, and
// loaded once per request and freed before the steps: the same runs as the resident encoder
// (diffusers' goldens, runs 0 and 1); `once` holds nothing of the encoder between requests.
TEST(ZImagePipeline, TextEncoderPlacementsMatchDiffusers) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder folder = ModelFolder::open(test::fixtureDir());
  for (TextEncoderPlacement pl : {TextEncoderPlacement::HostStreamed, TextEncoderPlacement::Once}) {
    SCOPED_TRACE(textEncoderPlacementName(pl));
    PipelineOptions opts;
    opts.text_encoder = pl;
    auto pipe = loadPipeline(folder, opts);
    auto& flow = dynamic_cast<FlowMatchPipeline&>(*pipe);
    EXPECT_EQ(pipe->weightBytes().count("text_encoder"),
              pl == TextEncoderPlacement::HostStreamed ? 1u : 0u);
    for (int n = 0; n < 2; ++n) {
      SCOPED_TRACE("run " + std::to_string(n));
      std::vector<at::Tensor> steps;
      const GenerationResult res = pipe->generate(runInputs(n), recordSteps(steps));
      expectRunMatches(n, res, steps);
    }
    if (pl == TextEncoderPlacement::Once) {
      EXPECT_FALSE(flow.textEncodersLoaded()) << "freed before the steps";
      EXPECT_EQ(pipe->weightBytes().count("text_encoder"), 0u);
    }
  }
}

TEST(ZImagePipeline, Bfloat16RunFinishesFinite) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder folder = ModelFolder::open(test::fixtureDir());
  PipelineOptions opts;
  opts.dtype = at::kBFloat16;
  auto pipe = loadPipeline(folder, opts);
  const GenerationResult r = pipe->generate(runInputs(2));  // CFG, truncation, normalisation
  ASSERT_TRUE(r.image.defined());
  EXPECT_TRUE(at::isfinite(r.image).all().item<bool>());
  EXPECT_TRUE(at::isfinite(r.final_latents).all().item<bool>());
  // Close to float32 (bf16 rounding only). Measured max |bf16 - float32 golden| (one thread):
  //  - the image of run 2: ours 0.014 (LibTorch 1.13) and 0.011 (2.6); diffusers' own bf16 run on
  //    torch 2.6 (ZImagePipeline, torch_dtype bfloat16, the float32 noise, enc.prompt_embeds.5
  //    and .2 cast, oneDNN off for the convolutions, see backend/nn/conv2d.h) 0.010. Bound 0.03.
  //  - the VAE alone on run 2's float32 final latents: ours 0.012 (1.13) and 0.0085 (2.6),
  //    diffusers 0.0080. Bound 0.03.
  // The defects these bounds catch: the timestep rounded to bfloat16 before t_embedder (diffusers
  // keeps it float32) gave 0.082 (1.13) and 0.084 (2.6) (final latents 0.55 against diffusers'
  // 0.03); LibTorch 2.6's wrong oneDNN bfloat16 convolution (out channels not a multiple of 16)
  // 0.40 (VAE alone 0.41). A run that stays in float32 is within 1e-4 (diffusers' float32 run:
  // 7e-7), hence the lower bound: bfloat16 really ran.
  const double image = test::maxAbsDiff(r.image, test::golden("run.2.image"));
  const double vae = test::maxAbsDiff(pipe->decode(test::golden("run.2.final_latents"), 64, 32),
                                      test::golden("run.2.image"));
  std::printf("[zimage] bfloat16 run 2: max |image - float32 golden| %.3g (VAE alone %.3g)\n",
              image, vae);
  EXPECT_LE(image, 0.03);
  EXPECT_GT(image, 1e-3);
  EXPECT_LE(vae, 0.03);
}

TEST(ZImageStrategies, ImpossibleStrategiesAreRefusedNamingTheRule) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const ModelFolder folder = ModelFolder::open(test::fixtureDir());
  const ModelDims& dims = folder.config->dims;
  auto rules = [&](const Strategy& s, const RequestDims& r) {
    std::string all;
    for (const auto& i : validateForRequest(s, dims, r)) all += i.rule + ": " + i.message + "\n";
    return all;
  };
  RequestDims r;
  r.width = r.height = 32;
  r.text_len = 18;
  // 2 heads: tp 4 and strict Ulysses 4 cannot divide them; tp 2 x ulysses 2 leaves 1 head per tp
  // rank for 2 Ulysses ranks.
  EXPECT_NE(rules(test::makeStrategy(4, 1, 1), r).find("tp_heads"), std::string::npos);
  EXPECT_NE(rules(test::makeStrategy(1, 1, 4), r).find("ulysses_heads"), std::string::npos);
  EXPECT_NE(rules(test::makeStrategy(2, 1, 2), r).find("ulysses_heads"), std::string::npos);
  // Strict ring 3: the padded lengths (32) are not divisible by 3.
  EXPECT_NE(rules(test::makeStrategy(1, 3, 1), r).find("ring_tokens"), std::string::npos);
  // The 32-padding makes 18 text tokens and 15 image tokens fine for cp 2 (32 and 32 rows).
  RequestDims odd = r;
  odd.width = 24;
  odd.height = 40;
  EXPECT_EQ(rules(test::makeStrategy(1, 2, 1), odd), "");
  EXPECT_EQ(rules(test::makeStrategy(1, 1, 2), odd), "");
  // cfg 2 needs CFG: guidance > 0 runs it (not > 1).
  Strategy cfg;
  cfg.world = cfg.cfg_degree = 2;
  RequestValues v;
  v.guidance = 0.0;
  r.true_cfg = resolveRequest(requestSpecOf(folder), v).cfg;
  EXPECT_NE(rules(cfg, r).find("cfg_true_cfg"), std::string::npos);
  v.guidance = 0.5;
  r.true_cfg = resolveRequest(requestSpecOf(folder), v).cfg;
  EXPECT_EQ(rules(cfg, r), "");
  // The family's recommended settings (Z-Image-Turbo: few steps, no CFG) reach the folder.
  const auto settings = nlohmann::json::parse(folder.default_settings);
  EXPECT_EQ(settings.at("steps").get<int>(), 9);
  EXPECT_EQ(settings.at("guidance").get<double>(), 0.0);
  // Features the family does not have are refused with the one message.
  EXPECT_NE(familyOf(folder).refusal("img2img").find("Z-Image (ZImagePipeline)"),
            std::string::npos);
}

// LoRA in the diffusers/PEFT key layout ("transformer.<module>.lora_A/B.weight"): on the query
// inside the fused q/k/v, to_out.0, w3 inside the fused w1/w3 and w2 of several stages, the
// forward equals the model loaded with the merged weights W + B A (alpha = r); clear() restores
// the base output exactly.
TEST(ZImageLora, DiffusersLoraEqualsMergedWeights) {
  if (worldSize() != 1) GTEST_SKIP() << "one-rank test";
  const auto& c = config();
  const int64_t C = c.dim, M = c.ffnHidden(), r = 2;
  const double scale = 1.0;  // alpha / r with alpha = r (no adapter metadata)
  struct Target {
    std::string module;
    int64_t in, out;
  };
  const std::vector<Target> targets{{"layers.0.attention.to_q", C, C},
                                    {"layers.1.attention.to_out.0", C, C},
                                    {"noise_refiner.0.feed_forward.w3", C, M},
                                    {"context_refiner.1.feed_forward.w2", M, C}};
  auto gen = at::detail::createCPUGenerator(7);
  std::map<std::string, at::Tensor> file;
  for (const auto& t : targets) {
    file["transformer." + t.module + ".lora_A.weight"] = at::randn({r, t.in}, gen) * 0.2;
    file["transformer." + t.module + ".lora_B.weight"] = at::randn({t.out, r}, gen) * 0.2;
  }
  const std::string path = (test::tempDir("lora") / "zimage_lora.safetensors").string();
  saveTensors(path, file);  // no metadata: alpha = r
  const tensor_parallel::LoraAdapter adapter = loadLoraAdapter(path, {});
  ASSERT_EQ(adapter.modules.size(), targets.size());
  const ModelFolder folder = ModelFolder::open(test::fixtureDir());
  EXPECT_EQ(familyOf(folder).refusal("lora"), "");

  auto w = weights();
  ZImageTransformer2DModel m(c, *w);
  const TransformerInputs in = itemInputs(2, 0);
  const at::Tensor base = m.forward(in);
  m.loraTargets().apply({{m.loraTargets().prepare(adapter), 1.0}});
  const at::Tensor withLora = m.forward(in);
  EXPECT_GT(test::maxAbsDiff(withLora, base), 1e-3);  // the adapter changes the output

  // The same model with the deltas merged into the checkpoint's weights.
  SafetensorsCollection ckpt(dirOf("transformer") + "/diffusion_pytorch_model.safetensors");
  std::map<std::string, at::Tensor> merged;
  for (const auto& name : ckpt.names()) merged[name] = loadTensor(ckpt, name, at::kFloat);
  for (const auto& t : targets) {
    at::Tensor& W = merged.at(t.module + ".weight");
    W = W + scale * at::matmul(file.at("transformer." + t.module + ".lora_B.weight"),
                               file.at("transformer." + t.module + ".lora_A.weight"));
  }
  auto mw = WeightSource::fromTensors(merged, "merged");
  ZImageTransformer2DModel mm(c, *mw);
  const double d = test::maxAbsDiff(withLora, mm.forward(in));
  EXPECT_LE(d, 1e-5);
  std::printf("[zimage] LoRA (4 modules, rank 2): max |lora - merged| %.3g\n", d);
  m.loraTargets().clear();
  EXPECT_TRUE(m.forward(in).equal(base));
}

// ---- Several ranks ----

TEST(ZImageTransformer, TwoRankStrategiesEqualOneRank) {
  if (worldSize() != 2) GTEST_SKIP() << "runs under mpirun -np 2";
  expectStrategyMatches(test::makeStrategy(2, 1, 1));
  expectStrategyMatches(test::makeStrategy(1, 1, 2));
  expectStrategyMatches(test::makeStrategy(1, 2, 1));
  expectStrategyMatches(test::makeStrategy(1, 1, 2, /*ulyAny=*/true));
  expectStrategyMatches(test::makeStrategy(1, 2, 1, false, /*ringAny=*/true));
}

TEST(ZImageTransformer, ThreeRankAnythingStrategiesEqualOneRank) {
  if (worldSize() != 3) GTEST_SKIP() << "runs under mpirun -np 3";
  // 2 heads over 3 Ulysses ranks and 32-multiples over 3 ring ranks: the anything modes.
  expectStrategyMatches(test::makeStrategy(1, 1, 3, /*ulyAny=*/true));
  expectStrategyMatches(test::makeStrategy(1, 3, 1, false, /*ringAny=*/true));
}

TEST(ZImageTransformer, FourRankStrategiesEqualOneRank) {
  if (worldSize() != 4) GTEST_SKIP() << "runs under mpirun -np 4";
  expectStrategyMatches(test::makeStrategy(1, 2, 2));
  expectStrategyMatches(test::makeStrategy(2, 1, 2, /*ulyAny=*/true));
  expectStrategyMatches(test::makeStrategy(2, 2, 1));
}

TEST(ZImagePipeline, CfgParallelAndTensorParallelRunsEqualOneRank) {
  if (worldSize() != 2) GTEST_SKIP() << "runs under mpirun -np 2";
  const ModelFolder folder = ModelFolder::open(test::fixtureDir());
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
    auto pipe = loadPipeline(folder, opts);
    // Run 1: CFG with a given negative prompt; run 2: cfg_truncation (steps 4-5 on the positive
    // branch only, shared by cfg rank 0) and cfg_normalization.
    for (int n : {1, 2}) {
      SCOPED_TRACE("run " + std::to_string(n));
      std::vector<at::Tensor> steps;
      expectRunMatches(n, pipe->generate(runInputs(n), recordSteps(steps)), steps);
    }
  }
}

int main(int argc, char** argv) { return dit::test::mpiTestMain(argc, argv); }
