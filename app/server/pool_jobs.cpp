// The pool's jobs (pool.h): the bounded queue, submit / cancel / find, the finished jobs kept for
// /v1/jobs, the server events for /v1/events, and the status JSON of jobs, groups and models. Every
// function here takes the pool's lock (or documents that its caller holds it); the groups' side
// (starting them, the scheduler thread, their observers) is pool.cpp.
#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include "app/server/pool.h"

namespace dit::server {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

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
  if (job->state == JobState::Queued && !job->handed) {
    queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
    finish(*job, JobState::Cancelled);
  } else {
    // Running, or in an attached group's queue: the scheduler cancels it there.
    job->cancel_requested = true;
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
  std::lock_guard lock(mu_);  // an attached group's model follows its owner's restarts
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
