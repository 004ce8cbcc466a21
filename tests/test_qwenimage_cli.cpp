// Qwen-Image end to end through ditstudio-cli (one rank in-process, several ranks through mpirun +
// ditstudio-worker) on tests/data/tiny-qwenimage-A: run 0 ("a photo of a cat", seed 42, 32x32,
// 4 steps, no CFG) and run 1 (true CFG 4 with a negative prompt, 24x40, 3 steps) give diffusers'
// initial latents, final latents and image (--output-tensors) within 1e-4 on one rank and under
// every strategy the sizes allow; dp 2 writes two images; impossible strategies are refused
// naming the rule.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"
#include "golden_util.h"

using namespace dit;
namespace fs = std::filesystem;

namespace {

std::string tmp(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("ditstudio_qwenimage_cli_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string promptText(size_t i) {
  return test::goldenJson().at("tokenization").at("prompts").at(i).at("prompt");
}

// Runs golden run `n` with `flags`; returns the exit status and fills `log`.
int runCli(int n, const std::string& flags, const std::string& out, std::string& log) {
  const auto& r = test::goldenJson().at("runs").at(static_cast<size_t>(n));
  std::ostringstream cmd;
  cmd << DITSTUDIO_CLI << " --model " << quoted(test::fixtureDir()) << " --prompt "
      << quoted(promptText(r.at("prompt_index").get<size_t>())) << " --seed "
      << r.at("seed").get<int>() << " --width " << r.at("width").get<int>() << " --height "
      << r.at("height").get<int>() << " --steps " << r.at("steps").get<int>()
      << " --true-cfg-scale " << r.at("true_cfg_scale").get<double>();
  if (!r.at("negative_prompt_index").is_null())
    cmd << " --negative-prompt " << quoted(promptText(r.at("negative_prompt_index").get<size_t>()));
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

void expectRunMatches(int n, const std::string& out) {
  const std::string k = "run." + std::to_string(n) + ".";
  for (const char* t : {"initial_latents", "final_latents", "image"}) {
    at::Tensor got = load(out + ".safetensors", t), want = test::golden(k + t);
    if (got.dim() + 1 == want.dim()) got = got.unsqueeze(0);
    const double d = test::maxAbsDiff(got, want);
    std::printf("%s run %d %s: max |diff| %.3g\n", out.c_str(), n, t, d);
    EXPECT_LE(d, 1e-4) << t;
  }
}

}  // namespace

struct CliCase {
  std::string name;
  int run;
  std::string flags;
};

class QwenImageCli : public ::testing::TestWithParam<CliCase> {};

TEST_P(QwenImageCli, MatchesDiffusers) {
  const CliCase& c = GetParam();
  const std::string out = tmp(c.name);
  std::string log;
  ASSERT_EQ(runCli(c.run, c.flags, out, log), 0) << log;
  EXPECT_TRUE(fs::exists(out + ".png")) << log;
  expectRunMatches(c.run, out);
}

// Run 0: 16 image and 10 text tokens (both split evenly over 2); run 1: true CFG (two calls per
// step), 15 image tokens (ulysses / ring need the anything modes there).
INSTANTIATE_TEST_SUITE_P(Strategies, QwenImageCli,
                         ::testing::Values(CliCase{"one_rank", 0, ""},
                                           CliCase{"true_cfg_one_rank", 1, ""},
                                           CliCase{"tp2", 0, "--tp-degree 2"},
                                           CliCase{"ulysses2", 0, "--ulysses-degree 2"},
                                           CliCase{"ring2", 0, "--ring-degree 2"},
                                           CliCase{"cfg2", 1, "--cfg-degree 2"},
                                           CliCase{"tp2_true_cfg", 1, "--tp-degree 2"},
                                           CliCase{"ulysses2_anything_true_cfg", 1,
                                                   "--ulysses-degree 2 --ulysses-anything"}),
                         [](const auto& info) { return info.param.name; });

TEST(QwenImageCliDataParallel, TwoReplicasTwoSeeds) {
  const std::string out = tmp("dp2");
  std::string log;
  ASSERT_EQ(runCli(0, "--dp-degree 2 --num-images 2", out, log), 0) << log;
  EXPECT_LE(test::maxAbsDiff(load(out + "-0.safetensors", "image").unsqueeze(0),
                             test::golden("run.0.image")),
            1e-4);
  EXPECT_TRUE(fs::exists(out + "-1.png")) << log;
  EXPECT_GT(test::maxAbsDiff(load(out + "-1.safetensors", "image").unsqueeze(0),
                             test::golden("run.0.image")),
            1e-3);
}

TEST(QwenImageCliRefusals, ImpossibleStrategiesNameTheRule) {
  std::string log;
  // 2 heads: tp 4 cannot give every rank a whole head.
  EXPECT_NE(runCli(0, "--tp-degree 4", tmp("tp4"), log), 0);
  EXPECT_NE(log.find("num_attention_heads"), std::string::npos) << log;
  // cfg 2 without true CFG (run 0 has no negative prompt).
  EXPECT_NE(runCli(0, "--cfg-degree 2", tmp("cfg2_off"), log), 0);
  EXPECT_NE(log.find("true CFG"), std::string::npos) << log;
  // Run 1's 15 image tokens do not split over ulysses 2 without the anything mode.
  EXPECT_NE(runCli(1, "--ulysses-degree 2", tmp("uly_strict"), log), 0);
  EXPECT_NE(log.find("15"), std::string::npos) << log;
}

// A common field QwenImagePipeline does not read is named when given, with what it reads
// instead (diffusers warns for an ignored guidance_scale); the strategy then refuses the run, so
// nothing is computed. runCli always gives --true-cfg-scale, which the family reads: no warning
// for it. Another family's knob (Z-Image's cfg_truncation) is refused naming the field, before
// anything starts.
TEST(QwenImageCliRefusals, IgnoredOptionsAreNamed) {
  std::string log;
  EXPECT_NE(runCli(0, "--tp-degree 4 --guidance 4", tmp("ignored"), log), 0);
  EXPECT_NE(log.find("guidance is ignored: QwenImagePipeline reads guidance_scale only for "
                     "guidance-distilled transformers"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("true_cfg_scale is ignored"), std::string::npos) << log;
  EXPECT_NE(log.find("num_attention_heads"), std::string::npos) << log;
  EXPECT_NE(runCli(0, "--cfg-truncation 0.5", tmp("unknown_knob"), log), 0);
  EXPECT_NE(log.find("'cfg_truncation' is not an option of Qwen-Image (QwenImagePipeline); it "
                     "takes true_cfg_scale"),
            std::string::npos)
      << log;
}

// A diffusers/PEFT LoRA on Qwen-Image modules (attn.to_q inside the fused q/k/v GEMM, the text
// stream's add_v_proj, img_mlp.net.0.proj and txt_mlp.net.2, colwise / rowwise under tp) gives the
// image of the same deltas merged into the checkpoint, on one rank and under tp 2.
TEST(QwenImageCliLora, EqualsMergedWeightsOnOneRankAndTp2) {
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
  for (const std::string m :
       {"transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.add_v_proj",
        "transformer_blocks.0.img_mlp.net.0.proj", "transformer_blocks.1.txt_mlp.net.2"}) {
    at::Tensor& w = weights.at(m + ".weight");
    const at::Tensor a = (at::rand({2, w.size(1)}) - 0.5) * 0.6;  // lora_A [r, in]
    const at::Tensor b = (at::rand({w.size(0), 2}) - 0.5) * 0.6;  // lora_B [out, r]
    lora["transformer." + m + ".lora_A.weight"] = a;
    lora["transformer." + m + ".lora_B.weight"] = b;
    w = w + at::matmul(b, a);  // no alpha: scale 1
  }
  saveTensors(wfile, weights);
  const std::string loraFile = tmp("qwenimage_lora.safetensors");
  saveTensors(loraFile, lora);
  // Run 0 on the merged copy (same prompt, seed and size).
  auto runOn = [&](const std::string& model, const std::string& flags, const std::string& out,
                   std::string& log) {
    std::ostringstream cmd;
    cmd << DITSTUDIO_CLI << " --model " << quoted(model) << " --prompt " << quoted(promptText(0))
        << " --seed 42 --width 32 --height 32 --steps 4 " << flags << " --output-tensors "
        << quoted(out + ".safetensors") << " --output " << quoted(out + ".png") << " > "
        << quoted(out + ".log") << " 2>&1";
    const int rc = std::system(cmd.str().c_str());
    std::ifstream in(out + ".log");
    log.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  };
  std::string log;
  const std::string ref = tmp("lora_merged");
  ASSERT_EQ(runOn(merged.string(), "", ref, log), 0) << log;
  const at::Tensor want = load(ref + ".safetensors", "image");
  EXPECT_GT(t::maxAbsDiff(want.unsqueeze(0), t::golden("run.0.image")), 1e-2);
  for (const std::string flags : {"", "--tp-degree 2"}) {
    const std::string out = tmp(flags.empty() ? "lora_one_rank" : "lora_tp2");
    ASSERT_EQ(runOn(test::fixtureDir(), flags + " --lora " + quoted(loraFile), out, log), 0) << log;
    const double d = t::maxAbsDiff(load(out + ".safetensors", "image"), want);
    std::printf("LoRA %s: max |image - merged| %.3g\n", flags.c_str(), d);
    EXPECT_LE(d, 1e-5) << flags;
  }
}

// ditstudio-make-model on the Qwen-Image template: fresh weights for every component through the
// family runtime (the Qwen2.5-VL language model without lm_head, the whole AutoencoderKLQwenImage)
// give a folder the CLI loads and runs.
TEST(QwenImageCliMakeModel, FreshFolderRuns) {
  const std::string dir = tmp("made");
  fs::remove_all(dir);
  const std::string make = std::string(DITSTUDIO_MAKE_MODEL) + " --template " +
                           quoted(test::fixtureDir()) + " --out " + quoted(dir) + " --seed 7 > " +
                           quoted(dir + ".log") + " 2>&1";
  ASSERT_EQ(std::system(make.c_str()), 0);
  SafetensorsCollection te(dir + "/text_encoder/model.safetensors");
  EXPECT_EQ(te.names().size(), 38u);  // 3 layers x 12 + embedding + final norm
  SafetensorsCollection vae(dir + "/vae/diffusion_pytorch_model.safetensors");
  SafetensorsCollection ref(test::fixtureDir() + "/vae/diffusion_pytorch_model.safetensors");
  EXPECT_EQ(vae.names().size(), ref.names().size());
  const std::string out = tmp("made_run");
  std::ostringstream cmd;
  cmd << DITSTUDIO_CLI << " --model " << quoted(dir) << " --prompt 'a cat' --seed 1 --width 32"
      << " --height 32 --steps 2 --output-tensors " << quoted(out + ".safetensors") << " --output "
      << quoted(out + ".png") << " > " << quoted(out + ".log") << " 2>&1";
  ASSERT_EQ(std::system(cmd.str().c_str()), 0);
  EXPECT_TRUE(load(out + ".safetensors", "image").isfinite().all().item<bool>());
}
