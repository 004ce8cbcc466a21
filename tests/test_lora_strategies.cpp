// LoRA (issue 13) through the real programs: every parallel strategy with LoRAs equals the one-rank
// run with the same LoRAs within 1e-4 (ditstudio-cli --lora, as tests/test_strategies.cpp), and
// one worker group switches LoRAs between requests without reloading: X at 1.0, then none, then X
// at 0.5 — the second equals a fresh base run exactly, the third a fresh run at 0.5 exactly, the
// model's weights are read once (the worker's weight_reads counter does not move), bad LoRA files
// are refused naming the file and module while the group keeps serving.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <vector>

#include "app/common/lora_cache.h"
#include "app/protocol/protocol.h"
#include "backend/io/model_folder.h"
#include "backend/io/png_io.h"
#include "backend/io/sha256.h"
#include "backend/io/weight_source.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"
#include "golden_util.h"
#include "tests/test_temp_dir.h"

using namespace dit;
using namespace dit::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kKohya = fixtureDir() + "/lora/lora-kohya.safetensors";
const std::string kDiffusers = fixtureDir() + "/lora/lora-diffusers.safetensors";
// Both files: fused q/k/v(/mlp) splits, colwise, rowwise, packed rowwise and replicated layers.
const std::string kLoraFlags = "--lora " + kKohya + " --lora " + kDiffusers + ":0.6";

std::string tmp(const std::string& name) {
  const fs::path d = dit::test::processTempDir("ditstudio-lora-strat-");
  return (d / name).string();
}

