// A generate request on every rank of the group, in named steps (Worker::handleGenerate): the
// parameters resolved and checked, the host-dependent checks (files, memory), the request's LoRAs,
// diffusers' warnings, a shared random seed, the images with their callbacks (stage, progress,
// previews, cancel, fault injection), and the done event. Writing the images: results.cpp.
#include <ATen/ATen.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "app/common/device_stats.h"
#include "app/common/generation.h"
#include "app/common/lora_cache.h"
#include "app/common/request_values.h"
#include "app/protocol/events.h"
#include "app/protocol/protocol.h"
#include "app/worker/worker.h"
#include "backend/family_runtime.h"
#include "backend/io/lora_file.h"
#include "backend/io/png_io.h"
#include "backend/io/sha256.h"
#include "backend/io/weight_source.h"
#include "backend/models/family_registry.h"
#include "backend/models/memory_estimate.h"
#include "parallel/device_mesh.h"
#include "parallel/process_group.h"
#include "parallel/strategy.h"

namespace dit::worker {

using nlohmann::json;
namespace fs = std::filesystem;

void Worker::handleGenerate(const protocol::GenerateRequest& req) {
  struct Done {  // the request's id may be reused once this returns
    Worker* w;
    std::string id;
    ~Done() {
      if (w->rank_ == 0) w->reader_.finished(id);
    }
  } done{this, req.id};
  const int numImages = req.imageCount();
  protocol::GenerationParams request = req.params;
  PipelineInputs base;
  RequestDims dims;
  if (!resolveRequest(req, request, base, dims)) return;
  // Checks that depend on this rank's host (memory, existing files): every rank learns every
  // verdict (one allgather), the lowest refusing rank reports, all skip the request together.
  if (refuseRequest(req, base, dims, numImages)) return;
  // The request's LoRAs (none = the base weights exactly), from the cache or read once.
  if (!applyLoras(req.id, request.loras)) return;
  // Across hosts: the LoRAs, init image and mask every host read must be the same bytes.
  if (multiHost_ && refuseDifferentInputs(req, request)) return;
  // What diffusers would warn about (truncated prompts, settings without effect), once.
  if (rank_ == 0) emitRequestWarnings(req, base);
  if (request.random_seed) base.seed = sharedRandomSeed();
  const auto tReq = Clock::now();
  const bool cancelled = runImages(req, request, base);
  finishRequest(req.id, cancelled, tReq);
}

// The request's parameters as the pipeline resolves them (`base`), checked against the strategy.
// The verdict is identical on every rank: rank 0 reports a refusal once and the group keeps
// serving. Returns false when refused.
bool Worker::resolveRequest(const protocol::GenerateRequest& req,
                            const protocol::GenerationParams& request, PipelineInputs& base,
                            RequestDims& dims) {
  try {
    // The family's declared request, resolved as every front end resolved it.
    protocol::GenerationParams q = request;
    q.num_images = req.imageCount();
    const ResolvedRequest r = dit::resolveRequest(requestSpecOf(pipe_->model()), requestValues(q));
    throwIfProblems(r);
    base = pipe_->resolve(pipelineParams(request));
    dims = r.dims();
    auto issues = validateForRequest(s_, modelDims(pipe_->model()), dims);
    if (!issues.empty()) throw std::invalid_argument(joinIssues(issues));
  } catch (const std::exception& e) {
    if (rank_ == 0) emitTyped(protocol::ErrorEvent{req.id, 0, e.what(), false});
    return false;
  }
  return true;
}

// The request's host-dependent checks on every rank: an existing `output` / `output_tensors`
// without `overwrite` (rank 0, which sees the paths the client named), and the memory estimate
// (activations, attention and VAE decode on top of the loaded weights, for every rank sharing
// this host) against MemAvailable on CPU devices or the device's free memory on CUDA. Returns
// true when any rank refuses; the lowest refusing rank emits the error event.
bool Worker::refuseRequest(const protocol::GenerateRequest& req, const PipelineInputs& base,
                           RequestDims rd, int numImages) {
  std::string refusal;
  replaceable_.clear();
  try {
    // Every rank reads the init image and mask itself (a file only some ranks can read is
    // refused by all of them together).
    checkInputImages(req.params);
    if (rank_ == 0 && !req.overwrite)
      for (int i = 0; i < numImages && refusal.empty(); ++i)
        for (const std::string* f : {&req.output, &req.output_tensors})
          if (!f->empty() && fs::exists(indexedPath(*f, i, numImages))) {
            refusal = "refusing to overwrite the existing file " + indexedPath(*f, i, numImages) +
                      " (send \"overwrite\": true to replace it)";
            break;
          }
    // Only the files there now may be replaced when the image is written (a file that appears
    // meanwhile is never replaced: OutputReplacePolicy).
    if (rank_ == 0 && req.overwrite)
      for (int i = 0; i < numImages; ++i)
        for (const std::string* f : {&req.output, &req.output_tensors})
          if (!f->empty() && fs::exists(indexedPath(*f, i, numImages)))
            replaceable_.push_back(indexedPath(*f, i, numImages));
    if (refusal.empty()) {
      // The resolved request's dims, with the pipeline's resolved size and text length.
      rd.width = base.width;
      rd.height = base.height;
      rd.text_len = base.max_sequence_length;
      const bool cuda = device_.rfind("cuda", 0) == 0;
      // The text encoders as this group places them (`once` loads them for the request).
      const MemoryEstimate est = estimateRequestMemory(
          pipe_->model(), s_, rd, static_cast<int>(c10::elementSize(computeDtype_)), !cuda,
          textEncoder_);
      if (cuda) {
        if (auto avail = deviceMemoryAvailable(c10::Device(device_)))
          refusal = memoryRefusal(est, est.requestBytes(), 1, *avail, rd,
                                  "free device memory on " + device_ + " (weights already loaded)");
      } else if (auto avail = hostMemoryAvailable()) {
        refusal = memoryRefusal(est, est.requestBytes(), ranksOnHost_, *avail, rd,
                                "host memory (MemAvailable, weights already loaded)");
      }
    }
  } catch (const std::exception& e) {
    refusal = e.what();
  }
  const int first = firstRefusingRank(!refusal.empty());
  if (first < 0) return false;
  if (first == rank_) emitTyped(protocol::ErrorEvent{req.id, rank_, refusal, false});
  return true;
}

// Applies the request's LoRA list on every rank (LoraCache: each file parsed and sharded once).
// A file that cannot be used (missing, corrupt, unknown format, a module this model does not
// have or whose shape differs) is refused by every rank together: the lowest failing rank
// emits the error event naming the file and module, the base weights are restored and the group
// keeps serving. On success rank 0 emits a "lora" event (what was applied, bytes per rank,
// files parsed so far, model weight reads of this process: unchanged by LoRA switches).
bool Worker::applyLoras(const std::string& id, std::vector<protocol::LoraRequest>& loras) {
  std::string refusal;
  std::vector<std::shared_ptr<const LoraCache::Entry>> entries;
  DiffusionTransformer& dit = pipe_->transformer();
  try {
    entries = loraCache_.apply(loras, dit);
  } catch (const std::exception& e) {
    // Across hosts the host is named: a file present on one host only is refused there.
    refusal = std::string("LoRA refused") + (multiHost_ ? " on host " + hostname() : "") + ": " +
              e.what();
  }
  const int first = firstRefusingRank(!refusal.empty());
  if (first >= 0) {
    dit.loraTargets().clear();
    if (first == rank_) emitTyped(protocol::ErrorEvent{id, rank_, refusal, false});
    return false;
  }
  if (rank_ == 0) {
    json list = json::array();
    for (size_t i = 0; i < entries.size(); ++i)
      list.push_back(json{{"file", loras[i].file},
                          {"strength", loras[i].strength},
                          {"sha256", loras[i].sha256},
                          {"format", loraFormatName(entries[i]->info.format)},
                          {"rank", entries[i]->info.rank},
                          {"modules", entries[i]->prepared->entries.size()},
                          {"bytes_rank0", entries[i]->prepared->bytes}});
    emitTyped(protocol::LoraEvent{id, list,
                                  static_cast<std::int64_t>(dit.loraTargets().appliedBytes()),
                                  static_cast<std::int64_t>(loraCache_.loads()),
                                  static_cast<std::int64_t>(WeightSource::processReads())});
  }
  return true;
}

// Issue 36: on a multi-host group, the request's input files as each host read them (the LoRAs'
// SHA-256 from the LoRA cache, the init image's and mask's computed here) are compared with rank
// 0's (Worker::differencesAcrossHosts): a host holding another file at the same path is refused,
// naming the file, the hosts and both hashes, instead of computing a wrong image. Every rank
// calls it; returns true (the request refused, the LoRAs removed) when a file differs.
bool Worker::refuseDifferentInputs(const protocol::GenerateRequest& req,
                                   const protocol::GenerationParams& request) {
  std::vector<protocol::FileFingerprint> files;
  auto sizeOf = [](const std::string& f) {
    std::error_code ec;
    const auto n = fs::file_size(f, ec);
    return ec ? std::uint64_t(0) : static_cast<std::uint64_t>(n);
  };
  for (const protocol::LoraRequest& l : request.loras)
    files.push_back({"LoRA " + l.file, sizeOf(l.file), "sha256:" + l.sha256});
  auto image = [&](const std::string& what, const std::string& path) {
    if (path.empty()) return;
    std::string digest;
    try {
      digest = "sha256:" + sha256File(path);
    } catch (const std::exception&) {
      digest = "unreadable";
    }
    files.push_back({what + path, sizeOf(path), digest});
  };
  image("init image ", request.init_image);
  image("mask ", request.mask_image);
  if (files.empty()) return false;
  const std::string diff = differencesAcrossHosts(files, firstRankOnHost(), worldGather());
  if (diff.empty()) return false;
  pipe_->transformer().loraTargets().clear();
  if (rank_ == 0)
    emitTyped(protocol::ErrorEvent{
        req.id, 0,
        "input differs between hosts: " + diff +
            ". Copy the same file to the same path on every host (sha256sum FILE prints its hash)",
        false});
  return true;
}

// Rank 0: the pipeline's warnings for the request (per prompt of a prompt list), as log events.
void Worker::emitRequestWarnings(const protocol::GenerateRequest& req, const PipelineInputs& base) {
  std::vector<std::string> warnings;
  if (req.prompts.empty())
    warnings = pipe_->requestWarnings(base);
  else
    for (size_t i = 0; i < req.prompts.size(); ++i) {
      PipelineInputs q = base;
      q.prompt = req.prompts[i];
      for (auto& w : pipe_->requestWarnings(q))
        warnings.push_back("prompts[" + std::to_string(i) + "]: " + w);
    }
  for (const auto& w : warnings) emitTyped(protocol::LogEvent{req.id, 0, "warning", w});
}

// A random seed is drawn on rank 0 and shared, so every rank starts from the same noise (the
// int64 tensor carries the uint64 bit pattern unchanged).
uint64_t Worker::sharedRandomSeed() {
  at::Tensor sd =
      at::full({1}, rank_ == 0 ? static_cast<int64_t>(randomSeed()) : int64_t(0), at::kLong);
  world_->broadcast(sd, 0)->wait();
  return static_cast<uint64_t>(sd.item<int64_t>());
}

// The rank that writes its data-parallel replica's images: coordinate 0 on every other axis.
bool Worker::isReplicaLeader() const {
  return mesh_->coord("cfg") == 0 && mesh_->coord("ring") == 0 && mesh_->coord("ulysses") == 0 &&
         mesh_->coord("tp") == 0;
}

// The request's images, in rounds of one image per data-parallel replica; each written (or shipped
// to rank 0) as soon as it is done. Returns whether the request was cancelled.
bool Worker::runImages(const protocol::GenerateRequest& req,
                       const protocol::GenerationParams& request, const PipelineInputs& base) {
  const int numImages = req.imageCount();
  const int dp = s_.dp_degree, dpi = mesh_->coord("dp");
  const bool leader = isReplicaLeader();
  bool cancelled = false;
  const int rounds = (numImages + dp - 1) / dp;
  for (int round = 0; round < rounds && !cancelled; ++round) {
    const int index = round * dp + dpi;  // this replica's image
    const bool mine = index < numImages;
    PipelineInputs p = base;
    if (!req.prompts.empty() && mine) p.prompt = req.prompts[index];
    // seed + image index, wrapping in the unsigned domain (no signed overflow near INT64_MAX).
    if (req.prompts.empty()) p.seed = base.seed + static_cast<uint64_t>(index);
    const auto tImg = Clock::now();
    // A full round (every replica has an image) checks for a cancel at each pipeline stage; the
    // last round of a request with fewer images than replicas checks once, before it starts.
    const bool fullRound = (round + 1) * dp <= numImages;
    if (!fullRound && syncStats(0, 0, 0.0, false, req.id, index)) {
      if (rank_ == 0) emitTyped(protocol::CancelledEvent{req.id, 0});
      cancelled = true;
      break;
    }
    const ImageRun run = runImage(req, p, index, mine, leader, fullRound);
    cancelled = run.cancelled;
    if (cancelled) {
      if (rank_ == 0) emitTyped(protocol::CancelledEvent{req.id, run.stepSeen});
      break;
    }
    stage_ = "idle";
    // The prompt-embedding cache (--prompt-cache) said so: this image's prompts were not encoded.
    if (mine && leader && run.result.prompt_cache_hits > 0)
      emitTyped(protocol::LogEvent{req.id, rank_, "info",
                                   "image " + std::to_string(index) +
                                       ": prompt embeddings from the cache (" +
                                       std::to_string(run.result.prompt_cache_hits) + " hit" +
                                       (run.result.prompt_cache_hits == 1 ? "" : "s") + ", " +
                                       std::to_string(run.result.prompts_encoded) + " encoded)"});
    // Issue 18: results come home. A replica leader other than rank 0 may be on another host:
    // it writes its files to a private temporary folder, sends their bytes to rank 0 (through
    // the group, under the collective timeout), and rank 0 writes them where the user asked
    // and reports the image.
    // Single-host groups (every rank on rank 0's host name) keep writing where they computed.
    if (dp > 1 && multiHost_ &&
        shipResults(mine && leader && rank_ != 0, req, request, run.result, index, numImages, tImg))
      continue;
    if (mine && leader) commitImage(req, request, run.result, index, numImages, tImg);
  }
  return cancelled;
}

namespace {
/// Thrown out of the pipeline by a stage callback when rank 0 says cancel (every rank throws it at
/// the same stage); runImage catches it: the image is cancelled, not failed.
struct CancelledAtStage {};
}  // namespace

// The pipeline's callbacks for one image: the stage (status events; with `stageChecks`, a cancel
// check as each stage starts, so a cancel sent while the ranks load LoRAs, tokenize or run the text
// encoders ends the request before the next stage instead of after the first denoising step), each
// step (fault injection, x0 previews on the replica leader, the per-step stats and rank 0's cancel
// flag).
PipelineCallbacks Worker::imageCallbacks(const protocol::GenerateRequest& req,
                                         const PipelineInputs& p, int index, bool leader,
                                         bool stageChecks, ImageRun& run) {
  PipelineCallbacks cb;
  cb.onStage = [this, &req, index, stageChecks](const std::string& st) {
    if (stageChecks && st != "decode" && syncStats(0, 0, 0.0, false, req.id, index))
      throw CancelledAtStage{};
    stage_ = st == "encode"    ? "encoding"
             : st == "denoise" ? "denoising"
             : st == "decode"  ? "decoding"
                               : st;
    // The GUI's status bar and monitor show the true stage (PROTOCOL.md `status`).
    if (rank_ == 0)
      emitTyped(protocol::StatusEvent{
          stage_, stage_ + " " + req.id + " image " + std::to_string(index), req.id});
    fault_.atStage(st);
  };
  cb.onStep = [this, &req, &p, index, leader, &run](int step, int steps, const at::Tensor&,
                                                    const at::Tensor& x0, double ms) {
    run.stepSeen = step;
    fault_.atStep(step);
    const int previewEvery = req.preview_every;
    if (leader && previewEvery > 0 && (step % previewEvery == 0) && step < steps) {
      at::Tensor img = pipe_->decode(x0, p.height, p.width);
      auto rgb = toRGB8(img);
      emitTyped(protocol::PreviewEvent{req.id, step, index,
                                       base64Encode(encodePng(rgb.data(), p.width, p.height))});
    }
    if (syncStats(step, steps, ms, true, req.id, index)) {
      run.cancelled = true;
      return false;
    }
    return true;
  };
  return cb;
}

// This rank's part of one image: the pipeline for its replica's image, or, on an idle replica in
// the last round, the per-step collectives alone.
Worker::ImageRun Worker::runImage(const protocol::GenerateRequest& req, const PipelineInputs& p,
                                  int index, bool mine, bool leader, bool fullRound) {
  ImageRun run;
  const PipelineCallbacks cb = imageCallbacks(req, p, index, leader, fullRound, run);
  if (mine) {
    try {
      run.result = pipe_->generate(p, cb);
    } catch (const CancelledAtStage&) {
      run.cancelled = true;  // before the stage that was about to start (stepSeen: 0)
    }
  } else {
    // Idle replica in the last round: keep the per-step collectives in lockstep (the
    // steps the pipeline runs: an init image's strength skips the first ones).
    const int steps = p.steps - p.firstStep();
    for (int s = 1; s <= steps && !run.cancelled; ++s)
      run.cancelled = syncStats(s, steps, 0.0, true, req.id, index);
  }
  return run;
}

// All images of the request are written before "done" (a world barrier orders the replicas).
void Worker::finishRequest(const std::string& id, bool cancelled, Clock::time_point tReq) {
  world_->barrier()->wait();
  stage_ = "idle";
  if (rank_ == 0) emitTyped(protocol::StatusEvent{"idle", "idle", id});
  syncStats(0, 0, 0.0, /*emit=*/true);  // every rank back to idle, final memory figures
  if (rank_ == 0 && !cancelled)
    emitTyped(protocol::DoneEvent{id, std::chrono::duration<double>(Clock::now() - tReq).count()});
}

}  // namespace dit::worker
