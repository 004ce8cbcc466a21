#include "backend/pipelines/flow_match_pipeline.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/models/cache/step_cache.h"
#include "backend/models/family.h"
#include "backend/pipelines/image_processor.h"
#include "backend/pipelines/prompt_encoding.h"
#include "parallel/context_parallel.h"
#include "parallel/process_group.h"
#include "parallel/strategy.h"

namespace dit {

namespace {
using Clock = std::chrono::steady_clock;
double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace

FlowMatchPipeline::FlowMatchPipeline(const ModelFolder& model, const PipelineOptions& opts,
                                     const FamilySpec& family)
    : model_(model), opts_(opts), device_(opts.device) {
  const std::vector<std::string>& v = family.pipeline_variants;
  if (model.pipeline_class != family.pipeline_class &&
      std::find(v.begin(), v.end(), model.pipeline_class) == v.end())
    throw std::invalid_argument(model.path + ": pipeline class \"" + model.pipeline_class +
                                "\" is not " + family.display_name + "'s (" +
                                family.pipeline_class + ")");
  caps_ = family.caps;
  spec_ = family.requestSpec(model);
  familyName_ = spec_.family;  // the family, or the name its request declares for this class
  if (device_.is_cuda() && !at::hasCUDA())
    throw std::invalid_argument(
        "--device cuda: this build of DiT Studio has no CUDA support (LibTorch without CUDA); "
        "use --device cpu or a CUDA build");
  if (device_.is_cpu() && opts.dtype == at::kHalf)
    throw std::invalid_argument(
        "float16 is not supported on the CPU (LibTorch has no CPU half LayerNorm/GroupNorm "
        "kernels); use float32 or bfloat16 on the CPU, float16 on GPUs");
  // The transformer family's declared plan (FamilySpec::dims), the rules the GUI and the CLI
  // run, before any weight is read.
  Strategy s;
  s.world = s.tp_degree = opts.parallel.tpSize();
  auto issues = validateDegrees(s);
  if (issues.empty()) issues = validateForModel(s, model.dims());
  if (!issues.empty()) throw std::invalid_argument(joinIssues(issues));
  if (opts.prompt_cache < 0)
    throw std::invalid_argument("the prompt-embedding cache size must be >= 0 entries, got " +
                                std::to_string(opts.prompt_cache));
  if (opts.prompt_cache > 0) {
    // The encoders' identity: what they were loaded from and how they compute.
    std::string id = model.path;
    for (const char* c : {"text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"})
      id += std::string("|") + c + "=" + model.component(c);
    id += std::string("|") + c10::toString(opts.dtype) + "|" + opts.device;
    promptCache_ = std::make_unique<PromptEmbeddingCache>(static_cast<size_t>(opts.prompt_cache),
                                                          std::move(id));
  }
}

FlowMatchPipeline::~FlowMatchPipeline() = default;

bool FlowMatchPipeline::cfgParallel() const { return opts_.cfg && opts_.cfg->size() == 2; }

bool FlowMatchPipeline::encodesPrompts() const { return dit::encodesPrompts(opts_); }
bool FlowMatchPipeline::loadsTextEncodersAtStart() const {
  return dit::loadsTextEncodersAtStart(opts_);
}
std::shared_ptr<ProcessGroup> FlowMatchPipeline::textEncoderTp() const {
  return textEncoderTpGroup(opts_);
}
uint64_t FlowMatchPipeline::promptCacheHits() const {
  return promptCache_ ? promptCache_->hits() : 0;
}
uint64_t FlowMatchPipeline::promptCacheMisses() const {
  return promptCache_ ? promptCache_->misses() : 0;
}

PromptConditioning FlowMatchPipeline::conditioning(const std::string& text, int maxSeq,
                                                   GenerationResult& res) {
  PromptConditioning c;
  std::string key;
  if (promptCache_) {
    // Every rank of a group sees the same prompts in the same order, so all agree on a hit.
    key = promptCache_->key(text, maxSeq);
    if (promptCache_->find(key, device_, c.inputs)) {
      ++res.prompt_cache_hits;
      spdlog::info("prompt-embedding cache hit ({} hits, {} of {} entries)", promptCache_->hits(),
                   promptCache_->size(), promptCache_->capacity());
      return c;
    }
  }
  if (encodesPrompts()) {
    if (!textEncodersLoaded()) loadTextEncoders();  // `once`: loaded for this request
    c = encodePromptConditioning(text, maxSeq);
  }
  if (opts_.text_encoder == TextEncoderPlacement::OwnRank)
    broadcastConditioning(opts_, device_, c.inputs, c.tokenize_ms, c.encode_ms);
  ++res.prompts_encoded;
  if (promptCache_) promptCache_->put(key, c.inputs);
  return c;
}

PipelineInputs FlowMatchPipeline::resolve(PipelineInputs p) const {
  RequestValues v;
  v.prompt = p.prompt;
  v.negative_prompt = p.negative_prompt;
  v.negative_prompt_given = p.negative_prompt_given;
  v.width = p.width;
  v.height = p.height;
  v.steps = p.steps;
  v.max_sequence_length = p.max_sequence_length;
  v.guidance = p.guidance;
  v.strength = p.strength;
  v.init_image = p.init_image;
  v.mask_image = p.mask_image;
  v.reference_images = p.reference_images;
  v.cache = p.cache.enabled();
  v.options = p.options;
  const ResolvedRequest r = resolveRequest(spec_, v);
  if (!r.ok()) {
    // An unreadable init or reference image is a file error, not a wrong value.
    for (const RequestProblem& pr : r.problems)
      if (pr.rule == "image") throw std::runtime_error(pr.message);
    throwIfProblems(r);
  }
  p.width = r.values.width;
  p.height = r.values.height;
  p.steps = r.values.steps;
  p.max_sequence_length = r.values.max_sequence_length;
  p.guidance = r.values.guidance;  // the generic CFG scale option may have set it
  p.options = r.values.options;
  return p;
}

void FlowMatchPipeline::checkCfg(const Guider& cfg) const {
  if (cfgParallel() && !cfg.enabled())
    throw std::invalid_argument("cfg_degree 2 needs true CFG (" + cfg.requirement() + ")" +
                                "; with CFG off one half of the group would idle — use "
                                "cfg_degree 1");
}

void FlowMatchPipeline::checkFiniteResult(const at::Tensor& t, const char* what, int steps,
                                          const PipelineInputs& p) {
  // One float64 reduction: NaN / Inf propagate into it (the tensor is float32 and small).
  if (std::isfinite(t.sum(at::kDouble).item<double>())) return;
  const int64_t n = at::logical_not(at::isfinite(t)).sum().item<int64_t>();
  const bool anyNan = at::isnan(t).any().item<bool>();
  std::string cause;
  if (transformer().loraTargets().appliedBytes() > 0)
    cause = "the LoRA(s) applied to this request (their factors, alpha or strength) or the weights";
  else
    cause = "the weights";
  if (opts_.dtype == at::kHalf)
    cause += ", or float16 overflowing (try --dtype bfloat16 or float32)";
  double largestScale = std::fabs(p.guidance);
  std::string scales = "guidance " + std::to_string(p.guidance);
  if (!spec_.guider.scale_field.empty() && spec_.guider.scale_field != "guidance") {
    const double v = p.option(spec_.guider.scale_field, 1.0);
    largestScale = std::max(largestScale, std::fabs(v));
    scales += ", " + spec_.guider.scale_field + " " + std::to_string(v);
  }
  if (largestScale > 100) cause += ", or the guidance scale (" + scales + ")";
  throw std::runtime_error(std::string(what) + " hold " + std::to_string(n) + " non-finite value" +
                           (n == 1 ? "" : "s") + (anyNan ? " (NaN)" : " (Inf)") + " after " +
                           std::to_string(steps) + " step" + (steps == 1 ? "" : "s") +
                           "; likely cause: " + cause +
                           ". No image was written (a NaN image is black, not a result)");
}

GenerationResult FlowMatchPipeline::generate(const PipelineInputs& params0,
                                             const PipelineCallbacks& cb) {
  at::NoGradGuard ng;
  const PipelineInputs p = resolve(params0);
  const Guider cfg = guider(p);
  checkCfg(cfg);
  const int cfgRank = cfgParallel() ? opts_.cfg->rank() : 0;
  if (cb.onStage) cb.onStage("encode");  // tokenize + text encoders
  const auto t0 = Clock::now();
  // Under CFG parallel each half encodes only the prompt it denoises.
  PromptConditioning pos, neg;
  GenerationResult counts;
  if (!cfgParallel() || cfgRank == 0) pos = conditioning(p.prompt, p.max_sequence_length, counts);
  if (cfg.enabled() && (!cfgParallel() || cfgRank == 1))
    neg = conditioning(cfg.negativePrompt(), p.max_sequence_length, counts);
  // `once`: the encoders leave before the steps (their memory goes back to the allocator).
  if (opts_.text_encoder == TextEncoderPlacement::Once && textEncodersLoaded())
    releaseTextEncoders();
  const double encodeTotal = msSince(t0);
  GenerationResult r = denoise(p, pos, neg, cb);
  r.prompt_cache_hits = counts.prompt_cache_hits;
  r.prompts_encoded = counts.prompts_encoded;
  // The conditioning the transformer got on this rank (whatever the placement and the cache).
  auto record = [&r](const char* name, const PromptConditioning& c) {
    if (auto it = c.inputs.find("encoder_hidden_states"); it != c.inputs.end())
      r.tensors[name] = it->second.to(at::kCPU, at::kFloat);
  };
  record("prompt_embeds", pos);
  record("negative_prompt_embeds", neg);
  r.timings_ms["tokenize"] = pos.tokenize_ms + neg.tokenize_ms;
  r.timings_ms["encode"] = pos.encode_ms + neg.encode_ms;
  r.timings_ms["encode_total"] = encodeTotal;
  return r;
}

at::Tensor FlowMatchPipeline::preprocessInitImage(const Image8& image, int height,
                                                  int width) const {
  return preprocessImage(image, height, width);
}

at::Tensor FlowMatchPipeline::prepareMask(const at::Tensor& mask, const at::Tensor&, at::Generator&,
                                          int64_t h, int64_t w, GenerationResult&) {
  // F.interpolate(mask, size=(h, w), mode="bilinear"): align_corners false, no antialias.
  const int64_t hw[2] = {h, w};
  const at::Tensor grid = at::upsample_bilinear2d(mask.to(at::kFloat), at::IntArrayRef(hw), false,
                                                  c10::nullopt, c10::nullopt);
  // _pack_latents: [1, 1, h, w] -> [1, h * w, 1].
  return grid.reshape({1, 1, h * w}).permute({0, 2, 1}).contiguous();
}

FlowMatchLatents FlowMatchPipeline::prepareLatents(const PipelineInputs& p,
                                                   const FlowMatchEulerDiscreteScheduler& sched,
                                                   const PipelineCallbacks& cb,
                                                   GenerationResult& res) {
  FlowMatchLatents s;
  const int mult = 2 * vaeScaleFactor();
  s.h = p.height / mult;
  s.w = p.width / mult;
  auto gen = at::detail::createCPUGenerator(p.seed);
  if (p.init_image.empty()) {
    s.latents = drawNoise(gen, s.h, s.w, res);
    // Editing: the references draw nothing (posterior mode), so the noise is the same either way.
    if (!p.reference_images.empty()) encodeReferences(p, s, cb, res);
    return s;
  }
  if (cb.onStage) cb.onStage("encode_image");
  const auto t0 = Clock::now();
  const bool inpaint = !p.mask_image.empty();
  const Image8 init = readImage(p.init_image);
  const Image8 mask = inpaint ? readImage(p.mask_image) : Image8{};
  // One CPU generator for every draw, in diffusers' order: the image encoding (when the family
  // samples the posterior), the noise, then the mask's (FLUX.1's masked image).
  const at::Tensor imageIn = preprocessInitImage(init, p.height, p.width);
  res.tensors["image_in"] = imageIn;
  s.image_latents = encodeImage(imageIn, gen, res);
  s.noise = drawNoise(gen, s.h, s.w, res);
  // scheduler.scale_noise at the first executed timestep.
  s.latents = sched.scaleNoise(s.image_latents, sched.beginIndex(), s.noise);
  if (inpaint) {
    const at::Tensor maskIn = preprocessMask(mask, p.height, p.width);
    res.tensors["mask_in"] = maskIn;
    s.mask = prepareMask(maskIn, imageIn, gen, s.h, s.w, res);
    res.tensors["mask_latents"] = s.mask;
  }
  res.timings_ms["encode_image"] = msSince(t0);
  return s;
}

at::Tensor FlowMatchPipeline::preprocessReference(const Image8& image,
                                                  const ReferenceFit& fit) const {
  Image8 rgb = toRGB(image);
  if (spec_.references.fit == ReferenceRule::Fit::CenterCrop) {
    // Flux2ImageProcessor: the area cap (_resize_to_target_area, LANCZOS), then
    // _resize_and_crop's centre crop to the floored size (no resampling).
    if (fit.scaled_width != rgb.width || fit.scaled_height != rgb.height)
      rgb = resizeLanczos(rgb, fit.scaled_width, fit.scaled_height);
    rgb = cropImage(rgb, fit.crop_left, fit.crop_top, fit.width, fit.height);
  }
  // Resize (FluxKontextPipeline): image_processor.resize to the fitted size (LANCZOS, when it
  // differs), then preprocess at that size.
  return preprocessImage(rgb, fit.height, fit.width);
}

at::Tensor FlowMatchPipeline::encodeReference(const at::Tensor&, int, GenerationResult&) {
  throw std::invalid_argument("reference images are not supported for " + familyName_ + " (" +
                              model_.pipeline_class + ")");
}

at::Tensor FlowMatchPipeline::referenceIds(int, int64_t, int64_t) const {
  throw std::invalid_argument("reference images are not supported for " + familyName_ + " (" +
                              model_.pipeline_class + ")");
}

void FlowMatchPipeline::encodeReferences(const PipelineInputs& p, FlowMatchLatents& s,
                                         const PipelineCallbacks& cb, GenerationResult& res) {
  if (cb.onStage) cb.onStage("encode_references");
  const auto t0 = Clock::now();
  const ReferenceRule& rule = spec_.references;
  const int mult = 2 * vaeScaleFactor();
  bool autoResize = false;
  if (!rule.auto_resize_field.empty()) {
    auto it = p.options.find(rule.auto_resize_field);
    autoResize = it == p.options.end() || it->second != 0;
  }
  std::vector<at::Tensor> tokens, ids;
  for (size_t i = 0; i < p.reference_images.size(); ++i) {
    const std::string& path = p.reference_images[i];
    const std::string what = "reference image " + std::to_string(i + 1);
    Image8 img;
    try {
      img = readImage(path);
    } catch (const std::exception& e) {
      throw std::runtime_error(what + ": " + e.what());
    }
    const ReferenceFit fit = fitReference(rule, mult, img.width, img.height, autoResize);
    if (!fit.problem.empty())
      throw std::invalid_argument(what + " (" + path + ") " + fit.problem + " (" + rule.source +
                                  ")");
    const int index = static_cast<int>(i);
    const at::Tensor x = preprocessReference(img, fit);
    res.tensors["ref_image." + std::to_string(i)] = x;
    tokens.push_back(encodeReference(x, index, res));
    ids.push_back(referenceIds(index, fit.height / mult, fit.width / mult));
  }
  const at::Tensor packed = at::cat(tokens, 1).contiguous();
  s.reference_ids = at::cat(ids, 0).contiguous();
  res.tensors["ref_latents"] = packed;
  res.tensors["ref_ids"] = s.reference_ids;
  s.reference_tokens = packed.to(device_, opts_.dtype);
  res.timings_ms["encode_references"] = msSince(t0);
}

at::Tensor FlowMatchPipeline::modelTimestep(float timestep, at::ScalarType dt) const {
  // timestep.expand(B).to(latents.dtype) / 1000, as the pipelines pass it.
  return at::full({1}, timestep, at::TensorOptions().dtype(at::kFloat).device(device_)).to(dt) /
         1000;
}

TransformerInputs FlowMatchPipeline::transformerInputs(const at::Tensor& latents,
                                                       const at::Tensor& timestep,
                                                       const PromptConditioning& prompt,
                                                       const FlowMatchLatents& state) const {
  TransformerInputs in = prompt.inputs;
  for (const auto& [name, t] : state.fixed_inputs) in[name] = t;
  in["timestep"] = timestep;
  in["hidden_states"] =
      state.reference_tokens.defined()
          ? at::cat({latents, state.reference_tokens.to(latents.scalar_type())}, 1)
          : latents;
  return in;
}

GenerationResult FlowMatchPipeline::denoise(const PipelineInputs& p, const PromptConditioning& pos,
                                            const PromptConditioning& neg,
                                            const PipelineCallbacks& cb) {
  at::NoGradGuard ng;
  GenerationResult res;
  res.params = p;
  const Guider cfg = guider(p);
  checkCfg(cfg);
  const bool cfgPar = cfgParallel();
  const int cfgRank = cfgPar ? opts_.cfg->rank() : 0;
  const PromptConditioning& mine = cfgPar && cfgRank == 1 ? neg : pos;
  if (!mine.defined() || (cfg.enabled() && !cfgPar && !neg.defined()))
    throw std::invalid_argument(
        "the prompt conditioning this rank needs was not given (the prompt, and with CFG the "
        "negative prompt)");
  DiffusionTransformer& model = transformer();
  if (p.cache.enabled() && !model.supportsStepCache()) {
    // The family's flag says yes but its transformer has no step-cache seam: refuse the same way.
    FamilyCapabilities caps = caps_;
    caps.step_cache = false;
    checkRequestSupported(familyName_, caps, {false, false, true});
  }
  auto stage = [&](const char* s) {
    if (cb.onStage) cb.onStage(s);
  };
  const int mult = 2 * vaeScaleFactor();
  const int tokens = (p.height / mult) * (p.width / mult);
  FlowMatchEulerDiscreteScheduler sched(schedulerConfigFor(p));
  sched.setTimesteps(p.steps, scheduleMu(tokens, p.steps), p.init_image.empty() ? 1.0 : p.strength);
  FlowMatchLatents state = prepareLatents(p, sched, cb, res);
  const int tStart = sched.beginIndex();
  res.t_start = tStart;
  res.initial_latents = state.latents.clone();
  const auto dt = opts_.dtype;
  at::Tensor latents = state.latents.to(device_, dt);
  prepareTransformerInputs(p, state);
  // The inpaint blend's operands, on the device once.
  at::Tensor mask;
  if (state.mask.defined()) mask = state.mask.to(device_, dt);

  // Step caching: fresh state for this call (diffusers resets it when the call ends).
  std::unique_ptr<StepCache> cache;
  if (p.cache.enabled()) {
    cache = std::make_unique<StepCache>(
        p.cache, opts_.parallel.cp ? opts_.parallel.cp->group() : nullptr, opts_.parallel.tp);
    model.setStepCache(cache.get());
  }
  struct Detach {
    DiffusionTransformer* t;
    bool on;
    ~Detach() {
      if (on) t->setStepCache(nullptr);
    }
  } detach{&model, cache != nullptr};

  stage("denoise");
  const auto tDen = Clock::now();
  const int stepsRun = sched.stepsToRun();
  for (int k = tStart; k < p.steps; ++k) {
    const int i = k - tStart;  // executed step, 0-based
    const auto ts = Clock::now();
    const at::Tensor tt = modelTimestep(sched.timestep(k), dt);
    // CFG at this step (a family may run some steps on the conditional branch only).
    const bool guided = cfg.activeAt(sched.timestep(k));
    auto run = [&](const PromptConditioning& c, const char* context) {
      if (cache) cache->setContext(context);
      at::Tensor out = model.forward(transformerInputs(latents, tt, c, state));
      // Conditioning tokens are not denoised: noise_pred[:, :latents.size(1)].
      if (out.size(1) != latents.size(1)) out = out.narrow(1, 0, latents.size(1));
      return out;
    };
    at::Tensor v;
    if (!cfg.enabled()) {
      v = run(pos, "cond");
    } else if (!cfgPar) {
      if (guided) {
        const at::Tensor vc = run(pos, "cond"), vu = run(neg, "uncond");
        v = cfg.combine(vc, vu);
      } else {
        v = run(pos, "cond");
      }
    } else if (guided) {
      // CFG parallel: rank 0 of the cfg group predicts the conditional, rank 1 the
      // unconditional branch; exchange and combine identically on both.
      const at::Tensor part = run(mine, cfgRank == 0 ? "cond" : "uncond").contiguous();
      const at::Tensor both = opts_.cfg->allgather(part.unsqueeze(0), 0)->result();
      v = cfg.combine(both[0], both[1]);
    } else {
      // A step without CFG under CFG parallel: rank 0 predicts the conditional branch and the
      // same exchange hands it to rank 1 (which sends zeros of the same shape).
      const at::Tensor part =
          cfgRank == 0 ? run(pos, "cond").contiguous() : at::zeros_like(latents).contiguous();
      v = opts_.cfg->allgather(part.unsqueeze(0), 0)->result()[0];
    }
    v = schedulerModelOutput(v);
    at::Tensor x0;
    if (cb.onStep) x0 = sched.predOriginalSample(v, k, latents);
    latents = sched.step(v, k, latents);
    if (mask.defined()) {
      // Keep the original outside the mask: re-noised to the next sigma (scale_noise with the
      // same noise), the clean image latents after the last step.
      const at::Tensor ref = k + 1 < p.steps
                                 ? sched.scaleNoise(state.image_latents, k + 1, state.noise)
                                 : state.image_latents;
      const at::Tensor m = mask.to(latents.scalar_type());
      latents = (1 - m) * ref.to(latents.device(), latents.scalar_type()) + m * latents;
    }
    if (cache) {
      // Reported for the branch this rank denoises ("cond" unless it is CFG-parallel rank 1).
      cache->setContext(cfgPar && cfgRank == 1 ? "uncond" : "cond");
      res.cache_computed.push_back(cache->lastComputed() ? 1 : 0);
      res.cache_rel_l1.push_back(cache->lastRelL1());
    }
    const double ms = msSince(ts);
    res.timings_ms["step." + std::to_string(i + 1)] = ms;
    res.steps_done = i + 1;
    if (cb.onStep && !cb.onStep(i + 1, stepsRun, latents, x0, ms)) {
      res.cancelled = true;
      break;
    }
  }
  res.timings_ms["denoise"] = msSince(tDen);
  res.final_latents = latents.to(at::kFloat).to(at::kCPU).contiguous();
  if (res.cancelled) return res;
  checkFiniteResult(res.final_latents, "the denoised latents", res.steps_done, p);
  stage("decode");
  const auto tDec = Clock::now();
  {
    // The final decode is collective (finalDecodeGroup()); previews are not.
    finalDecode_ = true;
    struct Reset {
      bool& flag;
      ~Reset() { flag = false; }
    } reset{finalDecode_};
    res.image = decode(latents, p.height, p.width);
  }
  res.timings_ms["decode"] = msSince(tDec);
  checkFiniteResult(res.image, "the decoded image", res.steps_done, p);
  return res;
}

}  // namespace dit
