// The FLUX.2 text side behind Flux2PromptEncoder, loaded under the transformer's tensor-parallel
// group with only the decoder layers the stacked hidden states need: [klein] Qwen2Tokenizer +
// Qwen3Model + qwen3PromptEmbeds; [dev] (Flux2Pipeline) MistralTokenizer + the Mistral decoder
// (Qwen3Model with parseMistralTextConfig's switches) + mistralPromptEmbeds.
#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <regex>
#include <stdexcept>

#include "backend/io/safetensors.h"
#include "backend/io/weight_source.h"
#include "backend/models/text_encoders/modeling_qwen3.h"
#include "backend/pipelines/flux2/pipeline_flux2.h"
#include "backend/pipelines/prompt_encoding.h"
#include "backend/tokenizers/mistral_tokenizer.h"
#include "backend/tokenizers/qwen2_tokenizer.h"

namespace dit {

namespace {

// The decoder of either encoder as `opts` places it: under textEncoderTpGroup(opts), read into
// host memory and streamed to the device under host-streamed.
std::unique_ptr<Qwen3Model> loadDecoder(const ModelFolder& model, const PipelineOptions& opts,
                                        int maxLayer) {
  const Flux2PipelineConfig& cfg = flux2Config(model);
  const bool stream = opts.text_encoder == TextEncoderPlacement::HostStreamed;
  const c10::Device device(opts.device);
  auto w = WeightSource::forComponent(model, "text_encoder", "model", opts.dtype,
                                      stream ? c10::Device(at::kCPU) : device);
  auto m = std::make_unique<Qwen3Model>(cfg.text_encoder, *w, textEncoderTpGroup(opts), maxLayer,
                                        stream ? std::optional<c10::Device>(device) : std::nullopt);
  if (m->streamed())
    spdlog::info(
        "FLUX.2 text encoder in host memory ({} bytes), streamed to {} one layer at a time "
        "(largest {} bytes)",
        m->weightBytes(), device.str(), m->largestLayerBytes());
  return m;
}

// What both encoders share: the options, the layers asked, the decoder's lifetime.
class DecoderPromptEncoder : public Flux2PromptEncoder {
 public:
  DecoderPromptEncoder(const ModelFolder& model, const PipelineOptions& opts)
      : model_(model), opts_(opts), layers_(flux2Config(model).text_encoder_out_layers) {}
  uint64_t weightBytes() const override { return decoder_ ? decoder_->weightBytes() : 0; }
  void release() override { decoder_.reset(); }
  bool loaded() const override { return decoder_ != nullptr; }

 protected:
  const Qwen3Model& decoder() const {
    if (!decoder_)
      throw std::logic_error("the FLUX.2 text encoder is not loaded (released after its prompts)");
    return *decoder_;
  }
  int maxLayer() const { return *std::max_element(layers_.begin(), layers_.end()); }
  ModelFolder model_;
  PipelineOptions opts_;
  std::vector<int> layers_;
  std::unique_ptr<Qwen3Model> decoder_;
};

class Qwen3PromptEncoder : public DecoderPromptEncoder {
 public:
  Qwen3PromptEncoder(const ModelFolder& model, const PipelineOptions& opts)
      : DecoderPromptEncoder(model, opts),
        tokenizer_(Qwen2Tokenizer::fromFolder(model.component("tokenizer"))) {
    if (loadsTextEncodersAtStart(opts)) load();
  }
  void load() override {
    if (decoder_) return;
    decoder_ = loadDecoder(model_, opts_, maxLayer());
    if (!decoder_->replicatedReason().empty())
      spdlog::info("FLUX.2 text encoder replicated on every tp rank: {}",
                   decoder_->replicatedReason());
  }
  at::Tensor encode(const std::string& prompt, int maxLen) const override {
    return qwen3PromptEmbeds(tokenizer_, decoder(), prompt, maxLen, layers_);
  }
  size_t untruncatedTokens(const std::string& prompt) const override {
    return tokenizer_.encode(tokenizer_.applyChatTemplate(prompt), 0).untruncated_length;
  }

 private:
  Qwen2Tokenizer tokenizer_;
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

class MistralPromptEncoder : public DecoderPromptEncoder {
 public:
  MistralPromptEncoder(const ModelFolder& model, const PipelineOptions& opts)
      : DecoderPromptEncoder(model, opts),
        tokenizer_(MistralTokenizer::fromFolder(model.component("tokenizer"))) {
    if (loadsTextEncodersAtStart(opts)) load();
  }
  void load() override {
    if (decoder_) return;
    const Flux2PipelineConfig& cfg = flux2Config(model_);
    try {
      decoder_ = loadDecoder(model_, opts_, maxLayer());
    } catch (const ModelFileError& e) {
      // A tensor whose shape disagrees with the config: name the config keys it follows.
      static const std::regex named("tensor '([^']+)'.* has shape");
      std::smatch mt;
      const std::string cause = e.cause();
      if (!std::regex_search(cause, mt, named)) throw;
      throw ModelFileError(e.file(), cause + " (text_encoder/config.json's text_config: " +
                                         mistralShapeKeys(mt[1].str(), cfg.text_encoder) + ")");
    }
    if (!decoder_->replicatedReason().empty())
      spdlog::info("FLUX.2 [dev] text encoder replicated on every tp rank: {}",
                   decoder_->replicatedReason());
  }
  at::Tensor encode(const std::string& prompt, int maxLen) const override {
    return mistralPromptEmbeds(tokenizer_, decoder(), prompt, maxLen, layers_);
  }
  size_t untruncatedTokens(const std::string& prompt) const override {
    return tokenizer_.encode(tokenizer_.applyChatTemplate(prompt), 0).untruncated_length;
  }

 private:
  MistralTokenizer tokenizer_;
};

}  // namespace

std::unique_ptr<Flux2PromptEncoder> loadFlux2PromptEncoder(const ModelFolder& model,
                                                           const PipelineOptions& opts) {
  if (!encodesPrompts(opts)) return nullptr;  // own-rank: another rank of the group encodes
  if (flux2Config(model).mistral) return std::make_unique<MistralPromptEncoder>(model, opts);
  return std::make_unique<Qwen3PromptEncoder>(model, opts);
}

}  // namespace dit
