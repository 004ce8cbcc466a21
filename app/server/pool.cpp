#include "app/server/pool.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>
#include <stdexcept>

#include "app/launcher/group_start.h"
#include "app/launcher/launch.h"
#include "app/server/request_guard.h"

namespace dit::server {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string randomTag() {
  std::random_device rd;
  std::ostringstream s;
  s << std::hex << (rd() & 0xffffff);
  return s.str();
}

}  // namespace

// ------------------------------------------------------------------------------------------
// The observer of one group: runs on the scheduler thread, inside its session's calls.

// For an attached group it runs on its owner's thread instead (AttachedGroup).

class Pool::GroupObserver : public launcher::SessionObserver {
 public:
  GroupObserver(Pool& pool, int index) : pool_(pool), index_(index) {}

  void stateChanged(State s) override {
    std::lock_guard lock(pool_.mu_);
    Group& g = pool_.groups_[index_];
    g.state = launcher::WorkerSession::stateName(s);
    if (s == State::Failed) g.failed = true;
    // An attached group is started again by its owner (the window's Start): serving again.
    if (g.attached && (s == State::Starting || s == State::Ready)) {
      g.failed = false;
      if (s == State::Starting) g.failure = nullptr;
    }
    pool_.emit(json{{"type", "group.state"}, {"group", g.spec.name}, {"state", g.state}});
    pool_.cv_.notify_all();
  }
  void stageChanged(const std::string& stage) override {
    std::lock_guard lock(pool_.mu_);
    pool_.groups_[index_].stage = stage;
    pool_.cv_.notify_all();
  }
  void event(const protocol::Event& raw, const protocol::WorkerEvent& ev) override {
    if (const auto& w = pool_.groups_[index_].watch) w->noteEvent();  // the stall counts anew
    std::lock_guard lock(pool_.mu_);
    Group& g = pool_.groups_[index_];
    if (const auto* h = std::get_if<protocol::HelloEvent>(&ev)) {
      g.pids[h->rank] = h->pid;
      g.world = std::max(g.world, h->world);
    } else if (const auto* r = std::get_if<protocol::ReadyEvent>(&ev)) {
      g.ready = raw.data;
      g.world = r->world;
      // An attached group's owner may have started it again with another model (the window's
      // Start): the pool serves the one it runs now.
      if (g.attached && r->model.is_object() && r->model.contains("path") &&
          r->model["path"].is_string() && !r->model["path"].get<std::string>().empty()) {
        g.spec.model = r->model["path"].get<std::string>();
        g.model_id = modelId(g.spec.model);
      }
      pool_.emit(json{{"type", "group.ready"},
                      {"group", g.spec.name},
                      {"world", r->world},
                      {"load_seconds", r->load_seconds}});
    } else if (std::holds_alternative<protocol::RanksEvent>(ev)) {
      g.ranks = raw.data.value("ranks", json::array());
      pool_.emit(json{{"type", "group.ranks"}, {"group", g.spec.name}, {"ranks", g.ranks}});
    } else if (const auto* p = std::get_if<protocol::ProgressEvent>(&ev)) {
      if (auto job = pool_.jobLocked(p->id)) {
        started(*job);
        job->step = p->step;
        job->steps = p->steps;
        job->image_index = p->image_index;
        job->step_ms = p->step_ms;
        job->eta_s = p->eta_s;
        pool_.emit(json{{"type", "job.progress"},
                        {"job", job->id},
                        {"step", p->step},
                        {"steps", p->steps},
                        {"image_index", p->image_index},
                        {"step_ms", p->step_ms},
                        {"eta_s", p->eta_s}});
      }
    } else if (const auto* v = std::get_if<protocol::PreviewEvent>(&ev)) {
      if (auto job = pool_.jobLocked(v->id); job && job->previews) {
        started(*job);
        job->preview_list.push_back(
            JobPreview{++job->preview_seq, v->step, v->image_index, v->png});
        while (job->preview_list.size() > 64) job->preview_list.pop_front();
        pool_.emit(json{{"type", "job.preview"},
                        {"job", job->id},
                        {"step", v->step},
                        {"image_index", v->image_index},
                        {"png", v->png}});
      }
    } else if (const auto* i = std::get_if<protocol::ImageEvent>(&ev)) {
      if (auto job = pool_.jobLocked(i->id)) {
        started(*job);
        job->images.push_back(JobImage{i->image_index, i->path, i->seed, i->has_seed, i->params});
        pool_.emit(json{{"type", "job.image"},
                        {"job", job->id},
                        {"image_index", i->image_index},
                        {"file", fs::path(i->path).filename().string()},
                        {"seed", i->has_seed ? json(i->seed) : json(nullptr)}});
      }
    }
    pool_.cv_.notify_all();
  }
  void requestDone(const std::string& id, double seconds) override {
    std::lock_guard lock(pool_.mu_);
    if (auto job = pool_.jobLocked(id)) {
      started(*job);
      job->extra["seconds"] = seconds;
      pool_.finish(*job, JobState::Done);
      ++pool_.groups_[index_].jobs_done;
    }
    release(id);
  }
  void requestCancelled(const std::string& id, int step) override {
    std::lock_guard lock(pool_.mu_);
    if (auto job = pool_.jobLocked(id)) {
      unqueue(*job);
      job->extra["cancelled_at_step"] = step;
      pool_.finish(*job, JobState::Cancelled);
    }
    release(id);
  }
  void requestFailed(const std::string& id, const std::string& given) override {
    const Group& group = pool_.groups_[index_];
    const bool groupDown =
        group.session ? !group.session->isRunning() || group.session->process().tearingDown()
                      : group.attached && group.failed;
    // A silent remote rank named by its host's answer, as ditstudio-cli names it (blocks while
    // the host is asked over ssh: at most 10 s a host, once per message).
    const std::string message = named(given);
    std::lock_guard lock(pool_.mu_);
    if (auto job = pool_.jobLocked(id)) {
      unqueue(*job);
      Group& g = pool_.groups_[index_];
      // A rank's message names the files it was given: the client sees its own names.
      std::vector<std::pair<std::string, std::string>> names;
      const auto& p = job->request.params;
      if (!p.init_image.empty()) names.emplace_back(p.init_image, "the uploaded image");
      if (!p.mask_image.empty()) names.emplace_back(p.mask_image, "the uploaded mask");
      for (const auto& l : p.loras)
        names.emplace_back(l.file, fs::path(l.file).filename().string());
      const std::string said = clientMessage(message, names);
      job->error = groupDown ? "group " + g.spec.name + " failed: " + said : said;
      job->error_status = groupDown ? 500 : 400;
      pool_.finish(*job, JobState::Failed);
    }
    release(id);
  }
  void errorReported(const launcher::GroupFailure& f) override {
    // A fatal error naming a silent remote rank is named now, while the group's abort has not
    // ended the rank yet (its request failure and the group's failure repeat the message).
    if (f.fatal) (void)named(f.message);
  }
  void groupFailed(const launcher::GroupFailure& f) override {
    const std::string message = named(f.message);
    std::lock_guard lock(pool_.mu_);
    Group& g = pool_.groups_[index_];
    g.failed = true;
    g.failure = json{{"rank", f.rank}, {"pid", f.pid}, {"message", message}, {"detail", f.detail}};
    if (!f.host.empty()) g.failure["host"] = f.host;
    pool_.emit(json{
        {"type", "group.failed"}, {"group", g.spec.name}, {"rank", f.rank}, {"message", message}});
    pool_.cv_.notify_all();
  }
  void logLine(int, const std::string& level, const std::string& text) override {
    // The group's failure naming a rank on a peer host that disconnected (OpenMPI 5): named by
    // the host's answer while the ranks there can still be asked.
    if (level == "error" && launcher::RemoteRankWatch::hasDisconnectedRank(text)) (void)named(text);
  }

