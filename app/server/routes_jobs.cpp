// DiT Studio's own endpoints: jobs, groups, health, events (server-sent), presets, the page.
#include "app/server/http_routes.h"
#include "app/server/resources.h"

namespace dit::server {

using nlohmann::json;

// --- DiT Studio's own endpoints -------------------------------------------------------------
void Handlers::jobs(const httplib::Request&, httplib::Response& res) {
  sendJson(res, 200, pool.jobsJson());
}

void Handlers::jobGet(const httplib::Request& req, httplib::Response& res) {
  auto job = pool.find(req.matches[1]);
  if (!job)
    throw ApiError(404, "invalid_request_error", "no job '" + std::string(req.matches[1]) + "'");
  json j;
  {
    std::lock_guard lock(pool.mutex());
    j = job->toJson();
    if (!job->preview_list.empty()) j["preview"] = job->preview_list.back().png_b64;
  }
  sendJson(res, 200, j);
}

void Handlers::jobCancel(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  auto job = pool.find(id);
  if (!job) throw ApiError(404, "invalid_request_error", "no job '" + id + "'");
  const bool ok = pool.cancel(id);
  json j;
  {
    std::lock_guard lock(pool.mutex());
    j = job->toJson();
  }
  j["cancel_requested"] = ok;
  sendJson(res, ok ? 202 : 409, j);
}

// Asynchronous submission (the page): the OpenAI generation body; previews on; returns the job.
void Handlers::jobCreate(const httplib::Request& req, httplib::Response& res) {
  const json b = parseBody(req, opt.max_json_depth, BodyKind::OpenAi);
  ImagesCall c = openAiCall(b, "page");
  // The page's reference picker: base64 images in order (editing models only).
  const std::vector<std::string> refs = jsonImages(b, "reference_images");
  if (!refs.empty()) {
    if (!imagesAreReferences(c, json{{"image_role", "reference"}}, false, "reference_images"))
      throw badRequest("reference images need an editing model", "reference_images");
    std::vector<const std::string*> ptrs;
    for (const std::string& r : refs) ptrs.push_back(&r);
    attachReferences(c, ptrs, "reference_images");
  }
  c.job.previews = true;
  c.job.request.preview_every = previewEvery(c, 12);  // about 12 live previews per image
  checkProtocol(c.job.request.params);
  checkRequestLine(c.job.request);
  resolveForModel(c);
  std::shared_ptr<Job> job;
  try {
    job = pool.submit(c.job);
  } catch (const Refusal& r) {
    throw ApiError(r.status, r.type, r.what(), r.param, r.code);
  }
  json j;
  {
    std::lock_guard lock(pool.mutex());
    j = job->toJson();
  }
  sendJson(res, 202, j);
}

void Handlers::groups(const httplib::Request&, httplib::Response& res) {
  sendJson(res, 200, pool.groupsJson());
}

void Handlers::health(const httplib::Request&, httplib::Response& res) {
  const json g = pool.groupsJson();
  int ready = 0, failed = 0;
  for (const json& x : g["data"]) {
    if (x["state"] == "ready" || x["state"] == "busy") ++ready;
    if (x["state"] == "failed") ++failed;
  }
  sendJson(res, 200,
           json{{"status", ready > 0 ? "ok"
                           : failed  ? "failed"
                                     : "starting"},
                {"groups", g["data"].size()},
                {"ready", ready},
                {"failed", failed}});
}

void Handlers::events(const httplib::Request& req, httplib::Response& res) {
  std::uint64_t since;
  {
    std::lock_guard lock(pool.mutex());
    since = pool.lastEventSeq();
  }
  if (req.has_param("since")) {
    try {
      since = std::stoull(req.get_param_value("since"));
    } catch (const std::exception&) {
      throw badRequest("'since' must be an event sequence number", "since");
    }
  }
  auto seen = std::make_shared<std::uint64_t>(since);
  auto first = std::make_shared<bool>(true);
  // One of at most --max-event-streams open streams: the slot is held by the provider and given
  // back when the response ends (the client went away, or the server stops), whatever ends it.
  if (s.eventStreams_.fetch_add(1) >= opt.max_event_streams) {
    s.eventStreams_.fetch_sub(1);
    res.set_header("Retry-After", "5");
    throw ApiError(503, "server_error",
                   "too many open event streams (" + std::to_string(opt.max_event_streams) +
                       ", --max-event-streams); close another page's stream or try again later",
                   {}, "too_many_event_streams");
  }
  auto slot = std::shared_ptr<std::atomic<std::size_t>>(
      &s.eventStreams_, [](std::atomic<std::size_t>* n) { n->fetch_sub(1); });
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, seen, first, slot](
                                                            size_t, httplib::DataSink& sink) {
    std::string out;
    if (*first) {
      *first = false;
      json hello{{"type", "hello"},
                 {"groups", pool.groupsJson()["data"]},
                 {"jobs", pool.jobsJson()["data"]}};
      out += "event: hello\ndata: " + hello.dump() + "\n\n";
    }
    {
      std::unique_lock lock(pool.mutex());
      pool.changed().wait_for(lock, std::chrono::milliseconds(1000),
                              [&] { return pool.lastEventSeq() > *seen; });
      for (const json& e : pool.eventsSince(*seen)) {
        out += "event: " + e.value("type", std::string("event")) + "\ndata: " + e.dump() + "\n\n";
        *seen = e["seq"].get<std::uint64_t>();
      }
    }
    if (out.empty()) out = ": keep-alive\n\n";
    return sink.write(out.data(), out.size());
  });
}

void Handlers::presets(const httplib::Request&, httplib::Response& res) {
  res.set_content(kBuiltinPresetsJson, "application/json");
}

void Handlers::page(const httplib::Request&, httplib::Response& res) {
  res.set_header("Content-Security-Policy",
                 "default-src 'self'; img-src 'self' data: blob:; style-src 'self' "
                 "'unsafe-inline'; script-src 'self' 'unsafe-inline'; connect-src 'self'");
  res.set_content(kPageHtml, "text/html; charset=utf-8");
}

}  // namespace dit::server
