// The shared text side of every pipeline's text-encoder placement (PipelineOptions::text_encoder,
// backend/models/text_encoder_placement.h): which rank loads and runs the encoders, the broadcast
// of an own-rank encoder's conditioning to the rest of its group, and the prompt-embedding cache.
// FlowMatchPipeline::generate() drives them for every family; a family only says how to load and
// free its encoders (FlowMatchPipeline's loadTextEncoders / releaseTextEncoders hooks).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>

#include "backend/models/diffusion_transformer.h"
#include "backend/pipelines/diffusion_pipeline.h"

namespace dit {

class ProcessGroup;

/// The tensor-parallel group a text encoder with an own plan (Qwen3 / Mistral) is sharded under:
/// the transformer's tp group, or null (whole) when the placement is own-rank.
std::shared_ptr<ProcessGroup> textEncoderTpGroup(const PipelineOptions& o);
/// This rank runs the text encoders: always, except under own-rank where only the rank at
/// coordinate 0 of the tp and cp groups does.
bool encodesPrompts(const PipelineOptions& o);
/// This rank loads the text encoders when the pipeline is built: encodesPrompts() and not once.
bool loadsTextEncodersAtStart(const PipelineOptions& o);

/// Broadcasts `c` (one prompt's conditioning, tensors on `device`) from the encoding rank of
/// own-rank (coordinate 0 of tp and cp) to every rank of its tp x cp group: over the cp group
/// among the tp-rank-0 ranks, then over the tp group. On the receiving ranks `c` is replaced by
/// tensors of the sender's names, shapes and dtypes on `device`; tokenize_ms / encode_ms travel
/// with them. Collective over o.parallel.cp's group and o.parallel.tp (a no-op when both are
/// absent or of size 1). Throws std::invalid_argument when the sender's conditioning is empty.
void broadcastConditioning(const PipelineOptions& o, const c10::Device& device,
                           TransformerInputs& inputs, double& tokenize_ms, double& encode_ms);

/// An LRU cache of prompt conditionings (diffusers' prompt_embeds passed back in, done for the
/// user): the key is the SHA-256 of everything that decides the embeddings besides the loaded
/// encoders themselves (the prompt text, max_sequence_length and the pipeline's text-encoder
/// identity: model folder, text encoder / tokenizer paths, dtype); values are kept on the host
/// (CPU) so the cache takes no device memory, and handed back on the pipeline's device. A
/// negative prompt is one more prompt text (its own entry). LoRAs apply to the transformer
/// only (tensor_parallel::LoraTargets), so they do not change the key.
class PromptEmbeddingCache {
 public:
  /// `capacity` entries (>= 1); `identity` the encoders' identity folded into every key.
  PromptEmbeddingCache(size_t capacity, std::string identity);
  /// The key of `prompt` at `max_sequence_length` (hex SHA-256).
  std::string key(const std::string& prompt, int max_sequence_length) const;
  /// The cached conditioning of `key` on `device` (fresh tensors) into `out`, or false.
  bool find(const std::string& key, const c10::Device& device, TransformerInputs& out);
  /// Stores a host copy of `inputs` under `key`, dropping the least recently used entry when
  /// full.
  void put(const std::string& key, const TransformerInputs& inputs);
  size_t size() const { return lru_.size(); }
  size_t capacity() const { return capacity_; }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 private:
  size_t capacity_;
  std::string identity_;
  std::list<std::pair<std::string, TransformerInputs>> lru_;  ///< most recent first
  std::map<std::string, std::list<std::pair<std::string, TransformerInputs>>::iterator> index_;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace dit