 private:
  // `message` with a silent or disconnected remote rank named by its host (hostfile groups; once
  // per message: the same error reaches errorReported, requestFailed and groupFailed).
  std::string named(const std::string& message) {
    const auto& watch = pool_.groups_[index_].watch;
    if (!watch || !watch->active()) return message;
    if (const auto it = named_.find(message); it != named_.end()) return it->second;
    const std::string n = launcher::nameSilentRanks(watch.get(), message);
    if (n != message && pool_.opt_.log)
      pool_.opt_.log("group " + pool_.groups_[index_].spec.name + ": " + n);
    return named_[message] = n;
  }
  // A handed job's first news: it runs now (lock held).
  void started(Job& job) {
    if (job.state != JobState::Queued) return;
    unqueue(job);
    job.state = JobState::Running;
    job.started_at = std::chrono::steady_clock::now();
    Group& g = pool_.groups_[index_];
    if (g.attached) g.job = job.id;
    pool_.emit(json{{"type", "job.started"}, {"job", job.id}, {"group", g.spec.name}});
  }
  // A handed job leaves the pool's queue (lock held).
  void unqueue(const Job& job) {
    auto& q = pool_.queue_;
    q.erase(std::remove(q.begin(), q.end(), job.id), q.end());
  }
  // The group is free again (lock held).
  void release(const std::string& id) {
    Group& g = pool_.groups_[index_];
    if (g.job == id) g.job.clear();
    pool_.cv_.notify_all();
  }
  Pool& pool_;
  int index_;
  std::map<std::string, std::string> named_;  ///< fatal messages as the hosts named them
};

