// FlowMatchPipeline: the ONE denoising loop of the flow-matching families (FLUX.1, FLUX.2 [klein],
// ...), the shape of diffusers' modular pipelines (modular_pipelines/flux/denoise.py: the loop
// written once, a family supplies the step blocks) and of stable-diffusion.cpp's single sampler.
//
// It owns: resolve() with the shared limits and the generic capability refusal
// (pipeline_capabilities.h); the schedule (FlowMatchEulerDiscreteScheduler::setTimesteps with
// img2img's strength / t_start); the latents (text-to-image noise, FluxImg2ImgPipeline's and
// Flux2KleinInpaintPipeline's start through scheduler.scale_noise, the inpaint mask); CFG and the
// cfg_degree 2 exchange (rank 0 of the cfg group the conditional branch, rank 1 the
// unconditional one, one allgather per step); scheduler.step; the inpaint blend
// (FluxInpaintPipeline / Flux2KleinInpaintPipeline: the re-noised original outside the mask, the
// clean one after the last step); step caching through DiffusionTransformer::setStepCache; the
// stage / per-step callbacks with x0 previews; cancellation; timings; decode.
//
// A family declares its request once (FamilySpec::request: defaults, size rule, guider kind and
// knobs; resolve() and the Guider read it) and its pipeline
// (pipelines/<family>/pipeline_<family>.cpp) supplies the hooks: prompt encoding, the schedule's
// mu, noise drawing and packing, image encoding, the mask on its latent layout, the fixed
// transformer inputs (position ids, guidance, conditioning tokens) and decode. Every tensor the
// loop handles is packed latents [1, S_img, C_packed] (float32 on the CPU between stages, the
// compute dtype on the device in the loop).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "backend/io/image_io.h"
#include "backend/models/request_spec.h"
#include "backend/pipelines/diffusion_pipeline.h"
#include "backend/pipelines/guider.h"
#include "backend/pipelines/pipeline_capabilities.h"
#include "backend/schedulers/flow_match_euler_discrete_scheduler.h"

namespace dit {

struct FamilySpec;
class PromptEmbeddingCache;

/// One prompt's text conditioning as the transformer takes it (diffusers' encode_prompt output),
/// by the transformer's input names: e.g. FLUX.1 "encoder_hidden_states" [1, L, 4096],
/// "pooled_projections" [1, 768], "txt_ids" [L, 3]; FLUX.2 "encoder_hidden_states" [1, L, D],
/// "txt_ids" [L, 4] int64. On the pipeline's device; empty = not encoded on this rank.
struct PromptConditioning {
  TransformerInputs inputs;
  double tokenize_ms = 0, encode_ms = 0;  ///< wall time of tokenization and of the encoders
  bool defined() const { return !inputs.empty(); }
};

/// The latents of one generation (packed, float32, CPU) and what the loop needs beyond them.
struct FlowMatchLatents {
  int64_t h = 0, w = 0;      ///< the token grid: height, width / (2 x vae_scale_factor)
  at::Tensor latents;        ///< the first transformer input [1, h * w, C]
  at::Tensor noise;          ///< with an init image: the noise draw [1, h * w, C]
  at::Tensor image_latents;  ///< with an init image: the clean image latents [1, h * w, C]
  at::Tensor mask;           ///< inpainting: 1 = repaint, broadcastable to [1, h * w, C]
  /// Inputs every transformer call of the loop gets besides hidden_states, timestep and the
  /// prompt's (family-set in prepareTransformerInputs: "img_ids", "guidance", ...), on the device.
  TransformerInputs fixed_inputs;
  /// Conditioning tokens appended after the noisy tokens every step (Flux2KleinInpaintPipeline's
  /// init image; the reference images of Flux2KleinPipeline(image=[...]) and
  /// FluxKontextPipeline) [1, S_ref, C] on the device in the compute dtype; the prediction is cut
  /// back to the first h * w tokens. Undefined = none.
  at::Tensor reference_tokens;
  /// The reference images' position ids [S_ref, axes] (CPU, the family's id dtype), in the order
  /// of reference_tokens; the family appends them to img_ids. Undefined = no reference images.
  at::Tensor reference_ids;
};

class FlowMatchPipeline : public DiffusionPipeline {
 public:
  ~FlowMatchPipeline() override;

