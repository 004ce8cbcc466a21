#include "app/server/pool.h"

#include <sched.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "app/launcher/launch.h"
#include "app/server/request_guard.h"

namespace dit::server {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int toInt(const std::string& what, const std::string& v) {
  try {
    size_t used = 0;
    const long x = std::stol(v, &used);
    if (used != v.size() || x < 0 || x > 4096) throw std::invalid_argument(v);
    return static_cast<int>(x);
  } catch (const std::logic_error&) {
    throw std::invalid_argument(what + " must be an integer in 0 .. 4096, got '" + v + "'");
  }
}

void setKey(GroupSpec& g, const std::string& key, const std::string& value,
            const std::string& where) {
  const std::string what = where + ": " + key;
  if (key == "name")
    g.name = value;
  else if (key == "model")
    g.model = value;
  else if (key == "np")
    g.np = toInt(what, value);
  else if (key == "tp" || key == "tp_degree")
    g.strategy.tp_degree = toInt(what, value);
  else if (key == "ring" || key == "ring_degree")
    g.strategy.ring_degree = toInt(what, value);
  else if (key == "ulysses" || key == "ulysses_degree")
    g.strategy.ulysses_degree = toInt(what, value);
  else if (key == "cfg" || key == "cfg_degree")
    g.strategy.cfg_degree = toInt(what, value);
  else if (key == "dp" || key == "dp_degree")
    g.strategy.dp_degree = toInt(what, value);
  else if (key == "threads" || key == "omp_threads")
    g.omp_threads = std::max(1, toInt(what, value));
  else if (key == "device")
    g.device = value;
  else if (key == "dtype")
    g.dtype = value;
  else if (key == "devices") {
    g.devices = value;
    std::replace(g.devices.begin(), g.devices.end(), ':', ',');
    std::replace(g.devices.begin(), g.devices.end(), '+', ',');
  } else if (key == "cpus") {
    g.cpus = value;
    std::replace(g.cpus.begin(), g.cpus.end(), ':', ',');
    std::replace(g.cpus.begin(), g.cpus.end(), '+', ',');
    if (g.cpus.empty() || g.cpus.find_first_not_of("0123456789,-") != std::string::npos)
      throw std::invalid_argument(what + " must list CPU numbers and ranges, got '" + value + "'");
  } else if (key == "hostfile")
    g.hostfile = value;
  else if (key == "network_interface")
    g.network_interface = value;
  else
    throw std::invalid_argument(where + ": unknown key '" + key +
                                "' (name, model, np, tp, ring, ulysses, cfg, dp, threads, device, "
                                "dtype, devices, cpus, hostfile)");
}

std::string randomTag() {
  std::random_device rd;
  std::ostringstream s;
  s << std::hex << (rd() & 0xffffff);
  return s.str();
}

std::int64_t unixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double secondsBetween(std::chrono::steady_clock::time_point a,
                      std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

GroupSpec parseGroupSpec(const std::string& spec, const GroupSpec& defaults) {
  GroupSpec g = defaults;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw std::invalid_argument("--pool '" + spec + "': '" + item + "' is not key=value");
    setKey(g, item.substr(0, eq), item.substr(eq + 1), "--pool '" + spec + "'");
  }
  return g;
}

std::vector<GroupSpec> parsePoolFile(const std::string& path, const GroupSpec& defaults) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("pool file " + path + " cannot be read");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw std::invalid_argument("pool file " + path + " is not valid JSON: " + e.what());
  }
  if (j.is_object() && j.contains("groups")) j = j["groups"];
  if (!j.is_array() || j.empty())
    throw std::invalid_argument("pool file " + path +
                                ": expected {\"groups\": [ {...}, ... ]} with at least one group");
  std::vector<GroupSpec> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string where = "pool file " + path + ", groups[" + std::to_string(i) + "]";
    if (!j[i].is_object()) throw std::invalid_argument(where + " is not an object");
    GroupSpec g = defaults;
    for (const auto& [k, v] : j[i].items()) {
      if (v.is_string())
        setKey(g, k, v.get<std::string>(), where);
      else if (v.is_number_integer())
        setKey(g, k, std::to_string(v.get<long long>()), where);
      else
        throw std::invalid_argument(where + ": field '" + k + "' must be a string or an integer");
    }
    out.push_back(std::move(g));
  }
  return out;
}