// ------------------------------------------------------------------------------------------

Pool::Pool(std::vector<GroupSpec> groups, PoolOptions options)
    : specs_(std::move(groups)), opt_(std::move(options)), tag_(randomTag()) {
  if (specs_.empty()) throw std::invalid_argument("the pool has no group");
  fs::create_directories(opt_.images_dir);
  opt_.images_dir = fs::canonical(opt_.images_dir).string();
  groups_.resize(specs_.size());
  for (size_t i = 0; i < specs_.size(); ++i) {
    Group& g = groups_[i];
    g.spec = specs_[i];
    if (g.spec.name.empty()) g.spec.name = "g" + std::to_string(i);
    g.model_id = modelId(g.spec.model);
    g.observer = std::make_unique<GroupObserver>(*this, static_cast<int>(i));
    g.session =
        std::make_unique<launcher::WorkerSession>(g.observer.get(), g.spec.name + "-" + tag_);
  }
  for (size_t i = 0; i < groups_.size(); ++i)
    for (size_t k = 0; k < i; ++k)
      if (groups_[i].spec.name == groups_[k].spec.name)
        throw std::invalid_argument("two groups are named '" + groups_[i].spec.name + "'");
}

Pool::Pool(GroupSpec spec, AttachedGroup& group, PoolOptions options)
    : specs_{std::move(spec)}, opt_(std::move(options)), tag_(randomTag()) {
  fs::create_directories(opt_.images_dir);
  opt_.images_dir = fs::canonical(opt_.images_dir).string();
  groups_.resize(1);
  Group& g = groups_.front();
  g.spec = specs_.front();
  if (g.spec.name.empty()) g.spec.name = "g0";
  g.model_id = modelId(g.spec.model);
  g.observer = std::make_unique<GroupObserver>(*this, 0);
  g.attached = &group;
}

Pool::~Pool() { stop(); }

launcher::SessionObserver& Pool::attachedObserver() {
  if (groups_.size() != 1 || !groups_.front().attached)
    throw std::logic_error("Pool::attachedObserver: the pool has no attached group");
  return *groups_.front().observer;
}

std::vector<std::string> Pool::withCpuSet(std::vector<std::string> argv, const std::string& cpus) {
  return launcher::withCpuSet(std::move(argv), cpus);
}

namespace {
int groupWorld(const GroupSpec& g) {
  const Strategy& s = g.strategy;
  return g.np > 0 ? g.np
                  : s.tp_degree * s.ring_degree * s.ulysses_degree * s.cfg_degree * s.dp_degree;
}
}  // namespace

