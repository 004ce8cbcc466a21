#include "backend/pipelines/flux2/pipeline_flux2_kv.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <utility>

#include "backend/models/flux2/transformer_flux2.h"

namespace dit {

namespace {

Flux2Transformer2DModel& flux2Transformer(DiffusionTransformer& t) {
  auto* m = dynamic_cast<Flux2Transformer2DModel*>(&t);
  if (!m)
    throw std::logic_error(
        "Flux2KleinKVPipeline: the transformer is not a Flux2Transformer2DModel");
  return *m;
}

}  // namespace

Flux2KleinKVPipeline::Flux2KleinKVPipeline(const ModelFolder& model, const PipelineOptions& opts,
                                           std::unique_ptr<Flux2PromptEncoder> encoder)
    : Flux2KleinPipeline(model, opts, std::move(encoder)) {}

Flux2KleinKVPipeline::~Flux2KleinKVPipeline() { releaseReferenceKV(); }

void Flux2KleinKVPipeline::releaseReferenceKV() {
  flux2Transformer(transformer()).setKVCache(nullptr);
  kv_.reset();
}

GenerationResult Flux2KleinKVPipeline::generate(const PipelineInputs& params,
                                                const PipelineCallbacks& cb) {
  struct Release {
    Flux2KleinKVPipeline* p;
    ~Release() { p->releaseReferenceKV(); }
  } release{this};
  return Flux2KleinPipeline::generate(params, cb);
}

void Flux2KleinKVPipeline::prepareTransformerInputs(const PipelineInputs& p, FlowMatchLatents& s) {
  releaseReferenceKV();
  Flux2KleinPipeline::prepareTransformerInputs(p, s);
  // Only reference images (never together with an init image) go through the cache: an init
  // image's conditioning tokens (Flux2KleinInpaintPipeline) stay on the plain path.
  if (!s.reference_tokens.defined() || !p.init_image.empty()) return;
  kv_ = std::make_unique<Flux2KVCache>(s.reference_tokens.size(1));
  flux2Transformer(transformer()).setKVCache(kv_.get());
}

}  // namespace dit
