// The Torch side shared by ditstudio-cli (in-process, one rank), ditstudio-worker (the MPI rank
// program) and ditstudio-bench (target dit_app): protocol request parameters -> pipeline
// parameters, output writing, strategy checks against a model. The request format itself is
// app/protocol/ (dit_protocol). Torch types stay in the .cpp.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "app/protocol/protocol.h"
#include "backend/pipelines/diffusion_pipeline.h"
#include "parallel/strategy.h"

namespace dit {

/// The pipeline's parameters for one image of a request (backend PipelineInputs: 0 = model
/// default, resolved by DiffusionPipeline::resolve). The 64-bit seed is carried bit for bit (the
/// pipeline seeds its CPU generator with the same uint64 value); random_seed and num_images are
/// the caller's business (the worker draws the seed and loops over the images). The cache
/// spelling is parsed (throws std::invalid_argument for an unknown mode).
PipelineInputs pipelineParams(const protocol::GenerationParams& p);

/// Reads the request's init image and mask completely (every rank does, before any collective
/// work) and checks init_image_sha256 when given. Throws std::runtime_error naming the file and
/// the cause (unreadable, not an image, SHA-256 differs from the recalled one).
void checkInputImages(const protocol::GenerationParams& p);

/// Step-caching report of one image: {"mode", "computed_steps", "reused_steps", "steps",
/// "step_ms_computed" (mean), "saved_ms" (estimated: reused steps x mean computed-step time
/// minus their actual time)}; null without caching.
nlohmann::json cacheReport(const GenerationResult& r);
/// The request parameters of one made image: `request` with the pipeline's resolved values
/// (width, height, steps, max_sequence_length, seed, the canonical cache spelling, the init
/// image's SHA-256) and num_images 1. What image events and the PNG "parameters" chunk report.
protocol::GenerationParams imageParams(protocol::GenerationParams request,
                                       const PipelineInputs& resolved);

/// Writes the PNG (8-bit RGB, text chunk "parameters" = protocol::toJson(params) plus `extra`, e.g.
/// model path and strategy, plus "cache_report" when caching ran). Creates parent folders.
/// Throws std::runtime_error.
void writeImagePng(const std::string& path, const GenerationResult& r,
                   const protocol::GenerationParams& params, const nlohmann::json& extra);

/// Writes `image` [3,H,W] float32 in [0,1], `initial_latents` and `final_latents` (packed,
/// float32) to a safetensors file, with protocol::toJson(params) as metadata "parameters".
void writeResultTensors(const std::string& path, const GenerationResult& r,
                        const protocol::GenerationParams& params);

/// "out.png" with index 2 of 3 -> "out-2.png"; with count 1 the path is unchanged.
std::string indexedPath(const std::string& path, int index, int count);

/// A PNG name under `dir` that no file has yet, for images written to the worker's output folder:
/// "<dir>/<YYYYmmdd-HHMMSS>-<id>-<index>-s<seed>.png" (local time; the id's characters outside
/// [A-Za-z0-9._-] become '_'), with "-2", "-3", ... before ".png" when that name is taken. The
/// file is created empty (O_EXCL) so that two writers never pick the same name. Creates `dir`.
/// Throws std::runtime_error when the folder cannot be created or written.
std::string uniqueImagePath(const std::string& dir, const std::string& id, int index,
                            uint64_t seed);

/// The sizes strategy validation needs, from the model's configs (no weights read).
ModelDims modelDims(const ModelFolder& m);

/// Validates a strategy against a model and one request before anything is loaded: degrees,
/// tp against heads and sharded dimensions, strict ring/Ulysses divisibility, cfg needs true
/// CFG, sizes. Defaults of `p` (0 = model default) are resolved as FluxPipeline::resolve does
/// (128 x vae_scale_factor pixels, the folder's default text length).
/// Returns "" or the joined messages.
std::string validateStrategyForRequest(const Strategy& s, const ModelFolder& m,
                                       const protocol::GenerationParams& p, int numImages);

/// Keeps freed tensor memory in the process instead of returning it to the kernel after every
/// op: glibc serves blocks above M_MMAP_THRESHOLD with fresh mmaps whose page faults and zeroing
/// dominated CPU step time (measured 3.3x slower per step on the tiny model at 128x128). Call
/// once at program start.
void tuneHostAllocator();

/// Random seed from std::random_device in [0, 2^63) (random_seed requests): exact wherever a signed
/// 64-bit integer is stored (Qt JSON, GUI history); requested seeds may use the full uint64 range.
uint64_t randomSeed();

}  // namespace dit
