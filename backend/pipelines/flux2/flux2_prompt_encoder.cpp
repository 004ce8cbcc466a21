// The FLUX.2 text side behind Flux2PromptEncoder, loaded under the transformer's tensor-parallel
// group with only the decoder layers the stacked hidden states need: [klein] Qwen2Tokenizer +
// Qwen3Model + qwen3PromptEmbeds; [dev] (Flux2Pipeline) MistralTokenizer + the Mistral decoder
// (Qwen3Model with parseMistralTextConfig's switches) + mistralPromptEmbeds.
#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <regex>

#include "backend/io/safetensors.h"
#include "backend/io/weight_source.h"
#include "backend/models/text_encoders/modeling_qwen3.h"
#include "backend/pipelines/flux2/pipeline_flux2.h"
#include "backend/tokenizers/mistral_tokenizer.h"
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

// The config keys a text-encoder tensor's shape follows, for a tensor that disagrees with
// text_encoder/config.json: "'num_attention_heads' (4) x 'head_dim' (8) = 32 rows, 'hidden_size'
// (24) columns".
std::string mistralShapeKeys(const std::string& tensor, const Qwen3Config& c) {
  auto k = [](const char* key, int v) {
    std::string s(1, '\'');
    s.append(key).append("' (").append(std::to_string(v)).append(")");
    return s;
  };
  const std::string H = k("hidden_size", c.hidden_size),
                    M = k("intermediate_size", c.intermediate_size);
  const std::string q = k("num_attention_heads", c.num_attention_heads) + " x " +
                        k("head_dim", c.head_dim) + " = " +
                        std::to_string(c.num_attention_heads * c.head_dim);
  const std::string kv = k("num_key_value_heads", c.num_key_value_heads) + " x " +
                         k("head_dim", c.head_dim) + " = " +
                         std::to_string(c.num_key_value_heads * c.head_dim);
  auto has = [&](const char* s) { return tensor.find(s) != std::string::npos; };
  if (has("embed_tokens")) return k("vocab_size", c.vocab_size) + " rows, " + H + " columns";
  if (has("q_proj")) return q + " rows, " + H + " columns";
  if (has("k_proj") || has("v_proj")) return kv + " rows, " + H + " columns";
  if (has("o_proj")) return H + " rows, " + q + " columns";
  if (has("gate_proj") || has("up_proj")) return M + " rows, " + H + " columns";
  if (has("down_proj")) return H + " rows, " + M + " columns";
  return H + " elements";
}

class MistralPromptEncoder : public Flux2PromptEncoder {
 public:
  MistralPromptEncoder(const ModelFolder& model, const PipelineOptions& opts)
      : tokenizer_(MistralTokenizer::fromFolder(model.component("tokenizer"))),
        layers_(flux2Config(model).text_encoder_out_layers) {
    const Flux2PipelineConfig& cfg = flux2Config(model);
    auto w = WeightSource::forComponent(model, "text_encoder", "model", opts.dtype,
                                        c10::Device(opts.device));
    const int maxLayer = *std::max_element(layers_.begin(), layers_.end());
    try {
      model_ = std::make_unique<Qwen3Model>(cfg.text_encoder, *w, opts.parallel.tp, maxLayer);
    } catch (const ModelFileError& e) {
      // A tensor whose shape disagrees with the config: name the config keys it follows.
      static const std::regex named("tensor '([^']+)'.* has shape");
      std::smatch mt;
      const std::string cause = e.cause();
      if (!std::regex_search(cause, mt, named)) throw;
      throw ModelFileError(e.file(), cause + " (text_encoder/config.json's text_config: " +
                                         mistralShapeKeys(mt[1].str(), cfg.text_encoder) + ")");
    }
    if (!model_->replicatedReason().empty())
      spdlog::info("FLUX.2 [dev] text encoder replicated on every tp rank: {}",
                   model_->replicatedReason());
  }
  at::Tensor encode(const std::string& prompt, int maxLen) const override {
    return mistralPromptEmbeds(tokenizer_, *model_, prompt, maxLen, layers_);
  }
  size_t untruncatedTokens(const std::string& prompt) const override {
    return tokenizer_.encode(tokenizer_.applyChatTemplate(prompt), 0).untruncated_length;
  }
  uint64_t weightBytes() const override { return model_->weightBytes(); }

 private:
  MistralTokenizer tokenizer_;
  std::vector<int> layers_;
  std::unique_ptr<Qwen3Model> model_;
};

}  // namespace

std::unique_ptr<Flux2PromptEncoder> loadFlux2PromptEncoder(const ModelFolder& model,
                                                           const PipelineOptions& opts) {
  if (flux2Config(model).mistral) return std::make_unique<MistralPromptEncoder>(model, opts);
  return std::make_unique<Qwen3PromptEncoder>(model, opts);
}

}  // namespace dit
