#include "backend/pipelines/flux/pipeline_flux.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

#include "backend/io/image_io.h"
#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl.h"
#include "backend/models/cache/step_cache.h"
#include "backend/models/text_encoders/modeling_clip.h"
#include "backend/models/text_encoders/modeling_t5.h"
#include "backend/pipelines/image_processor.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"
#include "backend/tokenizers/clip_tokenizer.h"
#include "backend/tokenizers/t5_tokenizer.h"
#include "parallel/context_parallel.h"
#include "parallel/process_group.h"
#include "parallel/strategy.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

/// Throws ModelFileError naming transformer/config.json when the checkpoint's tensor names differ
/// from the parameters the config declares (defined below).
void checkCheckpointMatchesConfig(const ModelFolder& model);

using Clock = std::chrono::steady_clock;
static double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct FluxPipeline::Impl {
  ModelFolder model;
  FluxPipelineConfig cfg;  ///< model.configAs<FluxPipelineConfig>()
  PipelineOptions opts;
  c10::Device device{at::kCPU};
  std::unique_ptr<CLIPTokenizer> clipTok;
  std::unique_ptr<T5Tokenizer> t5Tok;
  std::unique_ptr<CLIPTextModel> clip;
  std::unique_ptr<T5EncoderModel> t5;
  std::unique_ptr<FluxTransformer2DModel> transformer;
  std::unique_ptr<AutoencoderKL> vae;
  std::map<std::string, uint64_t> bytes;
};

FluxPipeline::FluxPipeline(const ModelFolder& model, const PipelineOptions& opts) : d_(new Impl) {
  auto& D = *d_;
  D.model = model;
  D.cfg = fluxConfig(model);  // refuses another pipeline family
  D.opts = opts;
  D.device = c10::Device(opts.device);
  if (D.device.is_cuda() && !at::hasCUDA())
    throw std::invalid_argument(
        "--device cuda: this build of DiT Studio has no CUDA support (LibTorch " +
        std::string("without CUDA); use --device cpu or a CUDA build"));
  if (D.device.is_cpu() && opts.dtype == at::kHalf)
    throw std::invalid_argument(
        "float16 is not supported on the CPU (LibTorch has no CPU half LayerNorm/GroupNorm "
        "kernels); use float32 or bfloat16 on the CPU, float16 on GPUs");
  // Validate the parallel plan before reading any weight.
  {
    // The transformer family's declared plan (FamilySpec::dims), the rules the GUI and the CLI
    // run.
    Strategy s;
    s.world = s.tp_degree = opts.parallel.tpSize();
    auto issues = validateDegrees(s);
    if (issues.empty()) issues = validateForModel(s, model.dims());
    if (!issues.empty()) throw std::invalid_argument(joinIssues(issues));
  }
  for (const std::string& note : model.notes) spdlog::info("{}", note);
  // The config against the tensors actually present, before any weight is read: a config that
  // describes another model (num_layers -1 or 1 for a 2-block checkpoint) is refused, naming a
  // tensor the config does not account for and one the checkpoint lacks.
  if (model.dims().parameters) checkCheckpointMatchesConfig(model);
  D.clipTok = std::make_unique<CLIPTokenizer>(model.component("tokenizer"));
  D.t5Tok = std::make_unique<T5Tokenizer>(model.component("tokenizer_2"));
  {
    auto w = WeightSource::forComponent(model, "transformer", "diffusion_pytorch_model", opts.dtype,
                                        D.device);
    D.transformer = std::make_unique<FluxTransformer2DModel>(D.cfg.transformer, *w, opts.parallel);
    D.bytes["transformer"] = w->bytesLoaded();
  }
  {
    auto w = WeightSource::forComponent(model, "text_encoder", "model", opts.dtype, D.device);
    D.clip = std::make_unique<CLIPTextModel>(D.cfg.text_encoder, *w);
    D.bytes["text_encoder"] = w->bytesLoaded();
  }
  {
    auto w = WeightSource::forComponent(model, "text_encoder_2", "model", opts.dtype, D.device);
    D.t5 = std::make_unique<T5EncoderModel>(D.cfg.text_encoder_2, *w);
    D.bytes["text_encoder_2"] = w->bytesLoaded();
  }
  {
    auto w =
        WeightSource::forComponent(model, "vae", "diffusion_pytorch_model", opts.dtype, D.device);
    D.vae = std::make_unique<AutoencoderKL>(D.cfg.vae, *w);
    D.bytes["vae"] = w->bytesLoaded();
  }
}

