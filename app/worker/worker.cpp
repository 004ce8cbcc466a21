// ditstudio-worker: the rank program. Started by mpirun (by the GUI or ditstudio-cli), it builds
// the DeviceMesh for the chosen strategy, loads this rank's shard of the model, then serves
// requests read by rank 0 from stdin and broadcast to every rank (app/PROTOCOL.md; requests and
// events are read and written through app/protocol/). Events are prefixed JSON lines on stdout. Any
// exception inside a rank ends the whole group through abortGroup (error event naming the rank,
// then MPI_Abort).
//
// This file: start-up (checks every rank refuses together, the model fingerprints), the mesh and
// groups, loading and the ready event, the serve loop with its heartbeat, the request broadcast
// and the per-step stats exchange. A generate request: generate.cpp and results.cpp.
#include "app/worker/worker.h"

#include <ATen/ATen.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "app/common/blas_kernel.h"
#include "app/common/device_stats.h"
#include "app/common/generation.h"
#include "app/protocol/events.h"
#include "app/protocol/file_fingerprint.h"
#include "app/protocol/port_probe.h"
#include "app/protocol/protocol.h"
#include "app/worker/liveness.h"
#include "app/worker/request_source.h"
#include "backend/family_runtime.h"
#include "backend/io/model_folder.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_loader.h"
#include "backend/io/weight_source.h"
#include "backend/models/family_registry.h"
#include "parallel/collective_call.h"
#include "parallel/context_parallel.h"
#include "parallel/device_mesh.h"
#include "parallel/process_group.h"
#include "parallel/process_group_mpi.h"
#include "parallel/runtime.h"
#include "parallel/strategy.h"

namespace dit::worker {

using nlohmann::json;

namespace {

const char* kStages[] = {"idle", "loading", "encoding", "denoising", "decoding"};
int stageIndex(const std::string& s) {
  for (int i = 0; i < 5; ++i)
    if (s == kStages[i]) return i;
  return 0;
}

// Where each component came from (single files: layout and prefix), for the ready event.
json sourcesJson(const ModelFolder& m) {
  json j = json::object();
  for (const auto& [name, c] : m.components) {
    json e{{"path", c.path}, {"from", c.flag}};
    if (c.single_file) e["layout"] = c.layout, e["prefix"] = c.prefix;
    j[name] = e;
  }
  if (!m.variant.empty()) j["variant"] = m.variant;
  return j;
}

}  // namespace

int Worker::run() {
  rank_ = worldRank();
  fault_ = Fault::fromEnv(rank_);
  if (fault_.kind == "model") modelDir_ = fault_.arg;
  // 1. Everything that can be refused is refused before any weight is read (every rank
  //    computes the same verdict, so all exit without a collective).
  ModelFolder model;
  const std::string refusal = checkStart(model);
  if (refuseTogether(refusal)) return 2;
  if (refuseDifferentModels()) return 2;
  emitTyped(protocol::HelloEvent{rank_, worldSize(), ::getpid(), hostname(), blasInfoJson(blas_)});

  // 2. Mesh and groups, created in the same order on every rank.
  const PipelineOptions po = buildMesh();
  exchangePeers();
  countRanksOnHost();

  const double loadS = loadModel(model, po);
  syncStats(0, 0, 0.0, /*emit=*/true);
  if (rank_ == 0) {
    emitTyped(readyEvent(model, loadS));
    reader_.start(std::make_unique<StdinRequestSource>());
  }
  // 3. Serve.
  serve();
  world_->barrier()->wait();
  if (rank_ == 0) emitTyped(protocol::ByeEvent{});
  return 0;
}

// Opens the model (into `model`) and checks the strategy against it; returns the refusal ("" when
// none). Never throws: every rank must reach the common verdict.
std::string Worker::checkStart(ModelFolder& model) {
  std::string refusal;
  try {
    src_.model = modelDir_;
    model = ModelFolder::open(src_);
    refusal = joinIssues(validateDegrees(s_));
    if (refusal.empty()) refusal = joinIssues(validateForModel(s_, modelDims(model)));
    if (!refusal.empty()) refusal = "strategy refused: " + refusal;
  } catch (const std::exception& e) {
    refusal = e.what();
  }
  return refusal;
}

// A collective of the group's start, before the process groups with deadlines exist, under the
// collective timeout all the same (issue 18): `post` starts a non-blocking collective and this
// rank polls it until DITSTUDIO_COLLECTIVE_TIMEOUT_S. A rank that never arrives (its host hung)
// or an MPI channel that does not work between two hosts (OpenMPI picking an interface the hosts
// share by subnet only, such as a container bridge, spins in the first collective) then ends the
// group with this message, naming the step, the rank and its host, instead of waiting forever.
void Worker::startupCollective(const std::string& what,
                               const std::function<void(MPI_Request*)>& post) {
  std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
  post(&reqs[0]);
  const double timeout = defaultCollectiveTimeoutSeconds();
  if (pollRequests(reqs, timeout)) return;
  throw std::runtime_error("collective timeout: " + what + " did not complete within " +
                           secondsStr(timeout) + " s on rank " + std::to_string(rank_) + " (host " +
                           hostname() + "): a rank never arrived, or " +
                           protocol::hostNetworkAdvice());
}

// Every rank learns whether any rank refuses to start (e.g. a model folder that differs on
// one node), so all of them exit together instead of some waiting in the mesh set-up. The
// message is printed once: by rank 0 if it refuses, else by each refusing rank.
bool Worker::refuseTogether(const std::string& refusal) {
  int mine = refusal.empty() ? 0 : 1, any = 0, root = mine;
  startupCollective("the group's first exchange (start-up checks)", [&](MPI_Request* r) {
    MPI_Iallreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, r);
  });
  startupCollective("the start-up checks' verdict",
                    [&](MPI_Request* r) { MPI_Ibcast(&root, 1, MPI_INT, 0, MPI_COMM_WORLD, r); });
  if (!any) return false;
  if (mine && (rank_ == 0 || !root))
    emitTyped(protocol::ErrorEvent{std::nullopt, rank_, refusal, true});
  return true;
}

