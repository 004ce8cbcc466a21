// ZImagePipeline (diffusers pipelines/z_image/pipeline_z_image.py) on the shared loop
// (pipelines/flow_match_pipeline.h): the prompt through the Qwen3 chat template with
// enable_thinking=True, Qwen2Tokenizer (max_length 512, right padding) and Qwen3Model's
// hidden_states[-2], keeping only the real tokens' rows (ZImagePipeline._encode_prompt); noise
// drawn as randn (1, C, H / vsf, W / vsf) which is the loop's latent layout for this family (the
// transformer patchifies itself); the FlowMatchEulerDiscreteScheduler with the scheduler config's
// static or dynamic shift (mu = calculate_shift, used only with dynamic shifting); the
// transformer's time input (1000 - timestep) / 1000 and its output negated for the scheduler;
// CFG when guidance_scale > 0: pred = pos + g (pos - neg) in float32, with cfg_truncation (steps
// whose normalised time exceeds it run the positive prompt only) and cfg_normalization (the
// guided prediction's L2 norm clipped to cfg_normalization x the positive one's), the negative
// prompt "" unless given; then latents / scaling_factor + shift_factor through AutoencoderKL's
// decoder. Parallel strategies come from PipelineOptions: tp and ring/Ulysses inside the
// transformer (its declared plans, zimage/zimage_plan.h), cfg 2 splits the two CFG branches over
// two ranks (truncated steps run on rank 0 and are shared), dp is the worker's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/pipelines/diffusion_pipeline.h"
#include "backend/pipelines/flow_match_pipeline.h"
#include "backend/pipelines/zimage/zimage_pipeline_config.h"

namespace dit {

class ZImageTransformer2DModel;
class AutoencoderKL;
class Qwen2Tokenizer;
class Qwen3Model;

/// The text side of ZImagePipeline (_encode_prompt): Qwen2Tokenizer + Qwen3Model placed as
/// PipelineOptions::text_encoder says (under the transformer's tp group by default), with the
/// decoder layers up to hidden_states[-2] only.
class ZImagePromptEncoder {
 public:
  /// Loads tokenizer/ and text_encoder/ of `model` (layers 1 .. num_hidden_layers - 1; the
  /// encoder's weights not yet under the once placement). Throws ModelFileError naming the file.
  ZImagePromptEncoder(const ModelFolder& model, const PipelineOptions& opts);
  ~ZImagePromptEncoder();
  /// The chat-template string (enable_thinking=True) tokenized: {input_ids, attention_mask} int64
  /// [max_sequence_length] (truncated, right-padded with <|endoftext|>).
  std::pair<at::Tensor, at::Tensor> tokenize(const std::string& prompt,
                                             int max_sequence_length) const;
  /// prompt_embeds float32 [n_real, hidden_size] on the encoder's device: hidden_states[-2] of the
  /// real (mask 1) tokens only. Collective over the text encoder's tp group.
  at::Tensor encode(const std::string& prompt, int max_sequence_length) const;
  /// Tokens of the chat-template string before truncation.
  size_t untruncatedTokens(const std::string& prompt) const;
  /// Bytes of the encoder's weights this rank holds (0 while released; host bytes when
  /// streamed).
  uint64_t weightBytes() const;
  /// Loads the encoder's weights as the options place them (textEncoderTpGroup, host-streamed);
  /// the tokenizer stays loaded throughout. No-op when loaded.
  void load();
  /// Frees the encoder's weights (encode() throws until load()).
  void release();
  bool loaded() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

class ZImagePipeline : public FlowMatchPipeline {
 public:
  /// Loads the transformer and the VAE from `model` and takes the text side `encoder` (null:
  /// prompts are refused; generateFromEmbeddings() runs). Throws ModelFileError /
  /// std::invalid_argument naming the file or the degree that does not fit.
  ZImagePipeline(const ModelFolder& model, const PipelineOptions& opts,
                 std::unique_ptr<ZImagePromptEncoder> encoder);
  ~ZImagePipeline() override;

  /// Heads, dim, main layers (as single-stream), vae_scale_factor, 50 default steps, no guidance
  /// embedding, 512 text tokens.
  PipelineModelInfo info() const override;
  /// Denoising and decoding with given prompt embeddings [n, cap_feat_dim] or [1, n,
  /// cap_feat_dim] (`negative_embeds` used when CFG is on: guidance > 0). `params` is resolved
  /// first. Collective over the pipeline's groups.
  GenerationResult generateFromEmbeddings(const PipelineInputs& params,
                                          const at::Tensor& prompt_embeds,
                                          const at::Tensor& negative_embeds,
                                          const PipelineCallbacks& cb = {});
  /// latents [1, C, H / vsf, W / vsf] -> image [3, H, W] float32 in [0, 1] (CPU).
  at::Tensor decode(const at::Tensor& latents, int height, int width) override;
  std::vector<std::string> requestWarnings(const PipelineInputs& p) const override;
  DiffusionTransformer& transformer() override;
  std::map<std::string, uint64_t> weightBytes() const override;
  bool textEncodersLoaded() const override;

 protected:
  PromptConditioning encodePromptConditioning(const std::string& prompt,
                                              int max_sequence_length) override;
  void loadTextEncoders() override;
  void releaseTextEncoders() override;
  const SchedulerConfig& schedulerConfig() const override;
  /// The folder's scheduler config with the request's `shift` knob as its static shift
  /// (diffusers: FlowMatchEulerDiscreteScheduler.from_config(config, shift=S)); the folder's
  /// shift when the request has none.
  SchedulerConfig schedulerConfigFor(const PipelineInputs& p) const override;
  /// calculate_shift(image_seq_len, ...) from the scheduler config (ignored by a static shift).
  double scheduleMu(int image_seq_len, int steps) const override;
  /// randn [1, C, 2h, 2w] (float32, CPU): the latent layout the loop runs in for Z-Image.
  at::Tensor drawNoise(at::Generator& gen, int64_t h, int64_t w,
                       GenerationResult& res) const override;
  /// Not supported (the family declares no img2img): throws std::invalid_argument.
  at::Tensor encodeImage(const at::Tensor& image, at::Generator& gen,
                         GenerationResult& res) override;
  void prepareTransformerInputs(const PipelineInputs& p, FlowMatchLatents& latents) override;
  /// (1000 - timestep) / 1000 in float32, kept float32 whatever the compute dtype (as
  /// ZImagePipeline passes it to the transformer).
  at::Tensor modelTimestep(float timestep, at::ScalarType dtype) const override;
  /// -prediction (ZImagePipeline: noise_pred = -noise_pred).
  at::Tensor schedulerModelOutput(const at::Tensor& prediction) const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

}  // namespace dit