void checkCheckpointMatchesConfig(const ModelFolder& model) {
  // A single-file transformer is checked by its KeyLayout instead (every stored key mapped, the
  // hyper-parameters read from the tensor shapes; backend/models/checkpoint_layouts.h).
  if (auto it = model.components.find("transformer");
      it != model.components.end() && it->second.single_file)
    return;
  const ParameterTable& declared = *model.dims().parameters;
  const auto st =
      SafetensorsCollection::openFolder(model.component("transformer"), "diffusion_pytorch_model");
  std::vector<std::string> extra, missing;
  for (const std::string& n : st.names())
    if (!declared.contains(n)) extra.push_back(n);
  for (const ParameterInfo& p : declared)
    if (!st.contains(p.name)) missing.push_back(p.name);
  if (extra.empty() && missing.empty()) return;
  const FluxTransformerConfig& c = fluxConfig(model).transformer;
  std::string msg = "the transformer config (num_layers " + std::to_string(c.num_layers) +
                    ", num_single_layers " + std::to_string(c.num_single_layers) +
                    ") does not describe these weights:";
  if (!extra.empty())
    msg += " " + std::to_string(extra.size()) + " tensor" + (extra.size() == 1 ? "" : "s") +
           " of the checkpoint that the config has no place for (first: '" + extra[0] + "')";
  if (!missing.empty())
    msg += std::string(extra.empty() ? "" : ";") + " " + std::to_string(missing.size()) +
           " tensor" + (missing.size() == 1 ? "" : "s") +
           " the config needs that the checkpoint lacks (first: '" + missing[0] + "')";
  throw ModelFileError(model.component("transformer") + "/config.json", msg);
}

FluxPipeline::~FluxPipeline() = default;
const ModelFolder& FluxPipeline::model() const { return d_->model; }
FluxTransformer2DModel& FluxPipeline::transformer() { return *d_->transformer; }
std::map<std::string, uint64_t> FluxPipeline::weightBytes() const { return d_->bytes; }

PipelineModelInfo FluxPipeline::info() const {
  const FluxTransformerConfig& t = d_->cfg.transformer;
  PipelineModelInfo i;
  i.num_attention_heads = t.num_attention_heads;
  i.inner_dim = t.innerDim();
  i.num_layers = t.num_layers;
  i.num_single_layers = t.num_single_layers;
  i.vae_scale_factor = d_->cfg.vae.vaeScaleFactor();
  i.default_steps = 28;
  i.guidance_embeds = t.guidance_embeds;
  i.max_sequence_length = d_->cfg.max_sequence_length;
  return i;
}

