// Single-file checkpoints through the real ditstudio-cli (issue 12): the ComfyUI all-in-one file
// (with the fixture folder as --config) gives the folder run's image and latents, on one rank and
// on two ranks (tp 2: the worker receives --config through mpirun); a transformer-only file with
// --vae / --text-encoder / --text-encoder-2 from elsewhere runs; a missing component is named
// with the flag that supplies it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"
#include "golden_util.h"

using namespace dit;
using namespace dit::test;
namespace fs = std::filesystem;

namespace {

std::string formats(const std::string& f) {
  return std::string(DITSTUDIO_FORMATS_FIXTURE) + "/" + f;
}

fs::path root() {
  static fs::path d = [] {
    fs::path p =
        fs::temp_directory_path() / ("ditstudio-formats-cli-" + std::to_string(::getpid()));
    fs::create_directories(p);
    return p;
  }();
  return d;
}

// Runs `cmd`; returns {exit status, combined output}.
std::pair<int, std::string> sh(const std::string& cmd) {
  const fs::path log = root() / "last.log";
  const int rc = std::system((cmd + " > " + log.string() + " 2>&1").c_str());
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return {rc, text};
}

// image and final_latents of one run.
std::pair<at::Tensor, at::Tensor> generate(const std::string& args, const std::string& name) {
  const fs::path out = root() / name;
  std::ostringstream cmd;
  cmd << DITSTUDIO_CLI << " " << args << " --prompt 'a lighthouse at dusk' --seed 5"
      << " --width 40 --height 48 --steps 2 --max-sequence-length 32 --output " << out.string()
      << ".png --output-tensors " << out.string() << ".safetensors";
  const auto [rc, log] = sh(cmd.str());
  EXPECT_EQ(rc, 0) << cmd.str() << "\n" << log;
  if (rc != 0) return {};
  SafetensorsCollection c(out.string() + ".safetensors");
  return {loadTensor(c, "image", at::kFloat), loadTensor(c, "final_latents", at::kFloat)};
}

}  // namespace

TEST(FormatsCli, AllInOneEqualsFolderOneAndTwoRanks) {
  const auto folder = generate("--model " + fixtureDir(), "folder");
  ASSERT_TRUE(folder.first.defined());
  const std::string aio =
      "--model " + formats("checkpoint-comfy-aio.safetensors") + " --config " + fixtureDir();
  const auto one = generate(aio, "aio");
  ASSERT_TRUE(one.first.defined());
  std::printf("  aio 1 rank vs folder: image %.3g, final_latents %.3g\n",
              maxAbsDiff(one.first, folder.first), maxAbsDiff(one.second, folder.second));
  EXPECT_EQ(maxAbsDiff(one.first, folder.first), 0.0);
  EXPECT_EQ(maxAbsDiff(one.second, folder.second), 0.0);
  const auto tp2 = generate(aio + " --tp-degree 2", "aio-tp2");
  ASSERT_TRUE(tp2.first.defined());
  std::printf("  aio tp 2 vs folder 1 rank: image %.3g, final_latents %.3g\n",
              maxAbsDiff(tp2.first, folder.first), maxAbsDiff(tp2.second, folder.second));
  EXPECT_LT(maxAbsDiff(tp2.second, folder.second), 1e-4);
  EXPECT_LT(maxAbsDiff(tp2.first, folder.first), 1e-4);
}

TEST(FormatsCli, ComponentsFromAnywhereAndMissingOnes) {
  const auto folder = generate("--model " + fixtureDir(), "folder2");
  ASSERT_TRUE(folder.first.defined());
  // BFL transformer + ae.safetensors + CLIP folder + T5 from the all-in-one file.
  const auto mixed = generate(
      "--model " + formats("transformer-bfl.safetensors") + " --config " + fixtureDir() +
          " --vae " + formats("ae.safetensors") + " --text-encoder " + fixtureDir() +
          "/text_encoder" + " --text-encoder-2 " + formats("checkpoint-comfy-aio.safetensors"),
      "mixed");
  ASSERT_TRUE(mixed.first.defined());
  EXPECT_EQ(maxAbsDiff(mixed.first, folder.first), 0.0);
  // Nothing but the transformer: refused before anything starts, naming the flags.
  const auto [rc, log] =
      sh(std::string(DITSTUDIO_CLI) + " --model " + formats("transformer-bfl.safetensors") +
         " --config " + fixtureDir() + " --output " + (root() / "never.png").string());
  EXPECT_NE(rc, 0);
  EXPECT_NE(log.find("transformer-bfl.safetensors: has no text_encoder (give one with "
                     "--text-encoder), no text_encoder_2 (give one with --text-encoder-2), no vae "
                     "(give one with --vae)"),
            std::string::npos)
      << log;
  EXPECT_FALSE(fs::exists(root() / "never.png"));
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  std::error_code ec;
  fs::remove_all(root(), ec);
  return rc;
}
