#include "backend/pipelines/zimage/pipeline_zimage.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl.h"
#include "backend/models/text_encoders/modeling_qwen3.h"
#include "backend/models/zimage/transformer_zimage.h"
#include "backend/models/zimage/zimage_family.h"
#include "backend/pipelines/prompt_encoding.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"
#include "backend/tokenizers/qwen2_tokenizer.h"

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

// ---- ZImagePromptEncoder ----

struct ZImagePromptEncoder::Impl {
  Qwen2Tokenizer tokenizer;
  ModelFolder folder;
  PipelineOptions opts;
  int layer = 0;
  std::unique_ptr<Qwen3Model> model;
  explicit Impl(Qwen2Tokenizer t) : tokenizer(std::move(t)) {}
};

ZImagePromptEncoder::ZImagePromptEncoder(const ModelFolder& model, const PipelineOptions& opts)
    : d_(new Impl(Qwen2Tokenizer::fromFolder(model.component("tokenizer")))) {
  d_->folder = model;
  d_->opts = opts;
  d_->layer = zimageConfig(model).textEncoderLayer();
  if (loadsTextEncodersAtStart(opts)) load();
}

void ZImagePromptEncoder::load() {
  if (d_->model) return;
  const ZImagePipelineConfig& cfg = zimageConfig(d_->folder);
  const bool stream = d_->opts.text_encoder == TextEncoderPlacement::HostStreamed;
  const c10::Device device(d_->opts.device);
  auto w = WeightSource::forComponent(d_->folder, "text_encoder", "model", d_->opts.dtype,
                                      stream ? c10::Device(at::kCPU) : device);
  // hidden_states[-2]: the decoder layers up to num_hidden_layers - 1, no final norm.
  d_->model =
      std::make_unique<Qwen3Model>(cfg.text_encoder, *w, textEncoderTpGroup(d_->opts), d_->layer,
                                   stream ? std::optional<c10::Device>(device) : std::nullopt);
  if (!d_->model->replicatedReason().empty())
    spdlog::info("Z-Image text encoder replicated on every tp rank: {}",
                 d_->model->replicatedReason());
}

void ZImagePromptEncoder::release() { d_->model.reset(); }
bool ZImagePromptEncoder::loaded() const { return d_->model != nullptr; }

ZImagePromptEncoder::~ZImagePromptEncoder() = default;

std::pair<at::Tensor, at::Tensor> ZImagePromptEncoder::tokenize(const std::string& prompt,
                                                                int maxLen) const {
  if (maxLen < 1)
    throw std::invalid_argument("max_sequence_length must be at least 1, got " +
                                std::to_string(maxLen));
  const auto e = d_->tokenizer.encode(d_->tokenizer.applyChatTemplate(prompt, true), maxLen);
  return {at::tensor(e.input_ids, at::kLong), at::tensor(e.attention_mask, at::kLong)};
}

at::Tensor ZImagePromptEncoder::encode(const std::string& prompt, int maxLen) const {
  if (!d_->model)
    throw std::logic_error("the Z-Image text encoder is not loaded (released after its prompts)");
  auto [ids, mask] = tokenize(prompt, maxLen);
  const int64_t n = mask.sum().item<int64_t>();
  const at::Tensor h =
      d_->model->hiddenStates(ids.unsqueeze(0), mask.unsqueeze(0), {d_->layer}).at(0);
  // prompt_embeds[i][prompt_masks[i]]: the real tokens are the first n (right padding).
  return h.select(0, 0).narrow(0, 0, n).contiguous();
}

size_t ZImagePromptEncoder::untruncatedTokens(const std::string& prompt) const {
  return d_->tokenizer.encode(d_->tokenizer.applyChatTemplate(prompt, true), 0).untruncated_length;
}

uint64_t ZImagePromptEncoder::weightBytes() const {
  return d_->model ? d_->model->weightBytes() : 0;
}

// ---- ZImagePipeline ----

