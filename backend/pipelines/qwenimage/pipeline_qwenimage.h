// QwenImagePipeline (diffusers pipelines/qwenimage/pipeline_qwenimage.py) on the shared loop
// (pipelines/flow_match_pipeline.h):
//  - encode_prompt: the pipeline's own template (not a chat template) around the prompt, the
//    Qwen2Tokenizer (truncation to tokenizer_max_length + 34 ids, padding to the longest prompt
//    of a batch), the Qwen2.5-VL language model's last hidden state (final RMSNorm), the first 34
//    template rows dropped, rows zero-padded to the longest prompt with a mask (None when all
//    ones), then [:, :max_sequence_length];
//  - noise randn (B, 1, C, 2h, 2w) packed 2x2 (feature c * 4 + dy * 2 + dx), img_shapes
//    (1, h, w); the schedule's exponential shift with mu = calculate_shift(h * w) and the
//    scheduler's shift_terminal;
//  - true CFG: on when true_cfg_scale > 1 AND a negative prompt is given; two transformer calls
//    per step; comb = neg + s (cond - neg), rescaled per token to the norm of cond over the
//    channels; guidance_scale is ignored (no guidance embedding);
//  - decode: unpack to (B, C, 1, 2h, 2w), latents * std + mean per channel, AutoencoderKLQwenImage
//    decode, frame 0, (x / 2 + 0.5).clamp(0, 1).
// Parallel strategies come from PipelineOptions: tp (the text encoder under the same tp group, as
// Qwen3's plan shards it) and ring / Ulysses inside the transformer (its declared plans), cfg 2
// splits the two CFG calls, dp is the worker's. Text-to-image only (no img2img / inpaint yet).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/pipelines/diffusion_pipeline.h"
#include "backend/pipelines/flow_match_pipeline.h"
#include "backend/pipelines/qwenimage/qwenimage_pipeline_config.h"

namespace dit {

class Qwen2Tokenizer;
class Qwen3Model;
class QwenImageTransformer2DModel;
class AutoencoderKLQwenImage;

/// QwenImagePipeline.prompt_template_encode with `prompt` pasted verbatim (str.format).
std::string qwenImagePromptTemplate(const std::string& prompt);

/// tokenizer(template(prompts), max_length = max_length, padding=True, truncation=True): ids
/// truncated to max_length, padded on the right with pad (<|endoftext|>) to the longest of the
/// batch. Returns {input_ids int64 [B, L], attention_mask int64 [B, L]}. Throws
/// std::invalid_argument for an empty batch.
std::pair<at::Tensor, at::Tensor> qwenImageTokenize(const Qwen2Tokenizer& tokenizer,
                                                    const std::vector<std::string>& prompts,
                                                    int max_length = 1058);

/// QwenImagePipeline.encode_prompt for a batch: {prompt_embeds float32 [B, L, hidden] with rows
/// zero-padded to the longest prompt after the `drop` template rows, mask int64 [B, L] (1 = real
/// row; undefined when every row is real, as diffusers' None)}, both cut to max_sequence_length
/// rows. `unsliced` (optional) receives the embeddings before that cut. Collective over the text
/// encoder's tp group. Throws std::invalid_argument for max_sequence_length outside [1, 1024].
std::pair<at::Tensor, at::Tensor> qwenImagePromptEmbeds(const Qwen2Tokenizer& tokenizer,
                                                        const Qwen3Model& model,
                                                        const std::vector<std::string>& prompts,
                                                        int max_sequence_length = 512,
                                                        int drop = 34, int max_tokens = 1024,
                                                        at::Tensor* unsliced = nullptr);

/// _pack_latents: [B, C, 1 or none, 2h, 2w] -> [B, h * w, 4C] (feature c * 4 + dy * 2 + dx).
at::Tensor packQwenImageLatents(const at::Tensor& latents);
/// _unpack_latents: [B, h * w, 4C] -> [B, C, 1, 2h, 2w].
at::Tensor unpackQwenImageLatents(const at::Tensor& packed, int64_t h, int64_t w);

class QwenImagePipeline : public FlowMatchPipeline {
 public:
  /// Loads the transformer, the VAE and (unless `withTextEncoder` is false) the tokenizer and
  /// the text encoder (under the transformer's tp group) from `model`. Throws ModelFileError /
  /// std::invalid_argument naming the file or the degree that does not fit.
  QwenImagePipeline(const ModelFolder& model, const PipelineOptions& opts,
                    bool withTextEncoder = true);
  ~QwenImagePipeline() override;

  /// Heads, inner dim, blocks, vae_scale_factor, 50 default steps, no guidance embedding, 512
  /// text rows.
  PipelineModelInfo info() const override;
  at::Tensor decode(const at::Tensor& packed, int height, int width) override;
  std::vector<std::string> requestWarnings(const PipelineInputs& p) const override;
  DiffusionTransformer& transformer() override;
  std::map<std::string, uint64_t> weightBytes() const override;
  bool textEncodersLoaded() const override;

  /// The pipeline's prompt embeddings of `prompts` (see qwenImagePromptEmbeds). Throws
  /// std::invalid_argument when loaded without a text encoder.
  std::pair<at::Tensor, at::Tensor> encodePrompts(const std::vector<std::string>& prompts,
                                                  int max_sequence_length,
                                                  at::Tensor* unsliced = nullptr) const;

 protected:
  PromptConditioning encodePromptConditioning(const std::string& prompt,
                                              int max_sequence_length) override;
  /// The Qwen2.5-VL encoder placed as PipelineOptions::text_encoder says (the tokenizer is loaded
  /// with the pipeline whenever it has a text side).
  void loadTextEncoders() override;
  void releaseTextEncoders() override;
  const SchedulerConfig& schedulerConfig() const override;
  /// calculate_shift(image_seq_len, base/max image_seq_len, base/max shift).
  double scheduleMu(int image_seq_len, int steps) const override;
  /// randn (1, 1, C, 2h, 2w) float32 from `gen`, packed; recorded as "initial_noise".
  at::Tensor drawNoise(at::Generator& gen, int64_t h, int64_t w,
                       GenerationResult& res) const override;
  /// Not reached: the family declares no img2img / inpaint (FamilySpec::caps), so resolve()
  /// refuses an init image first. Throws std::invalid_argument.
  at::Tensor encodeImage(const at::Tensor& image, at::Generator& gen,
                         GenerationResult& res) override;
  /// img_shapes (1, h, w).
  void prepareTransformerInputs(const PipelineInputs& p, FlowMatchLatents& latents) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

}  // namespace dit
