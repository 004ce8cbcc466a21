#include "backend/pipelines/flux2/pipeline_flux2.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include "backend/io/image_io.h"
#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl_flux2.h"
#include "backend/models/flux2/flux2_family.h"
#include "backend/models/flux2/transformer_flux2.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"

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

// Whether this build runs Flux2KleinKVPipeline's cached reference attention (the KV modes of
// Flux2Transformer2DModel): yes, through Flux2KleinKVPipeline (pipeline_flux2_kv.h), which the
// family runtime loads for those folders.
static bool kvReferenceCacheSupported() { return true; }

struct Flux2KleinPipeline::Impl {
  Flux2PipelineConfig cfg;
  std::unique_ptr<Flux2PromptEncoder> encoder;
  std::unique_ptr<Flux2Transformer2DModel> transformer;
  std::unique_ptr<AutoencoderKLFlux2> vae;
  std::map<std::string, uint64_t> bytes;
  int vsf() const { return cfg.vae.vaeScaleFactor(); }
};

Flux2KleinPipeline::Flux2KleinPipeline(const ModelFolder& model, const PipelineOptions& opts,
                                       std::unique_ptr<Flux2PromptEncoder> encoder)
    : FlowMatchPipeline(model, opts, flux2KleinFamily()), d_(new Impl) {
  auto& D = *d_;
  if (model.pipeline_class == "Flux2KleinKVPipeline" && !kvReferenceCacheSupported())
    throw UnsupportedModelError(
        model.path + "/model_index.json",
        "Flux2KleinKVPipeline (reference K/V computed at step 0 and reused) is not implemented in "
        "this build; its checkpoints need that attention, so they are refused rather than run as "
        "Flux2KleinPipeline");
  D.cfg = flux2Config(model);
  {
    auto w = WeightSource::forComponent(model, "transformer", "diffusion_pytorch_model", opts.dtype,
                                        device());
    D.transformer = std::make_unique<Flux2Transformer2DModel>(D.cfg.transformer, *w, opts.parallel);
    D.bytes["transformer"] = w->bytesLoaded();
  }
  {
    auto w =
        WeightSource::forComponent(model, "vae", "diffusion_pytorch_model", opts.dtype, device());
    D.vae = std::make_unique<AutoencoderKLFlux2>(D.cfg.vae, D.cfg.batch_norm_eps, *w);
    D.vae->setTiling(opts.vae_tiling);
    D.bytes["vae"] = w->bytesLoaded();
  }
  D.encoder = std::move(encoder);
}

Flux2KleinPipeline::~Flux2KleinPipeline() = default;
DiffusionTransformer& Flux2KleinPipeline::transformer() { return *d_->transformer; }
std::map<std::string, uint64_t> Flux2KleinPipeline::weightBytes() const {
  std::map<std::string, uint64_t> b = d_->bytes;
  // What this rank holds now: none under own-rank on the other ranks, none between requests
  // under once.
  if (d_->encoder && d_->encoder->loaded())
    b["text_encoder"] = d_->encoder->weightBytes();
  else
    b.erase("text_encoder");
  return b;
}

bool Flux2KleinPipeline::textEncodersLoaded() const { return d_->encoder && d_->encoder->loaded(); }

void Flux2KleinPipeline::loadTextEncoders() {
  if (!d_->encoder)
    throw std::invalid_argument(
        "this FLUX.2 pipeline was loaded without its text encoder: prompts cannot be encoded");
  d_->encoder->load();
}

void Flux2KleinPipeline::releaseTextEncoders() {
  if (d_->encoder) d_->encoder->release();
}

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
  return guider(p).enabled();  // the family's GuiderSpec: guidance > 1, not distilled
}

const SchedulerConfig& Flux2KleinPipeline::schedulerConfig() const { return d_->cfg.scheduler; }

double Flux2KleinPipeline::scheduleMu(int image_seq_len, int steps) const {
  return computeEmpiricalMu(image_seq_len, steps);
}

