// ditstudio-worker: the rank program. Started by mpirun (by the GUI or ditstudio-cli), it builds
// the DeviceMesh for the chosen strategy, loads this rank's shard of the model, then serves
// requests read by rank 0 from stdin and broadcast to every rank (app/PROTOCOL.md; requests and
// events are read and written through app/protocol/). Events are prefixed JSON lines on stdout. Any
// exception inside a rank ends the whole group through abortGroup (error event naming the rank,
// then MPI_Abort).
#include <ATen/ATen.h>
#include <mpi.h>
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <variant>

#include "app/common/blas_kernel.h"
#include "app/common/device_stats.h"
#include "app/common/generation.h"
#include "app/common/lora_cache.h"
#include "app/common/model_source_options.h"
#include "app/launcher/fingerprint.h"
#include "app/launcher/launch.h"
#include "app/protocol/events.h"
#include "app/protocol/protocol.h"
#include "app/worker/request_source.h"
#include "backend/family_runtime.h"
#include "backend/io/model_folder.h"
#include "backend/io/png_io.h"
#include "backend/io/safe_write.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_loader.h"
#include "backend/io/weight_source.h"
#include "backend/models/family_registry.h"
#include "backend/models/memory_estimate.h"
#include "parallel/collective_call.h"
#include "parallel/context_parallel.h"
#include "parallel/device_mesh.h"
#include "parallel/event_lines.h"
#include "parallel/process_group.h"
#include "parallel/process_group_mpi.h"
#include "parallel/runtime.h"
#include "parallel/strategy.h"

using namespace dit;
using nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// ------------------------------------------------------------------ fault injection
// For the fault tests (tests/test_worker_faults.cpp) and for rehearsing failures on a demo rig:
// DITSTUDIO_FAULT_RANK=r with DITSTUDIO_FAULT=throw_at_step:N | exit_at_step:N | hang_at_step:N |
// kill_at_step:N |
// model:/other/folder (that rank alone loads another — e.g. corrupt — model folder).
struct Fault {
  std::string kind;
  std::string arg;
  int step = -1;
  static Fault fromEnv(int rank) {
    Fault f;
    const char* r = std::getenv("DITSTUDIO_FAULT_RANK");
    const char* k = std::getenv("DITSTUDIO_FAULT");
    if (!r || !k || std::atoi(r) != rank) return f;
    std::string spec(k);
    auto colon = spec.find(':');
    f.kind = spec.substr(0, colon);
    f.arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
    if (f.kind != "model" && !f.arg.empty()) f.step = std::atoi(f.arg.c_str());
    return f;
  }
  void atStep(int step) const {
    if (step != this->step) return;
    if (kind == "throw_at_step")
      throw std::runtime_error("injected fault: exception at step " + std::to_string(step));
    if (kind == "exit_at_step") std::_Exit(3);
    if (kind == "kill_at_step") ::raise(SIGKILL);  // as `kill -9` of this rank
    if (kind == "hang_at_step") std::this_thread::sleep_for(std::chrono::hours(1));
  }
};

const char* kStages[] = {"idle", "loading", "encoding", "denoising", "decoding"};
int stageIndex(const std::string& s) {
  for (int i = 0; i < 5; ++i)
    if (s == kStages[i]) return i;
  return 0;
}

// ------------------------------------------------------------------ liveness
// Every rank's pid and host, known to every rank, so the message that ends the group names the
// rank that stopped responding (issue 16).
struct Peer {
  int pid = -1;
  std::string host;
};

// Seconds a rank waits for the other side of an idle-loop heartbeat:
// DITSTUDIO_HEARTBEAT_TIMEOUT_S, default 10, never above the collective timeout.
double heartbeatTimeoutSeconds() {
  double t = 10.0;
  if (const char* v = std::getenv("DITSTUDIO_HEARTBEAT_TIMEOUT_S"); v && *v) {
    char* end = nullptr;
    const double d = std::strtod(v, &end);
    if (end != v && std::isfinite(d) && d > 0) t = d;
  }
  if (const char* v = std::getenv("DITSTUDIO_COLLECTIVE_TIMEOUT_S"); v && *v) {
    const double c = std::strtod(v, nullptr);
    if (std::isfinite(c) && c > 0) t = std::min(t, c);
  }
  return t;
}

