// ditstudio-cli runs diffusers FLUX.1 checkpoints of other shapes without code changes:
// transformer sharded over several files with an index, bf16 weights on disk, guidance embeds
// off, a deeper VAE (vae_scale_factor 4), other head counts / head dims / RoPE axes.
// Checkpoints are written by ditstudio-make-model (random weights, fixed seed).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "golden_util.h"

using namespace dit;
using namespace dit::test;
namespace fs = std::filesystem;

namespace {

fs::path root() {
  static fs::path d = [] {
    fs::path p = fs::temp_directory_path() / ("ditstudio-variants-" + std::to_string(::getpid()));
    fs::create_directories(p);
    return p;
  }();
  return d;
}

void sh(const std::string& cmd) {
  const int rc = std::system((cmd + " > " + (root() / "last.log").string() + " 2>&1").c_str());
  std::ifstream in(root() / "last.log");
  std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << cmd << "\n" << log;
}

// A model whose shapes all differ from the fixture's.
std::string makeModel(const std::string& name, const std::string& extra) {
  const fs::path out = root() / name;
  sh(std::string(DITSTUDIO_MAKE_MODEL) + " --template " + fixtureDir() + " --out " + out.string() +
     " --seed 7 --num-layers 1 --num-single-layers 3 --num-attention-heads 2 --attention-head-dim "
     "24"
     " --axes-dims-rope 4 10 10 --vae-block-out-channels 8 16 16 " +
     extra);
  return out.string();
}

at::Tensor generate(const std::string& model, const std::string& name, double guidance,
                    int size = 48) {
  const fs::path out = root() / name;
  std::ostringstream cmd;
  cmd << DITSTUDIO_CLI << " --model " << model << " --prompt 'a lighthouse at dusk' --seed 5"
      << " --width " << size << " --height " << size << " --steps 2 --guidance " << guidance
      << " --max-sequence-length 32 --output " << out.string() << ".png --output-tensors "
      << out.string() << ".safetensors";
  sh(cmd.str());
  SafetensorsCollection c(out.string() + ".safetensors");
  return loadTensor(c, "image", at::kFloat);
}

}  // namespace

TEST(CheckpointVariants, ShardedBf16NoGuidanceDeepVae) {
  const std::string single = makeModel("single-fp32", "--guidance-embeds 0");
  const std::string sharded = makeModel("sharded-fp32", "--guidance-embeds 0 --shard-bytes 40000");
  const std::string bf16 =
      makeModel("sharded-bf16", "--guidance-embeds 0 --shard-bytes 40000 --disk-dtype bfloat16");
  // The sharded checkpoint really is sharded.
  int shards = 0;
  for (auto& e : fs::directory_iterator(fs::path(sharded) / "transformer"))
    shards += e.path().extension() == ".safetensors";
  EXPECT_GT(shards, 2);
  EXPECT_TRUE(
      fs::exists(fs::path(sharded) / "transformer/diffusion_pytorch_model.safetensors.index.json"));

  at::Tensor a = generate(single, "single", 3.5);
  // vae_scale_factor 4 (three VAE levels): 48x48 pixels -> 6x6 packed tokens, image [3, 48, 48].
  ASSERT_EQ(a.sizes(), (at::IntArrayRef{3, 48, 48}));
  EXPECT_TRUE(at::isfinite(a).all().item<bool>());
  EXPECT_GT(a.std().item<double>(), 1e-4);  // not a constant image
  // Sharded files hold the same weights: identical output.
  EXPECT_EQ(maxAbsDiff(generate(sharded, "sharded", 3.5), a), 0.0);
  // guidance_embeds off: the guidance value has no effect.
  EXPECT_EQ(maxAbsDiff(generate(single, "single-g7", 7.0), a), 0.0);
  // bf16 on disk, computed in float32: close to the fp32 checkpoint (weights rounded to bf16).
  at::Tensor b = generate(bf16, "bf16", 3.5);
  EXPECT_LT(maxAbsDiff(b, a), 5e-2);
  EXPECT_GT(maxAbsDiff(b, a), 0.0);
}

TEST(CheckpointVariants, SizeMustFitDeeperVae) {
  const std::string m = makeModel("deep-vae", "");
  // 2 x vae_scale_factor = 8: 44 is refused with the multiple named.
  const std::string cmd =
      std::string(DITSTUDIO_CLI) + " --model " + m + " --width 44 --height 48 --steps 1 --output " +
      (root() / "bad.png").string() + " > " + (root() / "bad.log").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_NE(rc, 0);
  std::ifstream in(root() / "bad.log");
  std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("multiples of 8"), std::string::npos) << log;
}
