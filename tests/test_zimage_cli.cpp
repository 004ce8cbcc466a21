// Z-Image end to end through ditstudio-cli (one rank in-process, several ranks through mpirun +
// ditstudio-worker) on tests/data/tiny-zimage-A: the four runs of golden/README.md ("Whole runs")
// with --output-tensors (initial_latents, final_latents, image) within 1e-4 of diffusers; run 2
// (CFG 3 with the default negative prompt, --cfg-truncation 0.25, --cfg-normalization 1) under
// every strategy the fixture allows equals diffusers within 1e-4; dp 2 writes two images.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/io/png_io.h"
#include "backend/io/tensor_io.h"
#include "golden_util.h"

using namespace dit;
namespace fs = std::filesystem;

namespace {

std::string tmp(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("ditstudio_zimage_cli_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs golden run `n` with `flags`; returns the exit status and fills `log`.
int runCli(int n, const std::string& flags, const std::string& out, std::string& log) {
  const auto& r = test::goldenJson().at("runs").at(static_cast<size_t>(n));
  std::ostringstream cmd;
  cmd << DITSTUDIO_CLI << " --model " << quoted(test::fixtureDir()) << " --prompt "
      << quoted(r.at("prompt").get<std::string>()) << " --seed " << r.at("seed").get<int>()
      << " --width " << r.at("width").get<int>() << " --height " << r.at("height").get<int>()
      << " --steps " << r.at("steps").get<int>() << " --guidance "
      << r.at("guidance_scale").get<double>();
  if (r.at("negative_prompt_passed").get<bool>()) {
    const int neg = r.at("negative_prompt_index").get<int>();
    cmd << " --negative-prompt "
        << quoted(test::goldenJson()
                      .at("tokenization")
                      .at("prompts")
                      .at(static_cast<size_t>(neg))
                      .at("prompt")
                      .get<std::string>());
  }
  if (r.at("cfg_truncation").get<double>() != 1.0)
    cmd << " --cfg-truncation " << r.at("cfg_truncation").get<double>();
  if (r.at("cfg_normalization").is_number())
    cmd << " --cfg-normalization " << r.at("cfg_normalization").get<double>();
  cmd << " " << flags << " --output " << quoted(out + ".png") << " --output-tensors "
      << quoted(out + ".safetensors") << " > " << quoted(out + ".log") << " 2>&1";
  const int rc = std::system(cmd.str().c_str());
  std::ifstream in(out + ".log");
  log.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

at::Tensor load(const std::string& file, const std::string& name) {
  SafetensorsCollection c(file);
  return loadTensor(c, name, at::kFloat);
}

void expectRunMatches(int n, const std::string& file) {
  const std::string k = "run." + std::to_string(n) + ".";
  EXPECT_TRUE(load(file, "initial_latents").equal(test::golden(k + "initial_latents")));
  EXPECT_LE(test::maxAbsDiff(load(file, "final_latents"), test::golden(k + "final_latents")), 1e-4);
  EXPECT_LE(test::maxAbsDiff(load(file, "image"), test::golden(k + "image")), 1e-4);
}

}  // namespace

TEST(ZImageCli, OneRankRunsMatchDiffusers) {
  for (int n = 0; n < 4; ++n) {
    SCOPED_TRACE("run " + std::to_string(n));
    const std::string out = tmp("run" + std::to_string(n));
    std::string log;
    ASSERT_EQ(runCli(n, "", out, log), 0) << log;
    EXPECT_TRUE(fs::exists(out + ".png")) << log;
    expectRunMatches(n, out + ".safetensors");
  }
}

class ZImageCliStrategies : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(ZImageCliStrategies, Run2MatchesDiffusers) {
  const auto& [name, flags] = GetParam();
  const std::string out = tmp(name);
  std::string log;
  ASSERT_EQ(runCli(2, flags, out, log), 0) << log;
  expectRunMatches(2, out + ".safetensors");
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, ZImageCliStrategies,
    ::testing::Values(std::pair<std::string, std::string>{"tp2", "--tp-degree 2"},
                      std::pair<std::string, std::string>{"ulysses2", "--ulysses-degree 2"},
                      std::pair<std::string, std::string>{"ring2", "--ring-degree 2"},
                      std::pair<std::string, std::string>{"cfg2", "--cfg-degree 2"},
                      std::pair<std::string, std::string>{"ulysses3_anything",
                                                          "--ulysses-degree 3 --ulysses-anything"},
                      std::pair<std::string, std::string>{
                          "tp2_ulysses2_anything",
                          "--tp-degree 2 --ulysses-degree 2 --ulysses-anything"},
                      std::pair<std::string, std::string>{"ulysses2_ring2",
                                                          "--ulysses-degree 2 --ring-degree 2"}),
    [](const auto& info) { return info.param.first; });

// The family's `shift` knob (zimage_family.cpp: the scheduler's static shift) through the flag
// generated from its declaration: run 2 with shift 6 and 1.5 equals diffusers' ZImagePipeline with
// FlowMatchEulerDiscreteScheduler.from_config(config, shift=S) (tests/data/zimage-shift), on one
// rank and under ulysses 2; the same knob through --set; a shift of 0 is refused naming it.
TEST(ZImageCli, ShiftKnobMatchesDiffusersRescheduled) {
  const std::string golden =
      std::string(DITSTUDIO_TEST_DATA_DIR) + "/zimage-shift/golden.safetensors";
  struct Case {
    std::string name, flags, key;
  };
  for (const Case& c :
       {Case{"shift6", "--shift 6", "shift6."}, Case{"shift1_5", "--set shift=1.5", "shift1.5."},
        Case{"shift6_ulysses2", "--shift 6 --ulysses-degree 2", "shift6."}}) {
    SCOPED_TRACE(c.name);
    const std::string out = tmp(c.name);
    std::string log;
    ASSERT_EQ(runCli(2, c.flags, out, log), 0) << log;
    EXPECT_LE(test::maxAbsDiff(load(out + ".safetensors", "final_latents"),
                               load(golden, c.key + "final_latents")),
              1e-4);
    EXPECT_LE(test::maxAbsDiff(load(out + ".safetensors", "image"), load(golden, c.key + "image")),
              1e-4);
    // The run did move: shift 3 (the folder's) ends elsewhere.
    EXPECT_GT(test::maxAbsDiff(load(out + ".safetensors", "final_latents"),
                               test::golden("run.2.final_latents")),
              0.1);
  }
  const std::string out = tmp("shift0");
  std::string log;
  EXPECT_NE(runCli(2, "--shift 0", out, log), 0) << log;
  EXPECT_NE(log.find("shift"), std::string::npos) << log;
  EXPECT_NE(log.find("(0, 100]"), std::string::npos) << log;
}

TEST(ZImageCli, ImpossibleStrategyRefusedNamingTheRule) {
  const std::string out = tmp("tp4");
  std::string log;
  EXPECT_NE(runCli(0, "--tp-degree 4", out, log), 0) << log;
  EXPECT_NE(log.find("n_heads"), std::string::npos) << log;
}

TEST(ZImageCliDataParallel, TwoReplicasTwoSeeds) {
  const std::string out = tmp("dp2");
  std::string log;
  ASSERT_EQ(runCli(0, "--dp-degree 2 --num-images 2", out, log), 0) << log;
  EXPECT_LE(test::maxAbsDiff(load(out + "-0.safetensors", "image"), test::golden("run.0.image")),
            1e-4);
  EXPECT_TRUE(fs::exists(out + "-1.png")) << log;
  EXPECT_GT(test::maxAbsDiff(load(out + "-1.safetensors", "image"), test::golden("run.0.image")),
            1e-3);
}

// First Block Cache and TaylorSeer through the shared DiT driver (noise_refiner.0 is the head
// block; TaylorSeer caches every "<stage>.<i>.attn"): run 0 (4 steps) skips steps, and under
// ulysses 2 and tp 2 every rank takes the same decisions (the PNG's cache_report), so the result
// equals one rank's within 1e-4.
TEST(ZImageCliStepCache, StrategiesEqualOneRank) {
  auto computed = [](const std::string& png) {
    const auto j = nlohmann::json::parse(readPngText(png).at("parameters"));
    if (!j.contains("cache_report")) return std::vector<int>{};
    return j["cache_report"]["computed_steps"].get<std::vector<int>>();
  };
  int run = 0;
  for (const std::string cache : {"taylorseer:1,2,1", "first-block:2.0"}) {
    std::string log;
    const std::string one = tmp("cache-" + std::to_string(run++));
    ASSERT_EQ(runCli(0, "--cache " + cache, one, log), 0) << log;
    const std::vector<int> steps = computed(one + ".png");
    ASSERT_FALSE(steps.empty()) << cache << ": no cache_report\n" << log;
    EXPECT_LT(steps.size(), 4u) << cache << ": the cache skipped no step";
    const at::Tensor ref = load(one + ".safetensors", "final_latents");
    for (const std::string strategy : {"--ulysses-degree 2", "--tp-degree 2"}) {
      const std::string out = tmp("cache-" + std::to_string(run++));
      ASSERT_EQ(runCli(0, "--cache " + cache + " " + strategy, out, log), 0) << log;
      EXPECT_EQ(computed(out + ".png"), steps) << cache << " " << strategy;
      EXPECT_LE(test::maxAbsDiff(load(out + ".safetensors", "final_latents"), ref), 1e-4)
          << cache << " " << strategy;
    }
  }
}
