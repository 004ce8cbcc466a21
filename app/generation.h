// Request <-> GenerationParams conversion and output writing shared by ditstudio-cli (in-process,
// one rank) and ditstudio-worker (the MPI rank program). Torch types stay in the .cpp.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "backend/pipelines/flux/pipeline_flux.h"
#include "parallel/strategy.h"

namespace dit {

/// Reads a generate request object (PROTOCOL.md field names). Missing fields keep the defaults
/// of GenerationParams (resolved later against the model). Throws std::invalid_argument naming a
/// field of the wrong type.
GenerationParams paramsFromJson(const nlohmann::json& j);

/// Field `key` of a request as T, `fallback` when absent or null. Throws std::invalid_argument
/// naming the field and its value when it has the wrong type.
template <typename T>
T requestField(const nlohmann::json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw std::invalid_argument(std::string("request field '") + key + "' has the wrong type: " + it->dump());
  }
}
nlohmann::json paramsToJson(const GenerationParams& p);

/// Writes the PNG (8-bit RGB, text chunk "parameters" = JSON of the resolved parameters plus
/// `extra`, e.g. model path and strategy). Creates parent folders. Throws std::runtime_error.
void writeImagePng(const std::string& path, const GenerationResult& r, const nlohmann::json& extra);

/// Writes `image` [3,H,W] float32 in [0,1], `initial_latents` and `final_latents` (packed,
/// float32) to a safetensors file, with the parameters as metadata.
void writeResultTensors(const std::string& path, const GenerationResult& r);

/// "out.png" with index 2 of 3 -> "out-2.png"; with count 1 the path is unchanged.
std::string indexedPath(const std::string& path, int index, int count);

/// The sizes strategy validation needs, from the model's configs (no weights read).
ModelDims modelDims(const ModelFolder& m);

/// Validates a strategy against a model and one request before anything is loaded: degrees,
/// tp against heads and sharded dimensions, strict ring/Ulysses divisibility, cfg needs true
/// CFG, sizes. Defaults of `p` are resolved as FluxPipeline::resolve does. Returns "" or the
/// joined messages.
std::string validateStrategyForRequest(const Strategy& s, const ModelFolder& m, GenerationParams p,
                                       int numImages);

/// Keeps freed tensor memory in the process instead of returning it to the kernel after every
/// op: glibc serves blocks above M_MMAP_THRESHOLD with fresh mmaps whose page faults and zeroing
/// dominated CPU step time (measured 3.3x slower per step on the tiny model at 128x128). Call
/// once at program start.
void tuneHostAllocator();

/// Random 63-bit seed from std::random_device (for seed < 0).
int64_t randomSeed();

}  // namespace dit
