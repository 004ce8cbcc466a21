// FLUX.2 [klein] end to end through ditstudio-cli (one rank in-process, several ranks through
// mpirun + ditstudio-worker), run 0 of tests/data/tiny-flux2-A ("a photo of a cat", seed 42,
// 32x32, 4 steps, guidance 4 = CFG): every strategy that applies gives diffusers' image within
// 1e-4, written where asked; dp 2 writes two images, the second with seed 43.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/io/model_folder.h"
#include "backend/io/png_io.h"
#include "backend/io/tensor_io.h"
#include "backend/models/memory_estimate.h"
#include "golden_util.h"

using namespace dit;
namespace fs = std::filesystem;

namespace {

std::string tmp(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("ditstudio_flux2_cli_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

// Runs run 0 with `flags`; returns the exit status and fills `log`.
int runCli(const std::string& flags, const std::string& out, std::string& log,
           const std::string& model = test::fixtureDir()) {
  const auto& r = test::goldenJson().at("runs").at(0);
  std::ostringstream cmd;
  cmd << DITSTUDIO_CLI << " --model '" << model << "' --prompt '"
      << r.at("prompt").get<std::string>() << "' --seed 42 --width 32 --height 32 --steps 4"
      << " --guidance 4 " << flags << " --output '" << out << ".png' --output-tensors '" << out
      << ".safetensors' > '" << out << ".log' 2>&1";
  const int rc = std::system(cmd.str().c_str());
  std::ifstream in(out + ".log");
  log.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

at::Tensor load(const std::string& file, const std::string& name) {
  SafetensorsCollection c(file);
  return loadTensor(c, name, at::kFloat);
}

}  // namespace

class Flux2Cli : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(Flux2Cli, MatchesDiffusers) {
  const auto& [name, flags] = GetParam();
  const std::string out = tmp(name);
  std::string log;
  ASSERT_EQ(runCli(flags, out, log), 0) << log;
  EXPECT_TRUE(fs::exists(out + ".png")) << log;
  EXPECT_LE(test::maxAbsDiff(load(out + ".safetensors", "image"), test::golden("run.0.image")),
            1e-4);
  EXPECT_LE(test::maxAbsDiff(load(out + ".safetensors", "final_latents"),
                             test::golden("run.0.final_latents")),
            1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, Flux2Cli,
    ::testing::Values(std::pair<std::string, std::string>{"one_rank", ""},
                      std::pair<std::string, std::string>{"tp2", "--tp-degree 2"},
                      std::pair<std::string, std::string>{"ulysses2", "--ulysses-degree 2"},
                      std::pair<std::string, std::string>{"ring2", "--ring-degree 2"},
                      std::pair<std::string, std::string>{"cfg2", "--cfg-degree 2"},
                      std::pair<std::string, std::string>{
                          "tp2_ulysses2_anything",
                          "--tp-degree 2 --ulysses-degree 2 --ulysses-anything"}),
    [](const auto& info) { return info.param.first; });

// FLUX.2 [klein] gains First Block Cache and TaylorSeer through the shared code alone (the DiT
// driver's step-cache seam, the shared loop's options): the run skips steps, and under ulysses 2
// and tp 2 every rank takes the same decisions (the PNG's cache_report), so the result equals one
// rank's within 1e-4.
TEST(Flux2CliStepCache, StrategiesEqualOneRank) {
  auto computed = [](const std::string& png) {
    const auto j = nlohmann::json::parse(readPngText(png).at("parameters"));
    if (!j.contains("cache_report")) return std::vector<int>{};
    return j["cache_report"]["computed_steps"].get<std::vector<int>>();
  };
  int run = 0;
  for (const std::string cache : {"taylorseer:1,2,1", "first-block:2.0"}) {
    std::string log;
    const std::string one = tmp("cache-" + std::to_string(run++));
    ASSERT_EQ(runCli("--cache " + cache, one, log), 0) << log;
    const std::vector<int> steps = computed(one + ".png");
    ASSERT_FALSE(steps.empty()) << cache << ": no cache_report\n" << log;
    EXPECT_LT(steps.size(), 4u) << cache << ": the cache skipped no step";
    const at::Tensor ref = load(one + ".safetensors", "final_latents");
    // Caching changes the result (it is not a no-op).
    EXPECT_GT(test::maxAbsDiff(ref, test::golden("run.0.final_latents")), 0.0) << cache;
    for (const std::string strategy : {"--ulysses-degree 2", "--tp-degree 2"}) {
      const std::string out = tmp("cache-" + std::to_string(run++));
      ASSERT_EQ(runCli("--cache " + cache + " " + strategy, out, log), 0) << log;
      EXPECT_EQ(computed(out + ".png"), steps) << cache << " " << strategy;
      EXPECT_LE(test::maxAbsDiff(load(out + ".safetensors", "final_latents"), ref), 1e-4)
          << cache << " " << strategy;
    }
  }
}

// Flux2KleinPipeline has no 512-token cap (FluxPipeline's is T5's): max_sequence_length 1024
// passes the request door and the family's own limit (the Qwen3 encoder's 40960 positions), the
// 1024 padded text tokens reach the transformer (the image differs from run 0's 512-token one),
// and Ulysses 2 over those tokens equals one rank. FLUX.1's 512 rule still holds for FLUX.1
// (test_cli_requests), and klein's own limit is named when passed.
TEST(Flux2CliSequenceLength, Runs1024TextTokens) {
  std::string log;
  const std::string one = tmp("seq1024");
  ASSERT_EQ(runCli("--max-sequence-length 1024", one, log), 0) << log;
  const at::Tensor image = load(one + ".safetensors", "image");
  EXPECT_TRUE(image.isfinite().all().item<bool>());
  EXPECT_GT(test::maxAbsDiff(image, test::golden("run.0.image")), 1e-6);
  const std::string uly = tmp("seq1024_ulysses2");
  ASSERT_EQ(runCli("--max-sequence-length 1024 --ulysses-degree 2", uly, log), 0) << log;
  EXPECT_LE(test::maxAbsDiff(load(uly + ".safetensors", "image"), image), 1e-4);
  EXPECT_NE(runCli("--max-sequence-length 40961", tmp("seq40961"), log), 0);
  EXPECT_NE(log.find("max_sequence_length cannot be greater than 40960 for Flux2KleinPipeline"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("loading"), std::string::npos) << "refused only after loading\n" << log;
}

TEST(Flux2CliDataParallel, TwoReplicasTwoSeeds) {
  const std::string out = tmp("dp2");
  std::string log;
  ASSERT_EQ(runCli("--dp-degree 2 --num-images 2", out, log), 0) << log;
  EXPECT_LE(test::maxAbsDiff(load(out + "-0.safetensors", "image"), test::golden("run.0.image")),
            1e-4);
  EXPECT_TRUE(fs::exists(out + "-1.png")) << log;
  // Replica 1 draws its own noise (seed 43): a different image.
  EXPECT_GT(test::maxAbsDiff(load(out + "-1.safetensors", "image"), test::golden("run.0.image")),
            1e-3);
}

// Flux2KleinInpaintPipeline through --init-image / --mask / --strength: golden/INPAINT.md run 0
// ("a photo of a cat" through the text encoder, seed 42, 4 steps at strength 0.6 = 3 run,
// guidance 4 = CFG, the rectangle mask), on one rank and with the 48 conditioning tokens split
// by Ulysses over two ranks. The size is the init image's (64x48; runCli's 32x32 is ignored).
TEST(Flux2CliInpaint, MatchesDiffusers) {
  const std::string g = test::fixtureDir() + "/golden/";
  const std::string golden = g + "inpaint.safetensors";
  for (const std::string flags : {"", "--ulysses-degree 2"}) {
    SCOPED_TRACE(flags);
    const std::string out = tmp(flags.empty() ? "inpaint_one_rank" : "inpaint_ulysses2");
    std::string log;
    ASSERT_EQ(runCli("--init-image '" + g + "inpaint_image.png' --mask '" + g +
                         "inpaint_mask_rect.png' --strength 0.6 " + flags,
                     out, log),
              0)
        << log;
    const double init = test::maxAbsDiff(load(out + ".safetensors", "initial_latents"),
                                         load(golden, "run.0.initial_latents"));
    const double fin = test::maxAbsDiff(load(out + ".safetensors", "final_latents"),
                                        load(golden, "run.0.final_latents"));
    const double img =
        test::maxAbsDiff(load(out + ".safetensors", "image"), load(golden, "run.0.image"));
    std::printf("inpaint cli%s: initial %.3g, final latents %.3g, image %.3g\n",
                flags.empty() ? "" : (" " + flags).c_str(), init, fin, img);
    EXPECT_LE(init, 1e-4);
    EXPECT_LE(fin, 5e-4);
    EXPECT_LE(img, 5e-4);
  }
}

TEST(Flux2CliRefusals, FeaturesOfFlux1OnlyAreNamed) {
  std::string log;
  // FLUX.2 [klein] is read from its diffusers folder only (FamilyCapabilities::single_file off):
  // a component from elsewhere gets the family's one refusal.
  EXPECT_NE(runCli("--vae '" DITSTUDIO_FIXTURE "/../tiny-flux-A/vae'", tmp("vae"), log), 0);
  EXPECT_NE(log.find("is not supported for FLUX.2 [klein]"), std::string::npos) << log;
  EXPECT_NE(runCli("--tp-degree 4", tmp("tp4"), log), 0);
  EXPECT_NE(log.find("num_attention_heads"), std::string::npos) << log;
}

// A diffusers/PEFT LoRA on FLUX.2 modules (an attention projection, the fused SwiGLU input and
// the single blocks' fused QKV+MLP projection, the last two packed column-wise under tp) gives
// the image of the same deltas merged into the checkpoint, on one rank and under tp 2; a
// FLUX.1 LoRA is refused naming the module it lacks.
TEST(Flux2CliLora, EqualsMergedWeightsOnOneRankAndTp2) {
  namespace t = dit::test;
  const fs::path merged = t::copyFixture("merged");
  const std::string wfile = (merged / "transformer/diffusion_pytorch_model.safetensors").string();
  std::map<std::string, at::Tensor> weights;
  {
    SafetensorsCollection c(wfile);
    for (const auto& n : c.names()) weights[n] = loadTensor(c, n, at::kFloat).clone();
  }
  at::manual_seed(7);
  std::map<std::string, at::Tensor> lora;
  for (const std::string m : {"transformer_blocks.0.attn.to_q", "transformer_blocks.0.ff.linear_in",
                              "single_transformer_blocks.0.attn.to_qkv_mlp_proj"}) {
    at::Tensor& w = weights.at(m + ".weight");
    const at::Tensor a = (at::rand({2, w.size(1)}) - 0.5) * 0.6;  // lora_A [r, in]
    const at::Tensor b = (at::rand({w.size(0), 2}) - 0.5) * 0.6;  // lora_B [out, r]
    lora["transformer." + m + ".lora_A.weight"] = a;
    lora["transformer." + m + ".lora_B.weight"] = b;
    w = w + at::matmul(b, a);  // no alpha: scale 1
  }
  saveTensors(wfile, weights);
  const std::string loraFile = tmp("flux2_lora.safetensors");
  saveTensors(loraFile, lora);

  std::string log;
  const std::string ref = tmp("lora_merged");
  ASSERT_EQ(runCli("", ref, log, merged.string()), 0) << log;
  const at::Tensor want = load(ref + ".safetensors", "image");
  // The LoRA changes the picture (else the comparison below says nothing).
  EXPECT_GT(t::maxAbsDiff(want, t::golden("run.0.image")), 1e-2);
  for (const std::string flags : {"", "--tp-degree 2"}) {
    const std::string out = tmp(flags.empty() ? "lora_one_rank" : "lora_tp2");
    ASSERT_EQ(runCli(flags + " --lora '" + loraFile + "'", out, log), 0) << log;
    EXPECT_LE(t::maxAbsDiff(load(out + ".safetensors", "image"), want), 1e-5) << flags;
  }
  const std::string flux1 = std::string(DITSTUDIO_FLUX1_LORA);
  EXPECT_NE(runCli("--lora '" + flux1 + "'", tmp("lora_flux1"), log), 0);
  EXPECT_NE(log.find("does not exist in this model"), std::string::npos) << log;
}

// The memory estimate holds the Qwen3 text encoder's per-rank share, the figure the sharded load
// reports (test_qwen3_tp: 822,720 bytes whole, 490,944 under tp 2 for the fixture's 27 loaded
// layers), and says when tp 4 replicates it (2 query heads do not divide by 4).
TEST(Flux2Memory, TextEncoderPerRankInTheEstimate) {
  ModelSources src;
  src.model = test::fixtureDir();
  const ModelFolder m = ModelFolder::open(src);
  std::string note;
  EXPECT_EQ(textEncoderBytesPerRank(m, 1, 4, &note), 822720u);
  EXPECT_EQ(note, "");
  EXPECT_EQ(textEncoderBytesPerRank(m, 2, 4, &note), 490944u);
  EXPECT_EQ(note, "");
  EXPECT_EQ(textEncoderBytesPerRank(m, 4, 4, &note), 822720u);
  EXPECT_NE(note.find("text encoder replicated on every tp rank"), std::string::npos) << note;
  Strategy s;
  s.world = s.tp_degree = 4;
  RequestDims r;
  r.width = r.height = 32;
  r.text_len = 512;
  const MemoryEstimate e = estimateRequestMemory(m, s, r, 4, true);
  EXPECT_NE(e.describe().find("replicated"), std::string::npos) << e.describe();
}
