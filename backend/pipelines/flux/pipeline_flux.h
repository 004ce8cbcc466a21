// FluxPipeline (diffusers pipelines/flux/pipeline_flux.py): prompt encoding (CLIP pooled +
// T5 sequence), seeded CPU noise, 2x2 latent packing, FlowMatchEulerDiscreteScheduler loop with
// optional true CFG, VAE decode and post-processing. Parallel strategies plug in through
// PipelineOptions (tensor/context parallel inside the transformer, CFG parallel across a group
// of two). Data parallel is handled above this class (each replica runs its own pipeline).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/models/flux/transformer_flux.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"

namespace dit {

class ProcessGroup;

struct PipelineOptions {
  at::ScalarType dtype = at::kFloat;  ///< compute dtype (float32, bfloat16, float16)
  std::string device = "cpu";         ///< "cpu" or "cuda[:i]"
  FluxParallelism parallel;           ///< tp / cp inside the transformer
  std::shared_ptr<ProcessGroup> cfg;  ///< CFG-parallel group of size 2 (null = none)
};

/// One request. Zero/negative values mean "the model's default" (FluxPipeline's defaults:
/// 128 * vae_scale_factor pixels, 28 steps, guidance 3.5, max_sequence_length from tokenizer_2).
struct GenerationParams {
  std::string prompt;
  std::string negative_prompt;
  /// diffusers' `negative_prompt is not None`: a given empty negative prompt counts (a non-empty
  /// one always does).
  bool negative_prompt_given = false;
  double true_cfg_scale = 1.0;
  int width = 0, height = 0;  ///< pixels; multiples of 2 * vae_scale_factor
  int steps = 0;
  double guidance = 3.5;
  /// Seed of the CPU generator (torch.Generator().manual_seed(seed)): the full unsigned 64-bit
  /// range, as PyTorch's.
  uint64_t seed = 0;
  int max_sequence_length = 0;
  bool hasNegativePrompt() const { return negative_prompt_given || !negative_prompt.empty(); }
  /// FluxPipeline.__call__: do_true_cfg = true_cfg_scale > 1 and has_neg_prompt.
  bool trueCfg() const { return hasNegativePrompt() && true_cfg_scale > 1.0; }
};

struct PromptEmbeds {
  at::Tensor prompt_embeds;  ///< [1, L, joint_attention_dim]
  at::Tensor pooled;         ///< [1, pooled_projection_dim]
  at::Tensor text_ids;       ///< [L, 3] zeros
  double tokenize_ms = 0, encode_ms = 0;  ///< wall time of tokenization and of the encoders
};

struct PipelineCallbacks {
  /// Called when a stage starts: "tokenize", "encode", "denoise", "decode".
  std::function<void(const std::string& stage)> onStage;
  /// After each denoising step (1-based), with the current packed latents and the x0 estimate
  /// (latents - sigma * v) and the step's wall time. Return false to cancel.
  std::function<bool(int step, int steps, const at::Tensor& latents, const at::Tensor& x0,
                     double step_ms)>
      onStep;
};

struct GenerationResult {
  at::Tensor initial_latents;  ///< packed [1, S_img, 4*C] float32
  at::Tensor final_latents;    ///< packed, float32
  at::Tensor image;            ///< [3, H, W] float32 in [0, 1]
  bool cancelled = false;
  int steps_done = 0;
  GenerationParams params;     ///< resolved parameters (defaults filled in)
  std::map<std::string, double> timings_ms;  ///< tokenize, encode, step.i, denoise, decode
};

class FluxPipeline {
 public:
  /// Loads every component from `model` (throws ModelFileError / std::invalid_argument naming
  /// the file or the degree that does not fit).
  FluxPipeline(const ModelFolder& model, const PipelineOptions& opts);
  ~FluxPipeline();

  const ModelFolder& model() const;
  /// Fills defaults and validates sizes: width/height multiples of 2*vae_scale_factor, steps >=
  /// 1, max_sequence_length in [1, 512]. Throws std::invalid_argument with the fix to apply.
  GenerationParams resolve(GenerationParams p) const;

  /// CLIP pooled + T5 sequence for one prompt (FluxPipeline.encode_prompt).
  PromptEmbeds encodePrompt(const std::string& prompt, int max_sequence_length);
  /// Seeded N(0,1) noise from the CPU generator, packed: [1, (h/2)(w/2), 4C] float32, where
  /// h = height / vae_scale_factor.
  at::Tensor initialLatents(uint64_t seed, int height, int width) const;
  /// img_ids [(h/2)(w/2), 3] float32 (0, row, col).
  static at::Tensor latentImageIds(int h2, int w2);
  /// Unpacks, unscales (latents / scaling_factor + shift_factor) and decodes:
  /// image [3, H, W] float32 in [0, 1].
  at::Tensor decode(const at::Tensor& packed, int height, int width);
  /// What diffusers would warn about for this request, without running it (each one sentence):
  /// prompts truncated by an encoder (diffusers' "The following part of your input was truncated
  /// because CLIP can only handle sequences up to 77 tokens" and T5's `max_sequence_length`
  /// warning), per encoder and prompt with the number of tokens dropped; true_cfg_scale > 1
  /// without a negative prompt and a negative prompt with true_cfg_scale <= 1 (FluxPipeline's
  /// "classifier-free guidance is not enabled" warnings); a non-default guidance on a model
  /// without guidance embeds (no effect). `p` is resolved first (throws as resolve does).
  std::vector<std::string> requestWarnings(const GenerationParams& p) const;
  /// The whole pipeline for one image.
  GenerationResult generate(const GenerationParams& params, const PipelineCallbacks& cb = {});

  FluxTransformer2DModel& transformer();
  /// Bytes of weights held by this rank, per component ("transformer", "text_encoder", ...).
  std::map<std::string, uint64_t> weightBytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

/// image [3, H, W] float in [0, 1] -> 8-bit RGB bytes, row-major (round half to even as
/// numpy's (x * 255).round()).
std::vector<uint8_t> toRGB8(const at::Tensor& image);

}  // namespace dit