void Pool::start() {
  // CPU slices for several single-host groups (each mpirun would place its ranks from core 0).
  std::vector<int> allowed;
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0)
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) allowed.push_back(c);
  }
  std::vector<std::string> slices(groups_.size());
  std::vector<bool> place(groups_.size(), false);
  int singleHost = 0;
  std::size_t need = 0;
  for (const Group& g : groups_)
    if (g.session && g.spec.hostfile.empty()) {
      ++singleHost;
      need += static_cast<std::size_t>(std::max(1, groupWorld(g.spec)) *
                                       std::max(1, g.spec.omp_threads));
    }
  std::size_t next = 0;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const GroupSpec& sp = groups_[i].spec;
    if (!groups_[i].session || !sp.hostfile.empty()) continue;
    if (!sp.cpus.empty()) {  // given: always used
      place[i] = true;
      slices[i] = sp.cpus;
      continue;
    }
    if (singleHost < 2) continue;  // one group: mpirun's own placement
    place[i] = true;
    if (need > allowed.size()) continue;  // more ranks than CPUs: no binding, no slice
    const std::size_t n =
        static_cast<std::size_t>(std::max(1, groupWorld(sp)) * std::max(1, sp.omp_threads));
    for (std::size_t k = 0; k < n; ++k)
      slices[i] += (k ? "," : "") + std::to_string(allowed[next + k]);
    next += n;
  }
  // Every group is prepared (strategy, hostfile plan, the pre-flight of every other host, argv)
  // before any starts: a refused one leaves nothing running.
  std::vector<launcher::PreparedGroup> prepared(groups_.size());
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    if (!g.session) continue;  // attached: its owner runs it
    Strategy s = g.spec.strategy;
    const int product = s.tp_degree * s.ring_degree * s.ulysses_degree * s.cfg_degree * s.dp_degree;
    s.world = g.spec.np > 0 ? g.spec.np : product;
    s.device = g.spec.device;
    if (auto issues = validateDegrees(s); !issues.empty())
      throw std::invalid_argument("group " + g.spec.name + ": " + joinIssues(issues));
    launcher::GroupSpec spec;
    launcher::MpirunLaunch& l = spec.launch;
    l.strategy = s;
    l.hostfile = g.spec.hostfile;
    l.omp_threads = std::max(1, g.spec.omp_threads);
    l.worker = opt_.exe_dir + "/ditstudio-worker";
    l.model = g.spec.model;
    l.extra_worker_args = {"--dtype", g.spec.dtype};
    for (const auto& a : g.spec.model_args) l.extra_worker_args.push_back(a);
    for (const auto& a : protocol::runOptionArgs(g.spec.run)) l.extra_worker_args.push_back(a);
    l.network_interface = g.spec.network_interface;
    l.ssh_options = g.spec.ssh_options;
    l.port_range = g.spec.port_range;
    l.isolate = g.spec.hostfile.empty() ? launcher::isolationProgram(opt_.exe_dir) : "";
    spec.preflight = g.spec.preflight;
    if (place[gi]) spec.cpu_set = slices[gi];
    if (!g.spec.devices.empty()) spec.env.emplace_back("CUDA_VISIBLE_DEVICES", g.spec.devices);
    launcher::HostGroupProgress progress;
    const std::string who = "group " + g.spec.name + ": ";
    if (opt_.log) {
      progress.planned = [&](const launcher::HostPlan& plan) {
        opt_.log(who + "hostfile " + g.spec.hostfile + ": " + launcher::describeHostPlan(plan));
      };
      progress.checked = [&](const launcher::PreflightResult& r) {
        if (r.ok)
          opt_.log(who + "pre-flight " + r.host + ": ok (worker, model fingerprint " +
                   r.fingerprint + ", " + std::to_string(std::lround(r.seconds * 1000)) + " ms)");
      };
    }
    try {
      prepared[gi] = launcher::prepareGroup(spec, progress);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(who + e.what());
    } catch (const std::runtime_error& e) {
      throw std::invalid_argument(who + e.what());
    }
    g.watch = prepared[gi].watch;
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    if (!g.session) continue;
    {
      std::lock_guard lock(mu_);
      g.cpus = slices[gi];
      g.state = "starting";
      g.world = prepared[gi].session.world;
      g.ready = nullptr;
      g.failed = false;
      g.failure = nullptr;
    }
    g.session->start(prepared[gi].session);
  }
  thread_ = std::thread([this] { run(); });
}