std::string quote(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

std::string slurp(const std::string& f) {
  std::ifstream in(f);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

int runCli(int r, const std::string& flags, const std::string& out, std::string* log) {
  const auto& c = goldenJson()["cases"]["runs"][r];
  std::ostringstream cmd;
  cmd << DITSTUDIO_CLI << " --model " << quote(fixtureDir()) << " --prompt " << quote(c["prompt"])
      << " --seed " << c["seed"].get<int64_t>() << " --width " << c["width"].get<int>()
      << " --height " << c["height"].get<int>() << " --steps " << c["steps"].get<int>()
      << " --guidance " << c["guidance"].get<double>() << " --max-sequence-length 48";
  if (c.contains("negative_prompt"))
    cmd << " --negative-prompt " << quote(c["negative_prompt"]) << " --true-cfg-scale "
        << c["true_cfg_scale"].get<double>();
  cmd << " " << flags << " --output " << quote(out + ".png") << " --output-tensors "
      << quote(out + ".safetensors") << " > " << quote(out + ".log") << " 2>&1";
  const int rc = std::system(cmd.str().c_str());
  *log = slurp(out + ".log");
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

at::Tensor load(const std::string& file, const std::string& name) {
  SafetensorsCollection c(file);
  return loadTensor(c, name, at::kFloat);
}

struct Case {
  std::string name, flags;
  int run;
};
class LoraStrategies : public ::testing::TestWithParam<Case> {};

// Every event line of a worker log.
std::vector<json> events(const std::string& log) {
  std::vector<json> out;
  std::istringstream in(log);
  std::string line;
  while (std::getline(in, line))
    if (auto e = protocol::parseEventLine(line)) out.push_back(e->data);
  return out;
}

// Runs one worker group (mpirun -np `np` with `flags`) on the given request lines + shutdown.
std::string runWorker(int np, const std::string& flags, const std::vector<json>& requests,
                      const std::string& name) {
  const std::string in = tmp(name + ".requests"), log = tmp(name + ".log");
  {
    std::ofstream f(in);
    for (const auto& r : requests) f << r.dump() << "\n";
    f << R"({"type":"shutdown"})"
      << "\n";
  }
  std::ostringstream cmd;
  cmd << "timeout 200 " << DITSTUDIO_MPIRUN << " --allow-run-as-root --oversubscribe -np " << np
      << " -x OMP_NUM_THREADS=1 " << DITSTUDIO_WORKER << " --model " << quote(fixtureDir()) << " "
      << flags << " < " << quote(in) << " > " << quote(log) << " 2>&1";
  const int rc = std::system(cmd.str().c_str());
  EXPECT_EQ(WIFEXITED(rc) ? WEXITSTATUS(rc) : 128, 0) << slurp(log);
  return slurp(log);
}

json request(const std::string& id, const std::string& out, const json& loras) {
  json r{{"type", "generate"},
         {"id", id},
         {"prompt", "a red fox"},
         {"seed", 7},
         {"width", 32},
         {"height", 32},
         {"steps", 2},
         {"max_sequence_length", 48},
         {"output", out + ".png"},
         {"output_tensors", out + ".safetensors"}};
  if (!loras.is_null()) r["loras"] = loras;
  return r;
}

}  // namespace

TEST_P(LoraStrategies, MatchesOneRankWithTheSameLoras) {
  const Case& c = GetParam();
  std::string log;
  const std::string ref = tmp(c.name + "-ref"), out = tmp(c.name);
  ASSERT_EQ(runCli(c.run, kLoraFlags, ref, &log), 0) << log;
  ASSERT_EQ(runCli(c.run, kLoraFlags + " " + c.flags, out, &log), 0) << log;
  const at::Tensor refLat = load(ref + ".safetensors", "final_latents");
  // The LoRAs change the result (against the no-LoRA golden): the comparison can fail.
  const double effect =
      maxAbsDiff(refLat, golden("run." + std::to_string(c.run) + ".final_latents"));
  const double dl = maxAbsDiff(load(out + ".safetensors", "final_latents"), refLat);
  const double di =
      maxAbsDiff(load(out + ".safetensors", "image"), load(ref + ".safetensors", "image"));
  std::printf("  %-10s LoRA effect %.3g  final_latents %.3g  image %.3g\n", c.name.c_str(), effect,
              dl, di);
  EXPECT_GT(effect, 1e-2);
  EXPECT_LT(dl, 1e-4);
  EXPECT_LT(di, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Cpu, LoraStrategies,
                         ::testing::Values(Case{"tp2", "--tp-degree 2", 0},
                                           Case{"tp4", "--tp-degree 4", 0},
                                           Case{"ulysses2", "--ulysses-degree 2", 0},
                                           Case{"ring2", "--ring-degree 2", 0},
                                           Case{"cfg2", "--cfg-degree 2", 2},
                                           Case{"dp2", "--dp-degree 2", 0}),
                         [](const auto& info) { return info.param.name; });

TEST(LoraWorker, SwitchesWithoutReloadingAndRefusesBadFiles) {
  // Bad files: a module the model lacks, a shape that does not fit, a corrupt file, an unknown
  // layout.
  const std::string bad1 = tmp("other-model.safetensors"), bad2 = tmp("shape.safetensors"),
                    corrupt = tmp("corrupt.safetensors"), unknown = tmp("unknown.safetensors");
  {
    SafetensorsCollection c(kDiffusers);
    std::map<std::string, at::Tensor> t;
    for (const auto& n : c.names()) t[n] = loadTensor(c, n, at::kFloat);
    auto t1 = t;
    t1["transformer.transformer_blocks.9.attn.to_q.lora_A.weight"] = at::zeros({4, 64});
    t1["transformer.transformer_blocks.9.attn.to_q.lora_B.weight"] = at::zeros({64, 4});
    saveTensors(bad1, t1);
    auto t2 = t;
    t2["transformer.single_transformer_blocks.1.proj_out.lora_A.weight"] = at::zeros({4, 100});
    saveTensors(bad2, t2);
    fs::copy_file(kDiffusers, corrupt, fs::copy_options::overwrite_existing);
    fs::resize_file(corrupt, 3000);
    saveTensors(unknown, {{"unet.down.0.weight", at::zeros({2, 2})}});
  }
  const json x1 = json::array({{{"file", kKohya}, {"strength", 1.0}}});
  const json x05 = json::array({{{"file", kKohya}, {"strength", 0.5}}});
  const std::string a = tmp("a"), b = tmp("b"), c = tmp("c"), ok = tmp("ok");
  const std::string log =
      runWorker(2, "--tp-degree 2",
                {request("a", a, x1), request("b", b, json()), request("c", c, x05),
                 request("bad1", tmp("bad1"), json::array({{{"file", bad1}}})),
                 request("bad2", tmp("bad2"), json::array({{{"file", bad2}}})),
                 request("bad3", tmp("bad3"), json::array({{{"file", corrupt}}})),
                 request("bad4", tmp("bad4"), json::array({{{"file", unknown}}})),
                 request("bad5", tmp("bad5"), json::array({{{"file", tmp("nope.safetensors")}}})),
                 request("ok", ok, x05)},
                "switch");
  // Fresh groups for the references.
  const std::string fb = tmp("fresh-base"), fc = tmp("fresh-05");
  runWorker(2, "--tp-degree 2", {request("fb", fb, json())}, "fresh-base");
  runWorker(2, "--tp-degree 2", {request("fc", fc, x05)}, "fresh-05");

  const double dBase = maxAbsDiff(load(b + ".safetensors", "final_latents"),
                                  load(fb + ".safetensors", "final_latents"));
  const double dHalf = maxAbsDiff(load(c + ".safetensors", "final_latents"),
                                  load(fc + ".safetensors", "final_latents"));
  const double dOk = maxAbsDiff(load(ok + ".safetensors", "final_latents"),
                                load(fc + ".safetensors", "final_latents"));
  const double effect = maxAbsDiff(load(a + ".safetensors", "final_latents"),
                                   load(fb + ".safetensors", "final_latents"));
  std::printf("  none after X: %.3g  X@0.5 after none: %.3g  after refusals: %.3g  X effect %.3g\n",
              dBase, dHalf, dOk, effect);
  EXPECT_EQ(dBase, 0.0);
  EXPECT_EQ(dHalf, 0.0);
  EXPECT_EQ(dOk, 0.0);
  EXPECT_GT(effect, 1e-2);
  EXPECT_EQ(maxAbsDiff(load(b + ".safetensors", "image"), load(fb + ".safetensors", "image")), 0);

  // Weights read once: every lora event reports the ready event's weight_reads; the LoRA file
  // was parsed once for three uses.
  int64_t readyReads = -1;
  std::vector<json> loraEvents;
  std::map<std::string, std::string> errors;
  for (const auto& e : events(log)) {
    if (e["event"] == "ready") readyReads = e["weight_reads"].get<int64_t>();
    if (e["event"] == "lora") loraEvents.push_back(e);
    if (e["event"] == "error") errors[e.value("id", "")] = e.value("message", "");
  }
  ASSERT_GT(readyReads, 0) << log;
  ASSERT_EQ(loraEvents.size(), 4u) << log;  // a, b, c, ok
  for (const auto& e : loraEvents) EXPECT_EQ(e["weight_reads"].get<int64_t>(), readyReads) << e;
  EXPECT_EQ(loraEvents[3]["lora_files_parsed"].get<int>(), 1) << loraEvents[3];
  EXPECT_EQ(loraEvents[1]["loras"].size(), 0u);
  EXPECT_EQ(loraEvents[1]["lora_bytes_rank0"].get<int64_t>(), 0);
  EXPECT_EQ(loraEvents[0]["loras"][0]["format"], "kohya");
  EXPECT_EQ(loraEvents[0]["loras"][0]["sha256"].get<std::string>().size(), 64u);
  // Refusals name the file and the first mismatching module.
  EXPECT_NE(errors["bad1"].find(bad1), std::string::npos) << errors["bad1"];
  EXPECT_NE(errors["bad1"].find("'transformer_blocks.9.attn.to_q' does not exist"),
            std::string::npos)
      << errors["bad1"];
  EXPECT_NE(errors["bad2"].find("'single_transformer_blocks.1.proj_out'"), std::string::npos)
      << errors["bad2"];
  EXPECT_NE(errors["bad3"].find(corrupt), std::string::npos) << errors["bad3"];
  EXPECT_NE(errors["bad4"].find("unknown LoRA format"), std::string::npos) << errors["bad4"];
  EXPECT_NE(errors["bad5"].find("LoRA file not found"), std::string::npos) << errors["bad5"];
  EXPECT_NE(log.find(R"("event":"done","id":"ok")"), std::string::npos) << log;
  EXPECT_NE(log.find(R"("event":"bye")"), std::string::npos) << log;
  // The PNG of request c records the LoRA (file, SHA-256, strength).
  const json params = json::parse(readPngText(c + ".png").at("parameters"));
  ASSERT_EQ(params["loras"].size(), 1u) << params;
  EXPECT_EQ(params["loras"][0]["file"], kKohya);
  EXPECT_EQ(params["loras"][0]["strength"].get<double>(), 0.5);
  EXPECT_EQ(params["loras"][0]["sha256"], loraEvents[0]["loras"][0]["sha256"]);
  EXPECT_EQ(params["loras"][0]["sha256"], sha256File(kKohya));
}

// Issue 35: a LoRA whose factors hold NaN / Inf, or whose alpha makes the scale overflow, is an
// error naming the file and the tensor, with a non-zero exit and no PNG (it used to give "wrote
// ..." and a black image whose metadata claimed the LoRA): through ditstudio-cli on one rank, and
// in a tp 2 worker group that keeps serving; a LoRA path that is a directory or a FIFO is named as
// such (not "not found").
TEST(LoraNonFinite, RefusedAtOneRankAndTp2NamingFileAndTensor) {
  SafetensorsCollection src(kDiffusers);
  std::map<std::string, at::Tensor> t;
  for (const auto& n : src.names()) t[n] = loadTensor(src, n, at::kFloat);
  const std::string key = "transformer.transformer_blocks.0.ff.net.2.lora_B.weight";
  ASSERT_TRUE(t.count(key));
  auto nanT = t;
  nanT[key] = t[key].clone();
  nanT[key].view({-1})[5] = std::numeric_limits<float>::quiet_NaN();
  const std::string nanFile = tmp("nan-lora.safetensors");
  saveTensors(nanFile, nanT);
  auto infT = t;
  infT[key] = t[key].clone();
  infT[key].view({-1})[0] = std::numeric_limits<float>::infinity();
  const std::string infFile = tmp("inf-lora.safetensors");
  saveTensors(infFile, infT);
  // Alpha tensors whose alpha / rank is no float32.
  auto alphaT = t;
  const std::string suffix = ".lora_A.weight";
  for (const auto& [n, v] : t)
    if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      alphaT[n.substr(0, n.size() - suffix.size()) + ".alpha"] = at::full({}, 1e300, at::kDouble);
  const std::string alphaFile = tmp("alpha-lora.safetensors");
  saveTensors(alphaFile, alphaT);

  // One rank, through the CLI: exit non-zero, no PNG, the file and tensor named.
  for (const auto& [file, words] : std::vector<std::pair<std::string, std::string>>{
           {nanFile, "tensor '" + key + "' holds 1 non-finite value (first: nan"},
           {alphaFile, "gives a scale outside the float32 range"}}) {
    const std::string out = tmp("cli-" + fs::path(file).stem().string());
    std::string log;
    const int rc = runCli(0, "--lora " + quote(file), out, &log);
    EXPECT_NE(rc, 0) << log;
    EXPECT_FALSE(fs::exists(out + ".png")) << log;
    EXPECT_FALSE(fs::exists(out + ".safetensors")) << log;
    EXPECT_NE(log.find(file), std::string::npos) << log;
    EXPECT_NE(log.find(words), std::string::npos) << log;
  }

  // tp 2 worker group: each refused with its own words, then a good request is served.
  const std::string dir = tmp("a-directory.safetensors");
  fs::create_directories(dir);
  const std::string fifo = tmp("a-fifo.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string ok = tmp("nonfinite-ok");
  const std::string log =
      runWorker(2, "--tp-degree 2",
                {request("nan", tmp("nan"), json::array({{{"file", nanFile}}})),
                 request("inf", tmp("inf"), json::array({{{"file", infFile}}})),
                 request("alpha", tmp("alpha"), json::array({{{"file", alphaFile}}})),
                 request("dir", tmp("dir"), json::array({{{"file", dir}}})),
                 request("fifo", tmp("fifo"), json::array({{{"file", fifo}}})),
                 request("ok", ok, json::array({{{"file", kKohya}, {"strength", 0.5}}}))},
                "nonfinite");
  std::map<std::string, std::string> errors;
  for (const auto& e : events(log))
    if (e["event"] == "error") errors[e.value("id", "")] = e.value("message", "");
  EXPECT_NE(errors["nan"].find(nanFile), std::string::npos) << errors["nan"];
  EXPECT_NE(errors["nan"].find("tensor '" + key + "' holds 1 non-finite value (first: nan"),
            std::string::npos)
      << errors["nan"];
  EXPECT_NE(errors["inf"].find("tensor '" + key + "' holds 1 non-finite value (first: inf"),
            std::string::npos)
      << errors["inf"];
  EXPECT_NE(errors["alpha"].find("outside the float32 range"), std::string::npos)
      << errors["alpha"];
  EXPECT_NE(errors["dir"].find("is a directory, not a regular file"), std::string::npos)
      << errors["dir"];
  EXPECT_NE(errors["fifo"].find("is a FIFO (named pipe), not a regular file"), std::string::npos)
      << errors["fifo"];
  for (const char* id : {"nan", "inf", "alpha", "dir", "fifo"}) {
    EXPECT_FALSE(fs::exists(tmp(id) + ".png")) << id;
    EXPECT_EQ(log.find(std::string(R"("event":"done","id":")") + id + "\""), std::string::npos)
        << id;
  }
  EXPECT_NE(log.find(R"("event":"done","id":"ok")"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(ok + ".png"));
}

// Nothing served stale: a LoRA file replaced between two requests by another file renamed over it
// (same size, same mtime: only its inode differs) is parsed again.
TEST(LoraCache, AFileReplacedBetweenRequestsIsReadAgain) {
  auto w = WeightSource::fromFolder(fixtureDir() + "/transformer", "diffusion_pytorch_model",
                                    at::kFloat, c10::Device(at::kCPU));
  FluxTransformer2DModel m(fluxConfig(ModelFolder::open(fixtureDir())).transformer, *w);
  const fs::path file = tmp("replaced.safetensors"), next = tmp("replacement.safetensors");
  fs::copy_file(kKohya, file, fs::copy_options::overwrite_existing);
  LoraCache cache(1ull << 30);
  cache.get(file.string(), m);
  cache.get(file.string(), m);
  EXPECT_EQ(cache.loads(), 1);  // the same file: cached
  fs::copy_file(kKohya, next, fs::copy_options::overwrite_existing);
  fs::last_write_time(next, fs::last_write_time(file));
  ASSERT_EQ(fs::file_size(next), fs::file_size(file));
  fs::rename(next, file);
  cache.get(file.string(), m);
  EXPECT_EQ(cache.loads(), 2);  // replaced: read again
  fs::remove(file);
}

TEST(LoraCache, BudgetBoundsWhatIsKept) {
  auto w = WeightSource::fromFolder(fixtureDir() + "/transformer", "diffusion_pytorch_model",
                                    at::kFloat, c10::Device(at::kCPU));
  FluxTransformer2DModel m(fluxConfig(ModelFolder::open(fixtureDir())).transformer, *w);
  // Room for one of the two files: using them in turn parses each again.
  const uint64_t one = LoraCache(1ull << 30).get(kKohya, m)->prepared->bytes;
  LoraCache small(one + one / 2);
  small.get(kKohya, m);
  small.get(kKohya, m);
  EXPECT_EQ(small.loads(), 1);  // cached
  small.get(kDiffusers, m);     // evicts the kohya file
  EXPECT_LE(small.bytes(), one + one / 2);
  small.get(kKohya, m);
  EXPECT_EQ(small.loads(), 3);
  // A large budget keeps both.
  LoraCache big(1ull << 30);
  big.get(kKohya, m);
  big.get(kDiffusers, m);
  big.get(kKohya, m);
  EXPECT_EQ(big.loads(), 2);
}
