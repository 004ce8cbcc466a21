// transformers Qwen3Model (the decoder stack of FLUX.2 [klein]'s Qwen3ForCausalLM text encoder)
// and diffusers' Flux2KleinPipeline._get_qwen3_prompt_embeds.
// Numerics follow transformers models/qwen3/modeling_qwen3.py (eval mode, no dropout, no KV cache).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/models/text_encoders/qwen3_config.h"

namespace dit {

class WeightSource;
class ProcessGroup;
class Qwen2Tokenizer;
class MistralTokenizer;

/// transformers Qwen3Model: embed_tokens, decoder layers (RMSNorm in fp32 times weight; attention
/// with q_norm/k_norm RMSNorms over head_dim before half-split rotate_half RoPE, inv_freq =
/// 1 / theta^(2i/head_dim); GQA query head h -> KV head h / (heads / kv_heads); SwiGLU MLP
/// down(silu(gate(x)) * up(x))), final norm. Weights under "model.*" (Qwen3ForCausalLM) or
/// unprefixed (Qwen3Model); lm_head is never read.
///
/// With the Qwen2 switches of Qwen3Config (parseQwen2_5_VLTextConfig) the same class is the
/// language model of Qwen2_5_VLForConditionalGeneration on text (transformers
/// models/qwen2_5_vl/modeling_qwen2_5_vl.py Qwen2_5_VLTextModel): no q/k norm, q/k/v biases,
/// position ids cumsum(mask) - 1 (padding 1) shared by the three mrope sections (plain RoPE for
/// text), weights under "model.language_model.*" or the older "model.*"; the vision tower is not
/// read.
///
/// With parseMistralTextConfig's switches it is the language model of
/// Mistral3ForConditionalGeneration (FLUX.2 [dev]'s text encoder; transformers
/// models/mistral/modeling_mistral.py): no q/k norm, no biases, explicit head_dim, GQA,
/// positions 0..L-1, weights under "model.language_model.*" (lm_head, the vision tower and the
/// projector are not read), and SDPA's treatment of left padding: a row with no allowed key
/// gets attention output 0 (masked_rows_zero).
///
/// Only the decoder layers needed for the largest hidden-states index ever requested are loaded
/// and run: `maxLayer` (default: num_hidden_layers) bounds the indices hiddenStates() accepts,
/// e.g. maxLayer 27 loads 27 of 28 layers for FLUX.2's (9, 18, 27) and skips the final norm.
///
/// Tensor parallel: with a tp group of size > 1 the weights load through WeightLoader with
/// qwen3ShardingPlan (each rank reads only its slices); q/k/v/gate/up are column-parallel,
/// o/down row-parallel (one all-reduce each); k/v are replicated when tp does not divide
/// num_key_value_heads; the whole model is replicated (logged, see replicatedReason()) when tp
/// does not divide num_attention_heads or intermediate_size. Device and dtype are the
/// WeightSource's.
///
/// Host streaming (the text-encoder placement host-streamed, text_encoder_placement.h): with
/// `streamTo` set, the WeightSource is a host (CPU) one and the weights stay there (page-locked
/// when streamTo is a CUDA device, so the copies are DMA); hiddenStates() looks the embeddings up
/// on the host and copies each decoder layer's weights into fresh tensors on streamTo right
/// before its forward, dropping them after it, so the device holds one layer at a time
/// (largestLayerBytes()). The numbers are those of the resident model (the same kernels on the
/// same device).
class Qwen3Model {
 public:
  /// Throws ModelFileError for missing / mismatching tensors, std::invalid_argument for maxLayer
  /// outside [0, num_hidden_layers] or a streamTo with a non-CPU WeightSource.
  Qwen3Model(const Qwen3Config& cfg, WeightSource& w, std::shared_ptr<ProcessGroup> tp = nullptr,
             int maxLayer = -1, std::optional<c10::Device> streamTo = std::nullopt);
  ~Qwen3Model();
  Qwen3Model(const Qwen3Model&) = delete;
  Qwen3Model& operator=(const Qwen3Model&) = delete;

  /// hidden_states[k] for every k of `indices` (0 = embedding lookup, k = output of decoder layer
  /// k (1-based), num_hidden_layers = final-norm output), as transformers'
  /// `output_hidden_states=True`. input_ids int64 [B, L] (ids < vocab_size), attention_mask int64
  /// [B, L] (1 = real token, 0 = padding): causal AND key-padding mask, position ids 0..L-1 for
  /// every row (padding does not shift them; with positions_from_mask cumsum(mask) - 1, padding
  /// positions 1). Returns float32 [B, L, hidden_size] per index, in
  /// the order asked, on computeDevice(). Collective over the tp group (every rank gets the
  /// same result). Throws std::invalid_argument for bad shapes/dtypes, an id out of range or an
  /// index outside [0, maxLayer] (num_hidden_layers allowed only when maxLayer is it).
  std::vector<at::Tensor> hiddenStates(const at::Tensor& input_ids,
                                       const at::Tensor& attention_mask,
                                       const std::vector<int>& indices) const;

  /// Bytes of weights this rank holds (compute dtype; in host memory when streamed()).
  uint64_t weightBytes() const;
  /// The weights stay on the host and stream to computeDevice() layer by layer.
  bool streamed() const;
  /// Where hiddenStates() computes: streamTo, or the weights' device.
  c10::Device computeDevice() const;
  /// Bytes of this rank's largest decoder layer (what streaming holds on the device at once).
  uint64_t largestLayerBytes() const;
  /// Decoder layers loaded (= maxLayer).
  int layersLoaded() const;
  /// Empty when the tp plan applies; otherwise why this rank holds the whole model.
  const std::string& replicatedReason() const;
  const Qwen3Config& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

/// diffusers Flux2KleinPipeline._get_qwen3_prompt_embeds for one prompt: the chat template
/// (tokenizer.applyChatTemplate), tokenization padded/truncated to max_sequence_length, the
/// encoder's hidden_states at `layers`, stacked per position: float32
/// [1, max_sequence_length, layers.size() * hidden_size] = cat over k of hidden_states[layers[k]]
/// (padding rows included). Throws std::invalid_argument for max_sequence_length < 1 or an empty
/// `layers`, and as hiddenStates.
at::Tensor qwen3PromptEmbeds(const Qwen2Tokenizer& tokenizer, const Qwen3Model& model,
                             const std::string& prompt, int max_sequence_length = 512,
                             const std::vector<int>& layers = {9, 18, 27});

/// diffusers Flux2Pipeline._get_mistral_3_small_prompt_embeds for one prompt: the chat string
/// (tokenizer.applyChatTemplate: format_input + SYSTEM_MESSAGE), tokenization truncated to the
/// first max_sequence_length ids and padded on the tokenizer's side (left), the encoder's
/// hidden_states at `layers` stacked per position: float32 [1, max_sequence_length,
/// layers.size() * hidden_size] = cat over k of hidden_states[layers[k]] (padding rows included).
/// Throws std::invalid_argument for max_sequence_length < 1 or an empty `layers`, and as
/// hiddenStates.
at::Tensor mistralPromptEmbeds(const MistralTokenizer& tokenizer, const Qwen3Model& model,
                               const std::string& prompt, int max_sequence_length = 512,
                               const std::vector<int>& layers = {10, 20, 30});

}  // namespace dit