std::string modelId(const std::string& modelPath) {
  fs::path p(modelPath);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();
  std::string id = p.filename().string();
  return id.empty() ? std::string("model") : id;
}

const char* jobStateName(JobState s) {
  switch (s) {
    case JobState::Queued:
      return "queued";
    case JobState::Running:
      return "running";
    case JobState::Done:
      return "done";
    case JobState::Failed:
      return "failed";
    case JobState::Cancelled:
      return "cancelled";
  }
  return "?";
}

json Job::toJson() const {
  json imgs = json::array();
  for (const JobImage& i : images) {
    json o{{"index", i.index}, {"file", fs::path(i.path).filename().string()}};
    o["seed"] = i.has_seed ? json(i.seed) : json(nullptr);
    imgs.push_back(o);
  }
  json j{{"id", id},
         {"object", "ditstudio.job"},
         {"api", api},
         {"model", model},
         {"state", jobStateName(state)},
         {"created", created},
         {"prompt", request.params.prompt},
         {"n", request.imageCount()},
         {"width", request.params.width},
         {"height", request.params.height},
         {"step", step},
         {"steps", steps},
         {"image_index", image_index},
         {"step_ms", step_ms},
         {"eta_s", eta_s},
         {"images", imgs},
         {"group", extra.value("group", json(nullptr))}};
  j["error"] = error.empty() ? json(nullptr) : json(error);
  const auto now = std::chrono::steady_clock::now();
  if (state == JobState::Queued)
    j["queued_s"] = secondsBetween(queued_at, now);
  else
    j["queued_s"] = secondsBetween(queued_at, started_at);
  if (state == JobState::Running)
    j["running_s"] = secondsBetween(started_at, now);
  else if (finished() && started_at.time_since_epoch().count() != 0)
    j["running_s"] = secondsBetween(started_at, finished_at);
  return j;
}

// ------------------------------------------------------------------------------------------
// The observer of one group: runs on the scheduler thread, inside its session's calls.

class Pool::GroupObserver : public launcher::SessionObserver {
 public:
  GroupObserver(Pool& pool, int index) : pool_(pool), index_(index) {}