// What this host can tell about a peer's process: stopped (SIGSTOP, a debugger), exited, or
// running. "" for a peer on another host (only its silence is known there).
std::string processState(const Peer& p, const std::string& myHost) {
  if (p.pid <= 0 || p.host != myHost) return {};
  std::ifstream in("/proc/" + std::to_string(p.pid) + "/stat");
  std::string stat;
  if (!in || !std::getline(in, stat)) return "its process has exited";
  const auto close = stat.rfind(')');
  const char state = close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
  if (state == 'T' || state == 't')
    return "its process is stopped (state " + std::string(1, state) + ": SIGSTOP or a debugger)";
  if (state == 'Z' || state == 'X') return "its process has exited";
  return "its process is running (state " + std::string(1, state) + ") but does not answer";
}

std::string describePeer(int rank, const Peer& p) {
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(p.pid) + " on " + p.host + ")";
}

// Polls `reqs` until all complete or `seconds` pass; true when all completed.
bool waitAll(std::vector<MPI_Request>& reqs, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int done = 0;
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// ------------------------------------------------------------------ worker
// What ensureBlasKernel() found and chose (reported in the hello event).
BlasInfo g_blas;

// Every event the worker writes is one of the protocol's types (app/protocol/events.h).
template <class Event>
void emitTyped(const Event& e) {
  emitEvent(protocol::toJson(e));
}

class Worker {
 public:
  Worker(Strategy s, ModelSources src, std::string dtype)
      : s_(std::move(s)), src_(std::move(src)), modelDir_(src_.model), dtype_(std::move(dtype)) {}

  int run() {
    rank_ = worldRank();
    fault_ = Fault::fromEnv(rank_);
    if (fault_.kind == "model") modelDir_ = fault_.arg;
    // 1. Everything that can be refused is refused before any weight is read (every rank
    //    computes the same verdict, so all exit without a collective).
    std::string refusal;
    ModelFolder model;
    try {
      src_.model = modelDir_;
      model = ModelFolder::open(src_);
      refusal = joinIssues(validateDegrees(s_));
      if (refusal.empty()) refusal = joinIssues(validateForModel(s_, dims(model)));
      if (!refusal.empty()) refusal = "strategy refused: " + refusal;
    } catch (const std::exception& e) {
      refusal = e.what();
    }
    if (refuseTogether(refusal)) return 2;
    if (refuseDifferentModels()) return 2;
    emitTyped(
        protocol::HelloEvent{rank_, worldSize(), ::getpid(), hostname(), blasInfoJson(g_blas)});

    // 2. Mesh and groups, created in the same order on every rank.
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
    world_ = mesh_->world();
    {  // every rank's pid and host (named when one stops responding); the heartbeat channel
      const int n = worldSize();
      std::vector<int> pids(static_cast<size_t>(n));
      int mine = static_cast<int>(::getpid());
      // A rank stopped here is named (the exchange itself cannot tell who is missing).
      checkStartupArrival(MPI_COMM_WORLD, "the exchange of pids",
                          defaultCollectiveTimeoutSeconds());
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
        peers_.push_back(
            Peer{pids[static_cast<size_t>(r)],
                 std::string(hosts.data() + 64 * r, strnlen(hosts.data() + 64 * r, 63))});
      MPI_Comm_dup(MPI_COMM_WORLD, &hb_);
    }
    {  // ranks sharing this host's memory (for the per-request memory estimate)
      MPI_Comm local;
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
      MPI_Comm_size(local, &ranksOnHost_);
      MPI_Comm_free(&local);
    }

    stage_ = "loading";
    if (rank_ == 0)
      emitTyped(protocol::StatusEvent{"loading", "loading " + modelDir_, std::nullopt});
    auto t0 = Clock::now();
    pipe_ = loadPipeline(model, po);
    const double loadS = std::chrono::duration<double>(Clock::now() - t0).count();
    stage_ = "idle";
    auto weights = pipe_->weightBytes();
    json wb = json::object();
    for (auto& [k, v] : weights) wb[k] = v;
    // The transformer's weights this rank holds, by storage (FP8 checkpoints stay 8-bit).
    json storage = json::object();
    {
      const at::ScalarType cdt = computeDtype_;
      for (auto& [k, v] :
           heldBytesByStorage(pipe_->transformer().parameters(),
                              static_cast<int64_t>(c10::elementSize(cdt)), computeDTypeName(cdt)))
        storage[k] = v;
    }
    syncStats(0, 0, 0.0, /*emit=*/true);
    if (rank_ == 0) {
      const PipelineModelInfo mi = pipe_->info();
      protocol::ReadyEvent ready;
      ready.world = worldSize();
      ready.strategy = protocol::strategyToJson(s_);
      ready.load_seconds = loadS;
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
      emitTyped(ready);
      reader_.start(std::make_unique<StdinRequestSource>());
    }
    // 3. Serve. Each turn starts with a heartbeat (rank 0 -> every rank -> rank 0, point to
    //    point with a deadline), so a rank that stops responding while the group is idle is
    //    named in the message that ends the group; a busy group's collectives time out
    //    (DITSTUDIO_COLLECTIVE_TIMEOUT_S) and the message names the stopped ranks on this host.
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
      throw std::runtime_error(std::string(e.what()) + livenessReport());
    }
    world_->barrier()->wait();
    if (rank_ == 0) emitTyped(protocol::ByeEvent{});
    return 0;
  }

 private:
  static std::string hostname() {
    char h[256] = {0};
    gethostname(h, sizeof h - 1);
    return h;
  }
  static ModelDims dims(const ModelFolder& m) { return modelDims(m); }
  // Where each component came from (single files: layout and prefix), for the ready event.
  static json sourcesJson(const ModelFolder& m) {
    json j = json::object();
    for (const auto& [name, c] : m.components) {
      json e{{"path", c.path}, {"from", c.flag}};
      if (c.single_file) e["layout"] = c.layout, e["prefix"] = c.prefix;
      j[name] = e;
    }
    if (!m.variant.empty()) j["variant"] = m.variant;
    return j;
  }
  // A collective of the group's start, before the process groups with deadlines exist, under the
  // collective timeout all the same (issue 18): `post` starts a non-blocking collective and this
  // rank polls it until DITSTUDIO_COLLECTIVE_TIMEOUT_S. A rank that never arrives (its host hung)
  // or an MPI channel that does not work between two hosts (OpenMPI picking an interface the hosts
  // share by subnet only, such as a container bridge, spins in the first collective) then ends the
  // group with this message, naming the step, the rank and its host, instead of waiting forever.
  void startupCollective(const std::string& what, const std::function<void(MPI_Request*)>& post) {
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    post(&reqs[0]);
    const double timeout = defaultCollectiveTimeoutSeconds();
    if (pollRequests(reqs, timeout)) return;
    throw std::runtime_error(
        "collective timeout: " + what + " did not complete within " + secondsStr(timeout) +
        " s on rank " + std::to_string(rank_) + " (host " + hostname() +
        "): a rank never arrived, or MPI traffic between the hosts does not get through. With a "
        "hostfile, name the network the hosts share with --network-interface (e.g. "
        "10.0.0.0/24), and check that no firewall drops the ranks' TCP ports");
  }

  // Every rank learns whether any rank refuses to start (e.g. a model folder that differs on
  // one node), so all of them exit together instead of some waiting in the mesh set-up. The
  // message is printed once: by rank 0 if it refuses, else by each refusing rank.
  bool refuseTogether(const std::string& refusal) {
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

  // Issue 18: every rank fingerprints the model it opened (app/launcher/fingerprint.h) and the
  // group compares them before any weight is read: a host holding another checkpoint at the same
  // path is refused, naming its rank and host, instead of computing a wrong image. Every rank
  // computes the same verdict; rank 0 reports. Also records whether the group spans hosts
  // (multiHost_: host names differ); a single-host group is never refused here.
  bool refuseDifferentModels() {
    constexpr int kLen = 128;  // fingerprint (16) + host (at most 63) + error marker
    std::string mine;
    try {
      mine = launcher::modelFingerprint({modelDir_, src_.config, src_.vae, src_.text_encoder,
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
    if (differ.empty() || !multiHost_) return false;
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

  // One round's transfer of replica results to rank 0 (every rank calls it; see the caller).
  // Returns true on the shipping ranks (their image is reported by rank 0).
  bool shipResults(bool ship, const protocol::GenerateRequest& req,
                   const protocol::GenerationParams& request, const GenerationResult& res,
                   int index, int numImages, Clock::time_point tImg) {
    at::Tensor flag = at::full({1}, ship ? 1 : 0, at::kInt);
    at::Tensor all = world_->allgather(flag, 0)->result();
    for (int src = 1; src < worldSize(); ++src) {
      if (all[src].item<int>() == 0) continue;
      if (rank_ == src) {
        json head{{"index", index}, {"rank", rank_}, {"host", hostname()}};
        std::string png, st;
        const protocol::GenerationParams made = imageParams(request, res.params);
        head["seed"] = made.seed;
        head["params"] = protocol::toJson(made);
        head["cache"] = cacheReport(res);
        head["seconds"] = std::chrono::duration<double>(Clock::now() - tImg).count();
        try {
          const fs::path dir =
              fs::temp_directory_path() / ("ditstudio-result-" + std::to_string(::getpid()));
          fs::create_directories(dir);
          json extra{{"model", modelDir_}, {"strategy", s_.describe()}, {"dtype", dtype_}};
          writeImagePng((dir / "image.png").string(), res, made, extra);
          png = readBytes(dir / "image.png");
          if (!req.output_tensors.empty()) {
            writeResultTensors((dir / "result.safetensors").string(), res, made);
            st = readBytes(dir / "result.safetensors");
          }
          fs::remove_all(dir);
        } catch (const std::exception& e) {
          head["error"] = e.what();
        }
        const std::string h = head.dump();
        at::Tensor sizes =
            at::tensor({static_cast<int64_t>(h.size()), static_cast<int64_t>(png.size()),
                        static_cast<int64_t>(st.size())},
                       at::kLong);
        world_->send(sizes, 0, 7)->wait();
        for (const std::string* b :
             {&h, static_cast<const std::string*>(&png), static_cast<const std::string*>(&st)})
          if (!b->empty()) {
            at::Tensor t = at::from_blob(const_cast<char*>(b->data()),
                                         {static_cast<int64_t>(b->size())}, at::kByte);
            world_->send(t, 0, 7)->wait();
          }
      } else if (rank_ == 0) {
        at::Tensor sizes = at::zeros({3}, at::kLong);
        world_->recv(sizes, src, 7)->wait();
        std::string parts[3];
        for (int i = 0; i < 3; ++i) {
          const int64_t n = sizes[i].item<int64_t>();
          if (n <= 0) continue;
          at::Tensor t = at::empty({n}, at::kByte);
          world_->recv(t, src, 7)->wait();
          parts[i].assign(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(n));
        }
        receiveResult(req, json::parse(parts[0]), parts[1], parts[2], numImages);
      }
    }
    return ship;
  }

  static std::string readBytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  // Rank 0: writes a replica's image (and tensors) where the request asked and reports it.
  void receiveResult(const protocol::GenerateRequest& req, const json& head, const std::string& png,
                     const std::string& st, int numImages) {
    const int index = head["index"].get<int>();
    const int src = head["rank"].get<int>();
    const std::string who =
        "rank " + std::to_string(src) + " on host " + head["host"].get<std::string>();
    if (head.contains("error")) {
      emitTyped(protocol::ErrorEvent{req.id, src,
                                     "cannot write image " + std::to_string(index) + " (" + who +
                                         "): " + head["error"].get<std::string>(),
                                     false});
      return;
    }
    std::string path;
    try {
      if (!req.output.empty())
        path = indexedPath(req.output, index, numImages);
      else
        path = uniqueImagePath(
            req.output_dir.empty() ? fs::temp_directory_path().string() : req.output_dir, req.id,
            index, head["seed"].get<uint64_t>());
      auto write = [](const std::string& file, const std::string& bytes) {
        std::ofstream out(file, std::ios::binary | std::ios::trunc);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        if (!out) throw std::runtime_error("cannot write " + file);
      };
      write(path, png);
      if (!req.output_tensors.empty()) write(indexedPath(req.output_tensors, index, numImages), st);
    } catch (const std::exception& e) {
      emitTyped(protocol::ErrorEvent{
          req.id, src, "cannot write image " + std::to_string(index) + ": " + e.what(), false});
      return;
    }
    protocol::ImageEvent image;
    image.id = req.id;
    image.cache = head["cache"];
    image.image_index = index;
    image.path = path;
    image.seed = head["seed"].get<std::uint64_t>();
    image.has_seed = true;
    image.params = head["params"];
    image.rank = src;
    image.host = head["host"].get<std::string>();
    image.seconds = head["seconds"].get<double>();
    emitTyped(image);
  }

  json broadcastJson(const json& j) {
    std::string s = rank_ == 0 ? j.dump() : std::string();
    at::Tensor len = at::full({1}, static_cast<int64_t>(s.size()), at::kLong);
    world_->broadcast(len, 0)->wait();
    at::Tensor buf = at::empty({len.item<int64_t>()}, at::kByte);
    if (rank_ == 0) std::memcpy(buf.data_ptr(), s.data(), s.size());
    world_->broadcast(buf, 0)->wait();
    return json::parse(std::string(static_cast<const char*>(buf.data_ptr()), buf.numel()));
  }

  static constexpr int kIdleTickSeconds = 5;
  static constexpr int kHeartbeatTag = 7001;

  // One idle-loop heartbeat. Rank 0 tells every rank whether a request follows (`work`) and
  // waits for each rank's answer; a rank that does not answer within heartbeatTimeoutSeconds()
  // is named ("rank 1 (pid 4242 on h) stopped responding ..."). The other ranks wait for rank 0
  // (its idle tick plus the timeout) and name it likewise. Returns whether a request follows.
  bool heartbeat(bool work) {
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

  // After a collective timeout: what this host knows about every other rank's process.
  std::string livenessReport() const {
    std::string out;
    for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
      if (r == rank_) continue;
      const std::string state = processState(peers_[static_cast<size_t>(r)], hostname());
      if (state.empty() && peers_[static_cast<size_t>(r)].host != hostname()) {
        // Another host: only its silence is known here (it hangs, or the link to it is down).
        out += "; " + describePeer(r, peers_[static_cast<size_t>(r)]) +
               " is on another host that did not answer (is the link to it up?)";
        continue;
      }
      if (state.empty() || state.rfind("its process is running", 0) == 0) continue;
      out +=
          "; " + describePeer(r, peers_[static_cast<size_t>(r)]) + " stopped responding: " + state;
    }
    return out;
  }

  uint64_t bytesSent() const { return mesh_->bytesSent(); }

  // One world collective per step: every rank's stats, plus rank 0's cancel flag. Returns true
  // when rank 0 says cancel.
  bool syncStats(int step, int steps, double stepMs, bool emit, const std::string& id = "",
                 int imageIndex = 0) {
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

  void handleGenerate(const protocol::GenerateRequest& req) {
    const std::string& id = req.id;
    struct Done {  // the request's id may be reused once this returns
      Worker* w;
      std::string id;
      ~Done() {
        if (w->rank_ == 0) w->reader_.finished(id);
      }
    } done{this, id};
    const std::vector<std::string>& prompts = req.prompts;
    const int numImages = req.imageCount();
    protocol::GenerationParams request = req.params;
    PipelineInputs base;
    try {
      base = pipe_->resolve(pipelineParams(request));
      RequestDims rd;
      rd.width = base.width;
      rd.height = base.height;
      rd.text_len = base.max_sequence_length;
      rd.true_cfg = pipe_->model().config->runsCfg(base.trueCfg(), base.guidance);
      rd.num_images = numImages;
      auto issues = validateForRequest(s_, dims(pipe_->model()), rd);
      if (!issues.empty()) throw std::invalid_argument(joinIssues(issues));
    } catch (const std::exception& e) {
      // Identical verdict on every rank: report once, keep serving.
      if (rank_ == 0) emitTyped(protocol::ErrorEvent{id, 0, e.what(), false});
      return;
    }
    // Checks that depend on this rank's host (memory, existing files): every rank learns every
    // verdict (one allgather), the lowest refusing rank reports, all skip the request together.
    if (refuseRequest(req, base, numImages)) return;
    // The request's LoRAs (none = the base weights exactly), from the cache or read once.
    if (!applyLoras(req.id, request.loras)) return;
    // What diffusers would warn about (truncated prompts, settings without effect), once.
    if (rank_ == 0) {
      std::vector<std::string> warnings;
      if (prompts.empty())
        warnings = pipe_->requestWarnings(base);
      else
        for (size_t i = 0; i < prompts.size(); ++i) {
          PipelineInputs q = base;
          q.prompt = prompts[i];
          for (auto& w : pipe_->requestWarnings(q))
            warnings.push_back("prompts[" + std::to_string(i) + "]: " + w);
        }
      for (const auto& w : warnings) emitTyped(protocol::LogEvent{id, 0, "warning", w});
    }
    // A random seed is drawn on rank 0 and shared, so every rank starts from the same noise (the
    // int64 tensor carries the uint64 bit pattern unchanged).
    if (request.random_seed) {
      at::Tensor sd =
          at::full({1}, rank_ == 0 ? static_cast<int64_t>(randomSeed()) : int64_t(0), at::kLong);
      world_->broadcast(sd, 0)->wait();
      base.seed = static_cast<uint64_t>(sd.item<int64_t>());
    }
    const std::string& output = req.output;
    const std::string& outputDir = req.output_dir;
    const std::string& outputTensors = req.output_tensors;
    const int previewEvery = req.preview_every;
    const int dp = s_.dp_degree, dpi = mesh_->coord("dp");
    const bool leader = mesh_->coord("cfg") == 0 && mesh_->coord("ring") == 0 &&
                        mesh_->coord("ulysses") == 0 && mesh_->coord("tp") == 0;
    const auto tReq = Clock::now();
    bool cancelled = false;
    const int rounds = (numImages + dp - 1) / dp;
    for (int round = 0; round < rounds && !cancelled; ++round) {
      const int index = round * dp + dpi;  // this replica's image
      const bool mine = index < numImages;
      PipelineInputs p = base;
      if (!prompts.empty() && mine) p.prompt = prompts[index];
      // seed + image index, wrapping in the unsigned domain (no signed overflow near INT64_MAX).
      if (prompts.empty()) p.seed = base.seed + static_cast<uint64_t>(index);
      int stepSeen = 0;
      PipelineCallbacks cb;
      cb.onStage = [&](const std::string& st) {
        stage_ = st == "encode"    ? "encoding"
                 : st == "denoise" ? "denoising"
                 : st == "decode"  ? "decoding"
                                   : st;
        // The GUI's status bar and monitor show the true stage (PROTOCOL.md `status`).
        if (rank_ == 0)
          emitTyped(protocol::StatusEvent{
              stage_, stage_ + " " + id + " image " + std::to_string(index), id});
      };
      cb.onStep = [&](int step, int steps, const at::Tensor&, const at::Tensor& x0, double ms) {
        stepSeen = step;
        fault_.atStep(step);
        if (leader && previewEvery > 0 && (step % previewEvery == 0) && step < steps) {
          at::Tensor img = pipe_->decode(x0, p.height, p.width);
          auto rgb = toRGB8(img);
          emitTyped(protocol::PreviewEvent{id, step, index,
                                           base64Encode(encodePng(rgb.data(), p.width, p.height))});
        }
        if (syncStats(step, steps, ms, true, id, index)) {
          cancelled = true;
          return false;
        }
        return true;
      };
      const auto tImg = Clock::now();
      GenerationResult res;
      if (mine) {
        res = pipe_->generate(p, cb);
      } else {
        // Idle replica in the last round: keep the per-step collectives in lockstep (the
        // steps the pipeline runs: an init image's strength skips the first ones).
        const int run = p.steps - p.firstStep();
        for (int s = 1; s <= run && !cancelled; ++s)
          cancelled = syncStats(s, run, 0.0, true, id, index);
      }
      if (cancelled) {
        if (rank_ == 0) emitTyped(protocol::CancelledEvent{id, stepSeen});
        break;
      }
      stage_ = "idle";
      // Issue 18: results come home. A replica leader other than rank 0 may be on another host:
      // it writes its files to a private temporary folder, sends their bytes to rank 0 (through
      // the group, under the collective timeout), and rank 0 writes them where the user asked
      // and reports the image.
      // Single-host groups (every rank on rank 0's host name) keep writing where they computed.
      if (dp > 1 && multiHost_ &&
          shipResults(mine && leader && rank_ != 0, req, request, res, index, numImages, tImg))
        continue;
      if (mine && leader) {
        std::string path;
        const protocol::GenerationParams made = imageParams(request, res.params);
        json extra{{"model", modelDir_}, {"strategy", s_.describe()}, {"dtype", dtype_}};
        // Leader-only I/O: a bad path is the user's error, not the group's (no collective is
        // skipped; every rank still meets at the barrier below).
        try {
          // The output folder never has a file replaced: a new unique name per image.
          if (!output.empty())
            path = indexedPath(output, index, numImages);
          else
            path =
                uniqueImagePath(outputDir.empty() ? fs::temp_directory_path().string() : outputDir,
                                id, index, made.seed);
          // Files that existed when the request was accepted (with "overwrite") and the name
          // reserved just now may be replaced; nothing else (a file appearing meanwhile stays).
          std::vector<std::string> allowed = replaceable_;
          if (output.empty()) allowed.push_back(path);
          const OutputReplacePolicy policy(allowed);
          writeImagePng(path, res, made, extra);
          if (!outputTensors.empty())
            writeResultTensors(indexedPath(outputTensors, index, numImages), res, made);
        } catch (const std::exception& e) {
          // No partial output: the empty file uniqueImagePath reserved goes too.
          std::error_code ec;
          if (output.empty() && !path.empty() && fs::is_regular_file(path, ec) &&
              fs::file_size(path, ec) == 0)
            fs::remove(path, ec);
          emitTyped(protocol::ErrorEvent{
              id, rank_, "cannot write image " + std::to_string(index) + ": " + e.what(), false});
          continue;
        }
        const json cache = cacheReport(res);
        if (!cache.is_null()) {
          std::ostringstream msg;
          msg << "cache " << cache["mode"].get<std::string>() << ": image " << index
              << " computed steps " << cache["computed_steps"].dump() << " of "
              << cache["steps"].get<int>() << ", reused " << cache["reused_steps"].dump()
              << ", about " << static_cast<int>(cache["saved_ms"].get<double>()) << " ms saved";
          emitTyped(protocol::LogEvent{id, rank_, "info", msg.str()});
        }
        protocol::ImageEvent image;
        image.id = id;
        image.cache = cache;
        image.image_index = index;
        image.path = path;
        image.seed = made.seed;
        image.has_seed = true;
        image.params = protocol::toJson(made);
        image.rank = rank_;
        image.seconds = std::chrono::duration<double>(Clock::now() - tImg).count();
        emitTyped(image);
      }
    }
    // All images of the request are written before "done" (a world barrier orders the replicas).
    world_->barrier()->wait();
    stage_ = "idle";
    if (rank_ == 0) emitTyped(protocol::StatusEvent{"idle", "idle", id});
    syncStats(0, 0, 0.0, /*emit=*/true);  // every rank back to idle, final memory figures
    if (rank_ == 0 && !cancelled)
      emitTyped(
          protocol::DoneEvent{id, std::chrono::duration<double>(Clock::now() - tReq).count()});
  }

  // Applies the request's LoRA list on every rank (LoraCache: each file parsed and sharded once).
  // A file that cannot be used (missing, corrupt, unknown format, a module this model does not
  // have or whose shape differs) is refused by every rank together: the lowest failing rank
  // emits the error event naming the file and module, the base weights are restored and the group
  // keeps serving. On success rank 0 emits a "lora" event (what was applied, bytes per rank,
  // files parsed so far, model weight reads of this process: unchanged by LoRA switches).
  bool applyLoras(const std::string& id, std::vector<protocol::LoraRequest>& loras) {
    std::string refusal;
    std::vector<std::shared_ptr<const LoraCache::Entry>> entries;
    DiffusionTransformer& dit = pipe_->transformer();
    try {
      entries = loraCache_.apply(loras, dit);
    } catch (const std::exception& e) {
      refusal = std::string("LoRA refused: ") + e.what();
    }
    at::Tensor mine = at::full({1, 1}, refusal.empty() ? int64_t(0) : int64_t(1), at::kLong);
    at::Tensor all = world_->allgather(mine, 0)->result();
    int first = -1;
    for (int r = 0; r < all.size(0) && first < 0; ++r)
      if (all[r][0].item<int64_t>() != 0) first = r;
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

  // The request's host-dependent checks on every rank: an existing `output` / `output_tensors`
  // without `overwrite` (rank 0, which sees the paths the client named), and the memory estimate
  // (activations, attention and VAE decode on top of the loaded weights, for every rank sharing
  // this host) against MemAvailable on CPU devices or the device's free memory on CUDA. Returns
  // true when any rank refuses; the lowest refusing rank emits the error event.
  bool refuseRequest(const protocol::GenerateRequest& req, const PipelineInputs& base,
                     int numImages) {
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
      // Only the files there now may be replaced when the image is written (a file that
      // appears meanwhile is never replaced: OutputReplacePolicy).
      if (rank_ == 0 && req.overwrite)
        for (int i = 0; i < numImages; ++i)
          for (const std::string* f : {&req.output, &req.output_tensors})
            if (!f->empty() && fs::exists(indexedPath(*f, i, numImages)))
              replaceable_.push_back(indexedPath(*f, i, numImages));
      if (refusal.empty()) {
        RequestDims rd;
        rd.width = base.width;
        rd.height = base.height;
        rd.text_len = base.max_sequence_length;
        rd.true_cfg = pipe_->model().config->runsCfg(base.trueCfg(), base.guidance);
        rd.num_images = numImages;
        const bool cuda = device_.rfind("cuda", 0) == 0;
        const MemoryEstimate est = estimateRequestMemory(
            pipe_->model(), s_, rd, static_cast<int>(c10::elementSize(computeDtype_)), !cuda);
        if (cuda) {
          if (auto avail = deviceMemoryAvailable(c10::Device(device_)))
            refusal =
                memoryRefusal(est, est.requestBytes(), 1, *avail, rd,
                              "free device memory on " + device_ + " (weights already loaded)");
        } else if (auto avail = hostMemoryAvailable()) {
          refusal = memoryRefusal(est, est.requestBytes(), ranksOnHost_, *avail, rd,
                                  "host memory (MemAvailable, weights already loaded)");
        }
      }
    } catch (const std::exception& e) {
      refusal = e.what();
    }
    at::Tensor mine = at::full({1, 1}, refusal.empty() ? int64_t(0) : int64_t(1), at::kLong);
    at::Tensor all = world_->allgather(mine, 0)->result();
    int first = -1;
    for (int r = 0; r < all.size(0) && first < 0; ++r)
      if (all[r][0].item<int64_t>() != 0) first = r;
    if (first < 0) return false;
    if (first == rank_) emitTyped(protocol::ErrorEvent{req.id, rank_, refusal, false});
    return true;
  }

  Strategy s_;
  std::vector<Peer> peers_;
  MPI_Comm hb_ = MPI_COMM_NULL;
  int ranksOnHost_ = 1;
  bool multiHost_ = false;  ///< some rank runs on another host name than rank 0 (issue 18)
  ModelSources src_;
  std::string modelDir_, dtype_, device_ = "cpu", stage_ = "idle";
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

}  // namespace

int main(int argc, char** argv) {
  // `ditstudio-worker --model-fingerprint PATH...`: prints one `file SIZE DIGEST PATH` line per
  // file, then `fingerprint HEX`, and exits without MPI (the launcher's pre-flight runs it on
  // every host over ssh and names the files that differ, issue 18). Exit 3 when a path is
  // missing or unreadable (the cause on stderr).
  if (argc >= 2 && std::string(argv[1]) == "--model-fingerprint") {
    try {
      const std::vector<std::string> paths(argv + 2, argv + argc);
      for (const launcher::FileFingerprint& f : launcher::modelFileFingerprints(paths))
        std::printf("file %llu %s %s\n", static_cast<unsigned long long>(f.size), f.digest.c_str(),
                    f.path.c_str());
      std::printf("fingerprint %s\n", launcher::modelFingerprint(paths).c_str());
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 3;
    }
  }
  // Every event line and abortGroup's fatal line are the protocol's (parallel/ knows none).
  setEventLineFormatter([](const json& e) { return protocol::eventLine(e); });
  setFatalLineFormatter(
      [](const FatalError& f) { return protocol::fatalErrorLine(f.rank, f.message); });
  // Before MPI_Init and any thread: may re-execute this rank with a better OpenBLAS kernel.
  g_blas = dit::ensureBlasKernel(argc, argv);
  tuneHostAllocator();
  initRuntime(argc, argv);
  const int rank = worldRank();
  auto logger = spdlog::stderr_logger_mt("worker");
  logger->set_pattern("[%H:%M:%S] [rank " + std::to_string(rank) + "/" +
                      std::to_string(worldSize()) + "] %v");
  spdlog::set_default_logger(logger);
  CLI::App app{"DiT Studio rank program (start with mpirun)", "ditstudio-worker"};
  Strategy s;
  std::string model, dtype = "float32";
  ModelSources src;
  app.add_option("--model", model,
                 "diffusers FLUX.1 or FLUX.2 [klein] folder, FLUX.1 single transformer file or "
                 "all-in-one checkpoint "
                 "(default: embedded tiny model)");
  addModelSourceOptions(app, src);
  app.add_option("--dtype", dtype, "float32 | bfloat16 | float16");
  app.add_option("--device", s.device, "cpu | cuda");
  launcher::addStrategyOptions(app, s);
  bool allowNonFinite = false;
  app.add_flag("--allow-nonfinite-weights", allowNonFinite,
               "load checkpoints that hold NaN or Inf (refused by default)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (rank == 0)
      emitTyped(protocol::ErrorEvent{std::nullopt, rank,
                                     std::string("bad worker arguments: ") + e.what(), true});
    finalizeRuntime();
    return 2;
  }
  if (model.empty()) model = defaultModelDir();
  if (allowNonFinite) setAllowNonFiniteWeights(true);
  s.world = worldSize();
  src.model = model;
  int rc = runOrAbort([&] { return Worker(s, src, dtype).run(); });
  finalizeRuntime();
  return rc;
}