PipelineInputs FluxPipeline::resolve(PipelineInputs p) const {
  const int vsf = d_->cfg.vae.vaeScaleFactor();
  const int mult = 2 * vsf;
  if (!std::isfinite(p.guidance) || !std::isfinite(p.true_cfg_scale))
    throw std::invalid_argument("guidance and true_cfg_scale must be finite numbers");
  if (p.width < 0 || p.height < 0 || p.steps < 0 || p.max_sequence_length < 0)
    throw std::invalid_argument(
        "width, height, steps and max_sequence_length cannot be negative (0 = the model's "
        "default)");
  if (!std::isfinite(p.strength) || p.strength <= 0 || p.strength > 1)
    throw std::invalid_argument("strength must be in (0, 1], got " + std::to_string(p.strength));
  if (!p.mask_image.empty() && p.init_image.empty())
    throw std::invalid_argument("a mask needs an init image (inpainting repaints the init image)");
  if (!p.init_image.empty() && (p.width <= 0 || p.height <= 0)) {
    // The init image's size, rounded down to the packing multiple.
    const auto [iw, ih] = imageSize(p.init_image);
    if (iw < mult || ih < mult)
      throw std::invalid_argument("init image " + p.init_image + " is " + std::to_string(iw) + "x" +
                                  std::to_string(ih) + " pixels; it must be at least " +
                                  std::to_string(mult) + "x" + std::to_string(mult));
    if (p.width <= 0) p.width = iw / mult * mult;
    if (p.height <= 0) p.height = ih / mult * mult;
  }
  // FluxPipeline: default_sample_size (128, or the transformer config's sample_size) x vsf.
  if (p.width <= 0) p.width = d_->cfg.transformer.sample_size * vsf;
  if (p.height <= 0) p.height = d_->cfg.transformer.sample_size * vsf;
  if (p.steps <= 0) p.steps = 28;
  if (p.max_sequence_length <= 0) p.max_sequence_length = d_->cfg.max_sequence_length;
  if (p.width % mult != 0 || p.height % mult != 0)
    throw std::invalid_argument("width and height must be multiples of " + std::to_string(mult) +
                                " (2 x vae_scale_factor " + std::to_string(vsf) +
                                ") for this model; got " + std::to_string(p.width) + "x" +
                                std::to_string(p.height) + " — try " +
                                std::to_string(std::max(mult, p.width / mult * mult)) + "x" +
                                std::to_string(std::max(mult, p.height / mult * mult)));
  constexpr int kMaxSide = 16384;
  if (p.width > kMaxSide || p.height > kMaxSide)
    throw std::invalid_argument("width and height are limited to " + std::to_string(kMaxSide) +
                                " pixels; got " + std::to_string(p.width) + "x" +
                                std::to_string(p.height));
  if (p.steps > 1000)
    throw std::invalid_argument("steps are limited to 1000; got " + std::to_string(p.steps));
  if (p.max_sequence_length > 512)
    throw std::invalid_argument("max_sequence_length cannot be greater than 512, got " +
                                std::to_string(p.max_sequence_length));
  if (!p.init_image.empty() && img2imgStart(p.steps, p.strength) >= p.steps)
    throw std::invalid_argument("strength " + std::to_string(p.strength) + " with " +
                                std::to_string(p.steps) +
                                " steps runs no denoising step (steps * strength < 1); raise "
                                "strength or steps");
  return p;
}

int img2imgStart(int steps, double strength) {
  // FluxImg2ImgPipeline.get_timesteps: Python floats, int() truncates.
  PipelineInputs p;
  p.init_image = "-";
  p.steps = steps;
  p.strength = strength;
  return p.firstStep();
}

PromptEmbeds FluxPipeline::encodePrompt(const std::string& prompt, int maxLen) {
  auto& D = *d_;
  PromptEmbeds e;
  auto t0 = Clock::now();
  auto clipIds = D.clipTok->encodePadded(prompt, D.cfg.tokenizer_max_length);
  auto t5Ids = D.t5Tok->encodePadded(prompt, maxLen);
  auto lo = at::TensorOptions().dtype(at::kLong);
  at::Tensor ci = at::from_blob(clipIds.data(), {1, (int64_t)clipIds.size()}, lo).clone();
  at::Tensor ti = at::from_blob(t5Ids.data(), {1, (int64_t)t5Ids.size()}, lo).clone();
  e.tokenize_ms = msSince(t0);
  auto t1 = Clock::now();
  at::NoGradGuard ng;
  e.pooled = D.clip->forward(ci).second;
  e.prompt_embeds = D.t5->forward(ti);
  e.encode_ms = msSince(t1);
  e.text_ids = at::zeros({e.prompt_embeds.size(1), 3},
                         at::TensorOptions().dtype(at::kFloat).device(D.device));
  return e;
}

std::vector<std::string> FluxPipeline::requestWarnings(const PipelineInputs& p0) const {
  const auto& D = *d_;
  const PipelineInputs p = resolve(p0);
  std::vector<std::string> w;
  auto fmt = [](double v) {
    std::ostringstream o;
    o << v;
    return o.str();
  };
  // FluxPipeline._get_clip_prompt_embeds / _get_t5_prompt_embeds: the untruncated ids are longer
  // than the padded ones (eos is kept, so the dropped tokens are untruncated - max_length).
  auto truncation = [&](const char* which, const std::string& text) {
    const int clipMax = D.cfg.tokenizer_max_length;
    const auto clip = D.clipTok->encode(text);
    if (static_cast<int64_t>(clip.size()) > clipMax)
      w.push_back(std::string("the ") + which +
                  " was truncated: CLIP can only handle sequences up to " +
                  std::to_string(clipMax) + " tokens; " + std::to_string(clip.size() - clipMax) +
                  " of its " + std::to_string(clip.size() - 2) + " tokens were dropped");
    const auto t5 = D.t5Tok->encode(text);
    if (static_cast<int64_t>(t5.size()) > p.max_sequence_length)
      w.push_back(std::string("the ") + which + " was truncated: T5 uses max_sequence_length " +
                  std::to_string(p.max_sequence_length) + " tokens; " +
                  std::to_string(t5.size() - p.max_sequence_length) + " of its " +
                  std::to_string(t5.size() - 1) + " tokens were dropped");
  };
  truncation("prompt", p.prompt);
  if (p.trueCfg()) truncation("negative prompt", p.negative_prompt);
  if (p.true_cfg_scale > 1 && !p.hasNegativePrompt())
    w.push_back("true_cfg_scale is " + fmt(p.true_cfg_scale) +
                ", but classifier-free guidance is not enabled since no negative prompt is given");
  else if (p.true_cfg_scale <= 1 && p.hasNegativePrompt())
    w.push_back(
        "a negative prompt is given but classifier-free guidance is not enabled since "
        "true_cfg_scale " +
        fmt(p.true_cfg_scale) + " <= 1");
  if (!D.cfg.transformer.guidance_embeds && p.guidance != PipelineInputs{}.guidance)
    w.push_back("guidance " + fmt(p.guidance) +
                " has no effect: this model has no guidance embedding (transformer guidance_embeds "
                "is false)");
  return w;
}