struct ZImagePipeline::Impl {
  ZImagePipelineConfig cfg;
  std::unique_ptr<ZImagePromptEncoder> encoder;
  std::unique_ptr<ZImageTransformer2DModel> transformer;
  std::unique_ptr<AutoencoderKL> vae;
  std::map<std::string, uint64_t> bytes;
  int vsf() const { return cfg.vae.vaeScaleFactor(); }
};

ZImagePipeline::ZImagePipeline(const ModelFolder& model, const PipelineOptions& opts,
                               std::unique_ptr<ZImagePromptEncoder> encoder)
    : FlowMatchPipeline(model, opts, zimageFamily()), d_(new Impl) {
  auto& D = *d_;
  D.cfg = zimageConfig(model);
  {
    auto w = WeightSource::forComponent(model, "transformer", "diffusion_pytorch_model", opts.dtype,
                                        device());
    D.transformer =
        std::make_unique<ZImageTransformer2DModel>(D.cfg.transformer, *w, opts.parallel);
    D.bytes["transformer"] = w->bytesLoaded();
  }
  {
    auto w =
        WeightSource::forComponent(model, "vae", "diffusion_pytorch_model", opts.dtype, device());
    D.vae = std::make_unique<AutoencoderKL>(D.cfg.vae, *w);
    D.vae->setTiling(opts.vae_tiling);
    D.bytes["vae"] = w->bytesLoaded();
  }
  D.encoder = std::move(encoder);
}

ZImagePipeline::~ZImagePipeline() = default;
DiffusionTransformer& ZImagePipeline::transformer() { return *d_->transformer; }
std::map<std::string, uint64_t> ZImagePipeline::weightBytes() const {
  std::map<std::string, uint64_t> b = d_->bytes;
  if (d_->encoder && d_->encoder->loaded()) b["text_encoder"] = d_->encoder->weightBytes();
  return b;
}

bool ZImagePipeline::textEncodersLoaded() const { return d_->encoder && d_->encoder->loaded(); }

void ZImagePipeline::loadTextEncoders() {
  if (!d_->encoder)
    throw std::invalid_argument(
        "this Z-Image pipeline was loaded without its text encoder: prompts cannot be encoded");
  d_->encoder->load();
}

void ZImagePipeline::releaseTextEncoders() {
  if (d_->encoder) d_->encoder->release();
}

PipelineModelInfo ZImagePipeline::info() const {
  const auto& t = d_->cfg.transformer;
  PipelineModelInfo i;
  i.num_attention_heads = t.n_heads;
  i.inner_dim = t.dim;
  i.num_layers = 0;  // no dual-stream blocks: the main layers are single-stream
  i.num_single_layers = t.n_layers;
  i.vae_scale_factor = d_->vsf();
  i.default_steps = 50;
  i.guidance_embeds = false;
  i.max_sequence_length = d_->cfg.max_sequence_length;
  return i;
}

const SchedulerConfig& ZImagePipeline::schedulerConfig() const { return d_->cfg.scheduler; }

SchedulerConfig ZImagePipeline::schedulerConfigFor(const PipelineInputs& p) const {
  SchedulerConfig c = d_->cfg.scheduler;
  // The family's request declares `shift` (zimage_family.cpp) as read only for a static shift.
  if (!c.use_dynamic_shifting) c.shift = p.option("shift", c.shift);
  return c;
}

double ZImagePipeline::scheduleMu(int image_seq_len, int) const {
  const SchedulerConfig& c = d_->cfg.scheduler;
  return calculateShift(image_seq_len, c.base_image_seq_len, c.max_image_seq_len, c.base_shift,
                        c.max_shift);
}

at::Tensor ZImagePipeline::modelTimestep(float timestep, at::ScalarType) const {
  // (1000 - timestep) / 1000 in float32, and float32 it stays whatever the compute dtype:
  // ZImagePipeline passes it so (no .to(transformer.dtype), unlike Flux / Qwen-Image) and
  // t_embedder takes t * t_scale in float32 (the transformer declares the input Float32, see
  // dit_spec.h). Rounded to bfloat16, t * 1000 moves by up to 2 (0.0769 -> 0.0767: 0.26), radians
  // in the sinusoid's fast channels: so rounded, bfloat16 run 2 of the Z-Image fixture ended 0.55
  // (max) from the float32 latents, against 0.03 for diffusers' bfloat16 run.
  const at::Tensor t =
      at::full({1}, timestep, at::TensorOptions().dtype(at::kFloat).device(device()));
  return (1000 - t) / 1000;
}

