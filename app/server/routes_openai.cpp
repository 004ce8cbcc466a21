// The OpenAI Images API: generations, edits (multipart), streaming, models and served files.
#include <algorithm>
#include <filesystem>

#include "app/server/http_routes.h"

namespace dit::server {

namespace fs = std::filesystem;
using nlohmann::json;

// The OpenAI body (JSON, or an edit's form fields) -> ImagesCall.
ImagesCall Handlers::openAiCall(const json& b, const std::string& api) {
  ImagesCall c;
  c.job.api = api;
  auto& p = c.job.request.params;
  const auto prompt = str(b, "prompt");
  if (!prompt || prompt->empty()) throw badRequest("'prompt' is required", "prompt");
  p.prompt = *prompt;
  if (auto m = str(b, "model")) c.job.model = *m;
  if (auto n = integer(b, "n", 1, opt.max_n)) p.num_images = static_cast<int>(*n);
  if (auto v = str(b, "size")) c.size = *v;
  parseSize(c.size, p);
  if (auto v = str(b, "response_format")) {
    if (*v != "b64_json" && *v != "url")
      throw badRequest("'response_format' must be 'b64_json' or 'url', got '" + *v + "'",
                       "response_format");
    c.response_format = *v;
  }
  if (auto v = str(b, "output_format")) {
    if (!canEncode(*v))
      throw badRequest("'output_format' must be 'png', 'jpeg' or 'webp', got '" + *v + "'",
                       "output_format");
    c.output_format = *v;
  }
  if (auto v = integer(b, "output_compression", 0, 100)) c.compression = static_cast<int>(*v);
  if (auto v = boolean(b, "stream")) c.stream = *v;
  if (auto v = integer(b, "partial_images", 0, 3)) c.partial_images = static_cast<int>(*v);
  if (auto v = str(b, "quality")) c.quality = *v;
  if (auto v = str(b, "background")) c.background = *v;
  (void)str(b, "user");
  (void)str(b, "moderation");
  (void)str(b, "style");
  applyDitFields(b, p, c.echo);
  return c;
}

// Non-streaming OpenAI response.
void Handlers::respondImages(const httplib::Request& req, httplib::Response& res, ImagesCall& c) {
  auto job = submit(c);
  std::vector<JobImage> imgs;
  {
    std::unique_lock lock(pool.mutex());
    waitFinished(lock, job);
    if (job->state != JobState::Done) throw jobError(*job);
    imgs = sortedImages(*job);
  }
  json body{{"created", unixNow()},
            {"data", imageItems(req, c, imgs)},
            {"output_format", c.output_format},
            {"size", c.size},
            {"quality", c.quality},
            {"background", c.background},
            {"usage", {{"input_tokens", 0}, {"output_tokens", 0}, {"total_tokens", 0}}}};
  const json echo = madeEcho(c, imgs);
  for (auto& [k, v] : echo.items()) body[k] = v;
  body["model"] = job->model;
  body["job"] = job->id;
  sendJson(res, 200, body);
}

// Streaming OpenAI response: partial images from the denoising previews, then one
// `*.completed` event per image; a client that goes away cancels the job.
void Handlers::streamImages(const httplib::Request& req, httplib::Response& res, ImagesCall& c,
                            const std::string& prefix) {
  auto job = submit(c);
  auto st = std::make_shared<StreamState>();
  auto call = std::make_shared<ImagesCall>(c);
  const std::string base = baseUrl(req);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  Pool* pool_ = &pool;
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, job, st, call, prefix, base](size_t, httplib::DataSink& sink) {
        try {
          return streamStep(job, *st, *call, prefix, base, sink);
        } catch (const std::exception& e) {  // nothing may escape into httplib's threads
          json d = errorBody(clientMessage(e.what()), "server_error", "", "");
          d["type"] = "error";
          const std::string chunk =
              "event: error\ndata: " + d.dump(-1, ' ', false, json::error_handler_t::replace) +
              "\n\n";
          sink.write(chunk.data(), chunk.size());
          pool.cancel(job->id);
          sink.done();
          return true;
        }
      },
      [pool_, job](bool success) {
        if (!success) pool_->cancel(job->id);  // the client went away: nothing keeps running
      });
}