std::vector<std::string> Flux2KleinPipeline::requestWarnings(const PipelineInputs& p0) const {
  const auto& D = *d_;
  const PipelineInputs p = resolve(p0);
  std::vector<std::string> w;
  const int mult = 2 * D.vsf();
  if (!p.init_image.empty()) {
    if ((p0.width > 0 && p0.width != p.width) || (p0.height > 0 && p0.height != p.height))
      w.push_back("width and height are ignored with an init image: the image is " +
                  std::to_string(p.width) + "x" + std::to_string(p.height) +
                  " (the init image's size, floored to a multiple of " + std::to_string(mult) +
                  ")");
  } else if ((p0.width > 0 && p0.width % mult != 0) || (p0.height > 0 && p0.height % mult != 0)) {
    w.push_back("height and width have to be divisible by " + std::to_string(mult) + " but are " +
                std::to_string(p0.height) + " and " + std::to_string(p0.width) + "; the image is " +
                std::to_string(p.width) + "x" + std::to_string(p.height));
  }
  if (D.cfg.mistral) {
    // Flux2Pipeline: guidance_scale feeds the guidance embedding; there is no CFG branch.
    if (p.option("true_cfg_scale", 1.0) != 1.0)
      w.emplace_back(
          "true_cfg_scale has no effect for FLUX.2 [dev]: it is guidance-distilled (guidance "
          "feeds its guidance embedding, no CFG)");
    if (!p.negative_prompt.empty())
      w.emplace_back(
          "a negative prompt has no effect for FLUX.2 [dev]: it is guidance-distilled (no CFG)");
  }
  if (p.guidance > 1 && D.cfg.is_distilled)
    w.push_back("guidance " + num(p.guidance) + " is ignored for step-wise distilled models");
  if (!D.cfg.mistral && p.option("true_cfg_scale", 1.0) != 1.0)
    w.emplace_back("true_cfg_scale has no effect for FLUX.2 [klein]: guidance > 1 runs CFG");
  if (!D.cfg.mistral && !p.negative_prompt.empty() && !doClassifierFreeGuidance(p))
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

at::Tensor Flux2KleinPipeline::latentIds(int64_t h, int64_t w, int64_t t) {
  at::Tensor ids = at::zeros({h, w, 4}, at::kLong);
  if (t != 0) ids.select(2, 0).fill_(t);
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
  at::Tensor img = D.vae->decodePacked(packed.to(device(), options().dtype), height / mult,
                                       width / mult, finalDecodeGroup());
  return (img / 2 + 0.5).clamp(0, 1).to(at::kFloat).to(at::kCPU).squeeze(0).contiguous();
}

PromptConditioning Flux2KleinPipeline::encodePromptConditioning(const std::string& prompt,
                                                                int max_sequence_length) {
  auto& D = *d_;
  if (!D.encoder)
    throw std::invalid_argument(
        "this FLUX.2 pipeline was loaded without its text encoder: prompts cannot be encoded");
  PromptConditioning c;
  const auto t0 = Clock::now();
  const at::Tensor e = D.encoder->encode(prompt, max_sequence_length);
  c.encode_ms = msSince(t0);
  c.inputs["encoder_hidden_states"] = e.to(device(), options().dtype);
  c.inputs["txt_ids"] = textIds(e.size(1)).to(device());
  return c;
}

GenerationResult Flux2KleinPipeline::generateFromEmbeddings(const PipelineInputs& params0,
                                                            const at::Tensor& promptEmbeds,
                                                            const at::Tensor& negativeEmbeds,
                                                            const PipelineCallbacks& cb) {
  at::NoGradGuard ng;
  const PipelineInputs p = resolve(params0);
  auto conditioning = [&](const at::Tensor& e) {
    PromptConditioning c;
    if (!e.defined()) return c;
    c.inputs["encoder_hidden_states"] = e.to(device(), options().dtype);
    c.inputs["txt_ids"] = textIds(e.size(1)).to(device());
    return c;
  };
  return denoise(p, conditioning(promptEmbeds), conditioning(negativeEmbeds), cb);
}

at::Tensor Flux2KleinPipeline::drawNoise(at::Generator& gen, int64_t h, int64_t w,
                                         GenerationResult& res) const {
  // Flux2KleinPipeline.prepare_latents: randn in the patchified layout, then packed.
  const at::Tensor noise = at::randn({1, d_->cfg.transformer.in_channels, h, w}, gen,
                                     at::TensorOptions().dtype(at::kFloat));
  res.tensors["initial_noise"] = noise;
  return packFlux2Latents(noise).contiguous();
}

at::Tensor Flux2KleinPipeline::preprocessInitImage(const Image8& image, int height,
                                                   int width) const {
  // Flux2KleinInpaintPipeline.__call__: an image over 1024 x 1024 pixels is first resized to
  // int(h * scale) x int(w * scale), scale = sqrt(1024^2 / (h * w)) (image_processor.resize,
  // LANCZOS), then preprocess resizes it to the floored size when that differs.
  if (static_cast<int64_t>(image.width) * image.height > 1024 * 1024) {
    const double scale =
        std::sqrt(1024.0 * 1024.0 / (static_cast<double>(image.height) * image.width));
    const Image8 scaled = resizeLanczos(toRGB(image), static_cast<int>(image.width * scale),
                                        static_cast<int>(image.height * scale));
    return FlowMatchPipeline::preprocessInitImage(scaled, height, width);
  }
  return FlowMatchPipeline::preprocessInitImage(image, height, width);
}

at::Tensor Flux2KleinPipeline::encodeImage(const at::Tensor& image, at::Generator&,
                                           GenerationResult& res) {
  // _encode_vae_image: retrieve_latents(sample_mode="argmax") -> the generator is not consumed.
  const at::Tensor lat =
      d_->vae->encodeNormalized(image.to(device(), options().dtype)).to(at::kFloat).cpu();
  res.tensors["image_latents"] = lat;
  return packFlux2Latents(lat).contiguous();
}

at::Tensor Flux2KleinPipeline::encodeReference(const at::Tensor& image, int index,
                                               GenerationResult& res) {
  // prepare_image_latents -> _encode_vae_image: the posterior mode (no draw), patchified,
  // BatchNorm-normalised; packed per reference.
  const at::Tensor lat =
      d_->vae->encodeNormalized(image.to(device(), options().dtype)).to(at::kFloat).cpu();
  res.tensors["ref_latents_unpacked." + std::to_string(index)] = lat;
  return packFlux2Latents(lat).contiguous();
}

at::Tensor Flux2KleinPipeline::referenceIds(int index, int64_t h, int64_t w) const {
  // _prepare_image_ids: T = scale + scale * i with scale 10; y, x from 0 inside each reference.
  return latentIds(h, w, 10 + 10 * static_cast<int64_t>(index));
}

void Flux2KleinPipeline::prepareTransformerInputs(const PipelineInputs& p, FlowMatchLatents& s) {
  // Flux2Pipeline (FLUX.2 [dev]): guidance = torch.full([1], guidance_scale) for the guidance
  // embedding (guidance_embeds); klein's transformers have none.
  if (d_->cfg.transformer.guidance_embeds)
    s.fixed_inputs["guidance"] =
        at::full({1}, p.guidance, at::TensorOptions().dtype(at::kFloat).device(device()));
  at::Tensor ids = latentIds(s.h, s.w);
  if (s.reference_ids.defined()) {
    // Flux2KleinPipeline(image=[...]): img_ids = cat([latent_ids, image_latent_ids]); the
    // reference tokens were encoded once (encodeReferences).
    ids = at::cat({ids, s.reference_ids}, 0);
  } else if (s.image_latents.defined()) {
    // prepare_image_latents([image_latents]): the init image as the first conditioning image,
    // T = 10 (_prepare_image_ids' scale), the same grid.
    s.reference_tokens = s.image_latents.to(device(), options().dtype);
    ids = at::cat({ids, latentIds(s.h, s.w, 10)}, 0);
  }
  s.fixed_inputs["img_ids"] = ids.to(device());
}

}  // namespace dit
