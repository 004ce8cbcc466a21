// FluxPipeline (diffusers pipelines/flux/pipeline_flux.py): prompt encoding (CLIP pooled +
// T5 sequence), seeded CPU noise, 2x2 latent packing, FlowMatchEulerDiscreteScheduler loop with
// optional true CFG, VAE decode and post-processing. Parallel strategies plug in through
// PipelineOptions (tensor/context parallel inside the transformer, CFG parallel across a group
// of two). Data parallel is handled above this class (each replica runs its own pipeline).
// Programs reach it through the DiffusionPipeline interface (loadPipeline,
// backend/family_runtime.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/models/flux/transformer_flux.h"
#include "backend/pipelines/diffusion_pipeline.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"

namespace dit {

struct PromptEmbeds {
  at::Tensor prompt_embeds;               ///< [1, L, joint_attention_dim]
  at::Tensor pooled;                      ///< [1, pooled_projection_dim]
  at::Tensor text_ids;                    ///< [L, 3] zeros
  double tokenize_ms = 0, encode_ms = 0;  ///< wall time of tokenization and of the encoders
};

class FluxPipeline : public DiffusionPipeline {
 public:
  /// Loads every component from `model` (throws ModelFileError / std::invalid_argument naming
  /// the file or the degree that does not fit).
  FluxPipeline(const ModelFolder& model, const PipelineOptions& opts);
  ~FluxPipeline() override;

  const ModelFolder& model() const override;
  /// Sizes from the FLUX configs: heads, inner dim, double/single blocks, the VAE scale factor,
  /// 28 default steps, guidance_embeds, min(512, tokenizer_2 model_max_length) text tokens.
  PipelineModelInfo info() const override;
  /// Fills defaults and validates sizes: width/height multiples of 2*vae_scale_factor, steps >=
  /// 1, max_sequence_length in [1, 512]; with an init image, width/height default to its size
  /// (rounded down), strength must be in (0, 1] and run at least one step, a mask needs an init
  /// image. Throws std::invalid_argument with the fix to apply; std::runtime_error naming an
  /// unreadable init image.
  PipelineInputs resolve(PipelineInputs p) const override;

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
  /// The whole pipeline for one image: text-to-image (FluxPipeline), image-to-image
  /// (FluxImg2ImgPipeline, with init_image) or inpainting (FluxInpaintPipeline, with
  /// init_image and mask_image), optionally with step caching (PipelineInputs::cache).
  /// Throws std::runtime_error naming an unreadable init image or mask.
  GenerationResult generate(const PipelineInputs& params,
                            const PipelineCallbacks& cb = {}) override;

  FluxTransformer2DModel& transformer() override;
  /// Bytes of weights held by this rank, per component ("transformer", "text_encoder", ...).
  std::map<std::string, uint64_t> weightBytes() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

/// FluxImg2ImgPipeline.get_timesteps: the first schedule index run for `steps` and `strength`,
/// int(max(steps - min(steps * strength, steps), 0)) in Python float arithmetic.
int img2imgStart(int steps, double strength);

}  // namespace dit
