// Parity with diffusers (float32, CPU) on the tiny-flux-A fixture: every golden except token ids
// (tested in test_tokenizers) — text embeddings, transformer forwards, VAE decode, scheduler
// tables, seeded initial latents and three whole-pipeline runs. Tolerance 1e-4 absolute.
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/models/text_encoders/modeling_clip.h"
#include "backend/models/text_encoders/modeling_t5.h"
#include "backend/nn/activations.h"
#include "backend/nn/qk_norm_rope.h"
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

// nn::rmsNormRopeCpuOut against the ATen form of diffusers' RMSNorm + apply_rotary_emb (the
// operations FluxAttention runs where the kernel does not apply), for FLUX's head dims 64 and 128
// and a generic one, strided input (a head view of a fused projection) and a head-major output.
at::Tensor rmsNormRopeReference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& cos,
                                const at::Tensor& sin) {
  const at::Tensor xf = x.to(at::kFloat);
  at::Tensor h = xf * at::rsqrt(xf.square().mean(-1, true) + 1e-6);
  h = w.scalar_type() == at::kBFloat16 ? (h.to(at::kBFloat16) * w).to(at::kFloat)
                                       : (h * w).to(x.scalar_type()).to(at::kFloat);
  const auto sz = h.sizes();
  const at::Tensor pairs = h.reshape({sz[0], sz[1], sz[2], sz[3] / 2, 2});
  const at::Tensor rotated =
      at::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).reshape(sz);  // (-x1, x0)
  return (h * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)).to(x.scalar_type());
}

TEST(CpuKernels, RmsNormRopeMatchesAtenForm) {
  for (const auto dt : {at::kFloat, at::kBFloat16}) {
    for (const int64_t d : {int64_t{64}, int64_t{128}, int64_t{24}}) {
      at::manual_seed(100 + d);
      const int64_t B = 2, S = 19, H = 3;
      // x: the first of three parts of a fused [B, S, 3 H d] projection, viewed per head.
      const at::Tensor fused = (at::randn({B, S, 3 * H * d}) * 2).to(dt);
      const at::Tensor x = fused.narrow(2, 0, H * d).reshape({B, S, H, d});
      const at::Tensor angles = at::randn({S, d / 2}).repeat_interleave(2, 1);
      const at::Tensor cos = angles.cos(), sin = angles.sin();
      for (const auto wdt : {dt, at::kFloat}) {
        const at::Tensor w = (at::rand({d}) + 0.5).to(wdt);
        ASSERT_TRUE(dit::nn::rmsNormRopeCpuApplies(x, w));
        at::Tensor out = at::empty({B, H, S, d}, x.options()).transpose(1, 2);  // head-major
        dit::nn::rmsNormRopeCpuOut(x, w, 1e-6, cos, sin, out);
        const at::Tensor ref = rmsNormRopeReference(x, w, cos, sin);
        const double diff = (out.to(at::kFloat) - ref.to(at::kFloat)).abs().max().item<double>();
        if (dt == at::kFloat) {
          EXPECT_LT(diff, 2e-6) << "d " << d;
        } else {
          // The kernel's sum of squares is added in another order: a value next to a rounding
          // boundary may land one bfloat16 step (2^-8 relative, |v| < 8 here) away.
          EXPECT_LE(diff, 8.0 / 256) << "d " << d << " weight " << wdt;
          const double exact = at::eq(out, ref).to(at::kFloat).mean().item<double>();
          EXPECT_GT(exact, 0.99) << "d " << d << " weight " << wdt;
        }
      }
    }
  }
  // Split over two threads: the same bits (rows are independent).
  {
    at::manual_seed(110);
    const at::Tensor xx = at::randn({2, 37, 3, 64}).to(at::kBFloat16);
    const at::Tensor ww = (at::rand({64}) + 0.5).to(at::kBFloat16);
    const at::Tensor ang = at::randn({37, 32}).repeat_interleave(2, 1);
    at::Tensor one = at::empty_like(xx), two = at::empty_like(xx);
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    dit::nn::rmsNormRopeCpuOut(xx, ww, 1e-6, ang.cos(), ang.sin(), one);
    at::set_num_threads(2);
    dit::nn::rmsNormRopeCpuOut(xx, ww, 1e-6, ang.cos(), ang.sin(), two);
    at::set_num_threads(threads);
    EXPECT_TRUE(at::equal(one, two));
  }
  const at::Tensor x = at::randn({1, 2, 2, 8});
  const at::Tensor cs = at::ones({2, 8});
  EXPECT_THROW(dit::nn::rmsNormRopeCpuOut(x, at::ones({8}), 1e-6, cs, cs, x),
               std::invalid_argument);  // out overlaps x
  EXPECT_THROW(dit::nn::rmsNormRopeCpuOut(x, at::ones({7}), 1e-6, cs, cs, x.clone()),
               std::invalid_argument);
  EXPECT_THROW(dit::nn::rmsNormRopeCpuOut(x, at::ones({8}), 1e-6, at::ones({3, 8}),
                                          at::ones({3, 8}), x.clone()),
               std::invalid_argument);
  EXPECT_FALSE(dit::nn::rmsNormRopeCpuApplies(x.to(at::kHalf), at::ones({8})));
  EXPECT_FALSE(dit::nn::rmsNormRopeCpuApplies(x.clone().requires_grad_(true), at::ones({8})));
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
    // Strided inputs are read in place: a narrow of a wider tensor, with a size-1 dimension.
    const at::Tensor wide = (at::randn({2, 1, 5, 60}) * 3).to(dt);
    EXPECT_TRUE(at::equal(dit::nn::geluTanhCpu(wide.narrow(3, 11, 37)),
                          dit::nn::geluTanhCpu(wide.narrow(3, 11, 37).contiguous())))
        << dt;
    EXPECT_TRUE(at::equal(dit::nn::geluTanhCpu(wide.transpose(0, 2)),
                          dit::nn::geluTanhCpu(wide.transpose(0, 2).contiguous())))
        << dt;
    EXPECT_THROW(dit::nn::geluTanhCpuOut(x, x), std::invalid_argument);  // out overlaps x
    // Empty: nothing to do whatever the layout (a rank holding no tokens under context parallel).
    at::Tensor emptyBuf = at::empty({2, 0, 50}, at::TensorOptions().dtype(dt));
    EXPECT_NO_THROW(dit::nn::geluTanhCpuOut(at::empty({2, 0, 37}, emptyBuf.options()),
                                            emptyBuf.narrow(2, 13, 37)));
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
    p.options["true_cfg_scale"] = c.value("true_cfg_scale", 1.0);
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
