// Flux2KleinPipeline (diffusers pipelines/flux2/pipeline_flux2_klein.py) on the shared loop
// (pipelines/flow_match_pipeline.h): the Qwen3 prompt embeddings (Flux2PromptEncoder), noise
// drawn in the patchified latent layout and packed, the FLUX.2 schedule (compute_empirical_mu),
// classic CFG (two calls per step, negative = the embedding of "") only when guidance_scale > 1
// and the model is not distilled, then AutoencoderKLFlux2's BatchNorm de-normalisation,
// unpatchify and decode. With an init image (and a mask) it is Flux2KleinInpaintPipeline
// (pipelines/flux2/pipeline_flux2_klein_inpaint.py): the size is the image's, the image latents
// (posterior mode, BatchNorm-normalised) start the loop through scale_noise AND enter every step
// as conditioning tokens (T = 10), the binarised mask is bilinear-sampled to the token grid and
// blends every step; image-to-image is the same with no mask (diffusers' all-white mask). Parallel
// strategies come from PipelineOptions as for FLUX.1: tp and ring/Ulysses inside the transformer
// (its declared plans), cfg 2 splits the two CFG calls over a group of two ranks, dp is the
// worker's.
//
// The same class runs Flux2Pipeline (FLUX.2 [dev], pipelines/flux2/pipeline_flux2.py) for a folder
// of that class (Flux2PipelineConfig::mistral): the Mistral3 text encoder and tekken tokenizer
// behind Flux2PromptEncoder (hidden states 10, 20, 30), the request's guidance sent to the
// transformer's guidance embedding as `guidance` float32 [1] every call, and no CFG (the family's
// declaration: one branch, no negative prompt). Everything else (noise, ids, schedule with
// compute_empirical_mu, decode, references, strategies) is shared with klein as diffusers shares
// it.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/pipelines/diffusion_pipeline.h"
#include "backend/pipelines/flow_match_pipeline.h"
#include "backend/pipelines/flux2/flux2_pipeline_config.h"

namespace dit {

class Flux2Transformer2DModel;
class AutoencoderKLFlux2;

/// The text side of Flux2KleinPipeline / Flux2Pipeline (encode_prompt): chat template, tokenizer,
/// the text encoder's hidden states stacked per token (Flux2KleinPipeline._get_qwen3_prompt_embeds,
/// Flux2Pipeline._get_mistral_3_small_prompt_embeds).
class Flux2PromptEncoder {
 public:
  virtual ~Flux2PromptEncoder() = default;
  /// prompt -> prompt_embeds float32 [1, max_sequence_length, joint_attention_dim] on the
  /// pipeline's device (padding rows included). Collective over the text encoder's tp group.
  virtual at::Tensor encode(const std::string& prompt, int max_sequence_length) const = 0;
  /// Tokens of the chat-template string before truncation (for the truncation warning).
  virtual size_t untruncatedTokens(const std::string& prompt) const = 0;
  /// Bytes of text-encoder weights this rank holds (0 while released; host bytes when
  /// streamed).
  virtual uint64_t weightBytes() const = 0;
  /// Loads the encoder's weights (the tokenizer stays loaded throughout). No-op when loaded.
  /// Throws as loading does.
  virtual void load() = 0;
  /// Frees the encoder's weights; encode() then throws until load(). No-op when released.
  virtual void release() = 0;
  virtual bool loaded() const = 0;
};

/// The FLUX.2 text side of `model` (tokenizer/, text_encoder/) as `opts` places it
/// (pipelines/flux2/flux2_prompt_encoder.cpp): the tokenizer always; the encoder's weights under
/// textEncoderTpGroup(opts) (the transformer's tp group; whole under own-rank), in host memory
/// streamed layer by layer under host-streamed, not yet under once (loaded per request). Null on
/// an own-rank placement's ranks that do not encode (encodesPrompts(opts) false).
std::unique_ptr<Flux2PromptEncoder> loadFlux2PromptEncoder(const ModelFolder& model,
                                                           const PipelineOptions& opts);

class Flux2KleinPipeline : public FlowMatchPipeline {
 public:
  /// Loads the transformer and the VAE from `model`, and takes the text side `encoder` (null:
  /// generate() refuses prompts and only generateFromEmbeddings() runs). Throws ModelFileError /
  /// std::invalid_argument naming the file or the degree that does not fit.
  Flux2KleinPipeline(const ModelFolder& model, const PipelineOptions& opts,
                     std::unique_ptr<Flux2PromptEncoder> encoder);
  ~Flux2KleinPipeline() override;