void Pool::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void Pool::run() {
  std::vector<launcher::WorkerSession*> sessions;
  for (Group& g : groups_)
    if (g.session) sessions.push_back(g.session.get());
  // A hostfile group that computes without an event this long: its other hosts are asked over
  // ssh about their ranks (once per stall), as ditstudio-cli asks them.
  const std::chrono::seconds stall = launcher::RemoteRankWatch::stallAfter();
  for (;;) {
    {
      std::unique_lock lock(mu_);
      if (stopping_) break;
      // Nothing to poll (an attached group only): wait for a job or a change instead.
      if (sessions.empty()) cv_.wait_for(lock, std::chrono::milliseconds(25));
      if (stopping_) break;
    }
    schedule();
    if (!sessions.empty()) launcher::pollSessions(sessions, std::chrono::milliseconds(25));
    for (Group& g : groups_)
      if (g.session && g.watch && g.watch->active() &&
          g.session->state() == launcher::WorkerSession::State::Busy && g.watch->stallDue(stall))
        for (const launcher::RemoteRankState& r : g.watch->checkStall(g.session->rankPids()))
          if (opt_.log)
            opt_.log("group " + g.spec.name + ": rank " + std::to_string(r.rank) + " (pid " +
                     std::to_string(r.pid) + " on " + r.host + ") is " + r.state +
                     " (asked over ssh while the group stalled)");
  }
  // Shutdown: cancel and stop every group, within the teardown policy's bounds.
  for (Group& g : groups_)
    if (g.session && g.session->isRunning()) g.session->stop(std::chrono::milliseconds(2000));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(12);
  auto anyRunning = [&] {
    return std::any_of(groups_.begin(), groups_.end(),
                       [](const Group& g) { return g.session && g.session->isRunning(); });
  };
  while (anyRunning() && std::chrono::steady_clock::now() < deadline)
    launcher::pollSessions(sessions, std::chrono::milliseconds(100));
  // An attached group keeps running: the jobs it was given are taken back (cancelled there).
  std::vector<std::pair<AttachedGroup*, std::string>> takeBack;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, job] : jobs_)
      if (!job->finished() && job->group >= 0 && groups_[job->group].attached) {
        takeBack.emplace_back(groups_[job->group].attached, id);
        queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
        job->error = "the server is shutting down";
        job->error_status = 503;
        finish(*job, JobState::Failed);
      }
  }
  for (const auto& [group, id] : takeBack) group->cancel(id);
  std::lock_guard lock(mu_);
  for (const std::string& id : queue_)
    if (auto job = jobLocked(id)) {
      job->error = "the server is shutting down";
      job->error_status = 503;
      finish(*job, JobState::Failed);
    }
  queue_.clear();
  cv_.notify_all();
}

void Pool::schedule() {
  std::vector<std::pair<int, protocol::GenerateRequest>> submits;
  std::vector<std::pair<int, std::string>> cancels;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, job] : jobs_)
      if ((job->state == JobState::Running || job->handed) && job->cancel_requested &&
          !job->cancel_sent) {
        job->cancel_sent = true;
        cancels.emplace_back(job->group, id);
      }
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      Group& g = groups_[gi];
      if (g.attached) {
        // The attached group's own queue orders the jobs beside its owner's requests: each is
        // handed over as it comes, and stays Queued here until the group's first news of it.
        if (g.failed) continue;
        for (const std::string& id : queue_) {
          auto job = jobLocked(id);
          if (!job || job->handed || job->model != g.model_id) continue;
          job->handed = true;
          job->group = static_cast<int>(gi);
          job->extra["group"] = g.spec.name;
          submits.emplace_back(static_cast<int>(gi), job->request);
        }
        continue;
      }
      if (g.failed || !g.job.empty() ||
          g.session->state() != launcher::WorkerSession::State::Ready ||
          !g.session->queue().empty())
        continue;
      for (auto it = queue_.begin(); it != queue_.end(); ++it) {
        auto job = jobLocked(*it);
        if (!job || job->model != g.model_id) continue;
        queue_.erase(it);
        job->state = JobState::Running;
        job->group = static_cast<int>(gi);
        job->extra["group"] = g.spec.name;
        job->started_at = std::chrono::steady_clock::now();
        g.job = job->id;
        submits.emplace_back(static_cast<int>(gi), job->request);
        emit(json{{"type", "job.started"}, {"job", job->id}, {"group", g.spec.name}});
        break;
      }
    }
    // Queued jobs no live group can serve any more.
    for (auto it = queue_.begin(); it != queue_.end();) {
      auto job = jobLocked(*it);
      const bool served = job && std::any_of(groups_.begin(), groups_.end(), [&](const Group& g) {
                            return !g.failed && g.model_id == job->model;
                          });
      if (job && !served) {
        std::string why;
        for (const Group& g : groups_)
          if (g.model_id == job->model && g.failure.is_object())
            why += (why.empty() ? "" : "; ") + g.spec.name + ": " +
                   g.failure.value("message", std::string());
        job->error =
            "no group serving model '" + job->model + "' is alive (" + clientMessage(why) + ")";
        job->error_status = 503;
        finish(*job, JobState::Failed);
        if (job->handed) cancels.emplace_back(job->group, job->id);  // taken back
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    if (!submits.empty() || !cancels.empty()) cv_.notify_all();
  }
  for (const auto& [gi, id] : cancels) {
    Group& g = groups_[gi];
    if (g.session)
      g.session->cancel(id);
    else
      g.attached->cancel(id);
  }
  for (auto& [gi, req] : submits) {
    Group& g = groups_[gi];
    if (g.session)
      g.session->submit(std::move(req));
    else
      g.attached->submit(std::move(req));
  }
}

}  // namespace dit::server