  void stateChanged(State s) override {
    std::lock_guard lock(pool_.mu_);
    Group& g = pool_.groups_[index_];
    g.state = launcher::WorkerSession::stateName(s);
    if (s == State::Failed) g.failed = true;
    pool_.emit(json{{"type", "group.state"}, {"group", g.spec.name}, {"state", g.state}});
    pool_.cv_.notify_all();
  }
  void stageChanged(const std::string& stage) override {
    std::lock_guard lock(pool_.mu_);
    pool_.groups_[index_].stage = stage;
    pool_.cv_.notify_all();
  }
  void event(const protocol::Event& raw, const protocol::WorkerEvent& ev) override {
    std::lock_guard lock(pool_.mu_);
    Group& g = pool_.groups_[index_];
    if (const auto* h = std::get_if<protocol::HelloEvent>(&ev)) {
      g.pids[h->rank] = h->pid;
      g.world = std::max(g.world, h->world);
    } else if (const auto* r = std::get_if<protocol::ReadyEvent>(&ev)) {
      g.ready = raw.data;
      g.world = r->world;
      pool_.emit(json{{"type", "group.ready"},
                      {"group", g.spec.name},
                      {"world", r->world},
                      {"load_seconds", r->load_seconds}});
    } else if (std::holds_alternative<protocol::RanksEvent>(ev)) {
      g.ranks = raw.data.value("ranks", json::array());
      pool_.emit(json{{"type", "group.ranks"}, {"group", g.spec.name}, {"ranks", g.ranks}});
    } else if (const auto* p = std::get_if<protocol::ProgressEvent>(&ev)) {
      if (auto job = pool_.jobLocked(p->id)) {
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
      job->extra["seconds"] = seconds;
      pool_.finish(*job, JobState::Done);
    }
    ++pool_.groups_[index_].jobs_done;
    release(id);
  }
  void requestCancelled(const std::string& id, int step) override {
    std::lock_guard lock(pool_.mu_);
    if (auto job = pool_.jobLocked(id)) {
      job->extra["cancelled_at_step"] = step;
      pool_.finish(*job, JobState::Cancelled);
    }
    release(id);
  }
  void requestFailed(const std::string& id, const std::string& message) override {
    const bool groupDown = !pool_.groups_[index_].session->isRunning() ||
                           pool_.groups_[index_].session->process().tearingDown();
    std::lock_guard lock(pool_.mu_);
    if (auto job = pool_.jobLocked(id)) {
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
  void groupFailed(const launcher::GroupFailure& f) override {
    std::lock_guard lock(pool_.mu_);
    Group& g = pool_.groups_[index_];
    g.failed = true;
    g.failure =
        json{{"rank", f.rank}, {"pid", f.pid}, {"message", f.message}, {"detail", f.detail}};
    pool_.emit(json{{"type", "group.failed"},
                    {"group", g.spec.name},
                    {"rank", f.rank},
                    {"message", f.message}});
    pool_.cv_.notify_all();
  }

 private:
  // The group is free again (lock held).
  void release(const std::string& id) {
    Group& g = pool_.groups_[index_];
    if (g.job == id) g.job.clear();
    pool_.cv_.notify_all();
  }
  Pool& pool_;
  int index_;
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

Pool::~Pool() { stop(); }

std::vector<std::string> Pool::withCpuSet(std::vector<std::string> argv, const std::string& cpus) {
  if (std::find(argv.begin(), argv.end(), "--hostfile") != argv.end()) return argv;
  auto bind = std::find(argv.begin(), argv.end(), "--bind-to");
  if (bind == argv.end() || bind + 1 == argv.end()) return argv;
  *(bind + 1) = "none";
  if (auto map = std::find(argv.begin(), argv.end(), "--map-by");
      map != argv.end() && map + 1 != argv.end())
    argv.erase(map, map + 2);
  // The CPU slice as the affinity mpirun starts with (util-linux's taskset), which its daemon
  // and the unbound ranks inherit: OpenMPI 4 and 5 alike (OpenMPI 5's --cpu-set becomes a PE
  // list that refuses --bind-to none).
  if (!cpus.empty()) argv.insert(argv.begin(), {"taskset", "--cpu-list", cpus});
  return argv;
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
    if (g.spec.hostfile.empty()) {
      ++singleHost;
      need += static_cast<std::size_t>(std::max(1, groupWorld(g.spec)) *
                                       std::max(1, g.spec.omp_threads));
    }
  std::size_t next = 0;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const GroupSpec& sp = groups_[i].spec;
    if (!sp.hostfile.empty()) continue;
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
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    launcher::MpirunLaunch l;
    Strategy s = g.spec.strategy;
    const int product = s.tp_degree * s.ring_degree * s.ulysses_degree * s.cfg_degree * s.dp_degree;
    s.world = g.spec.np > 0 ? g.spec.np : product;
    s.device = g.spec.device;
    if (auto issues = validateDegrees(s); !issues.empty())
      throw std::invalid_argument("group " + g.spec.name + ": " + joinIssues(issues));
    l.strategy = s;
    l.hostfile = g.spec.hostfile;
    l.omp_threads = std::max(1, g.spec.omp_threads);
    l.worker = opt_.exe_dir + "/ditstudio-worker";
    l.model = g.spec.model;
    l.extra_worker_args = {"--dtype", g.spec.dtype};
    for (const auto& a : g.spec.model_args) l.extra_worker_args.push_back(a);
    l.network_interface = g.spec.network_interface;
    l.isolate = g.spec.hostfile.empty() ? launcher::isolationProgram(opt_.exe_dir) : "";
    std::vector<std::string> argv = launcher::mpirunArgv(l);
    if (place[gi]) argv = withCpuSet(std::move(argv), slices[gi]);
    {
      std::lock_guard lock(mu_);
      g.cpus = slices[gi];
    }
    launcher::SessionLaunch launch{std::move(argv), {}, s.world};
    if (!g.spec.devices.empty()) launch.env.emplace_back("CUDA_VISIBLE_DEVICES", g.spec.devices);
    {
      std::lock_guard lock(mu_);
      g.state = "starting";
      g.world = s.world;
      g.ready = nullptr;
      g.failed = false;
      g.failure = nullptr;
    }
    g.session->start(launch);
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
  for (Group& g : groups_) sessions.push_back(g.session.get());
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) break;
    }
    schedule();
    launcher::pollSessions(sessions, std::chrono::milliseconds(25));
  }
  // Shutdown: cancel and stop every group, within the teardown policy's bounds.
  for (Group& g : groups_)
    if (g.session->isRunning()) g.session->stop(std::chrono::milliseconds(2000));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(12);
  auto anyRunning = [&] {
    return std::any_of(groups_.begin(), groups_.end(),
                       [](const Group& g) { return g.session->isRunning(); });
  };
  while (anyRunning() && std::chrono::steady_clock::now() < deadline)
    launcher::pollSessions(sessions, std::chrono::milliseconds(100));
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
      if (job->state == JobState::Running && job->cancel_requested && !job->cancel_sent) {
        job->cancel_sent = true;
        cancels.emplace_back(job->group, id);
      }
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      Group& g = groups_[gi];
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
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    if (!submits.empty() || !cancels.empty()) cv_.notify_all();
  }
  for (const auto& [gi, id] : cancels) groups_[gi].session->cancel(id);
  for (auto& [gi, req] : submits) groups_[gi].session->submit(std::move(req));
}

