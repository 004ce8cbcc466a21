#include "backend/pipelines/qwenimage/pipeline_qwenimage.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl_qwenimage.h"
#include "backend/models/qwenimage/qwenimage_family.h"
#include "backend/models/qwenimage/transformer_qwenimage.h"
#include "backend/models/text_encoders/modeling_qwen3.h"
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

std::string qwenImagePromptTemplate(const std::string& prompt) {
  return "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
         "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
         "<|im_start|>user\n" +
         prompt + "<|im_end|>\n<|im_start|>assistant\n";
}

std::pair<at::Tensor, at::Tensor> qwenImageTokenize(const Qwen2Tokenizer& tokenizer,
                                                    const std::vector<std::string>& prompts,
                                                    int maxLength) {
  if (prompts.empty()) throw std::invalid_argument("qwenImageTokenize: no prompt");
  std::vector<std::vector<int64_t>> ids;
  size_t longest = 0;
  for (const auto& p : prompts) {
    auto e = tokenizer.encode(qwenImagePromptTemplate(p), 0).input_ids;
    if (maxLength > 0 && e.size() > static_cast<size_t>(maxLength))
      e.resize(static_cast<size_t>(maxLength));
    longest = std::max(longest, e.size());
    ids.push_back(std::move(e));
  }
  const auto B = static_cast<int64_t>(prompts.size()), L = static_cast<int64_t>(longest);
  at::Tensor input = at::full({B, L}, tokenizer.padId(), at::kLong);
  at::Tensor mask = at::zeros({B, L}, at::kLong);
  for (int64_t b = 0; b < B; ++b) {
    const auto& e = ids[static_cast<size_t>(b)];
    const auto n = static_cast<int64_t>(e.size());
    if (n == 0) continue;
    input[b].narrow(0, 0, n).copy_(at::tensor(e, at::kLong));
    mask[b].narrow(0, 0, n).fill_(1);
  }
  return {input, mask};
}

std::pair<at::Tensor, at::Tensor> qwenImagePromptEmbeds(const Qwen2Tokenizer& tokenizer,
                                                        const Qwen3Model& model,
                                                        const std::vector<std::string>& prompts,
                                                        int maxSeq, int drop, int maxTokens,
                                                        at::Tensor* unsliced) {
  if (maxSeq < 1 || maxSeq > 1024)
    throw std::invalid_argument("max_sequence_length must be in [1, 1024], got " +
                                std::to_string(maxSeq));
  auto [ids, mask] = qwenImageTokenize(tokenizer, prompts, maxTokens + drop);
  // hidden_states[-1]: the final RMSNorm output.
  const at::Tensor h = model.hiddenStates(ids, mask, {model.config().num_hidden_layers}).at(0);
  // _extract_masked_hidden, drop the template prefix, zero-pad to the longest.
  std::vector<at::Tensor> rows;
  int64_t longest = 0;
  for (int64_t b = 0; b < h.size(0); ++b) {
    const at::Tensor keep = mask[b].ne(0).nonzero().squeeze(1).to(h.device());
    at::Tensor r = h[b].index_select(0, keep);
    r = r.size(0) > drop ? r.narrow(0, drop, r.size(0) - drop) : r.narrow(0, 0, 0);
    longest = std::max(longest, r.size(0));
    rows.push_back(r);
  }
  const int64_t B = h.size(0), D = h.size(2);
  at::Tensor embeds = at::zeros({B, longest, D}, h.options());
  at::Tensor emask = at::zeros({B, longest}, at::kLong);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = rows[static_cast<size_t>(b)].size(0);
    embeds[b].narrow(0, 0, n).copy_(rows[static_cast<size_t>(b)]);
    emask[b].narrow(0, 0, n).fill_(1);
  }
  if (unsliced) *unsliced = embeds;
  const int64_t keep = std::min<int64_t>(longest, maxSeq);
  embeds = embeds.narrow(1, 0, keep).contiguous();
  emask = emask.narrow(1, 0, keep).contiguous();
  if (emask.numel() == 0 || emask.ne(0).all().item<bool>()) emask = at::Tensor();
  return {embeds, emask};
}

at::Tensor packQwenImageLatents(const at::Tensor& latents) {
  const at::Tensor x = latents.dim() == 5 ? latents.select(2, 0) : latents;  // [B, C, 2h, 2w]
  const int64_t B = x.size(0), C = x.size(1), h = x.size(2) / 2, w = x.size(3) / 2;
  return x.reshape({B, C, h, 2, w, 2}).permute({0, 2, 4, 1, 3, 5}).reshape({B, h * w, C * 4});
}

at::Tensor unpackQwenImageLatents(const at::Tensor& packed, int64_t h, int64_t w) {
  const int64_t B = packed.size(0), C = packed.size(2) / 4;
  return packed.reshape({B, h, w, C, 2, 2})
      .permute({0, 3, 1, 4, 2, 5})
      .reshape({B, C, 1, h * 2, w * 2});
}