  const ModelFolder& model() const override { return model_; }
  /// The family's capabilities (its record, FamilySpec::caps).
  const FamilyCapabilities& capabilities() const { return caps_; }

  /// The family's declared request (requestSpecOf the model) resolved for `p`
  /// (resolveRequest, backend/models/request_spec.h: defaults, ranges, knobs, inputs, the size
  /// rule with the init image's size). Throws std::invalid_argument with every problem's message
  /// (the fix to apply); std::runtime_error naming an unreadable init image.
  PipelineInputs resolve(PipelineInputs p) const override;

  /// The whole pipeline for one image: resolve, the prompt encodings this rank needs (under
  /// cfg_degree 2 each rank encodes only its branch), then denoise(). Timings "tokenize",
  /// "encode", "encode_total" plus denoise()'s. Collective over the pipeline's groups. Throws as
  /// resolve() and denoise() do.
  GenerationResult generate(const PipelineInputs& params,
                            const PipelineCallbacks& cb = {}) override;

  /// The family's request declaration (requestSpecOf the model).
  const RequestSpec& requestSpec() const { return spec_; }
  /// The guider for resolved inputs `p` (the family's GuiderSpec).
  Guider guider(const PipelineInputs& p) const { return Guider(spec_.guider, p); }

  /// The text encoders are loaded on this rank now (false on an own-rank placement's other
  /// ranks, and under `once` between requests).
  virtual bool textEncodersLoaded() const = 0;
  /// The prompt-embedding cache's hits and misses since the pipeline was built (0 without a
  /// cache: PipelineOptions::prompt_cache 0).
  uint64_t promptCacheHits() const;
  uint64_t promptCacheMisses() const;

 protected:
  /// Checks the device (CUDA build for "cuda", no float16 on the CPU) and the tensor-parallel
  /// degree against the family's declared plans (model.dims()), before any weight is read.
  /// `family` is the subclass's own record (fluxFamily(), ...: the loop reaches its family
  /// through it, not through the family table); the folder's pipeline class must be its
  /// pipeline_class or one of its pipeline_variants. Throws std::invalid_argument naming the fix
  /// or the class mismatch.
  FlowMatchPipeline(const ModelFolder& model, const PipelineOptions& opts,
                    const FamilySpec& family);

  const PipelineOptions& options() const { return opts_; }
  const c10::Device& device() const { return device_; }
  bool cfgParallel() const;
  /// options().vae_decode during generate()'s final decode (collective there), else null: the
  /// group a family's decode() hands to the VAE's tiled decode.
  ProcessGroup* finalDecodeGroup() const { return finalDecode_ ? opts_.vae_decode.get() : nullptr; }

  /// The denoising loop and decode for resolved inputs `p` and the prompt conditionings this
  /// rank needs (`pos` except on cfg rank 1, `neg` when CFG runs except on cfg rank 0).
  /// GenerationResult: initial/final latents (packed float32 CPU), the image, t_start,
  /// steps_done, cache figures, timings "step.i", "denoise", "decode" (and "encode_image" with an
  /// init image) and the family's intermediates. Throws std::invalid_argument when cfg_degree 2
  /// runs without CFG or a needed conditioning is missing; std::runtime_error naming an
  /// unreadable init image or mask. Collective over the pipeline's groups.
  GenerationResult denoise(const PipelineInputs& p, const PromptConditioning& pos,
                           const PromptConditioning& neg, const PipelineCallbacks& cb);

  /// Pixels per latent pixel (the family's SizeRule).
  int vaeScaleFactor() const { return spec_.size.vae_scale_factor; }

  /// This rank runs the text encoders (encodesPrompts(options()): always, except on an own-rank
  /// placement's other ranks) and loads them when the pipeline is built (not under `once`).
  bool encodesPrompts() const;
  bool loadsTextEncodersAtStart() const;
  /// The group a text encoder with its own tensor-parallel plan is sharded under (the
  /// transformer's tp group; null under own-rank: the encoding rank holds it whole).
  std::shared_ptr<ProcessGroup> textEncoderTp() const;
  /// The text-encoder placement host-streamed: Qwen3Model's streamTo device.
  bool streamsTextEncoder() const {
    return opts_.text_encoder == TextEncoderPlacement::HostStreamed;
  }