at::Tensor ZImagePipeline::schedulerModelOutput(const at::Tensor& prediction) const {
  return -prediction;
}

std::vector<std::string> ZImagePipeline::requestWarnings(const PipelineInputs& p0) const {
  const auto& D = *d_;
  const PipelineInputs p = resolve(p0);
  std::vector<std::string> w;
  const bool cfg = p.guidance > 0.0;
  if (p.option("true_cfg_scale", 1.0) != 1.0)
    w.emplace_back("true_cfg_scale has no effect for Z-Image: guidance > 0 runs CFG");
  if (p.hasNegativePrompt() && !cfg)
    w.push_back("a negative prompt is given but CFG is off (guidance " + num(p.guidance) +
                " <= 0)");
  if (!cfg && (p.options.at("cfg_truncation") != 1.0 || p.options.at("cfg_normalization") != 0.0))
    w.emplace_back("cfg_truncation and cfg_normalization have no effect without CFG (guidance 0)");
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

at::Tensor ZImagePipeline::decode(const at::Tensor& latents, int, int) {
  auto& D = *d_;
  at::NoGradGuard ng;
  const at::Tensor z =
      latents.to(device(), options().dtype) / D.cfg.vae.scaling_factor + D.cfg.vae.shift_factor;
  const at::Tensor img = D.vae->decode(z, finalDecodeGroup());
  return (img / 2 + 0.5).clamp(0, 1).to(at::kFloat).to(at::kCPU).squeeze(0).contiguous();
}

PromptConditioning ZImagePipeline::encodePromptConditioning(const std::string& prompt,
                                                            int max_sequence_length) {
  auto& D = *d_;
  if (!D.encoder)
    throw std::invalid_argument(
        "this Z-Image pipeline was loaded without its text encoder: prompts cannot be encoded");
  PromptConditioning c;
  const auto t0 = Clock::now();
  const at::Tensor e = D.encoder->encode(prompt, max_sequence_length);
  c.encode_ms = msSince(t0);
  c.inputs["encoder_hidden_states"] = e.unsqueeze(0).to(device(), options().dtype);
  return c;
}

GenerationResult ZImagePipeline::generateFromEmbeddings(const PipelineInputs& params0,
                                                        const at::Tensor& promptEmbeds,
                                                        const at::Tensor& negativeEmbeds,
                                                        const PipelineCallbacks& cb) {
  at::NoGradGuard ng;
  const PipelineInputs p = resolve(params0);
  auto conditioning = [&](const at::Tensor& e) {
    PromptConditioning c;
    if (!e.defined()) return c;
    const at::Tensor e3 = e.dim() == 2 ? e.unsqueeze(0) : e;
    c.inputs["encoder_hidden_states"] = e3.to(device(), options().dtype);
    return c;
  };
  return denoise(p, conditioning(promptEmbeds), conditioning(negativeEmbeds), cb);
}

at::Tensor ZImagePipeline::drawNoise(at::Generator& gen, int64_t h, int64_t w,
                                     GenerationResult&) const {
  // prepare_latents: randn_tensor((1, C, 2 * (H // (vsf * 2)), ...), float32) on the CPU.
  return at::randn({1, d_->cfg.transformer.in_channels, 2 * h, 2 * w}, gen,
                   at::TensorOptions().dtype(at::kFloat));
}

at::Tensor ZImagePipeline::encodeImage(const at::Tensor&, at::Generator&, GenerationResult&) {
  throw std::invalid_argument("Z-Image (ZImagePipeline) has no image-to-image here");
}

void ZImagePipeline::prepareTransformerInputs(const PipelineInputs&, FlowMatchLatents&) {
  // Z-Image's transformer builds its position ids itself (from the caption and grid sizes).
}

}  // namespace dit
