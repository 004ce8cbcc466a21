// The FLUX.2 [klein] text side behind Flux2PromptEncoder: Qwen2Tokenizer (tokenizer/) and
// Qwen3Model (text_encoder/) loaded under the transformer's tensor-parallel group, with only the
// decoder layers the stacked hidden states need, and qwen3PromptEmbeds.
#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "backend/io/weight_source.h"
#include "backend/models/text_encoders/modeling_qwen3.h"
#include "backend/pipelines/flux2/pipeline_flux2.h"
#include "backend/tokenizers/qwen2_tokenizer.h"

namespace dit {

namespace {

class Qwen3PromptEncoder : public Flux2PromptEncoder {
 public:
  Qwen3PromptEncoder(const ModelFolder& model, const PipelineOptions& opts)
      : tokenizer_(Qwen2Tokenizer::fromFolder(model.component("tokenizer"))),
        layers_(flux2Config(model).text_encoder_out_layers) {
    const Flux2PipelineConfig& cfg = flux2Config(model);
    auto w = WeightSource::forComponent(model, "text_encoder", "model", opts.dtype,
                                        c10::Device(opts.device));
    const int maxLayer = *std::max_element(layers_.begin(), layers_.end());
    model_ = std::make_unique<Qwen3Model>(cfg.text_encoder, *w, opts.parallel.tp, maxLayer);
    if (!model_->replicatedReason().empty())
      spdlog::info("FLUX.2 text encoder replicated on every tp rank: {}",
                   model_->replicatedReason());
  }
  at::Tensor encode(const std::string& prompt, int maxLen) const override {
    return qwen3PromptEmbeds(tokenizer_, *model_, prompt, maxLen, layers_);
  }
  size_t untruncatedTokens(const std::string& prompt) const override {
    return tokenizer_.encode(tokenizer_.applyChatTemplate(prompt), 0).untruncated_length;
  }
  uint64_t weightBytes() const override { return model_->weightBytes(); }

 private:
  Qwen2Tokenizer tokenizer_;
  std::vector<int> layers_;
  std::unique_ptr<Qwen3Model> model_;
};

}  // namespace

std::unique_ptr<Flux2PromptEncoder> loadFlux2PromptEncoder(const ModelFolder& model,
                                                           const PipelineOptions& opts) {
  return std::make_unique<Qwen3PromptEncoder>(model, opts);
}

}  // namespace dit
