// The server's pool: several worker groups behind ONE bounded queue. Each job goes to the next free
// group that serves its model; a group that dies is named, its job failed with the cause, the
// others keep serving. A group is either started by the pool (one launcher::WorkerSession each,
// put together by dit_launcher's one group start, launcher::prepareGroup: the hostfile pre-flight,
// the mpirun argv, the naming of a silent remote rank) or attached (AttachedGroup: a group that
// runs elsewhere, the GUI window's own, whose queue the pool's jobs join). One scheduler thread
// owns the started sessions (WorkerSession is not thread-safe) and runs launcher::pollSessions
// over all of them; HTTP threads only touch the jobs, under the pool's mutex, and wait on its
// condition variable. No Torch, no Qt. Part of dit_server: pool.cpp (the groups and the
// scheduler), pool_jobs.cpp (jobs, events, status JSON), pool_config.cpp (--pool, pool files).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "app/launcher/host_group.h"
#include "app/launcher/worker_session.h"
#include "app/protocol/protocol.h"
#include "app/protocol/run_options.h"
#include "parallel/strategy.h"

namespace dit::server {

/// One group of the pool: what `mpirun -np N ditstudio-worker` gets.
struct GroupSpec {
  std::string name;                     ///< shown in status and errors; "" = "g<index>"
  std::string model;                    ///< model folder or file; "" = the embedded default model
  std::vector<std::string> model_args;  ///< --config/--vae/... passed to every rank
  Strategy strategy;                    ///< degrees; world = np (0: product of the degrees)
  int np = 0;
  int omp_threads = 1;
  std::string device = "cpu", dtype = "float32";
  std::string devices;   ///< CUDA_VISIBLE_DEVICES for the group's ranks ("" = unchanged)
  std::string hostfile;  ///< mpirun --hostfile (several machines)
  /// Single-host groups: the logical CPUs the group's ranks may use (mpirun started under taskset,
  /// e.g. "2,3" or "2-3"); "" = a share of this process's CPUs when the pool has several CPU groups
  /// (see Pool::start), else mpirun's own placement.
  std::string cpus;
  std::string network_interface;
  // Hostfile groups (docs/multi-host.md), as ditstudio-cli's flags of the same names:
  std::string ssh_options;  ///< ssh options for the pre-flight and mpirun's daemons
  std::string port_range;   ///< "MIN-MAX": every port the group listens on ("" = any)
  bool preflight = true;    ///< check every other host over ssh before mpirun starts
  /// --vae-tiling, --text-encoder-placement, --prompt-cache for every rank
  /// (app/protocol/run_options.h; the CLI's flags of the same names).
  protocol::RunOptions run;
};

/// Parses one `--pool` entry "key=value,key=value" over `defaults`. Keys: name, model, np,
/// tp (tp_degree), ring (ring_degree), ulysses (ulysses_degree), cfg (cfg_degree), dp (dp_degree),
/// threads (omp_threads), device, dtype, devices (CUDA_VISIBLE_DEVICES, separated by ':' or
/// '+'), cpus (taskset for mpirun, ':' or '+' separated), hostfile, network_interface,
/// ssh_options, port_range, preflight (0 or 1), vae_tiling (-1 off, 0 the VAE's sample_size, or
/// tile pixels), text_encoder_placement (sharded, own-rank, host-streamed, once), prompt_cache
/// (entries, 0 off). Throws std::invalid_argument naming the entry and
/// the key.
GroupSpec parseGroupSpec(const std::string& spec, const GroupSpec& defaults);

/// What `--plan` plans a group for besides the group itself (ditstudio-cli plan's options).
struct GroupPlanSettings {
  /// Memory per rank ("80G", "24GiB", bytes; parseMemorySize); "" = on CPU groups this host's
  /// MemAvailable divided by the group's ranks (CUDA groups need it).
  std::string memory;
  double usable = 0.9;        ///< share of each rank's memory a plan may fill, (0, 1]
  int width = 0, height = 0;  ///< the request size planned for (0: the model's default side)
  int text_len = 512;         ///< text tokens planned for
  /// CPU ranks of every group on this host sharing its MemAvailable (the pool's groups without
  /// a hostfile); 0 = the planned group's own ranks.
  int host_ranks = 0;
};

/// Lets the placement planner (backend/models/placement_planner.h) choose a group's degrees and
/// its text-encoder placement for its ranks (np; 1 when 0), device, dtype and model sources
/// (model_args): the strategy that fits, under the first of sharded, own-rank, host-streamed and
/// once that fits, or under the group's own placement when it gives one (issue 47: the server
/// uses the planner for its groups). Sets g.strategy's degrees, g.np and
/// g.run.text_encoder_placement, and returns the plan as text (planText) for the log. Throws
/// std::invalid_argument naming the group when it gives degrees of its own (the plan chooses
/// them), has a hostfile (not planned: give the degrees), is a CUDA group without `memory`, or
/// when nothing fits (the plan's message: the smallest memory per rank it needs) or the model's
/// configs cannot be read (naming the group and the file).
std::string planGroup(GroupSpec& g, const GroupPlanSettings& p);
/// A pool file: JSON {"groups": [{"name", "model", "np", "tp_degree", ..., "omp_threads",
/// "device", "dtype", "devices", "hostfile"}, ...]} (or the array alone). Throws
/// std::invalid_argument naming the file, the group and the field.
std::vector<GroupSpec> parsePoolFile(const std::string& path, const GroupSpec& defaults);
/// The model id clients use for a model path (its folder or file name, e.g. "tiny-flux").
std::string modelId(const std::string& modelPath);

enum class JobState { Queued, Running, Done, Failed, Cancelled };
const char* jobStateName(JobState s);

struct JobImage {
  int index = 0;
  std::string path;  ///< the worker's PNG in the images folder
  std::uint64_t seed = 0;
  bool has_seed = false;
  nlohmann::json params;  ///< as made (the image event's params)
};
struct JobPreview {
  std::uint64_t seq = 0;
  int step = 0, image_index = 0;
  std::string png_b64;
};

/// A request in the pool (all fields under Pool::mutex()).
struct Job {
  std::string id;     ///< also the worker request id ("img-...")
  std::string api;    ///< "openai.generations", "openai.edits", "sdapi.txt2img", "page", ...
  std::string model;  ///< model id
  protocol::GenerateRequest request;
  JobState state = JobState::Queued;
  int group = -1;  ///< index of the group running it
  int step = 0, steps = 0, image_index = 0;
  double step_ms = -1, eta_s = -1;
  std::vector<JobImage> images;
  std::string error;     ///< the cause, when Failed (names the rank for a dead group)
  int error_status = 0;  ///< HTTP status for the failure (400 refused by the worker, 500, 503)
  bool cancel_requested = false, cancel_sent = false;
  /// Given to an attached group's queue (AttachedGroup::submit) and not started there yet: still
  /// Queued (and in the pool's queue) until the group's first event for it.
  bool handed = false;
  bool previews = false;                ///< preview events kept (stream, page)
  std::deque<JobPreview> preview_list;  ///< the last previews (at most 64)
  std::uint64_t preview_seq = 0;
  std::int64_t created = 0;  ///< unix seconds
  std::chrono::steady_clock::time_point queued_at, started_at, finished_at;
  nlohmann::json extra = nlohmann::json::object();  ///< the API's echo / bookkeeping
  bool finished() const {
    return state == JobState::Done || state == JobState::Failed || state == JobState::Cancelled;
  }
  nlohmann::json toJson() const;  ///< status for /v1/jobs (without previews)
};

/// A job refused before it was queued: HTTP status, OpenAI error type/code, message.
struct Refusal : std::runtime_error {
  Refusal(int status, std::string type, std::string code, const std::string& message,
          std::string param = {})
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        code(std::move(code)),
        param(std::move(param)) {}
  int status;
  std::string type, code, param;
};

struct PoolOptions {
  std::string images_dir;           ///< where the workers write (created)
  std::string exe_dir;              ///< folder of ditstudio-worker / ditstudio-isolate
  std::size_t max_queue = 16;       ///< jobs queued (not yet running) at most; more: 429
  std::size_t keep_finished = 256;  ///< finished jobs kept for /v1/jobs
  /// Lines about the groups' start and the hosts (the hostfile plan, each host's pre-flight, a
  /// remote rank found stopped while its group stalled), e.g. "group g0: pre-flight 10.0.0.2: ok
  /// (...)"; empty = none. Called on the thread of Pool::start() or the scheduler thread.
  std::function<void(const std::string&)> log;
};

/// A group the pool does not start: one that runs elsewhere (the GUI window's group) and takes
/// the pool's jobs into its own queue beside its owner's requests. The pool calls submit() and
/// cancel() on its scheduler thread: each must only hand the work to the group's own thread and
/// return. The owner reports the group's news to Pool::attachedObserver() (the callbacks of a
/// launcher::SessionObserver, as a started group's session gives them), from one thread at a
/// time; requests of its own (ids the pool did not make) are ignored there.
class AttachedGroup {
 public:
  virtual ~AttachedGroup() = default;
  /// Queue `request` (its id, output_dir and preview cadence as the pool set them) on the group.
  virtual void submit(protocol::GenerateRequest request) = 0;
  /// Cancel request `id` (dropped when not sent yet, else a cancel line to the worker).
  virtual void cancel(const std::string& id) = 0;
};

class Pool {
 public:
  Pool(std::vector<GroupSpec> groups, PoolOptions options);
  /// A pool over ONE attached group (the GUI's Serve API): `spec` names it and its model (the
  /// model id clients use); `group` must outlive the pool. start() starts no process: the jobs
  /// are handed to `group` as they come (its queue orders them), and the group's news comes
  /// through attachedObserver().
  Pool(GroupSpec spec, AttachedGroup& group, PoolOptions options);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  /// Starts every group (launcher::prepareGroup, then its session) and the scheduler thread.
  /// A hostfile group's other hosts are checked over ssh first (the worker there, the same worker
  /// binary and model files by content fingerprint, the port range; seconds a host, one after the
  /// other, before any group starts), as ditstudio-cli checks them. Several single-host groups
  /// would each be placed from core 0 by their own mpirun (all on the same cores): each gets a
  /// disjoint slice of this process's CPUs (taskset; world x omp_threads CPUs each, in order)
  /// when they fit, else no binding (the kernel spreads them). Throws std::invalid_argument
  /// "group NAME: ..." for a strategy or hostfile refused, and for a host that failed its
  /// pre-flight ("group NAME: pre-flight failed:\nhost H holds a different model at M ...: FILE
  /// differs ..."); nothing was started then.
  void start();
  /// launcher::withCpuSet (kept for the pool's callers).
  static std::vector<std::string> withCpuSet(std::vector<std::string> argv,
                                             const std::string& cpus);
  /// The observer an attached group's owner reports the group's news to (the pool built with
  /// an AttachedGroup; throws std::logic_error otherwise). Thread-safe against the pool's other
  /// threads; call it from one thread at a time.
  launcher::SessionObserver& attachedObserver();
  /// Stops the groups (cancel, shutdown, teardown policy) and the scheduler thread; bounded.
  void stop();