  // ---- Family hooks ----
  /// One prompt's conditioning (collective over the text encoder's groups). Called only on a
  /// rank that encodesPrompts(), with the encoders loaded.
  virtual PromptConditioning encodePromptConditioning(const std::string& prompt,
                                                      int max_sequence_length) = 0;
  /// Loads this rank's text encoders (the `once` placement calls it before each request's
  /// prompts; a family loads them from its constructor when loadsTextEncodersAtStart()), sharded
  /// under textEncoderTp(), host-resident when streamsTextEncoder(). Throws as loading does.
  virtual void loadTextEncoders() = 0;
  /// Frees this rank's text encoders (tokenizers may stay: they are small and requestWarnings
  /// reads them). No-op when none are loaded.
  virtual void releaseTextEncoders() = 0;
  virtual const SchedulerConfig& schedulerConfig() const = 0;
  /// The scheduler configuration of one request: schedulerConfig() (the folder's
  /// scheduler_config.json) unless the family reads a request knob into it, as diffusers'
  /// `FlowMatchEulerDiscreteScheduler.from_config(config, shift=S)` does (ZImagePipeline's
  /// `shift`). Called once per denoise, on every rank with the same inputs.
  virtual SchedulerConfig schedulerConfigFor(const PipelineInputs&) const {
    return schedulerConfig();
  }
  /// The schedule's mu for `image_seq_len` packed tokens and N = `steps` (FLUX.1:
  /// calculate_shift; FLUX.2: compute_empirical_mu).
  virtual double scheduleMu(int image_seq_len, int steps) const = 0;
  /// Draws the initial noise from `gen` in the family's layout and returns it packed
  /// [1, h * w, C] float32 CPU; may record it in res.tensors.
  virtual at::Tensor drawNoise(at::Generator& gen, int64_t h, int64_t w,
                               GenerationResult& res) const = 0;
  /// The init image preprocessed [1, 3, height, width] float32 in [-1, 1] (default:
  /// VaeImageProcessor.preprocess, image_processor.h).
  virtual at::Tensor preprocessInitImage(const Image8& image, int height, int width) const;
  /// Encodes a preprocessed image to packed latents [1, h * w, C] float32 CPU (the family's VAE
  /// and normalisation; a posterior sample may draw from `gen`); may record intermediates.
  virtual at::Tensor encodeImage(const at::Tensor& image, at::Generator& gen,
                                 GenerationResult& res) = 0;
  /// The binarised mask [1, 1, H, W] (1 = repaint) on the packed latents, broadcastable to
  /// [1, h * w, C]. Default (Flux2KleinInpaintPipeline.prepare_mask_latents): bilinear
  /// (align_corners false, no antialias) straight to the h x w token grid, packed [1, h * w, 1].
  /// `image` is the preprocessed init image (FLUX.1 also encodes the masked image from `gen`).
  virtual at::Tensor prepareMask(const at::Tensor& mask, const at::Tensor& image,
                                 at::Generator& gen, int64_t h, int64_t w, GenerationResult& res);
  /// The start of the loop: noise for text-to-image; with an init image (encode_image stage):
  /// preprocess, encode, noise, scale_noise at sigmas[t_start], and with a mask the mask. One CPU
  /// generator seeded with p.seed serves every draw in diffusers' order (image encoding, noise,
  /// mask). Overridable; the default calls the hooks above.
  virtual FlowMatchLatents prepareLatents(const PipelineInputs& p,
                                          const FlowMatchEulerDiscreteScheduler& scheduler,
                                          const PipelineCallbacks& cb, GenerationResult& res);
  /// Reference image `index` (0-based) of the request, fitted by the family's
  /// RequestSpec::references (`fit`: fitReference) and preprocessed: [1, 3, fit.height,
  /// fit.width] float32 in [-1, 1]. Default: CenterCrop scales to the area cap (PIL LANCZOS) and
  /// centre-crops (Flux2ImageProcessor._resize_and_crop); Resize resamples (PIL LANCZOS) to the
  /// fitted size (FluxKontextPipeline); then VaeImageProcessor's x / 255 * 2 - 1.
  virtual at::Tensor preprocessReference(const Image8& image, const ReferenceFit& fit) const;
  /// Encodes a preprocessed reference to packed latents [1, h * w, C] float32 CPU: the posterior
  /// MODE (no generator draw, so the noise is the draw of the same request without references)
  /// and the family's normalisation; may record "ref_latents_unpacked.<index>". Default: throws
  /// std::invalid_argument (the family takes no reference images).
  virtual at::Tensor encodeReference(const at::Tensor& image, int index, GenerationResult& res);
  /// Position ids of reference `index`'s h x w tokens [h * w, axes] CPU in the family's id
  /// dtype (FLUX.2: (10 + 10 index, y, x, 0) int64; FLUX.1 Kontext: (1, y, x) float32).
  /// Default: throws as encodeReference.
  virtual at::Tensor referenceIds(int index, int64_t h, int64_t w) const;
  /// Sets latents.fixed_inputs (position ids, guidance, ...) and reference_tokens for the loop.
  virtual void prepareTransformerInputs(const PipelineInputs& p, FlowMatchLatents& latents) = 0;
  /// The transformer's time input [1] for scheduler timestep `timestep` (0..1000), on the device
  /// in `dtype`. Default: timestep / 1000 (FluxPipeline, Flux2KleinPipeline: sigma).
  virtual at::Tensor modelTimestep(float timestep, at::ScalarType dtype) const;
  /// The (guided) transformer prediction as the scheduler's model_output (same shape). Default:
  /// unchanged (ZImagePipeline negates it).
  virtual at::Tensor schedulerModelOutput(const at::Tensor& prediction) const { return prediction; }
  /// One transformer call's inputs: the prompt's, the fixed ones, "timestep" and
  /// "hidden_states" (the latents, followed by the reference tokens when there are some).
  virtual TransformerInputs transformerInputs(const at::Tensor& latents, const at::Tensor& timestep,
                                              const PromptConditioning& prompt,
                                              const FlowMatchLatents& state) const;

