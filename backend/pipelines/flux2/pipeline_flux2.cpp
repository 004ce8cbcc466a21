#include "backend/pipelines/flux2/pipeline_flux2.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl_flux2.h"
#include "backend/models/flux2/transformer_flux2.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"
#include "parallel/process_group.h"
#include "parallel/strategy.h"

namespace dit {

namespace {
using Clock = std::chrono::steady_clock;
double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
std::string num(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}
}  // namespace

struct Flux2KleinPipeline::Impl {
  ModelFolder model;
  Flux2PipelineConfig cfg;
  PipelineOptions opts;
  c10::Device device{at::kCPU};
  std::unique_ptr<Flux2PromptEncoder> encoder;
  std::unique_ptr<Flux2Transformer2DModel> transformer;
  std::unique_ptr<AutoencoderKLFlux2> vae;
  std::map<std::string, uint64_t> bytes;
  int vsf() const { return cfg.vae.vaeScaleFactor(); }
};

Flux2KleinPipeline::Flux2KleinPipeline(const ModelFolder& model, const PipelineOptions& opts,
                                       std::unique_ptr<Flux2PromptEncoder> encoder)
    : d_(new Impl) {
  auto& D = *d_;
  D.model = model;
  D.cfg = flux2Config(model);
  D.opts = opts;
  D.device = c10::Device(opts.device);
  if (D.device.is_cuda() && !at::hasCUDA())
    throw std::invalid_argument(
        "--device cuda: this build of DiT Studio has no CUDA support; use --device cpu");
  if (D.device.is_cpu() && opts.dtype == at::kHalf)
    throw std::invalid_argument(
        "float16 is not supported on the CPU; use float32 or bfloat16 on the CPU");
  {
    Strategy s;
    s.world = s.tp_degree = opts.parallel.tpSize();
    auto issues = validateDegrees(s);
    if (issues.empty()) issues = validateForModel(s, model.dims());
    if (!issues.empty()) throw std::invalid_argument(joinIssues(issues));
  }
  {
    auto w = WeightSource::forComponent(model, "transformer", "diffusion_pytorch_model", opts.dtype,
                                        D.device);
    D.transformer = std::make_unique<Flux2Transformer2DModel>(D.cfg.transformer, *w, opts.parallel);
    D.bytes["transformer"] = w->bytesLoaded();
  }
  {
    auto w =
        WeightSource::forComponent(model, "vae", "diffusion_pytorch_model", opts.dtype, D.device);
    D.vae = std::make_unique<AutoencoderKLFlux2>(D.cfg.vae, D.cfg.batch_norm_eps, *w);
    D.bytes["vae"] = w->bytesLoaded();
  }
  D.encoder = std::move(encoder);
  if (D.encoder) D.bytes["text_encoder"] = D.encoder->weightBytes();
}

Flux2KleinPipeline::~Flux2KleinPipeline() = default;
const ModelFolder& Flux2KleinPipeline::model() const { return d_->model; }
DiffusionTransformer& Flux2KleinPipeline::transformer() { return *d_->transformer; }
std::map<std::string, uint64_t> Flux2KleinPipeline::weightBytes() const { return d_->bytes; }

PipelineModelInfo Flux2KleinPipeline::info() const {
  const auto& t = d_->cfg.transformer;
  PipelineModelInfo i;
  i.num_attention_heads = t.num_attention_heads;
  i.inner_dim = t.innerDim();
  i.num_layers = t.num_layers;
  i.num_single_layers = t.num_single_layers;
  i.vae_scale_factor = d_->vsf();
  i.default_steps = 50;
  i.guidance_embeds = t.guidance_embeds;
  i.max_sequence_length = d_->cfg.max_sequence_length;
  return i;
}

bool Flux2KleinPipeline::doClassifierFreeGuidance(const PipelineInputs& p) const {
  return p.guidance > 1.0 && !d_->cfg.is_distilled;
}

PipelineInputs Flux2KleinPipeline::resolve(PipelineInputs p) const {
  const int vsf = d_->vsf(), mult = 2 * vsf;
  if (!std::isfinite(p.guidance) || !std::isfinite(p.true_cfg_scale))
    throw std::invalid_argument("guidance and true_cfg_scale must be finite numbers");
  if (p.width < 0 || p.height < 0 || p.steps < 0 || p.max_sequence_length < 0)
    throw std::invalid_argument(
        "width, height, steps and max_sequence_length cannot be negative (0 = the model's "
        "default)");
  if (!p.init_image.empty() || !p.mask_image.empty())
    throw std::invalid_argument(
        "image-to-image and inpainting are not supported for FLUX.2 [klein] yet (FLUX.1 "
        "models only); remove init_image/mask_image");
  if (p.cache.enabled())
    throw std::invalid_argument(
        "step caching (First Block Cache, TaylorSeer) is not supported for FLUX.2 [klein] yet "
        "(FLUX.1 models only); remove cache");
  if (p.width <= 0) p.width = 128 * vsf;
  if (p.height <= 0) p.height = 128 * vsf;
  if (p.steps <= 0) p.steps = 50;
  if (p.max_sequence_length <= 0) p.max_sequence_length = d_->cfg.max_sequence_length;
  if (p.width < mult || p.height < mult)
    throw std::invalid_argument("width and height must be at least " + std::to_string(mult) +
                                " (2 x vae_scale_factor " + std::to_string(vsf) + "); got " +
                                std::to_string(p.width) + "x" + std::to_string(p.height));
  // Flux2KleinPipeline.prepare_latents: 2 * (size // (vsf * 2)) latent pixels, i.e. the image
  // size floored to a multiple of 2 x vae_scale_factor (diffusers warns and resizes).
  p.width = p.width / mult * mult;
  p.height = p.height / mult * mult;
  if (p.width > 16384 || p.height > 16384)
    throw std::invalid_argument("width and height are limited to 16384 pixels; got " +
                                std::to_string(p.width) + "x" + std::to_string(p.height));
  if (p.steps > 1000)
    throw std::invalid_argument("steps are limited to 1000; got " + std::to_string(p.steps));
  if (p.max_sequence_length > 512)
    throw std::invalid_argument("max_sequence_length cannot be greater than 512, got " +
                                std::to_string(p.max_sequence_length));
  return p;
}

std::vector<std::string> Flux2KleinPipeline::requestWarnings(const PipelineInputs& p0) const {
  const auto& D = *d_;
  const PipelineInputs p = resolve(p0);
  std::vector<std::string> w;
  const int mult = 2 * D.vsf();
  if ((p0.width > 0 && p0.width % mult != 0) || (p0.height > 0 && p0.height % mult != 0))
    w.push_back("height and width have to be divisible by " + std::to_string(mult) + " but are " +
                std::to_string(p0.height) + " and " + std::to_string(p0.width) + "; the image is " +
                std::to_string(p.width) + "x" + std::to_string(p.height));
  if (p.guidance > 1 && D.cfg.is_distilled)
    w.push_back("guidance " + num(p.guidance) + " is ignored for step-wise distilled models");
  if (p.true_cfg_scale != 1.0)
    w.push_back("true_cfg_scale has no effect for FLUX.2 [klein]: guidance > 1 runs CFG");
  if (!p.negative_prompt.empty() && !doClassifierFreeGuidance(p))
    w.push_back("a negative prompt is given but CFG is off (guidance " + num(p.guidance) +
                (D.cfg.is_distilled ? ", distilled model)" : " <= 1)"));
  if (D.encoder) {
    const size_t n = D.encoder->untruncatedTokens(p.prompt);
    if (n > static_cast<size_t>(p.max_sequence_length))
      w.push_back("the prompt was truncated: the chat-template text has " + std::to_string(n) +
                  " tokens, max_sequence_length is " + std::to_string(p.max_sequence_length) +
                  "; " + std::to_string(n - static_cast<size_t>(p.max_sequence_length)) +
                  " were dropped");
  }
  return w;
}

at::Tensor Flux2KleinPipeline::latentIds(int64_t h, int64_t w) {
  at::Tensor ids = at::zeros({h, w, 4}, at::kLong);
  ids.select(2, 1).add_(at::arange(h, at::kLong).unsqueeze(1));
  ids.select(2, 2).add_(at::arange(w, at::kLong).unsqueeze(0));
  return ids.reshape({h * w, 4});
}

at::Tensor Flux2KleinPipeline::textIds(int64_t L) {
  at::Tensor ids = at::zeros({L, 4}, at::kLong);
  ids.select(1, 3).copy_(at::arange(L, at::kLong));
  return ids;
}

at::Tensor Flux2KleinPipeline::decode(const at::Tensor& packed, int height, int width) {
  auto& D = *d_;
  at::NoGradGuard ng;
  const int mult = 2 * D.vsf();
  at::Tensor img =
      D.vae->decodePacked(packed.to(D.device, D.opts.dtype), height / mult, width / mult);
  return (img / 2 + 0.5).clamp(0, 1).to(at::kFloat).to(at::kCPU).squeeze(0).contiguous();
}

GenerationResult Flux2KleinPipeline::generate(const PipelineInputs& params0,
                                              const PipelineCallbacks& cb) {
  auto& D = *d_;
  if (!D.encoder)
    throw std::invalid_argument(
        "this FLUX.2 pipeline was loaded without its text encoder: prompts cannot be encoded");
  at::NoGradGuard ng;
  const PipelineInputs p = resolve(params0);
  const bool cfg = doClassifierFreeGuidance(p);
  const bool cfgParallel = D.opts.cfg && D.opts.cfg->size() == 2;
  const int cfgRank = cfgParallel ? D.opts.cfg->rank() : 0;
  if (cb.onStage) cb.onStage("encode");
  auto t0 = Clock::now();
  at::Tensor pos, neg;
  if (!cfgParallel || cfgRank == 0) pos = D.encoder->encode(p.prompt, p.max_sequence_length);
  // Flux2KleinPipeline uses "" as the negative prompt; a given negative prompt replaces it.
  if (cfg && (!cfgParallel || cfgRank == 1))
    neg = D.encoder->encode(p.negative_prompt, p.max_sequence_length);
  const double encodeMs = msSince(t0);
  GenerationResult r = generateFromEmbeddings(p, pos, neg, cb);
  r.timings_ms["encode"] = encodeMs;
  return r;
}

GenerationResult Flux2KleinPipeline::generateFromEmbeddings(const PipelineInputs& params0,
                                                            const at::Tensor& promptEmbeds,
                                                            const at::Tensor& negativeEmbeds,
                                                            const PipelineCallbacks& cb) {
  auto& D = *d_;
  at::NoGradGuard ng;
  GenerationResult res;
  const PipelineInputs p = resolve(params0);
  res.params = p;
  const bool cfg = doClassifierFreeGuidance(p);
  const bool cfgParallel = D.opts.cfg && D.opts.cfg->size() == 2;
  if (cfgParallel && !cfg)
    throw std::invalid_argument(
        "cfg_degree 2 needs CFG (guidance > 1 on a model that is not distilled); with CFG off "
        "one half of the group would idle - use cfg_degree 1");
  const int cfgRank = cfgParallel ? D.opts.cfg->rank() : 0;
  const at::Tensor& mine = cfgParallel && cfgRank == 1 ? negativeEmbeds : promptEmbeds;
  if (!mine.defined() || (cfg && !cfgParallel && !negativeEmbeds.defined()))
    throw std::invalid_argument("FLUX.2: the prompt embeddings this rank needs were not given");

  const int mult = 2 * D.vsf();
  const int64_t h = p.height / mult, w = p.width / mult;
  const auto dt = D.opts.dtype;
  // Flux2KleinPipeline.prepare_latents: randn in the patchified layout, then packed.
  auto gen = at::detail::createCPUGenerator(p.seed);
  const at::Tensor noise = at::randn({1, D.cfg.transformer.in_channels, h, w}, gen,
                                     at::TensorOptions().dtype(at::kFloat));
  res.tensors["initial_noise"] = noise;
  at::Tensor latents = packFlux2Latents(noise).contiguous();
  res.initial_latents = latents.clone();
  latents = latents.to(D.device, dt);
  const at::Tensor imgIds = latentIds(h, w).to(D.device);
  const auto sched = flowMatchSchedule(D.cfg.scheduler, p.steps,
                                       computeEmpiricalMu(static_cast<int>(h * w), p.steps));
  auto run = [&](const at::Tensor& embeds, const at::Tensor& tt) {
    return D.transformer->forward({{"hidden_states", latents},
                                   {"encoder_hidden_states", embeds.to(D.device, dt)},
                                   {"timestep", tt},
                                   {"img_ids", imgIds},
                                   {"txt_ids", textIds(embeds.size(1)).to(D.device)}});
  };
  if (cb.onStage) cb.onStage("denoise");
  auto tDen = Clock::now();
  for (int i = 0; i < p.steps; ++i) {
    auto ts = Clock::now();
    // timestep.expand(B).to(latents.dtype) / 1000, as the pipeline passes it.
    const at::Tensor tt = at::full({1}, sched.timesteps[static_cast<size_t>(i)],
                                   at::TensorOptions().dtype(at::kFloat).device(D.device))
                              .to(dt) /
                          1000;
    at::Tensor v;
    if (!cfg) {
      v = run(promptEmbeds, tt);
    } else if (!cfgParallel) {
      const at::Tensor vc = run(promptEmbeds, tt), vn = run(negativeEmbeds, tt);
      v = vn + p.guidance * (vc - vn);
    } else {
      at::Tensor part = run(mine, tt).contiguous();
      at::Tensor both = D.opts.cfg->allgather(part.unsqueeze(0), 0)->result();
      v = both[1] + p.guidance * (both[0] - both[1]);
    }
    // FlowMatchEulerDiscreteScheduler.step: float32 update, cast back.
    const float sigma = sched.sigmas[static_cast<size_t>(i)];
    const float sigmaNext = sched.sigmas[static_cast<size_t>(i) + 1];
    const at::Tensor lf = latents.to(at::kFloat);
    latents = (lf + ((sigmaNext - sigma) * v).to(at::kFloat)).to(v.scalar_type());
    const double ms = msSince(ts);
    res.timings_ms["step." + std::to_string(i + 1)] = ms;
    res.steps_done = i + 1;
    if (cb.onStep) {
      const at::Tensor x0 = lf - sigma * v.to(at::kFloat);
      if (!cb.onStep(i + 1, p.steps, latents, x0, ms)) {
        res.cancelled = true;
        break;
      }
    }
  }
  res.timings_ms["denoise"] = msSince(tDen);
  res.final_latents = latents.to(at::kFloat).to(at::kCPU).contiguous();
  if (res.cancelled) return res;
  if (cb.onStage) cb.onStage("decode");
  auto tDec = Clock::now();
  res.image = decode(latents, p.height, p.width);
  res.timings_ms["decode"] = msSince(tDec);
  return res;
}

}  // namespace dit