  /// Queues a job (its request's id is set to the job id, output_dir to the images folder).
  /// Throws Refusal: 404 for a model no group serves, 429 when the queue is full, 503 when
  /// every group serving the model has failed.
  std::shared_ptr<Job> submit(Job job);
  /// Cancels a queued or running job. False for an unknown or finished one.
  bool cancel(const std::string& id);
  std::shared_ptr<Job> find(const std::string& id) const;

  /// The pool's lock and its condition variable, notified at every change of any job or group.
  std::mutex& mutex() const { return mu_; }
  std::condition_variable& changed() const { return cv_; }
  /// Waits (with mutex() held in `lock`) until `pred` or `timeout`.
  template <class Pred>
  bool waitFor(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout, Pred pred) {
    return cv_.wait_for(lock, timeout, pred);
  }

  // --- status (each takes the lock) ---------------------------------------------------------
  nlohmann::json jobsJson() const;
  nlohmann::json groupsJson() const;
  /// OpenAI's model list: one entry per model id served by a group that has not failed.
  nlohmann::json modelsJson() const;
  /// The model ids served (by any group, failed or not; an attached group's is the model of its
  /// last ready event).
  std::vector<std::string> models() const;
  std::size_t groupCount() const { return specs_.size(); }
  /// Images folder (absolute).
  const std::string& imagesDir() const { return opt_.images_dir; }
  /// Ready info of the first ready group serving `model` (null when none is ready yet).
  nlohmann::json readyInfo(const std::string& model) const;
  /// Blocks until every group is ready or failed (or timeout); true when at least one is ready.
  bool waitReady(std::chrono::milliseconds timeout);

