// FluxPipeline (diffusers pipelines/flux/pipeline_flux.py) on the shared loop
// (pipelines/flow_match_pipeline.h): prompt encoding (CLIP pooled + T5 sequence), seeded CPU
// noise, 2x2 latent packing, the distilled guidance embedding and optional true CFG, VAE decode
// and post-processing; with an init image FluxImg2ImgPipeline, with a mask FluxInpaintPipeline.
// Parallel strategies plug in through PipelineOptions (tensor/context parallel inside the
// transformer, CFG parallel across a group of two). Data parallel is handled above this class (each
// replica runs its own pipeline). Programs reach it through the DiffusionPipeline interface
// (loadPipeline, backend/family_runtime.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/models/flux/transformer_flux.h"
#include "backend/pipelines/diffusion_pipeline.h"
#include "backend/pipelines/flow_match_pipeline.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"

namespace dit {

struct PromptEmbeds {
  at::Tensor prompt_embeds;               ///< [1, L, joint_attention_dim]
  at::Tensor pooled;                      ///< [1, pooled_projection_dim]
  at::Tensor text_ids;                    ///< [L, 3] zeros
  double tokenize_ms = 0, encode_ms = 0;  ///< wall time of tokenization and of the encoders
};

class FluxPipeline : public FlowMatchPipeline {
 public:
  /// Loads every component from `model` (throws ModelFileError / std::invalid_argument naming
  /// the file or the degree that does not fit).
  FluxPipeline(const ModelFolder& model, const PipelineOptions& opts);
  ~FluxPipeline() override;

  /// Sizes from the FLUX configs: heads, inner dim, double/single blocks, the VAE scale factor,
  /// 28 default steps, guidance_embeds, min(512, tokenizer_2 model_max_length) text tokens.
  PipelineModelInfo info() const override;

  /// CLIP pooled + T5 sequence for one prompt (FluxPipeline.encode_prompt).
  PromptEmbeds encodePrompt(const std::string& prompt, int max_sequence_length);
  /// Seeded N(0,1) noise from the CPU generator, packed: [1, (h/2)(w/2), 4C] float32, where
  /// h = height / vae_scale_factor.
  at::Tensor initialLatents(uint64_t seed, int height, int width) const;
  /// img_ids [(h/2)(w/2), 3] float32 (0, row, col).
  static at::Tensor latentImageIds(int h2, int w2);
  /// Unpacks, unscales (latents / scaling_factor + shift_factor) and decodes:
  /// image [3, H, W] float32 in [0, 1].
  at::Tensor decode(const at::Tensor& packed, int height, int width) override;
  /// What diffusers would warn about for this request, without running it (each one sentence):
  /// prompts truncated by an encoder (diffusers' "The following part of your input was truncated
  /// because CLIP can only handle sequences up to 77 tokens" and T5's `max_sequence_length`
  /// warning), per encoder and prompt with the number of tokens dropped; true_cfg_scale > 1
  /// without a negative prompt and a negative prompt with true_cfg_scale <= 1 (FluxPipeline's
  /// "classifier-free guidance is not enabled" warnings); a non-default guidance on a model
  /// without guidance embeds (no effect). `p` is resolved first (throws as resolve does).
  std::vector<std::string> requestWarnings(const PipelineInputs& p) const override;

  FluxTransformer2DModel& transformer() override;
  /// Bytes of weights held by this rank, per component ("transformer", "text_encoder", ...).
  std::map<std::string, uint64_t> weightBytes() const override;
  bool textEncodersLoaded() const override;

 protected:
  PromptConditioning encodePromptConditioning(const std::string& prompt,
                                              int max_sequence_length) override;
  /// CLIP and T5 (whole: no tensor-parallel plan); host-streamed is refused at construction.
  void loadTextEncoders() override;
  void releaseTextEncoders() override;
  const SchedulerConfig& schedulerConfig() const override;
  /// calculate_shift(image_seq_len, base_image_seq_len, max_image_seq_len, base_shift, max_shift).
  double scheduleMu(int image_seq_len, int steps) const override;
  /// randn [1, C, 2h, 2w] (the unpacked latent layout; "noise" in res.tensors), packed 2x2.
  at::Tensor drawNoise(at::Generator& gen, int64_t h, int64_t w,
                       GenerationResult& res) const override;
  /// FluxImg2ImgPipeline._encode_vae_image: a posterior SAMPLE from `gen` ("vae_eps"), then
  /// (z - shift_factor) * scaling_factor ("image_latents", unpacked), packed.
  at::Tensor encodeImage(const at::Tensor& image, at::Generator& gen,
                         GenerationResult& res) override;
  /// FluxInpaintPipeline.prepare_mask_latents: the masked image encoded (a second posterior
  /// sample from `gen`; "masked_image_in", "masked_image_vae_eps", "masked_image_latents"), the
  /// mask resized (nearest) to the latent resolution ("mask_latent_hw"), repeated over the
  /// channels and packed per 2x2 sub-pixel: [1, h * w, 4C].
  at::Tensor prepareMask(const at::Tensor& mask, const at::Tensor& image, at::Generator& gen,
                         int64_t h, int64_t w, GenerationResult& res) override;
  /// FluxKontextPipeline's reference: the posterior mode (no draw), (z - shift_factor) *
  /// scaling_factor ("ref_latents_unpacked.<index>" [1, C, 2h, 2w]), packed [1, h * w, 4C]
  /// float32 CPU.
  at::Tensor encodeReference(const at::Tensor& image, int index, GenerationResult& res) override;
  /// (1, row, col) float32 [h * w, 3] (FluxKontextPipeline.prepare_latents: image_ids[..., 0] = 1).
  at::Tensor referenceIds(int index, int64_t h, int64_t w) const override;
  /// img_ids (0, row, col) float32 (with a Kontext reference its ids appended) and, with
  /// guidance_embeds, the distilled guidance [1].
  void prepareTransformerInputs(const PipelineInputs& p, FlowMatchLatents& latents) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

/// FluxImg2ImgPipeline.get_timesteps: the first schedule index run for `steps` and `strength`,
/// int(max(steps - min(steps * strength, steps), 0)) in Python float arithmetic.
int img2imgStart(int steps, double strength);

}  // namespace dit
