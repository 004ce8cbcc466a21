#include "backend/pipelines/flux/pipeline_flux.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl.h"
#include "backend/models/flux/flux_family.h"
#include "backend/models/text_encoders/modeling_clip.h"
#include "backend/models/text_encoders/modeling_t5.h"
#include "backend/pipelines/image_processor.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"
#include "backend/tokenizers/clip_tokenizer.h"
#include "backend/tokenizers/t5_tokenizer.h"
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
  FluxPipelineConfig cfg;  ///< model.configAs<FluxPipelineConfig>()
  std::unique_ptr<CLIPTokenizer> clipTok;
  std::unique_ptr<T5Tokenizer> t5Tok;
  std::unique_ptr<CLIPTextModel> clip;
  std::unique_ptr<T5EncoderModel> t5;
  std::unique_ptr<FluxTransformer2DModel> transformer;
  std::unique_ptr<AutoencoderKL> vae;
  std::map<std::string, uint64_t> bytes;
};

FluxPipeline::FluxPipeline(const ModelFolder& model, const PipelineOptions& opts)
    : FlowMatchPipeline(model, opts, fluxFamily()), d_(new Impl) {
  auto& D = *d_;
  D.cfg = fluxConfig(model);  // refuses another pipeline family
  for (const std::string& note : model.notes) spdlog::info("{}", note);
  // The config against the tensors actually present, before any weight is read: a config that
  // describes another model (num_layers -1 or 1 for a 2-block checkpoint) is refused, naming a
  // tensor the config does not account for and one the checkpoint lacks.
  if (model.dims().parameters) checkCheckpointMatchesConfig(model);
  D.clipTok = std::make_unique<CLIPTokenizer>(model.component("tokenizer"));
  D.t5Tok = std::make_unique<T5Tokenizer>(model.component("tokenizer_2"));
  {
    auto w = WeightSource::forComponent(model, "transformer", "diffusion_pytorch_model", opts.dtype,
                                        device());
    D.transformer = std::make_unique<FluxTransformer2DModel>(D.cfg.transformer, *w, opts.parallel);
    D.bytes["transformer"] = w->bytesLoaded();
  }
  if (opts.text_encoder == TextEncoderPlacement::HostStreamed)
    throw std::invalid_argument(
        "--text-encoder-placement host-streamed: FLUX.1's CLIP and T5 encoders are not streamed "
        "from host memory in this build (the Qwen3 / Mistral / Qwen2.5-VL encoders of FLUX.2, "
        "Z-Image and Qwen-Image are); use once, own-rank or sharded");
  if (loadsTextEncodersAtStart()) loadTextEncoders();
  {
    auto w =
        WeightSource::forComponent(model, "vae", "diffusion_pytorch_model", opts.dtype, device());
    D.vae = std::make_unique<AutoencoderKL>(D.cfg.vae, *w);
    D.vae->setTiling(opts.vae_tiling);
    D.bytes["vae"] = w->bytesLoaded();
  }
}

bool FluxPipeline::textEncodersLoaded() const { return d_->clip && d_->t5; }

void FluxPipeline::loadTextEncoders() {
  auto& D = *d_;
  // CLIP and T5 have no tensor-parallel plan: whole on the ranks that encode.
  if (!D.clip) {
    auto w =
        WeightSource::forComponent(model(), "text_encoder", "model", options().dtype, device());
    D.clip = std::make_unique<CLIPTextModel>(D.cfg.text_encoder, *w);
    D.bytes["text_encoder"] = w->bytesLoaded();
  }
  if (!D.t5) {
    auto w =
        WeightSource::forComponent(model(), "text_encoder_2", "model", options().dtype, device());
    D.t5 = std::make_unique<T5EncoderModel>(D.cfg.text_encoder_2, *w);
    D.bytes["text_encoder_2"] = w->bytesLoaded();
  }
}

void FluxPipeline::releaseTextEncoders() {
  auto& D = *d_;
  D.clip.reset();
  D.t5.reset();
  D.bytes.erase("text_encoder");
  D.bytes.erase("text_encoder_2");
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
  // Appended piecewise: `" " + to_string(n)` trips GCC 12's -Wstringop-overflow (a false
  // positive of its inlined string insert).
  if (!extra.empty()) {
    msg.append(" ").append(std::to_string(extra.size())).append(" tensor");
    msg.append(extra.size() == 1 ? "" : "s");
    msg.append(" of the checkpoint that the config has no place for (first: '")
        .append(extra[0])
        .append("')");
  }
  if (!missing.empty()) {
    msg.append(extra.empty() ? " " : "; ").append(std::to_string(missing.size())).append(" tensor");
    msg.append(missing.size() == 1 ? "" : "s");
    msg.append(" the config needs that the checkpoint lacks (first: '")
        .append(missing[0])
        .append("')");
  }
  throw ModelFileError(model.component("transformer") + "/config.json", msg);
}

FluxPipeline::~FluxPipeline() = default;
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

const SchedulerConfig& FluxPipeline::schedulerConfig() const { return d_->cfg.scheduler; }

double FluxPipeline::scheduleMu(int image_seq_len, int) const {
  const SchedulerConfig& c = d_->cfg.scheduler;
  return calculateShift(image_seq_len, c.base_image_seq_len, c.max_image_seq_len, c.base_shift,
                        c.max_shift);
}

int img2imgStart(int steps, double strength) { return img2imgStartIndex(steps, strength); }

PromptEmbeds FluxPipeline::encodePrompt(const std::string& prompt, int maxLen) {
  auto& D = *d_;
  if (!textEncodersLoaded())
    throw std::invalid_argument(
        "FluxPipeline::encodePrompt: the text encoders are not loaded on this rank (placement " +
        std::string(textEncoderPlacementName(options().text_encoder)) + ")");
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
                         at::TensorOptions().dtype(at::kFloat).device(device()));
  return e;
}