bool Handlers::streamStep(const std::shared_ptr<Job>& job, StreamState& stRef,
                          const ImagesCall& callRef, const std::string& prefix,
                          const std::string& base, httplib::DataSink& sink) {
  StreamState* st = &stRef;
  const ImagesCall* call = &callRef;
  if (st->ended) {
    sink.done();
    return true;
  }
  std::vector<JobPreview> previews;
  bool finished = false;
  std::vector<JobImage> imgs;
  JobState state;
  {
    std::unique_lock lock(pool.mutex());
    pool.changed().wait_for(lock, std::chrono::milliseconds(250),
                            [&] { return job->finished() || job->preview_seq > st->seq; });
    for (const JobPreview& p : job->preview_list)
      if (p.seq > st->seq) previews.push_back(p);
    if (!job->preview_list.empty()) st->seq = job->preview_list.back().seq;
    finished = job->finished();
    state = job->state;
    if (finished) imgs = sortedImages(*job);
  }
  auto send = [&](const std::string& event, const json& data) {
    const std::string chunk = "event: " + event + "\ndata: " + data.dump() + "\n\n";
    st->lastWrite = std::chrono::steady_clock::now();
    return sink.write(chunk.data(), chunk.size());
  };
  const std::string size = call->size;
  for (const JobPreview& p : previews) {
    if (st->partials >= call->partial_images) break;
    json d{{"type", prefix + ".partial_image"},
           {"b64_json", convertPreview(p.png_b64, call->output_format, call->compression)},
           {"created_at", unixNow()},
           {"size", size},
           {"quality", call->quality},
           {"background", call->background},
           {"output_format", call->output_format},
           {"partial_image_index", st->partials},
           {"step", p.step},
           {"image_index", p.image_index}};
    ++st->partials;
    if (!send(prefix + ".partial_image", d)) {
      pool.cancel(job->id);
      return false;
    }
  }
  if (finished) {
    st->ended = true;
    if (state == JobState::Done) {
      const json echo = madeEcho(*call, imgs);
      for (const JobImage& img : imgs) {
        auto [bytes, path] = outputImage(img, call->output_format, call->compression);
        json d{{"type", prefix + ".completed"},
               {"created_at", unixNow()},
               {"size", size},
               {"quality", call->quality},
               {"background", call->background},
               {"output_format", call->output_format},
               {"image_index", img.index},
               {"usage",
                {{"input_tokens", 0},
                 {"output_tokens", 0},
                 {"total_tokens", 0},
                 {"input_tokens_details", {{"image_tokens", 0}, {"text_tokens", 0}}}}}};
        if (call->response_format == "url")
          d["url"] = base + "/v1/images/files/" + s.registerFile(path);
        else
          d["b64_json"] = encodeBase64(bytes);
        for (auto& [k, v] : echo.items()) d[k] = v;
        d["seed"] = img.has_seed ? json(img.seed) : json(nullptr);
        d["job"] = job->id;
        if (!send(prefix + ".completed", d)) return false;
      }
    } else {
      const ApiError e = jobError(*job);
      json d = errorBody(e.what(), e.type, e.param, e.code);
      d["type"] = "error";
      send("error", d);
    }
    sink.done();
    return true;
  }
  // Heartbeat (an SSE comment): a client that went away makes the write fail.
  if (std::chrono::steady_clock::now() - st->lastWrite > std::chrono::milliseconds(500)) {
    static const std::string ping = ": keep-alive\n\n";
    st->lastWrite = std::chrono::steady_clock::now();
    if (!sink.write(ping.data(), ping.size())) {
      pool.cancel(job->id);
      return false;
    }
  }
  return true;
}

void Handlers::generations(const httplib::Request& req, httplib::Response& res) {
  ImagesCall c =
      openAiCall(parseBody(req, opt.max_json_depth, BodyKind::OpenAi), "openai.generations");
  if (c.stream)
    streamImages(req, res, c, "image_generation");
  else
    respondImages(req, res, c);
}

void Handlers::edits(const httplib::Request& req, httplib::Response& res) {
  const bool multipart = req.is_multipart_form_data();
  // Multipart: every 'image' / 'image[]' part in the order sent (the openai client sends several
  // as image[]) and 'mask'. JSON: 'image' a base64 image (or data: URL) or an array of them,
  // 'mask' one.
  const json b = multipart ? formToJson(req, opt.max_json_depth)
                           : parseBody(req, opt.max_json_depth, BodyKind::OpenAi);
  ImagesCall c = openAiCall(b, "openai.edits");
  std::vector<std::string> decoded;
  std::vector<const std::string*> images;
  std::string mask;
  if (multipart) {
    for (const char* key : {"image", "image[]"}) {
      auto [first, last] = req.files.equal_range(key);
      for (auto it = first; it != last; ++it) images.push_back(&it->second.content);
    }
    if (req.has_file("mask")) {
      mask = req.get_file_value("mask").content;
      if (mask.empty()) throw badRequest("'mask' is empty", "mask");
    }
  } else {
    decoded = jsonImages(b, "image");
    for (const std::string& d : decoded) images.push_back(&d);
    const std::vector<std::string> masks = jsonImages(b, "mask");
    if (masks.size() > 1) throw badRequest("'mask' must be one base64 image", "mask");
    if (!masks.empty()) mask = masks.front();
  }
  if (images.empty())
    throw badRequest(
        "'image' is required: PNG, JPEG or WebP files (multipart/form-data), or in JSON a base64 "
        "image or an array of them",
        "image");
  attachEditImages(c, b, images, mask, "image");
  if (c.stream)
    streamImages(req, res, c, "image_edit");
  else
    respondImages(req, res, c);
}

void Handlers::models(const httplib::Request&, httplib::Response& res) {
  sendJson(res, 200, pool.modelsJson());
}

void Handlers::file(const httplib::Request& req, httplib::Response& res) {
  const std::string name = req.matches[1];
  std::string path;
  if (!safeName(name) || !s.servedPath(name, path))
    throw ApiError(404, "invalid_request_error", "no image named '" + name + "' on this server");
  const std::string bytes = readFile(path);
  const std::string ext = fs::path(path).extension().string();
  res.set_content(bytes, ext == ".jpg"    ? "image/jpeg"
                         : ext == ".webp" ? "image/webp"
                                          : "image/png");
}

}  // namespace dit::server