struct QwenImagePipeline::Impl {
  QwenImagePipelineConfig cfg;
  std::unique_ptr<Qwen2Tokenizer> tokenizer;
  std::unique_ptr<Qwen3Model> text_encoder;
  std::unique_ptr<QwenImageTransformer2DModel> transformer;
  std::unique_ptr<AutoencoderKLQwenImage> vae;
  std::map<std::string, uint64_t> bytes;
  int vsf() const { return cfg.vae.vaeScaleFactor(); }
};

QwenImagePipeline::QwenImagePipeline(const ModelFolder& model, const PipelineOptions& opts,
                                     bool withTextEncoder)
    : FlowMatchPipeline(model, opts, qwenImageFamily()), d_(new Impl) {
  auto& D = *d_;
  D.cfg = qwenImageConfig(model);
  {
    auto w = WeightSource::forComponent(model, "transformer", "diffusion_pytorch_model", opts.dtype,
                                        device());
    D.transformer =
        std::make_unique<QwenImageTransformer2DModel>(D.cfg.transformer, *w, opts.parallel);
    D.bytes["transformer"] = w->bytesLoaded();
  }
  {
    auto w =
        WeightSource::forComponent(model, "vae", "diffusion_pytorch_model", opts.dtype, device());
    D.vae = std::make_unique<AutoencoderKLQwenImage>(D.cfg.vae, *w);
    D.bytes["vae"] = w->bytesLoaded();
  }
  if (withTextEncoder) {
    D.tokenizer =
        std::make_unique<Qwen2Tokenizer>(Qwen2Tokenizer::fromFolder(model.component("tokenizer")));
    if (loadsTextEncodersAtStart()) loadTextEncoders();
  }
}

bool QwenImagePipeline::textEncodersLoaded() const { return d_->text_encoder != nullptr; }

void QwenImagePipeline::loadTextEncoders() {
  auto& D = *d_;
  if (!D.tokenizer)
    throw std::invalid_argument(
        "this Qwen-Image pipeline was loaded without its text encoder: prompts cannot be "
        "encoded");
  if (D.text_encoder) return;
  // Placed as the options say: under textEncoderTp() (whole under own-rank), in host memory
  // streamed layer by layer under host-streamed.
  const bool stream = streamsTextEncoder();
  auto w = WeightSource::forComponent(model(), "text_encoder", "model", options().dtype,
                                      stream ? c10::Device(at::kCPU) : device());
  D.text_encoder =
      std::make_unique<Qwen3Model>(D.cfg.text_encoder, *w, textEncoderTp(), -1,
                                   stream ? std::optional<c10::Device>(device()) : std::nullopt);
  if (!D.text_encoder->replicatedReason().empty())
    spdlog::info("Qwen-Image text encoder replicated on every tp rank: {}",
                 D.text_encoder->replicatedReason());
  D.bytes["text_encoder"] = D.text_encoder->weightBytes();
}

void QwenImagePipeline::releaseTextEncoders() {
  d_->text_encoder.reset();
  d_->bytes.erase("text_encoder");
}

QwenImagePipeline::~QwenImagePipeline() = default;
DiffusionTransformer& QwenImagePipeline::transformer() { return *d_->transformer; }
std::map<std::string, uint64_t> QwenImagePipeline::weightBytes() const { return d_->bytes; }

PipelineModelInfo QwenImagePipeline::info() const {
  const auto& t = d_->cfg.transformer;
  PipelineModelInfo i;
  i.num_attention_heads = t.num_attention_heads;
  i.inner_dim = t.innerDim();
  i.num_layers = t.num_layers;
  i.num_single_layers = 0;
  i.vae_scale_factor = d_->vsf();
  i.default_steps = 50;
  i.guidance_embeds = false;
  i.max_sequence_length = d_->cfg.max_sequence_length;
  return i;
}

const SchedulerConfig& QwenImagePipeline::schedulerConfig() const { return d_->cfg.scheduler; }

double QwenImagePipeline::scheduleMu(int image_seq_len, int) const {
  const SchedulerConfig& s = d_->cfg.scheduler;
  return calculateShift(image_seq_len, s.base_image_seq_len, s.max_image_seq_len, s.base_shift,
                        s.max_shift);
}

std::pair<at::Tensor, at::Tensor> QwenImagePipeline::encodePrompts(
    const std::vector<std::string>& prompts, int maxSeq, at::Tensor* unsliced) const {
  const auto& D = *d_;
  if (!D.text_encoder)
    throw std::invalid_argument(
        "this Qwen-Image pipeline was loaded without its text encoder: prompts cannot be "
        "encoded");
  return qwenImagePromptEmbeds(*D.tokenizer, *D.text_encoder, prompts, maxSeq,
                               D.cfg.prompt_template_encode_start_idx, D.cfg.tokenizer_max_length,
                               unsliced);
}

