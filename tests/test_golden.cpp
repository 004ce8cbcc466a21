// Parity with diffusers (float32, CPU) on the tiny-flux-A fixture: every golden except token ids
// (tested in test_tokenizers) — text embeddings, transformer forwards, VAE decode, scheduler
// tables, seeded initial latents and three whole-pipeline runs. Tolerance 1e-4 absolute.
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/models/text_encoders/modeling_clip.h"
#include "backend/models/text_encoders/modeling_t5.h"
#include "backend/nn/activations.h"
#include "backend/pipelines/flux/pipeline_flux.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"
#include "golden_util.h"

using namespace dit;
using namespace dit::test;

namespace {
constexpr double kTol = 1e-4;

// Records and prints the difference so the test log shows the parity figures.
double diff(const std::string& what, const at::Tensor& a, const at::Tensor& b) {
  const double d = maxAbsDiff(a, b);
  std::printf("  max |diff| %-32s %.3g\n", what.c_str(), d);
  return d;
}

FluxPipeline& pipeline() {
  static FluxPipeline p(ModelFolder::open(fixtureDir()), PipelineOptions{});
  return p;
}
}  // namespace

// nn::geluTanhCpu (the FLUX feed-forward's activation on the CPU) against the float64 value of
// gelu(x, "tanh") over normal draws and a sweep of -200..200 (both tails, the clamp of its exp),
// in float32 and from bfloat16 (rounded once, as at::gelu rounds its float32 result), on a
// non-contiguous view and across the vectorised body and its remainder. The float64 reference is
// written as x / (1 + exp(-2u)), equal to 0.5 x (1 + tanh(u)) but without its cancellation for
// negative x (float64 at::gelu returns 0 from x = -7 on, where the value is about -3e-16).
static at::Tensor geluTanhFloat64(const at::Tensor& x) {
  const at::Tensor u2 = 1.5957691216057308 * (x + 0.044715 * x.pow(3));
  return x / (1 + at::exp(-u2));
}

