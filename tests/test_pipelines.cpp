// Issue 14 parity with diffusers (float32, CPU) on tests/data/tiny-flux-A/pipelines (README
// there): VaeImageProcessor preprocessing (exact, PIL Lanczos included), the VAE encoder (5e-5),
// every random draw (bit for bit), FluxImg2ImgPipeline at strength 0.6 and 1.0,
// FluxInpaintPipeline, First Block Cache at two thresholds (same computed steps) and TaylorSeer in
// three configurations; latents and images within 1e-4.
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>

#include "backend/io/image_io.h"
#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl.h"
#include "backend/models/cache/step_cache_config.h"
#include "backend/pipelines/flux/pipeline_flux.h"
#include "backend/pipelines/image_processor.h"
#include "golden_util.h"

using namespace dit;
using namespace dit::test;

namespace {
constexpr double kTol = 1e-4, kEncTol = 5e-5;

const std::string& dir() {
  static const std::string d = fixtureDir() + "/pipelines";
  return d;
}
const SafetensorsCollection& pg() {
  static SafetensorsCollection g(dir() + "/pipelines_golden.safetensors");
  return g;
}
at::Tensor G(const std::string& name) {
  const auto& info = pg().info(name);
  return loadTensor(pg(), name, info.dtype == DType::I32 ? at::kInt : at::kFloat);
}
const nlohmann::json& J() {
  static nlohmann::json j = [] {
    std::ifstream in(dir() + "/golden.json");
    return nlohmann::json::parse(in);
  }();
  return j;
}
double diff(const std::string& what, const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes()) << what;
  if (a.sizes() != b.sizes()) return INFINITY;
  const double d = maxAbsDiff(a, b);
  std::printf("  max |diff| %-40s %.3g\n", what.c_str(), d);
  return d;
}
FluxPipeline& pipeline() {
  static FluxPipeline p(ModelFolder::open(fixtureDir()), PipelineOptions{});
  return p;
}
PipelineInputs baseInputs(const nlohmann::json& c) {
  PipelineInputs p;
  p.prompt = J()["prompt"];
  p.seed = c["seed"];
  p.height = c["height"];
  p.width = c.value("width", 0);
  p.steps = c.value("num_inference_steps", 0);
  p.guidance = c.value("guidance_scale", 3.5);
  p.max_sequence_length = J()["max_sequence_length"];
  return p;
}
struct PipeRun {
  GenerationResult res;
  std::vector<at::Tensor> perStep;
};
PipeRun run(const PipelineInputs& p) {
  PipeRun r;
  PipelineCallbacks cb;
  cb.onStep = [&](int, int, const at::Tensor& lat, const at::Tensor&, double) {
    r.perStep.push_back(lat.to(at::kFloat).cpu().squeeze(0).clone());
    return true;
  };
  r.res = pipeline().generate(p, cb);
  return r;
}
// Latents after every step, final latents and image against `prefix`.
void expectRun(const PipeRun& r, const std::string& prefix) {
  at::Tensor per = G(prefix + "latents_per_step");
  ASSERT_EQ(static_cast<int64_t>(r.perStep.size()), per.size(0)) << prefix;
  EXPECT_LT(diff(prefix + "latents_per_step", at::stack(r.perStep), per), kTol);
  EXPECT_LT(diff(prefix + "final_latents", r.res.final_latents, G(prefix + "final_latents")), kTol);
  EXPECT_LT(diff(prefix + "image", r.res.image, G(prefix + "image")), kTol);
}
double psnr(const at::Tensor& a, const at::Tensor& b) {
  const double mse = (a - b).pow(2).mean().item<double>();
  return 10 * std::log10(1 / mse);
}
}  // namespace

TEST(Preprocess, InitImageExact) {
  const Image8 img = readImage(dir() + "/input_32x24.png");
  EXPECT_EQ(img.width, 24);
  EXPECT_EQ(img.height, 32);
  EXPECT_EQ(diff("vae_enc.in", preprocessImage(img, 32, 24), G("vae_enc.in")), 0.0);
}