std::shared_ptr<Job> Pool::submit(Job j) {
  std::lock_guard lock(mu_);
  if (stopping_) throw Refusal(503, "server_error", "shutting_down", "the server is shutting down");
  if (j.model.empty()) j.model = groups_.front().model_id;
  bool known = false, alive = false;
  std::string why;
  for (const Group& g : groups_)
    if (g.model_id == j.model) {
      known = true;
      alive = alive || !g.failed;
      if (g.failure.is_object())
        why += (why.empty() ? "" : "; ") + g.spec.name + ": " + g.failure.value("message", "");
    }
  if (!known) {
    std::string list;
    for (const Group& g : groups_)
      if (list.find("'" + g.model_id + "'") == std::string::npos)
        list += (list.empty() ? "'" : ", '") + g.model_id + "'";
    throw Refusal(404, "invalid_request_error", "model_not_found",
                  "The model '" + j.model + "' is not served here (models: " + list + ")", "model");
  }
  if (!alive)
    throw Refusal(503, "server_error", "group_failed",
                  "every group serving model '" + j.model + "' has failed (" + why + ")");
  if (queue_.size() >= opt_.max_queue)
    throw Refusal(429, "rate_limit_error", "queue_full",
                  "the queue is full (" + std::to_string(queue_.size()) +
                      " requests waiting, --max-queue " + std::to_string(opt_.max_queue) +
                      "); retry later");
  auto job = std::make_shared<Job>(std::move(j));
  job->id = "img-" + std::to_string(nextJob_++) + "-" + tag_;
  job->request.id = job->id;
  job->request.output.clear();
  job->request.output_tensors.clear();
  job->request.output_dir = opt_.images_dir;
  job->request.overwrite = false;
  job->state = JobState::Queued;
  job->created = unixNow();
  job->queued_at = std::chrono::steady_clock::now();
  jobs_[job->id] = job;
  queue_.push_back(job->id);
  emit(json{{"type", "job.queued"},
            {"job", job->id},
            {"api", job->api},
            {"model", job->model},
            {"prompt", job->request.params.prompt},
            {"queue_length", queue_.size()}});
  cv_.notify_all();
  return job;
}

bool Pool::cancel(const std::string& id) {
  std::lock_guard lock(mu_);
  auto job = jobLocked(id);
  if (!job || job->finished()) return false;
  if (job->state == JobState::Queued) {
    queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
    finish(*job, JobState::Cancelled);
  } else {
    job->cancel_requested = true;  // the scheduler sends the cancel line
  }
  cv_.notify_all();
  return true;
}

std::shared_ptr<Job> Pool::find(const std::string& id) const {
  std::lock_guard lock(mu_);
  return jobLocked(id);
}

std::string Pool::imagePath(const std::string& fileName) const {
  std::lock_guard lock(mu_);
  for (const auto& [id, job] : jobs_)
    for (const JobImage& i : job->images)
      if (fs::path(i.path).filename().string() == fileName) return i.path;
  return {};
}