at::Tensor FluxPipeline::latentImageIds(int h2, int w2) {
  at::Tensor ids = at::zeros({h2, w2, 3}, at::kFloat);
  ids.select(2, 1).add_(at::arange(h2, at::kFloat).unsqueeze(1));
  ids.select(2, 2).add_(at::arange(w2, at::kFloat).unsqueeze(0));
  return ids.reshape({h2 * w2, 3});
}

at::Tensor FluxPipeline::initialLatents(uint64_t seed, int height, int width) const {
  const int vsf = d_->cfg.vae.vaeScaleFactor();
  const int64_t C = d_->cfg.transformer.in_channels / 4, h = 2 * (height / (vsf * 2)),
                w = 2 * (width / (vsf * 2));
  auto gen = at::detail::createCPUGenerator(seed);
  at::Tensor noise = at::randn({1, C, h, w}, gen, at::TensorOptions().dtype(at::kFloat));
  return noise.view({1, C, h / 2, 2, w / 2, 2})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({1, (h / 2) * (w / 2), C * 4});
}

at::Tensor FluxPipeline::decode(const at::Tensor& packed, int height, int width) {
  auto& D = *d_;
  const int vsf = D.cfg.vae.vaeScaleFactor();
  const int64_t h = 2 * (height / (vsf * 2)), w = 2 * (width / (vsf * 2));
  const int64_t C = packed.size(2) / 4;
  at::NoGradGuard ng;
  at::Tensor z =
      packed.view({1, h / 2, w / 2, C, 2, 2}).permute({0, 3, 1, 4, 2, 5}).reshape({1, C, h, w});
  z = z / D.cfg.vae.scaling_factor + D.cfg.vae.shift_factor;
  at::Tensor img = D.vae->decode(z.to(D.device));
  return (img / 2 + 0.5).clamp(0, 1).to(at::kFloat).to(at::kCPU).squeeze(0).contiguous();
}