TEST(Preprocess, LanczosResizeExact) {
  const Image8 img = readImage(dir() + "/input_32x24.png");
  for (const auto& c : J()["cases"]["preproc_resize"]) {
    const std::string key = c["key"];
    EXPECT_EQ(diff(key, preprocessImage(img, c["height"], c["width"]), G(key)), 0.0) << key;
  }
}

TEST(Preprocess, MaskExact) {
  const Image8 m = readImage(dir() + "/mask_32x24.png");
  EXPECT_EQ(m.channels, 1);
  EXPECT_EQ(diff("inpaint.mask_in", preprocessMask(m, 32, 24), G("inpaint.mask_in")), 0.0);
}

TEST(Preprocess, ReadImageErrorsNameTheFile) {
  try {
    readImage(dir() + "/golden.json");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("golden.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a readable image"), std::string::npos) << e.what();
  }
  EXPECT_THROW(readImage(dir() + "/no-such.png"), std::runtime_error);
}

TEST(Preprocess, Sha256) {
  const std::string abc = "abc";
  EXPECT_EQ(sha256Hex(abc), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256Hex(std::string_view()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(VaeEncoder, PosteriorMatches) {
  auto m = ModelFolder::open(fixtureDir());
  auto w =
      WeightSource::fromFolder(m.component("vae"), "diffusion_pytorch_model", at::kFloat, at::kCPU);
  AutoencoderKL vae(fluxConfig(m).vae, *w);
  ASSERT_TRUE(vae.hasEncoder());
  at::NoGradGuard ng;
  auto post = vae.encode(G("vae_enc.in"));
  EXPECT_LT(diff("vae_enc.mean", post.mean, G("vae_enc.mean")), kEncTol);
  EXPECT_LT(diff("vae_enc.logvar", post.logvar, G("vae_enc.logvar")), kEncTol);
  EXPECT_LT(diff("vae_enc.std", post.std, G("vae_enc.std")), kEncTol);
}

TEST(Img2Img, StrengthCases) {
  for (const auto& c : J()["cases"]["img2img"]) {
    const std::string k = c["prefix"];
    PipelineInputs p = baseInputs(c);
    p.init_image = dir() + "/" + c["image_png"].get<std::string>();
    p.strength = c["strength"];
    EXPECT_EQ(img2imgStart(p.steps, p.strength), c["t_start"].get<int>()) << k;
    PipeRun r = run(p);
    EXPECT_EQ(r.res.t_start, c["t_start"].get<int>()) << k;
    EXPECT_EQ(r.res.steps_done, c["steps_run"].get<int>()) << k;
    // Random draws bit for bit, in diffusers' order.
    EXPECT_EQ(diff(k + "vae_eps", r.res.tensors.at("vae_eps"), G(k + "vae_eps")), 0.0);
    EXPECT_EQ(diff(k + "noise", r.res.tensors.at("noise"), G(k + "noise")), 0.0);
    EXPECT_LT(diff(k + "image_latents", r.res.tensors.at("image_latents"), G(k + "image_latents")),
              kEncTol);
    EXPECT_LT(diff(k + "initial_latents", r.res.initial_latents, G(k + "initial_latents")),
              kEncTol);
    expectRun(r, k);
  }
}

TEST(Inpaint, MatchesFluxInpaintPipeline) {
  const auto& c = J()["cases"]["inpaint"];
  const std::string k = c["prefix"];
  PipelineInputs p = baseInputs(c);
  p.init_image = dir() + "/" + c["image_png"].get<std::string>();
  p.mask_image = dir() + "/" + c["mask_png"].get<std::string>();
  p.strength = c["strength"];
  PipeRun r = run(p);
  EXPECT_EQ(r.res.t_start, c["t_start"].get<int>());
  EXPECT_EQ(r.res.steps_done, c["steps_run"].get<int>());
  const auto& t = r.res.tensors;
  EXPECT_EQ(diff(k + "mask_in", t.at("mask_in"), G(k + "mask_in")), 0.0);
  EXPECT_EQ(diff(k + "masked_image_in", t.at("masked_image_in"), G(k + "masked_image_in")), 0.0);
  EXPECT_EQ(diff(k + "vae_eps", t.at("vae_eps"), G(k + "vae_eps")), 0.0);
  EXPECT_EQ(diff(k + "noise", t.at("noise"), G(k + "noise")), 0.0);
  EXPECT_EQ(
      diff(k + "masked_image_vae_eps", t.at("masked_image_vae_eps"), G(k + "masked_image_vae_eps")),
      0.0);
  EXPECT_EQ(diff(k + "mask_latent_hw", t.at("mask_latent_hw"), G(k + "mask_latent_hw")), 0.0);
  EXPECT_EQ(diff(k + "mask_latents", t.at("mask_latents"), G(k + "mask_latents")), 0.0);
  EXPECT_LT(diff(k + "image_latents", t.at("image_latents"), G(k + "image_latents")), kEncTol);
  EXPECT_LT(
      diff(k + "masked_image_latents", t.at("masked_image_latents"), G(k + "masked_image_latents")),
      kEncTol);
  EXPECT_LT(diff(k + "initial_latents", r.res.initial_latents, G(k + "initial_latents")), kEncTol);
  expectRun(r, k);
}

TEST(Img2Img, BadInputsAreRefused) {
  const auto& c = J()["cases"]["img2img"][0];
  PipelineInputs p = baseInputs(c);
  p.init_image = dir() + "/" + c["image_png"].get<std::string>();
  for (double s : {0.0, -0.5, 1.5, std::nan("")}) {
    p.strength = s;
    EXPECT_THROW(pipeline().resolve(p), std::invalid_argument) << s;
  }
  p.strength = 1e-17;  // int(4 - 4e-17) = 4: no step would run (diffusers raises too)
  try {
    pipeline().resolve(p);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("runs no denoising step"), std::string::npos);
  }
  p.strength = 0.6;
  p.init_image = dir() + "/golden.json";
  p.width = p.height = 0;
  try {
    pipeline().resolve(p);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("golden.json"), std::string::npos) << e.what();
  }
  PipelineInputs q = baseInputs(c);
  q.mask_image = dir() + "/mask_32x24.png";
  EXPECT_THROW(pipeline().resolve(q), std::invalid_argument);
}

TEST(Img2Img, DefaultSizeAndResizedMask) {
  // No width/height: the init image's size; a mask of another size is resized (LANCZOS) as
  // diffusers' mask_processor does.
  const auto& c = J()["cases"]["img2img"][0];
  PipelineInputs p = baseInputs(c);
  p.width = p.height = 0;
  p.init_image = dir() + "/input_32x24.png";
  const PipelineInputs r = pipeline().resolve(p);
  EXPECT_EQ(r.width, 24);
  EXPECT_EQ(r.height, 32);
  const Image8 m = readImage(dir() + "/mask_32x24.png");
  at::Tensor big = preprocessMask(resizeLanczos(m, 48, 64), 32, 24);
  EXPECT_EQ(big.sizes(), (std::vector<int64_t>{1, 1, 32, 24}));
  // The rectangle stays where it was, up to its one-pixel rim.
  EXPECT_LT((big - G("inpaint.mask_in")).abs().sum().item<double>(), 2 * (12 + 14) + 1);
}

TEST(StepCache, ConfigSpelling) {
  auto a = parseStepCacheConfig("first-block:0.37");
  EXPECT_EQ(a.mode, StepCacheConfig::Mode::FirstBlock);
  EXPECT_DOUBLE_EQ(a.threshold, 0.37);
  EXPECT_EQ(a.toString(), "first-block:0.37");
  auto b = parseStepCacheConfig("taylorseer:2,3,2,lite");
  EXPECT_EQ(b.max_order, 2);
  EXPECT_EQ(b.cache_interval, 3);
  EXPECT_EQ(b.disable_cache_before_step, 2);
  EXPECT_TRUE(b.use_lite_mode);
  EXPECT_EQ(parseStepCacheConfig(b.toString()), b);
  auto c = parseStepCacheConfig("taylorseer:1");
  EXPECT_EQ(c.cache_interval, 5);
  EXPECT_EQ(c.disable_cache_before_step, 3);
  EXPECT_FALSE(parseStepCacheConfig("none").enabled());
  for (const char* bad : {"fast", "first-block", "first-block:x", "first-block:-1", "taylorseer:0",
                          "taylorseer:1,0,2", "taylorseer:1,2", "taylorseer:1,3,-1",
                          "taylorseer:1,3,2,extra", "first-block:0.1x"}) {
    try {
      parseStepCacheConfig(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  // TaylorSeer's schedule: K=3, W=2 over 10 steps computes 0, 1, 3, 6, 9.
  std::vector<int> computed;
  for (int i = 0; i < 10; ++i)
    if (b.taylorComputes(i)) computed.push_back(i);
  EXPECT_EQ(computed, (std::vector<int>{0, 1, 3, 6, 9}));
}

namespace {
std::vector<int> computedSteps(const GenerationResult& r) {
  std::vector<int> s;
  for (size_t i = 0; i < r.cache_computed.size(); ++i)
    if (r.cache_computed[i]) s.push_back(static_cast<int>(i));
  return s;
}
}  // namespace

TEST(StepCache, UncachedReference) {
  const auto& c = J()["cases"]["cache_ref"];
  PipeRun r = run(baseInputs(c));
  EXPECT_TRUE(r.res.cache_computed.empty());
  EXPECT_LT(
      diff("cache_ref.initial_latents", r.res.initial_latents, G("cache_ref.initial_latents")),
      1e-6);
  expectRun(r, "cache_ref.");
}

TEST(StepCache, FirstBlockCache) {
  for (const auto& c : J()["cases"]["fbcache"]) {
    const std::string k = c["prefix"];
    PipelineInputs p = baseInputs(c);
    p.cache.mode = StepCacheConfig::Mode::FirstBlock;
    p.cache.threshold = c["threshold"];
    PipeRun r = run(p);
    EXPECT_EQ(computedSteps(r.res), c["computed_steps"].get<std::vector<int>>()) << k;
    at::Tensor gc = G(k + "computed");
    at::Tensor rel = G(k + "rel_l1");
    ASSERT_EQ(r.res.cache_rel_l1.size(), static_cast<size_t>(rel.numel()));
    double worst = 0;
    for (int64_t i = 0; i < rel.numel(); ++i) {
      EXPECT_EQ(r.res.cache_computed[i], gc[i].item<int>()) << k << " step " << i;
      worst = std::max(worst, std::fabs(r.res.cache_rel_l1[i] - rel[i].item<double>()));
    }
    std::printf("  max |diff| %-40s %.3g\n", (k + "rel_l1").c_str(), worst);
    EXPECT_LT(worst, 1e-4) << k;
    expectRun(r, k);
    const double db = psnr(r.res.image, G("cache_ref.image"));
    std::printf("  %s PSNR vs uncached %.2f dB (diffusers %.2f)\n", k.c_str(), db,
                G(k + "psnr_db").item<double>());
    EXPECT_NEAR(db, G(k + "psnr_db").item<double>(), 0.5) << k;
  }
}

TEST(StepCache, TaylorSeer) {
  for (const auto& c : J()["cases"]["taylorseer"]) {
    const std::string k = c["prefix"];
    PipelineInputs p = baseInputs(c);
    p.cache.mode = StepCacheConfig::Mode::TaylorSeer;
    p.cache.cache_interval = c["config"]["cache_interval"];
    p.cache.disable_cache_before_step = c["config"]["disable_cache_before_step"];
    p.cache.max_order = c["config"]["max_order"];
    p.cache.use_lite_mode = c["config"].value("use_lite_mode", false);
    PipeRun r = run(p);
    EXPECT_EQ(computedSteps(r.res), c["computed_steps"].get<std::vector<int>>()) << k;
    at::Tensor gc = G(k + "computed");
    for (int64_t i = 0; i < gc.numel(); ++i)
      EXPECT_EQ(r.res.cache_computed.at(i), gc[i].item<int>()) << k << " step " << i;
    expectRun(r, k);
    const double db = psnr(r.res.image, G("cache_ref.image"));
    std::printf("  %s PSNR vs uncached %.2f dB (diffusers %.2f)\n", k.c_str(), db,
                G(k + "psnr_db").item<double>());
  }
}