// Issue 18: every rank fingerprints the model it opened (app/protocol/file_fingerprint.h) and the
// group compares them before any weight is read: a host holding another checkpoint at the same
// path is refused, naming its rank and host, instead of computing a wrong image. Every rank
// computes the same verdict; rank 0 reports. Also records whether the group spans hosts
// (multiHost_: host names differ); a single-host group is never refused here.
bool Worker::refuseDifferentModels() {
  constexpr int kLen = 128;  // fingerprint (16) + host (at most 63) + error marker
  std::string mine;
  try {
    mine = protocol::modelFingerprint({modelDir_, src_.config, src_.vae, src_.text_encoder,
                                       src_.text_encoder_2, src_.tokenizer, src_.tokenizer_2});
  } catch (const std::exception&) {
    mine = "unreadable";
  }
  char buf[kLen] = {0};
  std::snprintf(buf, sizeof buf, "%s %s", mine.c_str(), hostname().c_str());
  std::vector<char> all(static_cast<size_t>(worldSize()) * kLen);
  startupCollective("the exchange of model fingerprints", [&](MPI_Request* r) {
    MPI_Iallgather(buf, kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, MPI_COMM_WORLD, r);
  });
  auto entry = [&](int r) {
    const std::string e(all.data() + kLen * r, strnlen(all.data() + kLen * r, kLen - 1));
    const auto sp = e.find(' ');
    return std::make_pair(e.substr(0, sp), sp == std::string::npos ? "" : e.substr(sp + 1));
  };
  const auto [fp0, host0] = entry(0);
  std::string differ;
  for (int r = 1; r < worldSize(); ++r) {
    const auto [fp, host] = entry(r);
    if (host != host0) multiHost_ = true;
    if (fp == fp0) continue;
    differ += (differ.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
              " on host " + host + " has fingerprint " + fp;
  }
  // One host: every rank opened the same files (only fault injection gives one rank another
  // folder, and loading then names the file that fails); nothing to compare.
  if (!multiHost_) return false;
  if (!differ.empty()) {
    if (rank_ == 0)
      emitTyped(protocol::ErrorEvent{
          std::nullopt, 0,
          "model differs between hosts: " + modelDir_ + " on rank 0 (host " + host0 +
              ") has fingerprint " + fp0 + ", but " + differ +
              ". Copy the same checkpoint to the same path on every host (ditstudio-worker "
              "--model-fingerprint PATH prints a host's fingerprint)",
          true});
    return true;
  }
  // Issue 36: the fingerprint samples blocks of each file; a checkpoint changed between them
  // passes it. Across hosts, every byte each host reads is compared: the first rank of each host
  // hashes the files (XXH3-128, cached by path, size and mtime, so a host hashes a checkpoint once)
  // and rank 0 names what differs.
  bool first = true;
  for (int r = 0; r < rank_; ++r)
    if (entry(r).second == entry(rank_).second) first = false;
  std::vector<protocol::FileFingerprint> files;
  if (first) {
    try {
      files = protocol::modelContentHashes({modelDir_, src_.config, src_.vae, src_.text_encoder,
                                            src_.text_encoder_2, src_.tokenizer, src_.tokenizer_2});
    } catch (const std::exception&) {
      files.clear();  // every file is then named as missing on this rank
    }
  }
  const std::string diff =
      differencesAcrossHosts(files, first, startupGather("the exchange of model content hashes"));
  if (diff.empty()) return false;
  if (rank_ == 0)
    emitTyped(protocol::ErrorEvent{
        std::nullopt, 0,
        "model differs between hosts: " + diff +
            ". Copy the same checkpoint to the same path on every host (`xxh128sum FILE` prints a "
            "file's content hash)",
        true});
  return true;
}

Worker::GatherBytes Worker::startupGather(const std::string& what) {
  return [this, what](const std::string& mine, size_t len) {
    std::vector<char> buf(len, 0), all(len * static_cast<size_t>(worldSize()), 0);
    std::memcpy(buf.data(), mine.data(), std::min(len, mine.size()));
    startupCollective(what, [&](MPI_Request* r) {
      MPI_Iallgather(buf.data(), static_cast<int>(len), MPI_CHAR, all.data(), static_cast<int>(len),
                     MPI_CHAR, MPI_COMM_WORLD, r);
    });
    std::vector<std::string> out;
    for (int r = 0; r < worldSize(); ++r) {
      const char* p = all.data() + len * static_cast<size_t>(r);
      out.emplace_back(p, strnlen(p, len));
    }
    return out;
  };
}

Worker::GatherBytes Worker::worldGather() {
  return [this](const std::string& mine, size_t len) {
    at::Tensor t = at::zeros({1, static_cast<int64_t>(len)}, at::kByte);
    std::memcpy(t.data_ptr(), mine.data(), std::min(len, mine.size()));
    const at::Tensor all = world_->allgather(t, 0)->result().contiguous();
    std::vector<std::string> out;
    for (int64_t r = 0; r < all.size(0); ++r) {
      const char* p = reinterpret_cast<const char*>(all[r].data_ptr());
      out.emplace_back(p, strnlen(p, len));
    }
    return out;
  };
}

std::string Worker::differencesAcrossHosts(const std::vector<protocol::FileFingerprint>& mine,
                                           bool compare, const GatherBytes& gather) {
  const std::string list = compare ? protocol::encodeFileList(mine) : "";
  const std::string head = (compare ? protocol::fileListDigest(mine) : std::string("-")) + ' ' +
                           std::to_string(list.size()) + ' ' + hostname();
  const std::vector<std::string> heads = gather(head, 128);
  struct Head {
    std::string digest, host;
    size_t bytes = 0;
  };
  std::vector<Head> h(heads.size());
  for (size_t r = 0; r < heads.size(); ++r) {
    std::istringstream w(heads[r]);
    w >> h[r].digest >> h[r].bytes;
    std::getline(w >> std::ws, h[r].host);
  }
  bool differ = false;
  size_t longest = 0;
  for (size_t r = 0; r < h.size(); ++r) {
    if (h[r].digest == "-") continue;
    differ = differ || h[r].digest != h[0].digest;
    longest = std::max(longest, h[r].bytes);
  }
  if (!differ) return "";
  // The lists themselves (only when a digest differs): at most 1 MiB a rank.
  const std::vector<std::string> lists = gather(list, std::min<size_t>(longest + 1, 1 << 20));
  std::vector<protocol::RankFiles> ranks;
  for (size_t r = 0; r < lists.size(); ++r)
    if (h[r].digest != "-" && (r == 0 || h[r].digest != h[0].digest))
      ranks.push_back({static_cast<int>(r), h[r].host, protocol::decodeFileList(lists[r])});
  return protocol::describeRankDifferences(ranks, 6);
}

bool Worker::firstRankOnHost() const {
  for (int r = 0; r < rank_ && r < static_cast<int>(peers_.size()); ++r)
    if (peers_[static_cast<size_t>(r)].host == peers_[static_cast<size_t>(rank_)].host)
      return false;
  return true;
}

// The DeviceMesh of the strategy and the pipeline's parallel groups (tp, cp, cfg); the compute
// dtype and device of this rank.
PipelineOptions Worker::buildMesh() {
  mesh_ = std::make_unique<DeviceMesh>(s_);
  PipelineOptions po;
  const ComputeDType cd = resolveComputeDType(dtype_, s_.device);
  po.dtype = computeDtype_ = cd.dtype;
  if (!cd.note.empty() && rank_ == 0)
    emitTyped(protocol::LogEvent{std::nullopt, rank_, "warning", cd.note});
  po.device = s_.device;
  if (s_.device == "cuda") po.device = "cuda:" + std::to_string(mesh_->deviceIndex());
  device_ = po.device;
  if (s_.tp_degree > 1) po.parallel.tp = mesh_->group("tp");
  if (s_.cpDegree() > 1) {
    ContextParallelOptions co{s_.ring_degree, s_.ulysses_degree, s_.ulysses_anything,
                              s_.ring_anything};
    po.parallel.cp = std::make_shared<ContextParallel>(
        mesh_->group("ring"), mesh_->group("ulysses"), mesh_->group("cp"), co);
  }
  if (s_.cfg_degree == 2) po.cfg = mesh_->group("cfg");
  po.vae_tiling = vaeTiling_;
  po.text_encoder = textEncoder_;
  po.prompt_cache = promptCache_;
  // Every rank of tp, cp and cfg holds the same final latents: the tiles go over the largest.
  for (const char* dim : {"cfg", "cp", "tp"})
    if (mesh_->size(dim) > 1 && (!po.vae_decode || mesh_->size(dim) >= po.vae_decode->size()))
      po.vae_decode = mesh_->group(dim);
  world_ = mesh_->world();
  return po;
}

// Every rank's pid and host (named when one stops responding); the heartbeat channel.
void Worker::exchangePeers() {
  const int n = worldSize();
  std::vector<int> pids(static_cast<size_t>(n));
  int mine = static_cast<int>(::getpid());
  // A rank stopped here is named (the exchange itself cannot tell who is missing).
  checkStartupArrival(MPI_COMM_WORLD, "the exchange of pids", defaultCollectiveTimeoutSeconds());
  startupCollective("the exchange of pids", [&](MPI_Request* r) {
    MPI_Iallgather(&mine, 1, MPI_INT, pids.data(), 1, MPI_INT, MPI_COMM_WORLD, r);
  });
  char host[64] = {0};
  std::snprintf(host, sizeof host, "%s", hostname().c_str());
  std::vector<char> hosts(static_cast<size_t>(n) * 64);
  startupCollective("the exchange of host names", [&](MPI_Request* r) {
    MPI_Iallgather(host, 64, MPI_CHAR, hosts.data(), 64, MPI_CHAR, MPI_COMM_WORLD, r);
  });
  for (int r = 0; r < n; ++r)
    peers_.push_back(Peer{pids[static_cast<size_t>(r)],
                          std::string(hosts.data() + 64 * r, strnlen(hosts.data() + 64 * r, 63))});
  MPI_Comm_dup(MPI_COMM_WORLD, &hb_);
}

// Ranks sharing this host's memory (for the per-request memory estimate).
void Worker::countRanksOnHost() {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  MPI_Comm_size(local, &ranksOnHost_);
  MPI_Comm_free(&local);
}

// Loads this rank's shard of the pipeline; returns the seconds it took.
double Worker::loadModel(const ModelFolder& model, const PipelineOptions& po) {
  stage_ = "loading";
  if (rank_ == 0) emitTyped(protocol::StatusEvent{"loading", "loading " + modelDir_, std::nullopt});
  auto t0 = Clock::now();
  pipe_ = loadPipeline(model, po);
  const double loadS = std::chrono::duration<double>(Clock::now() - t0).count();
  stage_ = "idle";
  return loadS;
}

// Rank 0's ready event: the group, the load, the weights held and the model's facts.
protocol::ReadyEvent Worker::readyEvent(const ModelFolder& model, double loadSeconds) const {
  json wb = json::object();
  for (auto& [k, v] : pipe_->weightBytes()) wb[k] = v;
  // The transformer's weights this rank holds, by storage (FP8 checkpoints stay 8-bit).
  json storage = json::object();
  {
    const at::ScalarType cdt = computeDtype_;
    for (auto& [k, v] :
         heldBytesByStorage(pipe_->transformer().parameters(),
                            static_cast<int64_t>(c10::elementSize(cdt)), computeDTypeName(cdt)))
      storage[k] = v;
  }
  const PipelineModelInfo mi = pipe_->info();
  protocol::ReadyEvent ready;
  ready.world = worldSize();
  ready.strategy = protocol::strategyToJson(s_);
  ready.load_seconds = loadSeconds;
  ready.weight_reads = static_cast<std::int64_t>(WeightSource::processReads());
  ready.weight_bytes_rank0 = wb;
  ready.transformer_storage_rank0 = storage;
  ready.model = json{{"path", modelDir_},
                     {"sources", sourcesJson(model)},
                     {"heads", mi.num_attention_heads},
                     {"inner_dim", mi.inner_dim},
                     {"layers", mi.num_layers},
                     {"single_layers", mi.num_single_layers},
                     {"vae_scale_factor", mi.vae_scale_factor},
                     {"default_steps", mi.default_steps},
                     {"guidance_embeds", mi.guidance_embeds},
                     {"max_sequence_length", mi.max_sequence_length}};
  // The family's own statement of what this model is and can do (FamilySpec).
  const FamilySpec& family = familyOf(model);
  json facts = json::array();
  for (const ModelFact& f : family.facts(model))
    facts.push_back({{"key", f.key}, {"label", f.label}, {"value", f.value}});
  ready.model["family"] = family.display_name;
  ready.model["pipeline_class"] = family.pipeline_class;
  ready.model["facts"] = facts;
  ready.model["capabilities"] = {{"img2img", family.caps.img2img},
                                 {"inpaint", family.caps.inpaint},
                                 {"step_cache", family.caps.step_cache},
                                 {"single_file", family.caps.single_file},
                                 {"lora_formats", family.caps.lora_formats}};
  // The family's declared request for this model: the server resolves requests against it
  // before queueing them (a refusal is a 400 naming the field).
  ready.model["request"] = requestSpecToJson(requestSpecOf(model));
  return ready;
}

// Serves until shutdown. Each turn starts with a heartbeat (rank 0 -> every rank -> rank 0, point
// to point with a deadline), so a rank that stops responding while the group is idle is named in
// the message that ends the group; a busy group's collectives time out
// (DITSTUDIO_COLLECTIVE_TIMEOUT_S) and the message names the stopped ranks on this host.
void Worker::serve() {
  try {
    for (;;) {
      json req = rank_ == 0 ? reader_.next(std::chrono::seconds(kIdleTickSeconds)) : json{};
      const bool noop = !heartbeat(rank_ == 0 && req.value("type", "") != "noop");
      if (noop) continue;
      req = broadcastJson(req);
      // Checked by rank 0's reader; every rank reads the same bytes the same way.
      const protocol::Request r = protocol::parseRequest(req);
      if (std::holds_alternative<protocol::ShutdownRequest>(r)) break;
      if (const auto* g = std::get_if<protocol::GenerateRequest>(&r)) handleGenerate(*g);
    }
  } catch (const CollectiveTimeoutError& e) {
    throw std::runtime_error(std::string(e.what()) + livenessReport(peers_, rank_));
  }
}

json Worker::broadcastJson(const json& j) {
  std::string s = rank_ == 0 ? j.dump() : std::string();
  at::Tensor len = at::full({1}, static_cast<int64_t>(s.size()), at::kLong);
  world_->broadcast(len, 0)->wait();
  at::Tensor buf = at::empty({len.item<int64_t>()}, at::kByte);
  if (rank_ == 0) std::memcpy(buf.data_ptr(), s.data(), s.size());
  world_->broadcast(buf, 0)->wait();
  return json::parse(std::string(static_cast<const char*>(buf.data_ptr()), buf.numel()));
}

// One idle-loop heartbeat. Rank 0 tells every rank whether a request follows (`work`) and
// waits for each rank's answer; a rank that does not answer within heartbeatTimeoutSeconds()
// is named ("rank 1 (pid 4242 on h) stopped responding ..."). The other ranks wait for rank 0
// (its idle tick plus the timeout) and name it likewise. Returns whether a request follows.
bool Worker::heartbeat(bool work) {
  const int n = worldSize();
  if (n == 1) return work;
  const double timeout = heartbeatTimeoutSeconds();
  if (rank_ == 0) {
    std::vector<int> out(static_cast<size_t>(n), work ? 1 : 0), in(static_cast<size_t>(n), 0);
    std::vector<MPI_Request> reqs;
    for (int r = 1; r < n; ++r) {
      reqs.emplace_back();
      MPI_Isend(&out[static_cast<size_t>(r)], 1, MPI_INT, r, kHeartbeatTag, hb_, &reqs.back());
      reqs.emplace_back();
      MPI_Irecv(&in[static_cast<size_t>(r)], 1, MPI_INT, r, kHeartbeatTag, hb_, &reqs.back());
    }
    if (!waitAll(reqs, timeout)) {
      std::string silent;
      for (int r = 1; r < n; ++r) {
        int flag = 0;
        MPI_Request& rq = reqs[static_cast<size_t>(2 * (r - 1) + 1)];
        if (rq != MPI_REQUEST_NULL) MPI_Test(&rq, &flag, MPI_STATUS_IGNORE);
        if (rq == MPI_REQUEST_NULL || flag) continue;
        const std::string state = processState(peers_[static_cast<size_t>(r)], hostname());
        silent += (silent.empty() ? "" : "; ") + describePeer(r, peers_[static_cast<size_t>(r)]) +
                  " stopped responding: no heartbeat answer within " + secondsStr(timeout) +
                  " s while the group was " + (work ? "starting a request" : "idle") +
                  (state.empty() ? "" : " (" + state + ")");
      }
      throw std::runtime_error(silent.empty() ? "heartbeat timed out" : silent);
    }
    return work;
  }
  int in = 0, ack = 1;
  MPI_Request rq;
  MPI_Irecv(&in, 1, MPI_INT, 0, kHeartbeatTag, hb_, &rq);
  std::vector<MPI_Request> one{rq};
  if (!waitAll(one, kIdleTickSeconds + timeout)) {
    const std::string state = processState(peers_[0], hostname());
    throw std::runtime_error(
        describePeer(0, peers_[0]) + " stopped responding: no heartbeat within " +
        secondsStr(kIdleTickSeconds + timeout) + " s while the group was idle" +
        (state.empty() ? "" : " (" + state + ")"));
  }
  MPI_Request sq;
  MPI_Isend(&ack, 1, MPI_INT, 0, kHeartbeatTag, hb_, &sq);
  std::vector<MPI_Request> send{sq};
  if (!waitAll(send, timeout))
    throw std::runtime_error(describePeer(0, peers_[0]) +
                             " stopped responding: the heartbeat answer was not taken within " +
                             secondsStr(timeout) + " s");
  return in != 0;
}

// One world collective per step: every rank's stats, plus rank 0's cancel flag. Returns true
// when rank 0 says cancel.
bool Worker::syncStats(int step, int steps, double stepMs, bool emit, const std::string& id,
                       int imageIndex) {
  auto dm = deviceMemory(c10::Device(device_));
  const bool cancel = rank_ == 0 && !id.empty() && reader_.isCancelled(id);
  const std::vector<int64_t> row{stageIndex(stage_),
                                 step,
                                 steps,
                                 (int64_t)residentSetBytes(),
                                 (int64_t)peakResidentSetBytes(),
                                 (int64_t)dm.cur,
                                 (int64_t)dm.peak,
                                 (int64_t)bytesSent(),
                                 (int64_t)(stepMs * 1000.0),
                                 cancel ? 1 : 0};
  at::Tensor mine = at::tensor(row, at::kLong).unsqueeze(0);
  at::Tensor all = world_->allgather(mine, 0)->result();
  const bool cancelled = all[0][9].item<int64_t>() != 0;
  if (emit && rank_ == 0) {
    protocol::RanksEvent ranks;
    for (int r = 0; r < all.size(0); ++r) {
      auto row = all[r];
      auto v = [&](int i) { return row[i].item<int64_t>(); };
      protocol::RankStats st;
      st.rank = r;
      st.stage = kStages[static_cast<int>(v(0))];
      st.step = static_cast<int>(v(1));
      st.steps = static_cast<int>(v(2));
      st.rss = v(3);
      st.rss_peak = v(4);
      st.dev = v(5);
      st.dev_peak = v(6);
      st.bytes_sent = v(7);
      st.step_ms = static_cast<double>(v(8)) / 1000.0;
      ranks.ranks.push_back(std::move(st));
    }
    emitTyped(ranks);
    if (!id.empty() && step > 0)
      emitTyped(protocol::ProgressEvent{id, step, steps, stepMs, imageIndex,
                                        stepMs * (steps - step) / 1000.0});
  }
  return cancelled;
}

int Worker::firstRefusingRank(bool refuses) {
  at::Tensor mine = at::full({1, 1}, refuses ? int64_t(1) : int64_t(0), at::kLong);
  at::Tensor all = world_->allgather(mine, 0)->result();
  int first = -1;
  for (int r = 0; r < all.size(0) && first < 0; ++r)
    if (all[r][0].item<int64_t>() != 0) first = r;
  return first;
}

}  // namespace dit::worker
