// Flux2KleinKVPipeline (diffusers pipelines/flux2/pipeline_flux2_klein_kv.py): the FLUX.2 [klein]
// "-kv" checkpoints, a model folder whose model_index.json says Flux2KleinKVPipeline. Everything
// is Flux2KleinPipeline's (the references fitted, encoded once and packed with T = 10 + 10 i; the
// schedule; decode) except the transformer calls: the references' keys and values are computed
// once per request and reused (Flux2KVCache on Flux2Transformer2DModel). The first transformer
// call extracts them (the references modulated at the fixed timestep 0 and attending to each
// other only; the text and image tokens attend to everything), the later ones join the stored
// K/V to their keys and no longer carry the reference tokens through the blocks. The references'
// K/V do not depend on the step, the text or the noise, so both CFG branches share them.
#pragma once

#include <memory>

#include "backend/pipelines/flux2/pipeline_flux2.h"

namespace dit {

class Flux2KVCache;

class Flux2KleinKVPipeline : public Flux2KleinPipeline {
 public:
  /// As Flux2KleinPipeline's; the model folder's pipeline class is Flux2KleinKVPipeline.
  Flux2KleinKVPipeline(const ModelFolder& model, const PipelineOptions& opts,
                       std::unique_ptr<Flux2PromptEncoder> encoder);
  ~Flux2KleinKVPipeline() override;

  /// Flux2KleinPipeline::generate, the reference K/V released when it returns or throws.
  GenerationResult generate(const PipelineInputs& params,
                            const PipelineCallbacks& cb = {}) override;
  /// The reference K/V of the request running or last run (null without references or after
  /// releaseReferenceKV). generateFromEmbeddings keeps them until the next request or this call.
  const Flux2KVCache* referenceKV() const { return kv_.get(); }
  /// Uninstalls the cache from the transformer and frees the K/V.
  void releaseReferenceKV();

 protected:
  /// Flux2KleinPipeline's inputs, then, with reference images, a fresh Flux2KVCache over their
  /// tokens installed on the transformer (the loop keeps appending the reference tokens: the
  /// cached calls drop them before any block).
  void prepareTransformerInputs(const PipelineInputs& p, FlowMatchLatents& latents) override;

 private:
  std::unique_ptr<Flux2KVCache> kv_;
};

}  // namespace dit
