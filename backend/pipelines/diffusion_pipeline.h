// The Torch-side interface every pipeline family implements (diffusers DiffusionPipeline's role):
// what ditstudio-worker and ditstudio-cli need, independent of the family. Programs create a
// pipeline through the family table (backend/family_runtime.h: loadPipeline) from a ModelFolder and
// only see this interface. The flow-matching families implement it through the shared loop
// pipelines/flow_match_pipeline.h (FLUX.1: pipelines/flux/pipeline_flux.h, FLUX.2 [klein]:
// pipelines/flux2/pipeline_flux2.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/io/model_folder.h"
#include "backend/models/autoencoders/autoencoder_kl_config.h"
#include "backend/models/cache/step_cache_config.h"
#include "backend/models/diffusion_transformer.h"
#include "backend/models/text_encoder_placement.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"

namespace dit {

class ProcessGroup;

struct PipelineOptions {
  at::ScalarType dtype = at::kFloat;  ///< compute dtype (float32, bfloat16, float16)
  std::string device = "cpu";         ///< "cpu" or "cuda[:i]"
  TransformerParallelism parallel;    ///< tp / cp inside the transformer
  std::shared_ptr<ProcessGroup> cfg;  ///< CFG-parallel group of size 2 (null = none)
  /// Tiled VAE decode (diffusers' enable_tiling(); FLUX.1 and FLUX.2 VAEs): off by default.
  VaeTiling vae_tiling;
  /// With vae_tiling on: the ranks that share the tiles of generate()'s final decode (each
  /// decodes its share, rank 0 of the group blends and broadcasts); every rank of it must hold
  /// the same final latents (a tp, cp or cfg group). Null = this rank decodes every tile.
  /// Previews (decode() outside generate()) never use it.
  std::shared_ptr<ProcessGroup> vae_decode;
  /// Where the text encoders live (backend/models/text_encoder_placement.h): sharded under the
  /// tp group (default), on one rank of the tp x cp group (own-rank), in host memory streamed
  /// layer by layer (host-streamed), or loaded per request and freed before the steps (once).
  TextEncoderPlacement text_encoder = TextEncoderPlacement::Sharded;
  /// Entries of the prompt-embedding cache (pipelines/prompt_encoding.h: one per distinct prompt
  /// text and max_sequence_length, least recently used dropped first); 0 = no cache.
  int prompt_cache = 0;
};

/// The pipeline's resolved input for one image (what diffusers' pipeline __call__ takes). Zero or
/// negative values mean "the model's default", filled in by DiffusionPipeline::resolve (FLUX:
/// 128 * vae_scale_factor pixels, 28 steps, max_sequence_length from tokenizer_2). Not the
/// request type of the protocol (protocol::GenerationParams): app/common/generation.h converts.
struct PipelineInputs {
  std::string prompt;
  std::string negative_prompt;
  int width = 0, height = 0;  ///< pixels; multiples of 2 * vae_scale_factor
  int steps = 0;
  double guidance = 3.5;
  /// Seed of the CPU generator (torch.Generator().manual_seed(seed)): the full unsigned 64-bit
  /// range, as PyTorch's.
  uint64_t seed = 0;
  int max_sequence_length = 0;
  /// diffusers' `negative_prompt is not None`: a given empty negative prompt counts (a non-empty
  /// one always does).
  bool negative_prompt_given = false;
  bool hasNegativePrompt() const { return negative_prompt_given || !negative_prompt.empty(); }
  /// The family's own knobs by name (FamilySpec::knobs, e.g. ZImagePipeline's cfg_truncation):
  /// resolve() fills every declared knob (its default when absent) and refuses unknown names;
  /// the guider and the family's hooks read them by the name their spec declares.
  std::map<std::string, double> options;
  /// The knob `name` from `options`, `fallback` when absent (before resolve()).
  double option(const std::string& name, double fallback) const {
    auto it = options.find(name);
    return it != options.end() ? it->second : fallback;
  }
  /// Image-to-image (FluxImg2ImgPipeline; FLUX.2 [klein]: Flux2KleinInpaintPipeline without a
  /// mask): path of the init image, read by every rank; empty = text-to-image. FLUX.1:
  /// width/height 0 = the image's size rounded down to a multiple of 2 * vae_scale_factor;
  /// otherwise the image is resized (PIL LANCZOS) to width x height. FLUX.2 [klein]: always the
  /// image's size (area capped at 1024 x 1024), floored (the family's SizeRule).
  std::string init_image;
  /// Inpainting (FluxInpaintPipeline, Flux2KleinInpaintPipeline): path of the mask (white =
  /// repaint, binarised at 0.5, resized like the init image when its size differs); needs
  /// init_image.
  std::string mask_image;
  /// Editing (Flux2KleinPipeline's image=[...], FluxKontextPipeline's image): paths of the
  /// reference images in order, read by every rank; each is fitted by the family's
  /// RequestSpec::references (fitReference), VAE-encoded once per request (posterior mode: no
  /// draw) and its packed tokens appended to the image tokens in every transformer call. Empty =
  /// none. Not together with init_image.
  std::vector<std::string> reference_images;
  /// How much of the schedule runs, in (0, 1]: t_start = int(N - min(N * strength, N)) and the
  /// start latents are sigma[t_start] * noise + (1 - sigma[t_start]) * image_latents (diffusers'
  /// default 0.6). Used only with init_image.
  double strength = 0.6;
  /// Step caching (First Block Cache or TaylorSeer; off by default).
  StepCacheConfig cache;
  /// The first schedule index run: FluxImg2ImgPipeline.get_timesteps' t_start =
  /// int(max(steps - min(steps * strength, steps), 0)) with an init image, else 0. The pipeline
  /// runs steps - firstStep() denoising steps.
  int firstStep() const { return init_image.empty() ? 0 : img2imgStartIndex(steps, strength); }
};

struct PipelineCallbacks {
  /// Called when a stage starts: "tokenize", "encode", "denoise", "decode".
  std::function<void(const std::string& stage)> onStage;
  /// After each denoising step (1-based), with the current packed latents and the x0 estimate
  /// (latents - sigma * v) and the step's wall time in ms. Return false to cancel.
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
  PipelineInputs params;  ///< resolved inputs (defaults filled in)
  /// Index of the first schedule step run (img2img / inpaint strength; 0 for text-to-image);
  /// steps_done counts executed steps (at most steps - t_start).
  int t_start = 0;
  /// Step caching, per executed step: 1 = the cached part was computed, 0 = reused/predicted
  /// (empty without caching); First Block Cache's relative L1 per step (-1 = none).
  std::vector<int> cache_computed;
  std::vector<double> cache_rel_l1;
  /// Image-to-image / inpainting intermediates (float32, CPU), diffusers' names: vae_eps, noise,
  /// image_latents (unpacked), image_in ([1,3,H,W] preprocessed), and for inpainting mask_in,
  /// masked_image_in, masked_image_vae_eps, masked_image_latents, mask_latents (packed); from
  /// generate(): prompt_embeds / negative_prompt_embeds, the encoder_hidden_states this rank's
  /// transformer got ([1, L, D] or the family's shape) for the branches it ran.
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, double> timings_ms;  ///< tokenize, encode, step.i, denoise, decode
  /// Prompt texts of this image whose conditioning came from the prompt-embedding cache, and
  /// those this rank's group encoded (PipelineOptions::prompt_cache).
  int prompt_cache_hits = 0;
  int prompts_encoded = 0;
};

/// What the worker's `ready` event reports about the loaded model (app/PROTOCOL.md).
struct PipelineModelInfo {
  int num_attention_heads = 0;
  int inner_dim = 0;          ///< heads x head dim
  int num_layers = 0;         ///< dual-stream (text + image) blocks
  int num_single_layers = 0;  ///< single-stream blocks (0 when the family has none)
  int vae_scale_factor = 8;   ///< pixels per latent pixel
  int default_steps = 28;
  bool guidance_embeds = false;   ///< takes a distilled guidance scale
  int max_sequence_length = 512;  ///< default text tokens
};

class DiffusionPipeline {
 public:
  virtual ~DiffusionPipeline() = default;
  /// The folder the pipeline was loaded from.
  virtual const ModelFolder& model() const = 0;
  /// Sizes and defaults of the loaded model.
  virtual PipelineModelInfo info() const = 0;
  /// Fills defaults and validates sizes. Throws std::invalid_argument with the fix to apply.
  virtual PipelineInputs resolve(PipelineInputs p) const = 0;
  /// The whole pipeline for one image (collective over the pipeline's groups).
  virtual GenerationResult generate(const PipelineInputs& params,
                                    const PipelineCallbacks& cb = {}) = 0;
  /// Decodes packed latents (e.g. a step's x0 estimate, for previews) to an image [3, H, W]
  /// float32 in [0, 1]; height/width in pixels.
  virtual at::Tensor decode(const at::Tensor& packed, int height, int width) = 0;
  /// What diffusers would warn about for this request, without running it (one sentence each):
  /// truncated prompts per encoder, settings without effect. Throws as resolve() does.
  virtual std::vector<std::string> requestWarnings(const PipelineInputs& p) const = 0;
  /// The denoiser, for hooks and per-parameter figures.
  virtual DiffusionTransformer& transformer() = 0;
  /// Bytes of weights held by this rank, per component ("transformer", "text_encoder", ...).
  virtual std::map<std::string, uint64_t> weightBytes() const = 0;
};

/// image [3, H, W] float in [0, 1] -> 8-bit RGB bytes, row-major (round half to even as
/// numpy's (x * 255).round()).
std::vector<uint8_t> toRGB8(const at::Tensor& image);

}  // namespace dit