GenerationResult FluxPipeline::generate(const PipelineInputs& params0,
                                        const PipelineCallbacks& cb) {
  auto& D = *d_;
  at::NoGradGuard ng;
  GenerationResult res;
  PipelineInputs p = resolve(params0);
  res.params = p;
  const bool trueCfg = p.trueCfg();
  const bool cfgParallel = D.opts.cfg && D.opts.cfg->size() == 2;
  if (cfgParallel && !trueCfg)
    throw std::invalid_argument(
        "cfg_degree 2 needs true CFG (a negative prompt and true_cfg_scale > 1); with CFG off "
        "one half of the group would idle — use cfg_degree 1");
  const int cfgRank = cfgParallel ? D.opts.cfg->rank() : 0;

  auto stage = [&](const char* s) {
    if (cb.onStage) cb.onStage(s);
  };
  auto t0 = Clock::now();
  stage("encode");  // tokenize + text encoders
  // Under CFG parallel each half encodes only the prompt it denoises.
  PromptEmbeds pos, neg;
  if (!cfgParallel || cfgRank == 0) pos = encodePrompt(p.prompt, p.max_sequence_length);
  if (trueCfg && (!cfgParallel || cfgRank == 1))
    neg = encodePrompt(p.negative_prompt, p.max_sequence_length);
  res.timings_ms["tokenize"] = pos.tokenize_ms + neg.tokenize_ms;
  res.timings_ms["encode"] = pos.encode_ms + neg.encode_ms;
  res.timings_ms["encode_total"] = msSince(t0);

  const int vsf = D.cfg.vae.vaeScaleFactor();
  const int h2 = p.height / (vsf * 2), w2 = p.width / (vsf * 2);
  at::Tensor imgIds = latentImageIds(h2, w2).to(D.device);
  const auto sched = fluxSchedule(D.cfg.scheduler, p.steps, h2 * w2);
  const auto dt = D.opts.dtype;
  at::Tensor latents;
  // Inpainting: the packed image latents, noise and mask for the per-step blend.
  at::Tensor blendImage, blendNoise, maskLatents;
  int tStart = 0;
  if (p.init_image.empty()) {
    latents = initialLatents(p.seed, p.height, p.width);
  } else {
    stage("encode_image");
    auto tImg = Clock::now();
    tStart = img2imgStart(p.steps, p.strength);
    const bool inpaint = !p.mask_image.empty();
    const Image8 init = readImage(p.init_image);
    const Image8 mask = inpaint ? readImage(p.mask_image) : Image8{};
    // One CPU generator for every draw, in diffusers' order: the init image's posterior sample,
    // the noise, then (inpainting) the masked image's posterior sample.
    auto gen = at::detail::createCPUGenerator(p.seed);
    const double shift = D.cfg.vae.shift_factor, scale = D.cfg.vae.scaling_factor;
    at::Tensor imageIn = preprocessImage(init, p.height, p.width);
    at::Tensor eps;
    at::Tensor imageLatents =
        ((D.vae->encode(imageIn.to(D.device, dt)).sample(gen, &eps) - shift) * scale)
            .to(at::kFloat)
            .cpu();
    const int64_t C = D.cfg.transformer.in_channels / 4;
    at::Tensor noise =
        at::randn({1, C, 2 * h2, 2 * w2}, gen, at::TensorOptions().dtype(at::kFloat));
    res.tensors["image_in"] = imageIn;
    res.tensors["vae_eps"] = eps;
    res.tensors["noise"] = noise;
    res.tensors["image_latents"] = imageLatents;
    // scheduler.scale_noise at the first executed timestep.
    const float s0 = sched.sigmas[tStart];
    latents = packLatents(s0 * noise + (1.0 - s0) * imageLatents);
    if (inpaint) {
      at::Tensor maskIn = preprocessMask(mask, p.height, p.width);
      at::Tensor maskedIn = imageIn * (maskIn < 0.5f);
      at::Tensor eps3;
      at::Tensor masked =
          ((D.vae->encode(maskedIn.to(D.device, dt)).sample(gen, &eps3) - shift) * scale)
              .to(at::kFloat)
              .cpu();
      const int64_t hw[2] = {2 * h2, 2 * w2};
      at::Tensor maskHw =
          at::upsample_nearest2d(maskIn, at::IntArrayRef(hw), c10::nullopt, c10::nullopt);
      maskLatents = packLatents(maskHw.repeat({1, C, 1, 1}));
      blendImage = packLatents(imageLatents);
      blendNoise = packLatents(noise);
      res.tensors["mask_in"] = maskIn;
      res.tensors["masked_image_in"] = maskedIn;
      res.tensors["masked_image_vae_eps"] = eps3;
      res.tensors["masked_image_latents"] = packLatents(masked);
      res.tensors["mask_latent_hw"] = maskHw;
      res.tensors["mask_latents"] = maskLatents;
    }
    res.timings_ms["encode_image"] = msSince(tImg);
  }
  res.t_start = tStart;
  res.initial_latents = latents.clone();
  latents = latents.to(D.device, dt);
  // Step caching: fresh state for this call (diffusers resets it when the call ends).
  std::unique_ptr<StepCache> cache;
  if (p.cache.enabled()) {
    cache = std::make_unique<StepCache>(
        p.cache, D.opts.parallel.cp ? D.opts.parallel.cp->group() : nullptr, D.opts.parallel.tp);
    D.transformer->setStepCache(cache.get());
  }
  struct Unset {
    FluxTransformer2DModel* t;
    ~Unset() { t->setStepCache(nullptr); }
  } unset{D.transformer.get()};
  at::Tensor guidance;
  if (D.cfg.transformer.guidance_embeds)
    guidance = at::full({1}, p.guidance, at::TensorOptions().dtype(at::kFloat).device(D.device));

  stage("denoise");
  auto tDen = Clock::now();
  const int stepsRun = p.steps - tStart;
  for (int k = tStart; k < p.steps; ++k) {
    const int i = k - tStart;  // executed step, 0-based
    auto ts = Clock::now();
    const float t = sched.timesteps[k];
    // timestep.expand(B).to(latents.dtype) / 1000, as FluxPipeline passes it.
    at::Tensor tt =
        (at::full({1}, t, at::TensorOptions().dtype(at::kFloat).device(D.device)).to(dt) / 1000);
    auto run = [&](const PromptEmbeds& e) {
      if (cache) cache->setContext(&e == &neg ? "uncond" : "cond");
      return D.transformer->forward(latents, e.prompt_embeds, e.pooled, tt, imgIds, e.text_ids,
                                    guidance);
    };
    at::Tensor v;
    if (!trueCfg) {
      v = run(pos);
    } else if (!cfgParallel) {
      at::Tensor vp = run(pos), vn = run(neg);
      v = vn + p.true_cfg_scale * (vp - vn);
    } else {
      // CFG parallel: rank 0 of the cfg group predicts the conditional, rank 1 the
      // unconditional branch; exchange and combine identically on both.
      at::Tensor mine = run(cfgRank == 0 ? pos : neg).contiguous();
      at::Tensor both = D.opts.cfg->allgather(mine.unsqueeze(0), 0)->result();
      at::Tensor vp = both[0], vn = both[1];
      v = vn + p.true_cfg_scale * (vp - vn);
    }
    // FlowMatchEulerDiscreteScheduler.step: in float32, x += (sigma_next - sigma) * v.
    const float sigma = sched.sigmas[k], sigmaNext = sched.sigmas[k + 1];
    // As diffusers: the product (sigma_next - sigma) * v is formed in the model's dtype, the sum
    // in float32, the result cast back (identical in float32; matches bf16/fp16 rounding).
    at::Tensor lf = latents.to(at::kFloat);
    at::Tensor next = lf + ((sigmaNext - sigma) * v).to(at::kFloat);
    latents = next.to(v.scalar_type());
    if (maskLatents.defined()) {
      // FluxInpaintPipeline: keep the (re-noised) original outside the mask; the last step
      // blends with the clean image latents.
      at::Tensor ref = blendImage;
      if (k + 1 < p.steps) ref = sigmaNext * blendNoise + (1.0 - sigmaNext) * blendImage;
      const at::Tensor m = maskLatents.to(latents.device(), latents.scalar_type());
      latents = (1 - m) * ref.to(latents.device(), latents.scalar_type()) + m * latents;
    }
    if (cache) {
      // Reported for the branch this rank denoises ("cond" unless it is CFG-parallel rank 1).
      cache->setContext(cfgParallel && cfgRank == 1 ? "uncond" : "cond");
      res.cache_computed.push_back(cache->lastComputed() ? 1 : 0);
      res.cache_rel_l1.push_back(cache->lastRelL1());
    }
    at::Tensor vf = v.to(at::kFloat);
    const double ms = msSince(ts);
    res.timings_ms["step." + std::to_string(i + 1)] = ms;
    res.steps_done = i + 1;
    if (cb.onStep) {
      at::Tensor x0 = lf - sigma * vf;
      if (!cb.onStep(i + 1, stepsRun, latents, x0, ms)) {
        res.cancelled = true;
        break;
      }
    }
  }
  res.timings_ms["denoise"] = msSince(tDen);
  res.final_latents = latents.to(at::kFloat).to(at::kCPU).contiguous();
  if (res.cancelled) return res;
  stage("decode");
  auto tDec = Clock::now();
  res.image = decode(latents, p.height, p.width);
  res.timings_ms["decode"] = msSince(tDec);
  return res;
}

std::vector<uint8_t> toRGB8(const at::Tensor& image) {
  at::Tensor u8 = (image.to(at::kFloat) * 255)
                      .round()
                      .clamp(0, 255)
                      .to(at::kByte)
                      .permute({1, 2, 0})
                      .contiguous();
  std::vector<uint8_t> out(u8.numel());
  std::memcpy(out.data(), u8.data_ptr(), out.size());
  return out;
}

}  // namespace dit