std::shared_ptr<Job> Pool::jobLocked(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

void Pool::finish(Job& job, JobState state) {
  if (job.finished()) return;
  job.state = state;
  job.finished_at = std::chrono::steady_clock::now();
  json ev{{"type", std::string("job.") + jobStateName(state)}, {"job", job.id}};
  if (!job.error.empty()) ev["error"] = job.error;
  emit(ev);
  finished_.push_back(job.id);
  trimFinished();
  cv_.notify_all();
}

void Pool::trimFinished() {
  while (finished_.size() > opt_.keep_finished) {
    jobs_.erase(finished_.front());
    finished_.pop_front();
  }
}

void Pool::emit(json event) {
  event["seq"] = ++eventSeq_;
  event["time"] = unixNow();
  events_.push_back(std::move(event));
  while (events_.size() > 512) events_.pop_front();
}

std::vector<json> Pool::eventsSince(std::uint64_t since) const {
  std::vector<json> out;
  for (const json& e : events_)
    if (e["seq"].get<std::uint64_t>() > since) out.push_back(e);
  return out;
}

json Pool::jobsJson() const {
  std::lock_guard lock(mu_);
  json list = json::array();
  for (const auto& [id, job] : jobs_) list.push_back(job->toJson());
  std::sort(list.begin(), list.end(), [](const json& a, const json& b) {
    return a["created"].get<std::int64_t>() != b["created"].get<std::int64_t>()
               ? a["created"].get<std::int64_t>() < b["created"].get<std::int64_t>()
               : a["id"].get<std::string>() < b["id"].get<std::string>();
  });
  json queued = json::array();
  for (const std::string& id : queue_) queued.push_back(id);
  return json{{"object", "list"}, {"data", list}, {"queue", queued}, {"max_queue", opt_.max_queue}};
}

json Pool::groupsJson() const {
  std::lock_guard lock(mu_);
  json list = json::array();
  for (const Group& g : groups_) {
    json pids = json::object();
    for (const auto& [r, p] : g.pids) pids[std::to_string(r)] = p;
    Strategy s = g.spec.strategy;
    json o{{"name", g.spec.name},
           {"model", g.model_id},
           {"model_path", g.spec.model},
           {"state", g.state},
           {"stage", g.stage},
           {"world", g.world},
           {"device", g.spec.device},
           {"devices", g.spec.devices},
           {"hostfile", g.spec.hostfile},
           {"cpus", g.cpus},
           {"strategy", json{{"tp_degree", s.tp_degree},
                             {"ring_degree", s.ring_degree},
                             {"ulysses_degree", s.ulysses_degree},
                             {"cfg_degree", s.cfg_degree},
                             {"dp_degree", s.dp_degree}}},
           {"pids", pids},
           {"ranks", g.ranks},
           {"jobs_done", g.jobs_done},
           {"failure", g.failure}};
    o["job"] = g.job.empty() ? json(nullptr) : json(g.job);
    o["load_seconds"] = g.ready.is_object() ? g.ready.value("load_seconds", 0.0) : 0.0;
    list.push_back(o);
  }
  return json{{"object", "list"}, {"data", list}};
}

std::vector<std::string> Pool::models() const {
  std::vector<std::string> ids;
  for (const Group& g : groups_)
    if (std::find(ids.begin(), ids.end(), g.model_id) == ids.end()) ids.push_back(g.model_id);
  return ids;
}

json Pool::modelsJson() const {
  std::lock_guard lock(mu_);
  json list = json::array();
  std::vector<std::string> seen;
  for (const Group& g : groups_) {
    if (g.failed || std::find(seen.begin(), seen.end(), g.model_id) != seen.end()) continue;
    seen.push_back(g.model_id);
    json m{{"id", g.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "ditstudio"}};
    if (g.ready.is_object() && g.ready.contains("model")) {
      const json& mi = g.ready["model"];
      m["family"] = mi.value("family", "");
      m["pipeline_class"] = mi.value("pipeline_class", "");
      m["default_steps"] = mi.value("default_steps", 0);
      m["capabilities"] = mi.value("capabilities", json::object());
    }
    list.push_back(m);
  }
  return json{{"object", "list"}, {"data", list}};
}

json Pool::readyInfo(const std::string& model) const {
  std::lock_guard lock(mu_);
  for (const Group& g : groups_)
    if (g.model_id == model && g.ready.is_object()) return g.ready;
  return nullptr;
}

bool Pool::waitReady(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] {
    return std::all_of(groups_.begin(), groups_.end(),
                       [](const Group& g) { return g.failed || g.ready.is_object(); });
  });
  return std::any_of(groups_.begin(), groups_.end(),
                     [](const Group& g) { return !g.failed && g.ready.is_object(); });
}

}  // namespace dit::server
