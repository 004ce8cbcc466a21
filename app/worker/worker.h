// ditstudio-worker's rank: the Worker class. Its members are defined by concern:
//   worker.cpp    start-up checks, mesh, load, the ready event, the serve loop, the heartbeat,
//                 request broadcast and the per-step stats exchange;
//   generate.cpp  a generate request in named steps (parameters, checks, LoRAs, warnings, seed,
//                 the images with their callbacks, the done event);
//   results.cpp   writing each image where the request asked, and a replica's results shipped to
//                 rank 0 (issue 18);
//   liveness.*    peers, heartbeat timeout, process states; fault_injection.h  the test faults;
//   worker_main.cpp  arguments and main.
#pragma once

#include <ATen/ATen.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/common/blas_kernel.h"
#include "app/common/lora_cache.h"
#include "app/protocol/events.h"
#include "app/protocol/file_fingerprint.h"
#include "app/protocol/protocol.h"
#include "app/worker/fault_injection.h"
#include "app/worker/liveness.h"
#include "app/worker/request_source.h"
#include "backend/family_runtime.h"
#include "backend/io/model_folder.h"
#include "backend/models/autoencoders/autoencoder_kl_config.h"
#include "backend/models/text_encoder_placement.h"
#include "parallel/device_mesh.h"
#include "parallel/process_group.h"
#include "parallel/runtime.h"
#include "parallel/strategy.h"

namespace dit::worker {

using Clock = std::chrono::steady_clock;

/// Every event the worker writes is one of the protocol's types (app/protocol/events.h).
template <class Event>
void emitTyped(const Event& e) {
  emitEvent(protocol::toJson(e));
}

/// One rank of the group: start-up, load, then serving requests until shutdown (app/PROTOCOL.md).
class Worker {
 public:
  /// `blas`: what ensureBlasKernel() found and chose (reported in the hello event).
  Worker(Strategy s, ModelSources src, std::string dtype, BlasInfo blas)
      : s_(std::move(s)),
        src_(std::move(src)),
        modelDir_(src_.model),
        dtype_(std::move(dtype)),
        blas_(std::move(blas)) {}

  /// Tiled VAE decode for the pipelines this worker loads (--vae-tiling); the final decode's tiles
  /// are shared over the largest of the tp, cp and cfg groups. Call before run().
  void setVaeTiling(const VaeTiling& t) { vaeTiling_ = t; }
  /// Where the pipelines' text encoders live and the prompt-embedding cache's entries
  /// (--text-encoder-placement, --prompt-cache; PipelineOptions). Call before run().
  void setTextEncoder(TextEncoderPlacement p, int promptCache) {
    textEncoder_ = p;
    promptCache_ = promptCache;
  }

  /// The rank's whole life; returns the process exit code (2: start-up refused). Throws on any
  /// error the group cannot survive (runOrAbort then ends the group).
  int run();

 private:
  // ---- worker.cpp: start-up, mesh, load, serve
  std::string checkStart(ModelFolder& model);
  void startupCollective(const std::string& what, const std::function<void(MPI_Request*)>& post);
  bool refuseTogether(const std::string& refusal);
  bool refuseDifferentModels();
  /// One allgather of `len` bytes per rank (`mine` zero-padded or cut to `len`); returns every
  /// rank's bytes up to the first zero, in rank order.
  using GatherBytes = std::function<std::vector<std::string>(const std::string& mine, size_t len)>;
  GatherBytes startupGather(const std::string& what);
  GatherBytes worldGather();
  /// Issue 36: the files this rank read (`mine`, with content hashes) against rank 0's, over the
  /// group (two gathers at most: list digests, then the lists when a digest differs). Ranks with
  /// `compare` false (not the first rank of their host: they read the same files as that one) take
  /// part without being compared. Returns describeRankDifferences() of the differing ranks, the
  /// same text on every rank; "" when every compared rank read the same bytes.
  std::string differencesAcrossHosts(const std::vector<protocol::FileFingerprint>& mine,
                                     bool compare, const GatherBytes& gather);
  /// True when no lower rank runs on this rank's host (peers_ must be set).
  bool firstRankOnHost() const;
  PipelineOptions buildMesh();
  void exchangePeers();
  void countRanksOnHost();
  double loadModel(const ModelFolder& model, const PipelineOptions& po);
  protocol::ReadyEvent readyEvent(const ModelFolder& model, double loadSeconds) const;
  void serve();
  nlohmann::json broadcastJson(const nlohmann::json& j);
  bool heartbeat(bool work);
  uint64_t bytesSent() const { return mesh_->bytesSent(); }
  bool syncStats(int step, int steps, double stepMs, bool emit, const std::string& id = "",
                 int imageIndex = 0);
  /// The lowest rank whose `refuses` is true, or -1 (one world allgather; every rank calls it).
  int firstRefusingRank(bool refuses);