PromptConditioning QwenImagePipeline::encodePromptConditioning(const std::string& prompt,
                                                               int maxSeq) {
  PromptConditioning c;
  const auto t0 = Clock::now();
  const at::Tensor e = encodePrompts({prompt}, maxSeq).first;  // one prompt: no mask
  c.encode_ms = msSince(t0);
  c.inputs["encoder_hidden_states"] = e.to(device(), options().dtype);
  return c;
}

std::vector<std::string> QwenImagePipeline::requestWarnings(const PipelineInputs& p0) const {
  const auto& D = *d_;
  const PipelineInputs p = resolve(p0);
  std::vector<std::string> w;
  const int mult = 2 * D.vsf();
  if ((p0.width > 0 && p0.width % mult != 0) || (p0.height > 0 && p0.height % mult != 0))
    w.push_back("height and width have to be divisible by " + std::to_string(mult) + " but are " +
                std::to_string(p0.height) + " and " + std::to_string(p0.width) + "; the image is " +
                std::to_string(p.width) + "x" + std::to_string(p.height));
  const double trueCfgScale = p.option("true_cfg_scale", 1.0);
  if (trueCfgScale > 1 && !p.hasNegativePrompt())
    w.push_back("true_cfg_scale is passed as " + num(trueCfgScale) +
                ", but classifier-free guidance is not enabled since no negative_prompt is "
                "provided");
  else if (trueCfgScale <= 1 && p.hasNegativePrompt())
    w.push_back(
        "negative_prompt is passed but classifier-free guidance is not enabled since "
        "true_cfg_scale is " +
        num(trueCfgScale) + " (<= 1)");
  if (D.tokenizer) {
    const size_t n = D.tokenizer->encode(qwenImagePromptTemplate(p.prompt), 0).untruncated_length;
    const size_t drop = static_cast<size_t>(D.cfg.prompt_template_encode_start_idx);
    const size_t maxIds = static_cast<size_t>(D.cfg.tokenizer_max_length) + drop;
    if (n > maxIds)
      w.push_back("the prompt was truncated: the template text has " + std::to_string(n) +
                  " tokens, the tokenizer keeps " + std::to_string(maxIds));
    const size_t rows = std::min(n, maxIds) > drop ? std::min(n, maxIds) - drop : 0;
    if (rows > static_cast<size_t>(p.max_sequence_length))
      w.push_back("the prompt embeddings were cut to max_sequence_length " +
                  std::to_string(p.max_sequence_length) + " of " + std::to_string(rows) + " rows");
  }
  return w;
}

at::Tensor QwenImagePipeline::drawNoise(at::Generator& gen, int64_t h, int64_t w,
                                        GenerationResult& res) const {
  // QwenImagePipeline.prepare_latents: randn (B, 1, C, 2h, 2w), then _pack_latents.
  const int64_t C = d_->cfg.vae.z_dim;
  const at::Tensor noise =
      at::randn({1, 1, C, 2 * h, 2 * w}, gen, at::TensorOptions().dtype(at::kFloat));
  res.tensors["initial_noise"] = noise;
  return packQwenImageLatents(noise.permute({0, 2, 1, 3, 4})).contiguous();
}

at::Tensor QwenImagePipeline::encodeImage(const at::Tensor&, at::Generator&, GenerationResult&) {
  throw std::invalid_argument("Qwen-Image (QwenImagePipeline) has no image-to-image here");
}

void QwenImagePipeline::prepareTransformerInputs(const PipelineInputs&, FlowMatchLatents& s) {
  s.fixed_inputs["img_shapes"] =
      at::tensor(std::vector<int64_t>{1, s.h, s.w}, at::kLong).view({1, 3});
}

at::Tensor QwenImagePipeline::decode(const at::Tensor& packed, int height, int width) {
  auto& D = *d_;
  at::NoGradGuard ng;
  const int mult = 2 * D.vsf();
  const auto dt = options().dtype;
  at::Tensor lat = unpackQwenImageLatents(packed.to(device(), dt), height / mult, width / mult);
  // latents / (1 / latents_std) + latents_mean, per channel (float32 tables cast to the dtype).
  const int64_t C = D.cfg.vae.z_dim;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  std::vector<float> mean(D.cfg.vae.latents_mean.begin(), D.cfg.vae.latents_mean.end());
  std::vector<float> stdv(D.cfg.vae.latents_std.begin(), D.cfg.vae.latents_std.end());
  const at::Tensor m = at::tensor(mean, f32).view({1, C, 1, 1, 1}).to(device(), dt);
  const at::Tensor sInv = (1.0 / at::tensor(stdv, f32)).view({1, C, 1, 1, 1}).to(device(), dt);
  const at::Tensor img = D.vae->decode(lat / sInv + m).select(2, 0);
  return (img / 2 + 0.5).clamp(0, 1).to(at::kFloat).to(at::kCPU).squeeze(0).contiguous();
}

}  // namespace dit
