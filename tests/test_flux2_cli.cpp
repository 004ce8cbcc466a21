// FLUX.2 [klein] end to end through ditstudio-cli (one rank in-process, several ranks through
// mpirun + ditstudio-worker), run 0 of tests/data/tiny-flux2-A ("a photo of a cat", seed 42,
// 32x32, 4 steps, guidance 4 = CFG): every strategy that applies gives diffusers' image within
// 1e-4, written where asked; dp 2 writes two images, the second with seed 43.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "backend/io/tensor_io.h"
#include "golden_util.h"

using namespace dit;
namespace fs = std::filesystem;

namespace {

std::string tmp(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("ditstudio_flux2_cli_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

// Runs run 0 with `flags`; returns the exit status and fills `log`.
int runCli(const std::string& flags, const std::string& out, std::string& log) {
  const auto& r = test::goldenJson().at("runs").at(0);
  std::ostringstream cmd;
  cmd << DITSTUDIO_CLI << " --model '" << test::fixtureDir() << "' --prompt '"
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
                          "tp2_ulysses2_anything", "--tp-degree 2 --ulysses-degree 2 --ulysses-anything"}),
    [](const auto& info) { return info.param.first; });

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

TEST(Flux2CliRefusals, FeaturesOfFlux1OnlyAreNamed) {
  std::string log;
  EXPECT_NE(runCli("--cache first-block:0.1", tmp("cache"), log), 0);
  EXPECT_NE(log.find("not supported for FLUX.2"), std::string::npos) << log;
  EXPECT_NE(runCli("--tp-degree 4", tmp("tp4"), log), 0);
  EXPECT_NE(log.find("num_attention_heads"), std::string::npos) << log;
}
