// Flux2KleinPipeline (diffusers pipelines/flux2/pipeline_flux2_klein.py), text-to-image: the Qwen3
// prompt embeddings (Flux2PromptEncoder), noise drawn in the patchified latent layout and packed,
// the FLUX.2 schedule (compute_empirical_mu), the Euler loop over Flux2Transformer2DModel with
// classic CFG (two calls per step, negative = the embedding of "") only when guidance_scale > 1
// and the model is not distilled, then AutoencoderKLFlux2's BatchNorm de-normalisation,
// unpatchify and decode. Parallel strategies come from PipelineOptions as for FLUX.1: tp and
// ring/Ulysses inside the transformer (its declared plans), cfg 2 splits the two CFG calls over
// a group of two ranks, dp is the worker's.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/pipelines/diffusion_pipeline.h"
#include "backend/pipelines/flux2/flux2_pipeline_config.h"

namespace dit {

class Flux2Transformer2DModel;
class AutoencoderKLFlux2;

/// The text side of Flux2KleinPipeline (encode_prompt): chat template, Qwen2 tokenizer, Qwen3
/// hidden states stacked per token (Flux2KleinPipeline._get_qwen3_prompt_embeds).
class Flux2PromptEncoder {
 public:
  virtual ~Flux2PromptEncoder() = default;
  /// prompt -> prompt_embeds float32 [1, max_sequence_length, joint_attention_dim] on the
  /// pipeline's device (padding rows included). Collective over the text encoder's tp group.
  virtual at::Tensor encode(const std::string& prompt, int max_sequence_length) const = 0;
  /// Tokens of the chat-template string before truncation (for the truncation warning).
  virtual size_t untruncatedTokens(const std::string& prompt) const = 0;
  /// Bytes of text-encoder weights this rank holds.
  virtual uint64_t weightBytes() const = 0;
};

/// Loads the FLUX.2 text encoder and tokenizer of `model` (text_encoder/, tokenizer/) under the
/// transformer's tp group (pipelines/flux2/flux2_prompt_encoder.cpp).
std::unique_ptr<Flux2PromptEncoder> loadFlux2PromptEncoder(const ModelFolder& model,
                                                           const PipelineOptions& opts);

class Flux2KleinPipeline : public DiffusionPipeline {
 public:
  /// Loads the transformer and the VAE from `model`, and takes the text side `encoder` (null:
  /// generate() refuses prompts and only generateFromEmbeddings() runs). Throws ModelFileError /
  /// std::invalid_argument naming the file or the degree that does not fit.
  Flux2KleinPipeline(const ModelFolder& model, const PipelineOptions& opts,
                     std::unique_ptr<Flux2PromptEncoder> encoder);
  ~Flux2KleinPipeline() override;

  const ModelFolder& model() const override;
  /// Heads, inner dim, blocks, vae_scale_factor, 50 default steps, no guidance embedding, 512
  /// text tokens.
  PipelineModelInfo info() const override;
  /// Defaults (width/height 128 x vae_scale_factor, 50 steps, 512 text tokens); width/height
  /// rounded DOWN to multiples of 2 x vae_scale_factor as diffusers does (requestWarnings says
  /// so); image-to-image, inpainting and step caching are refused for FLUX.2 (std::invalid_argument
  /// naming the feature).
  PipelineInputs resolve(PipelineInputs p) const override;
  /// Encodes the prompt (and, with CFG, the negative: the given negative prompt, else "" as
  /// diffusers), then generateFromEmbeddings.
  GenerationResult generate(const PipelineInputs& params,
                            const PipelineCallbacks& cb = {}) override;
  /// The denoising and decoding with given prompt embeddings [1, L, joint_attention_dim]
  /// (`negative_embeds` used when CFG is on: guidance > 1 and not distilled; under cfg 2 each rank
  /// needs only the embedding of its branch). GenerationResult::tensors gets "initial_noise"
  /// [1, 4C, h, w] (float32, CPU). Collective over the pipeline's groups.
  GenerationResult generateFromEmbeddings(const PipelineInputs& params,
                                          const at::Tensor& prompt_embeds,
                                          const at::Tensor& negative_embeds,
                                          const PipelineCallbacks& cb = {});
  at::Tensor decode(const at::Tensor& packed, int height, int width) override;
  std::vector<std::string> requestWarnings(const PipelineInputs& p) const override;
  DiffusionTransformer& transformer() override;
  std::map<std::string, uint64_t> weightBytes() const override;

  /// CFG is on for these inputs: guidance > 1 and the model is not distilled.
  bool doClassifierFreeGuidance(const PipelineInputs& p) const;
  /// Packed-token position ids (0, y, x, 0), int64 [h * w, 4], row-major.
  static at::Tensor latentIds(int64_t h, int64_t w);
  /// Text position ids (0, 0, 0, l), int64 [L, 4].
  static at::Tensor textIds(int64_t L);

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

}  // namespace dit