  /// Heads, inner dim, blocks, vae_scale_factor, 50 default steps, no guidance embedding, 512
  /// text tokens.
  PipelineModelInfo info() const override;
  /// The denoising and decoding with given prompt embeddings [1, L, joint_attention_dim]
  /// (`negative_embeds` used when CFG is on: guidance > 1 and not distilled; under cfg 2 each rank
  /// needs only the embedding of its branch). `params` is resolved first. GenerationResult::tensors
  /// gets "initial_noise" [1, 4C, h, w] (float32, CPU) and, with an init image, "image_in",
  /// "image_latents" [1, 4C, h, w] (patchified, BatchNorm-normalised), and with a mask "mask_in"
  /// [1, 1, H, W] and "mask_latents" [1, h * w, 1]. Collective over the pipeline's groups.
  GenerationResult generateFromEmbeddings(const PipelineInputs& params,
                                          const at::Tensor& prompt_embeds,
                                          const at::Tensor& negative_embeds,
                                          const PipelineCallbacks& cb = {});
  at::Tensor decode(const at::Tensor& packed, int height, int width) override;
  std::vector<std::string> requestWarnings(const PipelineInputs& p) const override;
  DiffusionTransformer& transformer() override;
  std::map<std::string, uint64_t> weightBytes() const override;
  bool textEncodersLoaded() const override;

  /// CFG is on for these inputs: guidance > 1 and the model is not distilled.
  bool doClassifierFreeGuidance(const PipelineInputs& p) const;
  /// Packed-token position ids (t, y, x, 0), int64 [h * w, 4], row-major; t = 10 for the first
  /// conditioning image (Flux2KleinInpaintPipeline._prepare_image_ids), 0 for the noisy latents.
  static at::Tensor latentIds(int64_t h, int64_t w, int64_t t = 0);
  /// Text position ids (0, 0, 0, l), int64 [L, 4].
  static at::Tensor textIds(int64_t L);

 protected:
  PromptConditioning encodePromptConditioning(const std::string& prompt,
                                              int max_sequence_length) override;
  const SchedulerConfig& schedulerConfig() const override;
  /// compute_empirical_mu(image_seq_len, N).
  double scheduleMu(int image_seq_len, int steps) const override;
  /// randn [1, 4C, h, w] (the patchified layout), packed.
  at::Tensor drawNoise(at::Generator& gen, int64_t h, int64_t w,
                       GenerationResult& res) const override;
  /// An image over 1024 x 1024 pixels is first scaled to that area (PIL LANCZOS), then
  /// VaeImageProcessor.preprocess.
  at::Tensor preprocessInitImage(const Image8& image, int height, int width) const override;
  /// _encode_vae_image: the posterior mode (no draw), patchified, BatchNorm-normalised, packed.
  at::Tensor encodeImage(const at::Tensor& image, at::Generator& gen,
                         GenerationResult& res) override;
  /// Flux2KleinPipeline.prepare_image_latents for one reference: the posterior mode (no draw),
  /// patchified, BatchNorm-normalised ("ref_latents_unpacked.<index>" [1, 4C, h, w]), packed
  /// [1, h * w, 4C] float32 CPU.
  at::Tensor encodeReference(const at::Tensor& image, int index, GenerationResult& res) override;
  /// (10 + 10 index, y, x, 0) int64 [h * w, 4] (_prepare_image_ids).
  at::Tensor referenceIds(int index, int64_t h, int64_t w) const override;
  void loadTextEncoders() override;
  void releaseTextEncoders() override;
  /// img_ids (0, y, x, 0); `guidance` [1] = the request's guidance when the transformer has the
  /// guidance embedding (FLUX.2 [dev]); with reference images their ids appended (T = 10, 20, ...);
  /// with an init image the image latents are appended as conditioning tokens with ids (10, y, x,
  /// 0).
  void prepareTransformerInputs(const PipelineInputs& p, FlowMatchLatents& latents) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

}  // namespace dit