 private:
  void checkCfg(const Guider& guider) const;
  /// One prompt text's conditioning as the placement and the cache give it: from the cache, or
  /// encoded on this rank (loading the encoders first under `once`) and, under own-rank,
  /// broadcast over the tp x cp group. Counts in `res` (prompt_cache_hits / prompts_encoded).
  PromptConditioning conditioning(const std::string& text, int max_sequence_length,
                                  GenerationResult& res);
  /// The request's reference images, once per request (encode_references stage): read, fitted,
  /// preprocessed, encoded and packed into s.reference_tokens (device, compute dtype) and
  /// s.reference_ids; res.tensors gets "ref_image.<i>", "ref_latents" [1, S_ref, C] and
  /// "ref_ids". Throws std::runtime_error naming an unreadable file, std::invalid_argument for
  /// one the family's rule refuses.
  void encodeReferences(const PipelineInputs& p, FlowMatchLatents& s, const PipelineCallbacks& cb,
                        GenerationResult& res);
  /// Throws std::runtime_error when `t` (float32 CPU: the final latents, then the decoded image)
  /// holds NaN or Inf, naming `what`, the steps run and the likely cause (an applied LoRA, the
  /// weights, float16 overflow, an extreme guidance scale): nothing is written for such a result.
  void checkFiniteResult(const at::Tensor& t, const char* what, int steps, const PipelineInputs& p);

  ModelFolder model_;
  PipelineOptions opts_;
  c10::Device device_{at::kCPU};
  FamilyCapabilities caps_;
  RequestSpec spec_;          ///< requestSpecOf(model_)
  std::string familyName_;    ///< FamilySpec::display_name, named in refusals
  bool finalDecode_ = false;  ///< inside generate()'s final decode (finalDecodeGroup())
  std::unique_ptr<PromptEmbeddingCache> promptCache_;  ///< PipelineOptions::prompt_cache > 0
};

}  // namespace dit