  // ---- generate.cpp: one generate request
  /// One image of a request as this rank ran it.
  struct ImageRun {
    GenerationResult result;
    int stepSeen = 0;
    bool cancelled = false;
  };
  void handleGenerate(const protocol::GenerateRequest& req);
  /// Resolves the request once (the family's RequestSpec, then the pipeline's inputs) and checks
  /// it against the strategy; `dims` = the resolved request's dimensions for the memory check.
  bool resolveRequest(const protocol::GenerateRequest& req,
                      const protocol::GenerationParams& request, PipelineInputs& base,
                      RequestDims& dims);
  bool refuseRequest(const protocol::GenerateRequest& req, const PipelineInputs& base,
                     RequestDims dims, int numImages);
  bool applyLoras(const std::string& id, std::vector<protocol::LoraRequest>& loras);
  bool refuseDifferentInputs(const protocol::GenerateRequest& req,
                             const protocol::GenerationParams& request);
  void emitRequestWarnings(const protocol::GenerateRequest& req, const PipelineInputs& base);
  uint64_t sharedRandomSeed();
  bool isReplicaLeader() const;
  bool runImages(const protocol::GenerateRequest& req, const protocol::GenerationParams& request,
                 const PipelineInputs& base);
  /// `stageChecks`: every rank runs this image's pipeline (a full data-parallel round), so each
  /// stage start (encode, encode_image, encode_references, denoise) is also a cancel check (one
  /// world allgather there on every rank).
  PipelineCallbacks imageCallbacks(const protocol::GenerateRequest& req, const PipelineInputs& p,
                                   int index, bool leader, bool stageChecks, ImageRun& run);
  ImageRun runImage(const protocol::GenerateRequest& req, const PipelineInputs& p, int index,
                    bool mine, bool leader, bool fullRound);
  void finishRequest(const std::string& id, bool cancelled, Clock::time_point tReq);

  // ---- results.cpp: output files, results shipped to rank 0
  nlohmann::json imageMetadata() const;
  void commitImage(const protocol::GenerateRequest& req, const protocol::GenerationParams& request,
                   const GenerationResult& res, int index, int numImages, Clock::time_point tImg);
  bool shipResults(bool ship, const protocol::GenerateRequest& req,
                   const protocol::GenerationParams& request, const GenerationResult& res,
                   int index, int numImages, Clock::time_point tImg);
  void receiveResult(const protocol::GenerateRequest& req, const nlohmann::json& head,
                     const std::string& png, const std::string& st, int numImages);

  static constexpr int kIdleTickSeconds = 5;
  static constexpr int kHeartbeatTag = 7001;

  Strategy s_;
  std::vector<Peer> peers_;
  MPI_Comm hb_ = MPI_COMM_NULL;
  int ranksOnHost_ = 1;
  bool multiHost_ = false;  ///< some rank runs on another host name than rank 0 (issue 18)
  ModelSources src_;
  std::string modelDir_, dtype_, device_ = "cpu", stage_ = "idle";
  VaeTiling vaeTiling_;
  TextEncoderPlacement textEncoder_ = TextEncoderPlacement::Sharded;
  int promptCache_ = 0;
  BlasInfo blas_;
  at::ScalarType computeDtype_ = at::kFloat;  ///< resolveComputeDType(dtype_, device)
  int rank_ = 0;
  std::unique_ptr<DeviceMesh> mesh_;
  std::shared_ptr<ProcessGroup> world_;
  std::unique_ptr<DiffusionPipeline> pipe_;
  LoraCache loraCache_{loraCacheBudgetFromEnv()};
  /// Rank 0: the output files of the request being served that existed when it was accepted
  /// and may be replaced ("overwrite": true); refuseRequest sets it.
  std::vector<std::string> replaceable_;
  // Process-lifetime: its detached stdin thread may outlive this Worker.
  RequestQueue& reader_ = *new RequestQueue;
  Fault fault_;
};

}  // namespace dit::worker