  /// Calls f(const Job&) for every job known (queued, running, the last finished), lock held.
  template <class F>
  void forEachJob(F f) const {
    std::lock_guard lock(mu_);
    for (const auto& [id, job] : jobs_) f(*job);
  }
  /// The path of an image a job of this pool made, by its file name ("" when none has it).
  std::string imagePath(const std::string& fileName) const;

  /// Server events for /v1/events: each {"seq", "type", ...}; `since` = the last seq seen.
  std::vector<nlohmann::json> eventsSince(std::uint64_t since) const;  // lock held by caller
  std::uint64_t lastEventSeq() const { return eventSeq_; }             // lock held by caller

 private:
  class GroupObserver;
  struct Group {
    GroupSpec spec;
    std::string model_id;
    std::unique_ptr<GroupObserver> observer;
    std::unique_ptr<launcher::WorkerSession> session;  ///< null for an attached group
    AttachedGroup* attached = nullptr;                 ///< the group runs elsewhere
    /// Names a silent or disconnected remote rank of a hostfile group (prepareGroup's).
    std::shared_ptr<launcher::RemoteRankWatch> watch;
    // Mirrors for other threads (under mu_):
    std::string state = "stopped", stage = "stopped";
    std::string job;  ///< running job id
    nlohmann::json ready = nullptr, ranks = nlohmann::json::array(), failure = nullptr;
    std::map<int, std::int64_t> pids;
    std::string cpus;  ///< the --cpu-set it was started with ("" = none)
    int world = 0;
    int jobs_done = 0;
    bool failed = false;
  };

  void run();  ///< the scheduler thread
  void schedule();
  void finish(Job& job, JobState state);
  void emit(nlohmann::json event);  ///< lock held
  void trimFinished();              ///< lock held
  std::shared_ptr<Job> jobLocked(const std::string& id) const;

  std::vector<GroupSpec> specs_;
  PoolOptions opt_;
  std::vector<Group> groups_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  std::deque<std::string> queue_;     ///< queued job ids, in order
  std::deque<std::string> finished_;  ///< finished job ids, oldest first
  std::deque<nlohmann::json> events_;
  std::uint64_t eventSeq_ = 0;
  std::uint64_t nextJob_ = 1;
  std::string tag_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dit::server
