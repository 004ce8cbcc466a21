// Issue 11 through the real ditstudio-cli (one rank in-process, two ranks through mpirun and the
// worker): seeds round-trip exactly through the console, PNG metadata and --output-tensors;
// numbers, seeds and text are refused at the door before anything starts; an empty negative
// prompt with scale 4 equals diffusers' true-CFG run; diffusers' warnings are printed; existing
// files are never overwritten without --overwrite; an impossible size is refused by the memory
// estimate with per-rank figures.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "backend/io/png_io.h"
#include "golden_util.h"

using namespace dit;
using namespace dit::test;
namespace fs = std::filesystem;

namespace {

fs::path dir() {
  static const fs::path d = [] {
    fs::path p =
        fs::temp_directory_path() / ("ditstudio-cli-requests-" + std::to_string(::getpid()));
    fs::remove_all(p);
    fs::create_directories(p);
    return p;
  }();
  return d;
}

std::string quote(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

struct CliRun {
  int rc = -1;
  std::string log;
  double seconds = 0;
};

// ditstudio-cli with the tiny fixture, 32x32, 1 step, 48 T5 tokens unless `args` overrides.
CliRun cli(const std::string& args, const std::string& model = fixtureDir()) {
  const fs::path log = dir() / "cli.log";
  const std::string cmd = std::string(DITSTUDIO_CLI) + " --model " + quote(model) + " " + args +
                          " > " + quote(log.string()) + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = std::system(cmd.c_str());
  CliRun r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  std::ifstream in(log);
  r.log = std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return r;
}

const std::string kSmall = " --width 32 --height 32 --steps 1 --max-sequence-length 48 ";

nlohmann::json pngParams(const std::string& path) {
  return nlohmann::json::parse(readPngText(path).at("parameters"));
}

nlohmann::json tensorParams(const std::string& path) {
  SafetensorsReader r(path);
  return nlohmann::json::parse(r.metadata().at("parameters"));
}

class Seeds : public ::testing::TestWithParam<int> {};  // ranks

}  // namespace

// seeds 0, 2^53+1, 2^63, 2^64-1 round-trip exactly through the console line, the PNG's
// "parameters" chunk and the --output-tensors metadata, and seed the CPU generator with the same
// 64-bit value (initial latents equal torch.randn under manual_seed(seed)).
TEST_P(Seeds, RoundTripExactly) {
  const int ranks = GetParam();
  const std::uint64_t seeds[] = {0, (std::uint64_t(1) << 53) + 1, std::uint64_t(1) << 63,
                                 std::numeric_limits<std::uint64_t>::max()};
  for (std::uint64_t seed : seeds) {
    const std::string s = std::to_string(seed);
    const std::string out = (dir() / ("seed-" + std::to_string(ranks) + "-" + s)).string();
    const CliRun r =
        cli("--seed " + s + kSmall + (ranks > 1 ? "--np 2 --ring-degree 2 " : "") + "--output " +
            quote(out + ".png") + " --output-tensors " + quote(out + ".safetensors"));
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_NE(r.log.find("(seed " + s + (ranks > 1 ? ")" : ",")), std::string::npos) << r.log;
    const auto pj = pngParams(out + ".png");
    ASSERT_TRUE(pj["seed"].is_number_unsigned()) << pj.dump();
    EXPECT_EQ(pj["seed"].get<std::uint64_t>(), seed);
    const auto tj = tensorParams(out + ".safetensors");
    ASSERT_TRUE(tj["seed"].is_number_unsigned()) << tj.dump();
    EXPECT_EQ(tj["seed"].get<std::uint64_t>(), seed);
    // The generator got the full value: 4 latent channels x 4 (packing) of a 32x32 image at
    // vae_scale_factor 2 -> noise [1, 4, 16, 16] (the fixture: in_channels 16).
    SafetensorsCollection c(out + ".safetensors");
    at::Tensor init = loadTensor(c, "initial_latents", at::kFloat);
    auto gen = at::detail::createCPUGenerator(seed);
    const int64_t C = init.size(2) / 4,
                  side = 2 * static_cast<int64_t>(std::lround(std::sqrt(init.size(1))));
    at::Tensor noise = at::randn({1, C, side, side}, gen, at::TensorOptions().dtype(at::kFloat));
    at::Tensor packed = noise.view({1, C, side / 2, 2, side / 2, 2})
                            .permute({0, 2, 4, 1, 3, 5})
                            .reshape(init.sizes());
    EXPECT_EQ(maxAbsDiff(init, packed), 0.0) << "seed " << s;
  }
}
INSTANTIATE_TEST_SUITE_P(Cli, Seeds, ::testing::Values(1, 2), [](const auto& info) {
  return std::to_string(info.param) + "rank" + (info.param > 1 ? "s" : "");
});

// Per-image seeds wrap modulo 2^64: image 1 of a request with seed 2^64-1 uses seed 0.
TEST(CliRequests, ImageSeedsWrapModulo2To64) {
  const std::string out = (dir() / "wrap").string();
  const CliRun r = cli("--seed 18446744073709551615 --num-images 2" + kSmall + "--output " +
                       quote(out + ".png"));
  ASSERT_EQ(r.rc, 0) << r.log;
  EXPECT_EQ(pngParams(out + "-0.png")["seed"].get<std::uint64_t>(),
            std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(pngParams(out + "-1.png")["seed"].get<std::uint64_t>(), 0u);
  EXPECT_NE(r.log.find("(seed 0,"), std::string::npos) << r.log;
}

// NaN/inf/out-of-range numbers, bad seeds and invalid UTF-8 are refused before anything starts
// (exit 2, no output file, well under the time a model load takes), with the allowed range.
TEST(CliRequests, RefusedAtTheDoor) {
  const std::pair<std::string, std::string> cases[] = {
      {"--guidance nan", "--guidance must be a finite number in 0 .. 100, got nan"},
      {"--guidance inf", "--guidance must be a finite number in 0 .. 100, got inf"},
      {"--guidance -1", "--guidance must be a finite number in 0 .. 100, got -1"},
      // A family knob: finite at the door, its range the family's declaration (FLUX.1's).
      {"--true-cfg-scale -0.5",
       "true_cfg_scale must be a finite number in 0 .. 100 for FLUX.1, got -0.5"},
      {"--true-cfg-scale nan", "--true-cfg-scale must be a finite number, got nan"},
      {"--width=-8", "--width must be 0 (the model's default) or 1 .. 16384 pixels, got -8"},
      {"--height 0 --width 99999",
       "--width must be 0 (the model's default) or 1 .. 16384 pixels, got 99999"},
      {"--steps 1001", "--steps must be 0 (the model's default) or 1 .. 1000, got 1001"},
      {"--max-sequence-length 70000",
       "--max-sequence-length must be 0 (the model's default) or 1 .. 65536 tokens, got 70000"},
      // FluxPipeline's own limit (T5's 512), from the model's configs before anything loads.
      {"--max-sequence-length 600",
       "max_sequence_length cannot be greater than 512 for FluxPipeline (T5), got 600"},
      {"--num-images 0", "--num-images must be in 1 .. 10000, got 0"},
      {"--seed 18446744073709551616",
       "--seed '18446744073709551616' is not an integer in 0 .. 18446744073709551615"},
      {"--seed 12x", "--seed '12x' is not an integer in 0 .. 18446744073709551615"},
      {"--prompt " + quote("a \xff cat"),
       "--prompt is not valid UTF-8: invalid byte 0xff at byte offset 2 of its text"},
      {"--negative-prompt " + quote("\xc3"),
       "--negative-prompt is not valid UTF-8: invalid byte 0xc3 at byte offset 0"},
  };
  for (const auto& [args, message] : cases) {
    const std::string out = (dir() / "refused.png").string();
    const CliRun r = cli(args + " --output " + quote(out));
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.log;
    EXPECT_NE(r.log.find("error: " + message), std::string::npos) << args << "\n" << r.log;
    EXPECT_FALSE(fs::exists(out)) << args;
    EXPECT_EQ(r.log.find("loading"), std::string::npos) << "refused only after loading: " << args;
  }
  // --true-cfg-scale 0 is a valid "off" (it used to be refused with a contradictory message).
  const CliRun ok =
      cli("--true-cfg-scale 0" + kSmall + "--output " + quote((dir() / "cfg0.png").string()));
  EXPECT_EQ(ok.rc, 0) << ok.log;
}

// `--negative-prompt ""` is given: with scale 4 it runs true CFG and equals diffusers'
// FluxPipeline run (golden/extra_runs.md, key cfg_empty_neg: seed 11, 32x24 HxW, 2 steps).
TEST(CliRequests, EmptyNegativePromptRunsTrueCfgAsDiffusers) {
  const std::string out = (dir() / "cfg-empty").string();
  const CliRun r = cli(
      "--prompt 'a photo of a cat' --negative-prompt '' --true-cfg-scale 4 --seed 11 --height 32 "
      "--width 24 --steps 2 --guidance 3.5 --max-sequence-length 48 --output " +
      quote(out + ".png") + " --output-tensors " + quote(out + ".safetensors"));
  ASSERT_EQ(r.rc, 0) << r.log;
  SafetensorsCollection extra(fixtureDir() + "/golden/extra_runs.safetensors");
  SafetensorsCollection mine(out + ".safetensors");
  const double dl = maxAbsDiff(loadTensor(mine, "final_latents", at::kFloat),
                               loadTensor(extra, "cfg_empty_neg.final_latents", at::kFloat));
  const double di = maxAbsDiff(loadTensor(mine, "image", at::kFloat),
                               loadTensor(extra, "cfg_empty_neg.image", at::kFloat));
  std::printf("  cfg_empty_neg: final_latents %.3g image %.3g\n", dl, di);
  EXPECT_LT(dl, 1e-4);
  EXPECT_LT(di, 1e-4);
  // Without the option the same request is plain (no CFG): a different result.
  const std::string plain = (dir() / "cfg-none").string();
  ASSERT_EQ(cli("--prompt 'a photo of a cat' --true-cfg-scale 4 --seed 11 --height 32 --width 24 "
                "--steps 2 "
                "--max-sequence-length 48 --output " +
                quote(plain + ".png") + " --output-tensors " + quote(plain + ".safetensors"))
                .rc,
            0);
  SafetensorsCollection none(plain + ".safetensors");
  EXPECT_GT(maxAbsDiff(loadTensor(none, "final_latents", at::kFloat),
                       loadTensor(extra, "cfg_empty_neg.final_latents", at::kFloat)),
            1e-3);
  EXPECT_TRUE(pngParams(out + ".png").contains("negative_prompt"));
  EXPECT_FALSE(pngParams(plain + ".png").contains("negative_prompt"));
}

// diffusers' warnings: truncated prompts per encoder with the number of tokens dropped, and
// settings without effect, on one rank and through the worker.
TEST(CliRequests, WarnsAsDiffusers) {
  std::string longPrompt;
  for (int i = 0; i < 100; ++i) longPrompt += "word ";
  for (const std::string ranks : {"", "--np 2 --ring-degree 2 "}) {
    const CliRun r =
        cli(ranks + "--prompt " + quote(longPrompt) + " --true-cfg-scale 2" + kSmall + "--output " +
            quote((dir() / ("warn" + std::to_string(ranks.size()) + ".png")).string()));
    ASSERT_EQ(r.rc, 0) << r.log;
    EXPECT_NE(r.log.find("warning: the prompt was truncated: CLIP can only handle sequences up to "
                         "77 tokens; 25 of "
                         "its 100 tokens were dropped"),
              std::string::npos)
        << r.log;
    EXPECT_NE(
        r.log.find("warning: the prompt was truncated: T5 uses max_sequence_length 48 tokens; "),
        std::string::npos)
        << r.log;
    EXPECT_NE(
        r.log.find(
            "warning: true_cfg_scale is 2, but classifier-free guidance is not enabled since no "
            "negative prompt is given"),
        std::string::npos)
        << r.log;
  }
  const CliRun quiet =
      cli("--prompt 'a cat'" + kSmall + "--output " + quote((dir() / "quiet.png").string()));
  ASSERT_EQ(quiet.rc, 0) << quiet.log;
  EXPECT_EQ(quiet.log.find("warning:"), std::string::npos) << quiet.log;
  // Guidance on a model without guidance embeds has no effect.
  const fs::path noGuid = dir() / "no-guidance";
  const std::string mk = std::string(DITSTUDIO_MAKE_MODEL) + " --template " + quote(fixtureDir()) +
                         " --out " + quote(noGuid.string()) +
                         " --guidance-embeds 0 > /dev/null 2>&1";
  ASSERT_EQ(std::system(mk.c_str()), 0);
  const CliRun g =
      cli("--guidance 7" + kSmall + "--output " + quote((dir() / "noguid.png").string()),
          noGuid.string());
  ASSERT_EQ(g.rc, 0) << g.log;
  EXPECT_NE(g.log.find("warning: guidance 7 has no effect: this model has no guidance embedding"),
            std::string::npos)
      << g.log;
}

// An existing --output is never replaced silently: refused (exit 2, file untouched) unless
// --overwrite.
TEST(CliRequests, RefusesToOverwriteWithoutFlag) {
  const std::string out = (dir() / "keep.png").string();
  ASSERT_EQ(cli(kSmall + "--seed 1 --output " + quote(out)).rc, 0);
  const auto before = fs::last_write_time(out);
  const std::string bytes = [&] {
    std::ifstream in(out, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  for (const std::string ranks : {"", "--np 2 --ring-degree 2 "}) {
    const CliRun r = cli(ranks + kSmall + "--seed 2 --output " + quote(out));
    EXPECT_EQ(r.rc, 2) << r.log;
    EXPECT_NE(r.log.find("refusing to overwrite the existing file " + out + " (use --overwrite"),
              std::string::npos)
        << r.log;
    EXPECT_EQ(fs::last_write_time(out), before);
  }
  const CliRun r = cli(kSmall + "--seed 2 --overwrite --output " + quote(out));
  ASSERT_EQ(r.rc, 0) << r.log;
  EXPECT_EQ(pngParams(out)["seed"].get<std::uint64_t>(), 2u);
  std::ifstream in(out, std::ios::binary);
  EXPECT_NE(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()),
            bytes);
}

// Issue 35: output paths are checked in words before anything starts: an empty --output, a
// folder, and --output equal to --output-tensors (the tensors would replace the PNG).
TEST(CliRequests, OutputPathsRefusedInWords) {
  const std::string same = (dir() / "same.out").string();
  const std::pair<std::string, std::string> cases[] = {
      {"--output ''", "error: --output is empty: give the file name of the PNG to write"},
      {"--output " + quote(dir().string()), "is a folder: give the file name of the PNG to write"},
      {"--output " + quote(same) + " --output-tensors " + quote(same),
       "error: --output and --output-tensors name the same file (" + same + ")"},
      {"--output " + quote(same) + " --output-tensors " +
           quote((dir() / "." / "same.out").string()),
       "name the same file"},
  };
  for (const auto& [args, message] : cases) {
    const CliRun r = cli(kSmall + args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.log;
    EXPECT_NE(r.log.find(message), std::string::npos) << args << "\n" << r.log;
    EXPECT_EQ(r.log.find("filesystem error"), std::string::npos) << r.log;
    EXPECT_EQ(r.log.find("loading"), std::string::npos) << "refused only after loading: " << args;
    EXPECT_FALSE(fs::exists(same)) << args;
  }
}

// An impossible size is refused up front by the memory estimate, with the per-rank figures,
// instead of an allocator failure.
TEST(CliRequests, ImpossibleSizeRefusedWithEstimate) {
  for (const std::string ranks : {"", "--np 2 --ring-degree 2 "}) {
    const CliRun r = cli(ranks + "--width 16384 --height 16384 --steps 1 --output " +
                         quote((dir() / "huge.png").string()));
    EXPECT_EQ(r.rc, 2) << r.log;
    EXPECT_NE(r.log.find("error: not enough memory for 16384x16384: "), std::string::npos) << r.log;
    EXPECT_NE(r.log.find("(estimate per rank: weights "), std::string::npos) << r.log;
    EXPECT_NE(r.log.find(" + attention "), std::string::npos) << r.log;
    if (!ranks.empty()) {
      EXPECT_NE(r.log.find("each of the 2 ranks on this host needs about"), std::string::npos)
          << r.log;
    }
    EXPECT_LT(r.seconds, 20.0);
    EXPECT_FALSE(fs::exists(dir() / "huge.png"));
  }
}