TEST(CpuKernels, GeluTanhMatchesFloat64) {
  at::manual_seed(0);
  const at::Tensor xf = at::cat(
      {(at::randn({320, 2048}) * 3).flatten(), at::linspace(-200, 200, 100003, at::kFloat)});
  const at::Tensor xd = xf.to(at::kDouble);
  const at::Tensor ref = geluTanhFloat64(xd);
  const at::Tensor y = dit::nn::geluTanhCpu(xf).to(at::kDouble);
  ASSERT_EQ(y.sizes(), ref.sizes());
  const at::Tensor err = (y - ref).abs();
  // Within 2 float32 ulps of max(1, |x|), and 2e-6 relative where the value is not tiny.
  EXPECT_LE((err - 2.4e-7 * xd.abs().clamp_min(1.0)).max().item<double>(), 0.0);
  EXPECT_LE((err / ref.abs()).masked_select(ref.abs() > 1e-3).max().item<double>(), 2e-6);
  // Limits: x for large positive x, 0 to float precision for large negative x.
  EXPECT_EQ(y[-1].item<double>(), 200.0);
  EXPECT_LE(std::abs(y[ref.numel() - 100003].item<double>()), 1e-30);
  // Close to LibTorch's float32 kernel too (which loses relative accuracy in the negative tail).
  EXPECT_TRUE(at::allclose(y.to(at::kFloat), at::gelu(xf, "tanh"), 1e-5, 1e-6));

  // bfloat16: the float32 result rounded to nearest even, element for element, so within half a
  // bfloat16 ulp (at most 2^-8 relative) of the float64 value plus the float32 error.
  const at::Tensor xb = xf.to(at::kBFloat16);
  const at::Tensor yb = dit::nn::geluTanhCpu(xb);
  ASSERT_EQ(yb.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(yb.equal(dit::nn::geluTanhCpu(xb.to(at::kFloat)).to(at::kBFloat16)));
  const at::Tensor refb = geluTanhFloat64(xb.to(at::kDouble));
  EXPECT_LE(((yb.to(at::kDouble) - refb).abs() - 3.92e-3 * refb.abs() - 1e-30).max().item<double>(),
            0.0);

  // A non-contiguous view, and odd sizes (the vectorised loop's remainder).
  const at::Tensor nc = at::randn({7, 33}).t();
  EXPECT_TRUE(at::allclose(dit::nn::geluTanhCpu(nc), at::gelu(nc, "tanh"), 1e-5, 1e-6));
  EXPECT_EQ(dit::nn::geluTanhCpu(nc).sizes(), nc.sizes());
  EXPECT_EQ(dit::nn::geluTanhCpu(at::empty({0})).numel(), 0);
  EXPECT_THROW(dit::nn::geluTanhCpu(at::randn({4}, at::kDouble)), std::invalid_argument);
}

// geluTanhCpuOut writes the same values into a narrow of a wider buffer (as the single-stream
// block builds cat(attn, mlp)) and leaves the rest of the buffer untouched.
TEST(CpuKernels, GeluTanhOutIntoNarrowOfBuffer) {
  for (const auto dt : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(91);
    const at::Tensor x = (at::randn({2, 5, 37}) * 3).to(dt);
    at::Tensor buf = at::full({2, 5, 50}, 7.0, at::TensorOptions().dtype(dt));
    dit::nn::geluTanhCpuOut(x, buf.narrow(2, 13, 37));
    EXPECT_TRUE(at::equal(buf.narrow(2, 13, 37), dit::nn::geluTanhCpu(x))) << dt;
    EXPECT_TRUE(at::all(buf.narrow(2, 0, 13) == 7).item<bool>()) << dt;
    EXPECT_THROW(dit::nn::geluTanhCpuOut(x, buf.narrow(2, 0, 36)), std::invalid_argument);
    // Rows of unequal strides: [2, 5, 37] over a [5, 2, 50] buffer.
    at::Tensor other = at::zeros({5, 2, 50}, at::TensorOptions().dtype(dt));
    EXPECT_THROW(dit::nn::geluTanhCpuOut(x, other.transpose(0, 1).narrow(2, 0, 37)),
                 std::invalid_argument);
  }
}

TEST(Golden, SchedulerTables) {
  auto m = ModelFolder::open(fixtureDir());
  int n = 0;
  for (const auto& c : goldenJson()["cases"]["scheduler"]) {
    const int steps = c["steps"], seq = c["image_seq_len"];
    auto t = fluxSchedule(fluxConfig(m).scheduler, steps, seq);
    EXPECT_NEAR(t.mu, c["mu"].get<double>(), 1e-12);
    const std::string k = "sched." + std::to_string(steps) + "." + std::to_string(seq);
    at::Tensor gs = golden(k + ".sigmas"), gt = golden(k + ".timesteps");
    ASSERT_EQ(gs.numel(), static_cast<int64_t>(t.sigmas.size())) << k;
    ASSERT_EQ(gt.numel(), static_cast<int64_t>(t.timesteps.size())) << k;
    for (int i = 0; i < gs.numel(); ++i)
      EXPECT_NEAR(t.sigmas[i], gs[i].item<float>(), 1e-6) << k << " sigma " << i;
    for (int i = 0; i < gt.numel(); ++i)
      EXPECT_NEAR(t.timesteps[i], gt[i].item<float>(), 1e-3) << k << " t " << i;
    ++n;
  }
  EXPECT_EQ(n, 30);
}

TEST(Golden, TextEmbeddings) {
  const auto& prompts = goldenJson()["prompts"];
  const int L = goldenJson()["max_sequence_length"];
  for (int i : {0, 1, 2, 8}) {
    auto e = pipeline().encodePrompt(prompts[i].get<std::string>(), L);
    EXPECT_LT(diff("enc.prompt_embeds." + std::to_string(i), e.prompt_embeds.squeeze(0),
                   golden("enc.prompt_embeds." + std::to_string(i))),
              kTol)
        << i;
    EXPECT_LT(diff("enc.pooled." + std::to_string(i), e.pooled.squeeze(0),
                   golden("enc.pooled." + std::to_string(i))),
              kTol)
        << i;
    EXPECT_LT(maxAbsDiff(e.text_ids, golden("enc.text_ids." + std::to_string(i))), 0.0 + 1e-12)
        << i;
  }
}

TEST(Golden, TransformerForward) {
  at::NoGradGuard ng;
  for (int k = 0; k < 3; ++k) {
    const std::string p = "dit." + std::to_string(k) + ".in.";
    at::Tensor out = pipeline().transformer().forward(
        golden(p + "hidden_states"), golden(p + "encoder_hidden_states"),
        golden(p + "pooled_projections"), golden(p + "timestep"), golden(p + "img_ids"),
        golden(p + "txt_ids"), golden(p + "guidance"));
    at::Tensor ref = golden("dit." + std::to_string(k) + ".out");
    ASSERT_EQ(out.sizes(), ref.sizes());
    EXPECT_LT(diff("dit." + std::to_string(k) + ".out", out, ref), kTol) << "case " << k;
  }
}

// bfloat16 compute (CPU): the same forwards against the float32 goldens, at a tolerance for
// bfloat16 (8-bit significand, relative rounding 2^-9 per operation, accumulated over the
// fixture's blocks): max |diff| within 5% of the golden's largest magnitude (measured 2.5% to
// 3.7%, the same before and after the float32 LayerNorm/GELU paths below). Covers the CPU
// reduced-precision paths of flux_blocks (LayerNorm + modulation and tanh-GELU in float32 with
// one rounding), which the float32 goldens above do not reach.
TEST(Golden, TransformerForwardBfloat16) {
  at::NoGradGuard ng;
  PipelineOptions o;
  o.dtype = at::kBFloat16;
  FluxPipeline bf16(ModelFolder::open(fixtureDir()), o);
  for (int k = 0; k < 3; ++k) {
    const std::string p = "dit." + std::to_string(k) + ".in.";
    at::Tensor out = bf16.transformer().forward(
        golden(p + "hidden_states"), golden(p + "encoder_hidden_states"),
        golden(p + "pooled_projections"), golden(p + "timestep"), golden(p + "img_ids"),
        golden(p + "txt_ids"), golden(p + "guidance"));
    EXPECT_EQ(out.scalar_type(), at::kBFloat16);
    at::Tensor ref = golden("dit." + std::to_string(k) + ".out");
    ASSERT_EQ(out.sizes(), ref.sizes());
    const double scale = ref.abs().max().item<double>();
    const double d = diff("bf16 dit." + std::to_string(k) + ".out", out.to(at::kFloat), ref);
    std::printf("  relative to max |golden| %.3g: %.3g\n", scale, d / scale);
    EXPECT_LT(d, 0.05 * scale) << "case " << k;
  }
}

TEST(Golden, VaeDecode) {
  auto m = ModelFolder::open(fixtureDir());
  auto w =
      WeightSource::fromFolder(m.component("vae"), "diffusion_pytorch_model", at::kFloat, at::kCPU);
  AutoencoderKL vae(fluxConfig(m).vae, *w);
  at::NoGradGuard ng;
  at::Tensor out = vae.decode(golden("vae.in"));
  at::Tensor ref = golden("vae.out");
  ASSERT_EQ(out.sizes(), ref.sizes());
  EXPECT_LT(diff("vae.out", out, ref), kTol);
}

TEST(Golden, InitialLatentsAndRuns) {
  const auto& runs = goldenJson()["cases"]["runs"];
  const int L = goldenJson()["max_sequence_length"];
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto& c = runs[r];
    PipelineInputs p;
    p.prompt = c["prompt"];
    p.negative_prompt = c.value("negative_prompt", "");
    p.true_cfg_scale = c.value("true_cfg_scale", 1.0);
    p.seed = c["seed"];
    p.height = c["height"];
    p.width = c["width"];
    p.steps = c["steps"];
    p.guidance = c["guidance"];
    p.max_sequence_length = L;
    const std::string k = "run." + std::to_string(r) + ".";
    at::Tensor init = pipeline().initialLatents(p.seed, p.height, p.width);
    EXPECT_LT(diff(k + "initial_latents", init, golden(k + "initial_latents")), 1e-6) << k;
    auto res = pipeline().generate(p);
    EXPECT_LT(maxAbsDiff(res.initial_latents, golden(k + "initial_latents")), 1e-6) << k;
    ASSERT_EQ(res.final_latents.sizes(), golden(k + "final_latents").sizes());
    EXPECT_LT(diff(k + "final_latents", res.final_latents, golden(k + "final_latents")), kTol) << k;
    ASSERT_EQ(res.image.sizes(), golden(k + "image").sizes());
    EXPECT_LT(diff(k + "image", res.image, golden(k + "image")), kTol) << k;
  }
}