PromptConditioning FluxPipeline::encodePromptConditioning(const std::string& prompt,
                                                          int max_sequence_length) {
  PromptEmbeds e = encodePrompt(prompt, max_sequence_length);
  PromptConditioning c;
  c.inputs["encoder_hidden_states"] = e.prompt_embeds;
  c.inputs["pooled_projections"] = e.pooled;
  c.inputs["txt_ids"] = e.text_ids;
  c.tokenize_ms = e.tokenize_ms;
  c.encode_ms = e.encode_ms;
  return c;
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
  const double trueCfgScale = p.option("true_cfg_scale", 1.0);
  if (p.hasNegativePrompt() && trueCfgScale > 1) truncation("negative prompt", p.negative_prompt);
  if (trueCfgScale > 1 && !p.hasNegativePrompt())
    w.push_back("true_cfg_scale is " + fmt(trueCfgScale) +
                ", but classifier-free guidance is not enabled since no negative prompt is given");
  else if (trueCfgScale <= 1 && p.hasNegativePrompt())
    w.push_back(
        "a negative prompt is given but classifier-free guidance is not enabled since "
        "true_cfg_scale " +
        fmt(trueCfgScale) + " <= 1");
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
  at::Tensor img = D.vae->decode(z.to(device()), finalDecodeGroup());
  return (img / 2 + 0.5).clamp(0, 1).to(at::kFloat).to(at::kCPU).squeeze(0).contiguous();
}

at::Tensor FluxPipeline::drawNoise(at::Generator& gen, int64_t h, int64_t w,
                                   GenerationResult& res) const {
  const int64_t C = d_->cfg.transformer.in_channels / 4;
  const at::Tensor noise =
      at::randn({1, C, 2 * h, 2 * w}, gen, at::TensorOptions().dtype(at::kFloat));
  res.tensors["noise"] = noise;
  return packLatents(noise);
}

at::Tensor FluxPipeline::encodeImage(const at::Tensor& image, at::Generator& gen,
                                     GenerationResult& res) {
  const double shift = d_->cfg.vae.shift_factor, scale = d_->cfg.vae.scaling_factor;
  at::Tensor eps;
  const at::Tensor lat =
      ((d_->vae->encode(image.to(device(), options().dtype)).sample(gen, &eps) - shift) * scale)
          .to(at::kFloat)
          .cpu();
  res.tensors["vae_eps"] = eps;
  res.tensors["image_latents"] = lat;
  return packLatents(lat);
}

at::Tensor FluxPipeline::prepareMask(const at::Tensor& mask, const at::Tensor& image,
                                     at::Generator& gen, int64_t h, int64_t w,
                                     GenerationResult& res) {
  const double shift = d_->cfg.vae.shift_factor, scale = d_->cfg.vae.scaling_factor;
  const at::Tensor maskedIn = image * (mask < 0.5f);
  at::Tensor eps;
  const at::Tensor masked =
      ((d_->vae->encode(maskedIn.to(device(), options().dtype)).sample(gen, &eps) - shift) * scale)
          .to(at::kFloat)
          .cpu();
  const int64_t hw[2] = {2 * h, 2 * w};
  const at::Tensor maskHw =
      at::upsample_nearest2d(mask, at::IntArrayRef(hw), c10::nullopt, c10::nullopt);
  const int64_t C = d_->cfg.transformer.in_channels / 4;
  res.tensors["masked_image_in"] = maskedIn;
  res.tensors["masked_image_vae_eps"] = eps;
  res.tensors["masked_image_latents"] = packLatents(masked);
  res.tensors["mask_latent_hw"] = maskHw;
  return packLatents(maskHw.repeat({1, C, 1, 1}));
}

at::Tensor FluxPipeline::encodeReference(const at::Tensor& image, int index,
                                         GenerationResult& res) {
  // FluxKontextPipeline.prepare_latents -> _encode_vae_image(sample_mode="argmax"): the
  // posterior mode (no draw), (z - shift_factor) * scaling_factor, packed 2x2.
  const double shift = d_->cfg.vae.shift_factor, scale = d_->cfg.vae.scaling_factor;
  const at::Tensor lat =
      ((d_->vae->encode(image.to(device(), options().dtype)).mean - shift) * scale)
          .to(at::kFloat)
          .cpu();
  res.tensors["ref_latents_unpacked." + std::to_string(index)] = lat;
  return packLatents(lat).contiguous();
}

at::Tensor FluxPipeline::referenceIds(int, int64_t h, int64_t w) const {
  // image_ids = _prepare_latent_image_ids(...); image_ids[..., 0] = 1.
  at::Tensor ids = latentImageIds(static_cast<int>(h), static_cast<int>(w));
  ids.select(1, 0).fill_(1);
  return ids;
}

void FluxPipeline::prepareTransformerInputs(const PipelineInputs& p, FlowMatchLatents& s) {
  at::Tensor ids = latentImageIds(static_cast<int>(s.h), static_cast<int>(s.w));
  // FluxKontextPipeline: latent_ids = cat([latent_ids, image_ids]) (dim 0 is the sequence).
  if (s.reference_ids.defined()) ids = at::cat({ids, s.reference_ids.to(ids.scalar_type())}, 0);
  s.fixed_inputs["img_ids"] = ids.to(device());
  if (d_->cfg.transformer.guidance_embeds)
    s.fixed_inputs["guidance"] =
        at::full({1}, p.guidance, at::TensorOptions().dtype(at::kFloat).device(device()));
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
