// Helpers of the single-file transformer tests under mpirun (test_formats_mpi, test_gguf_mpi):
// a FLUX.1 transformer loaded from a single checkpoint file (BFL / ComfyUI safetensors, GGUF)
// through its key layout, and one golden case run through it.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "backend/io/safetensors.h"
#include "backend/io/weight_source.h"
#include "backend/models/checkpoint_layouts.h"
#include "backend/models/flux/flux_bfl_config.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"

namespace dit::test {

/// A transformer loaded from one file, with the key layout and weight source it was read through.
struct SingleFileTransformer {
  std::shared_ptr<const KeyLayout> layout;
  std::shared_ptr<WeightSource> w;
  std::unique_ptr<FluxTransformer2DModel> model;
};

/// The file's transformer component (float32, CPU) under `par`; `base` supplies what the tensor
/// shapes cannot (fluxConfigFromBfl). Throws as inspectCheckpoint / the loader do.
inline SingleFileTransformer loadSingleFileTransformer(const std::string& file,
                                                       const FluxTransformerConfig* base,
                                                       FluxParallelism par) {
  const CheckpointInfo info = inspectCheckpoint(file);
  const CheckpointComponent& c = info.require("transformer", "--model");
  SafetensorsReader r(file);
  SingleFileTransformer m;
  m.layout = componentLayout(r, c);
  m.w = WeightSource::fromLayout(m.layout, at::kFloat, at::kCPU);
  m.model = std::make_unique<FluxTransformer2DModel>(fluxConfigFromBfl(r, c.prefix, base), *m.w,
                                                     std::move(par));
  return m;
}

/// `m`'s output for golden case dit.<k> (its inputs read with `golden(name)`), without autograd.
inline at::Tensor runGoldenCase(const FluxTransformer2DModel& m, int k,
                                const std::function<at::Tensor(const std::string&)>& golden) {
  at::NoGradGuard ng;
  const std::string p = "dit." + std::to_string(k) + ".in.";
  return m.forward(golden(p + "hidden_states"), golden(p + "encoder_hidden_states"),
                   golden(p + "pooled_projections"), golden(p + "timestep"), golden(p + "img_ids"),
                   golden(p + "txt_ids"), golden(p + "guidance"));
}

}  // namespace dit::test
