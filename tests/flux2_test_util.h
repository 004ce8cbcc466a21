// Helpers of the FLUX.2 [klein] transformer tests (test_flux2, test_flux2_step_cache): the
// fixture's transformer folder (tiny-flux2-A, DITSTUDIO_FIXTURE through golden_util.h), its
// parsed config and its weights (float32, CPU).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "backend/io/config_json.h"
#include "backend/io/weight_source.h"
#include "backend/models/flux2/transformer_flux2.h"
#include "golden_util.h"

namespace dit::test {

/// <fixture>/transformer
inline std::string flux2TransformerDir() { return fixtureDir() + "/transformer"; }

/// The fixture transformer's config.json, parsed once.
inline const Flux2TransformerConfig& flux2TransformerConfig() {
  static const Flux2TransformerConfig c =
      parseFlux2TransformerConfig(readConfigJson(flux2TransformerDir() + "/config.json"),
                                  flux2TransformerDir() + "/config.json");
  return c;
}

/// The fixture transformer's weights, float32 on the CPU.
inline std::shared_ptr<WeightSource> flux2TransformerWeights() {
  return WeightSource::fromFolder(flux2TransformerDir(), "diffusion_pytorch_model", at::kFloat,
                                  c10::Device(at::kCPU));
}

}  // namespace dit::test
