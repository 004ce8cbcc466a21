// What every images face shares: the DiT Studio fields, the limits checked before queueing,
// uploads, the family's resolve, submission and the finished images (http_routes.h).
#include <algorithm>
#include <filesystem>
#include <regex>
#include <set>

#include "app/common/request_values.h"
#include "app/server/http_routes.h"

namespace dit::server {

namespace fs = std::filesystem;
using nlohmann::json;

// The DiT Studio fields shared by every face (seed, steps, guidance, true CFG, negative
// prompt, LoRAs, strength, max_sequence_length, cache), checked with the protocol's checks.
void Handlers::applyDitFields(const json& b, protocol::GenerationParams& p, json& echo) {
  if (b.contains("seed") && !b["seed"].is_null()) {
    const json& v = b["seed"];
    if (!v.is_number_integer())
      throw badRequest("'seed' must be an integer (0 .. 2^64-1, or -1 for random), got " + v.dump(),
                       "seed");
    if (v.is_number_unsigned()) {
      p.seed = v.get<std::uint64_t>();
      p.random_seed = false;
    } else if (v.get<long long>() < 0) {
      p.random_seed = true;
    } else {
      p.seed = static_cast<std::uint64_t>(v.get<long long>());
      p.random_seed = false;
    }
    echo["seed"] = v;
  } else {
    p.random_seed = true;  // OpenAI clients send no seed: a random one, reported back
  }
  if (auto v = integer(b, "steps", 1, protocol::kMaxSteps))
    p.steps = static_cast<int>(*v), echo["steps"] = *v;
  if (auto v = number(b, "guidance")) p.guidance = *v, echo["guidance"] = *v;
  if (auto v = str(b, "negative_prompt")) {
    p.negative_prompt = *v;
    p.negative_prompt_given = true;
    echo["negative_prompt"] = *v;
  }
  if (auto v = number(b, "strength")) p.strength = *v, echo["strength"] = *v;
  if (auto v = integer(b, "max_sequence_length", 1, protocol::kMaxSequenceLength))
    p.max_sequence_length = static_cast<int>(*v), echo["max_sequence_length"] = *v;
  if (auto v = str(b, "cache")) p.cache = *v, echo["cache"] = *v;
  // The model family's own knobs as {"options": {"name": number}} (an OpenAI client sends it as
  // an extra body field); which names the model takes and their ranges are the family's
  // declared request, resolved by the group (a name it does not take is refused naming it).
  if (b.contains("options") && !b["options"].is_null()) {
    const json& o = b["options"];
    if (!o.is_object())
      throw badRequest("'options' must be an object of numbers, e.g. {\"name\": 0.5}", "options");
    p.options.clear();
    for (auto it = o.begin(); it != o.end(); ++it) {
      if (!it->is_number())
        throw badRequest("'options." + it.key().substr(0, 64) + "' must be a number, got " +
                             std::string(it->type_name()),
                         "options." + it.key().substr(0, 64));
      p.options[it.key()] = it->get<double>();
    }
    echo["options"] = p.options;
  }
  if (b.contains("loras") && !b["loras"].is_null()) {
    const json& l = b["loras"];
    if (!l.is_array()) throw badRequest("'loras' must be an array of {name, strength}", "loras");
    if (opt.lora_dir.empty() && !l.empty())
      throw badRequest("this server accepts no LoRA (start it with --lora-dir DIR)", "loras");
    p.loras.clear();
    for (size_t i = 0; i < l.size(); ++i) {
      const std::string key = "loras[" + std::to_string(i) + "]";
      if (!l[i].is_object()) throw badRequest("'" + key + "' must be an object", key);
      std::string name = l[i].contains("name") ? l[i].value("name", "") : l[i].value("file", "");
      if (!safeName(name))
        throw badRequest("'" + key +
                             ".name' must be a file name inside the server's LoRA "
                             "folder (letters, digits, . _ -), got '" +
                             name + "'",
                         key);
      const fs::path file = fs::path(opt.lora_dir) / name;
      std::error_code ec;
      if (!fs::is_regular_file(file, ec))
        throw badRequest("'" + key + "': no LoRA '" + name + "' in the server's LoRA folder", key);
      protocol::LoraRequest r;
      r.file = fs::absolute(file).string();
      if (l[i].contains("strength")) {
        if (!l[i]["strength"].is_number())
          throw badRequest("'" + key + ".strength' must be a number", key);
        r.strength = l[i]["strength"].get<double>();
      }
      p.loras.push_back(r);
    }
    json shown = json::array();
    for (size_t i = 0; i < p.loras.size(); ++i)
      shown.push_back({{"name", fs::path(p.loras[i].file).filename().string()},
                       {"strength", p.loras[i].strength}});
    echo["loras"] = shown;
  }
}

void Handlers::checkProtocol(const protocol::GenerationParams& p) {
  for (const auto& [field, text] : {std::pair<const char*, const std::string*>{"prompt", &p.prompt},
                                    {"negative_prompt", &p.negative_prompt}}) {
    if (text->size() > opt.max_prompt_bytes)
      throw badRequest("'" + std::string(field) + "' is " + std::to_string(text->size()) +
                           " bytes; at most " + std::to_string(opt.max_prompt_bytes) +
                           " are accepted (--max-prompt-bytes)",
                       field);
    if (auto at = invalidUtf8At(*text))
      throw badRequest("'" + std::string(field) + "' is not valid UTF-8 text (byte at offset " +
                           std::to_string(*at) + ")",
                       field);
  }
  try {
    protocol::checkParams(p);
  } catch (const protocol::ProtocolError& e) {
    std::string msg = e.what();
    const std::string prefix = "request field ";
    if (msg.rfind(prefix, 0) == 0) msg = msg.substr(prefix.size());
    throw badRequest(msg, e.field());
  }
}

// The request as the workers will read it: one line of at most kMaxRequestLineBytes (a longer
// one would be refused by rank 0; here it is a 400 before anything is queued). The pool adds
// the id and the output folder: a margin for them.
void Handlers::checkRequestLine(const protocol::GenerateRequest& r) {
  std::size_t bytes = 0;
  try {
    bytes = protocol::requestLine(protocol::Request{r}).size();
  } catch (const json::exception&) {
    throw badRequest("the request holds text that is not valid UTF-8");
  }
  const std::size_t limit = protocol::kMaxRequestLineBytes - 8192;
  if (bytes > limit)
    throw badRequest(
        "the request is " + std::to_string(bytes) +
            " bytes as the workers receive it (prompts escaped); at most " + std::to_string(limit) +
            " are accepted",
        r.params.prompt.size() >= r.params.negative_prompt.size() ? "prompt" : "negative_prompt");
}

void Handlers::parseSize(const std::string& size, protocol::GenerationParams& p) {
  if (size == "auto" || size.empty()) return;
  static const std::regex re("([0-9]{1,6})x([0-9]{1,6})");
  std::smatch m;
  if (!std::regex_match(size, m, re))
    throw badRequest("'size' must be 'auto' or WIDTHxHEIGHT, got '" + size + "'", "size");
  const int w = std::stoi(m[1]), h = std::stoi(m[2]);
  if (w < 1 || h < 1 || w > opt.max_side || h > opt.max_side)
    throw badRequest("'size' " + size + " is outside 1 .. " + std::to_string(opt.max_side) +
                         " pixels per side (--max-side)",
                     "size");
  p.width = w;
  p.height = h;
}

// Saves an upload (decoded, limits checked) as a PNG in the images folder's uploads/.
std::string Handlers::saveUpload(const Pixels& px, const std::string& what) {
  const std::string bytes = encodeImage(px, "png", 100);
  std::uint64_t n;
  {
    std::lock_guard lock(s.filesMu_);
    n = ++s.uploads_;
  }
  const fs::path dir = fs::path(pool.imagesDir()) / "uploads";
  fs::create_directories(dir);
  return s.uniqueFile(
      (dir / ("upload-" + std::to_string(unixNow()) + "-" + std::to_string(n) + "-" + what))
          .string(),
      ".png", bytes);
}

void Handlers::attachImages(ImagesCall& c, const std::string& imageBytes,
                            const std::string& maskBytes, const std::string& imageField,
                            const std::string& maskField) {
  auto& p = c.job.request.params;
  Pixels img;
  try {
    img = decodeImage(
        imageBytes, imageField, opt.max_side,
        std::min<std::int64_t>(opt.max_upload_pixels, std::int64_t(opt.max_side) * opt.max_side));
  } catch (const ImageError& e) {
    throw badRequest(e.what(), imageField);
  }
  p.init_image = saveUpload(img, "image");
  if (!maskBytes.empty()) {
    Pixels m;
    try {
      m = decodeImage(
          maskBytes, maskField, opt.max_side,
          std::min<std::int64_t>(opt.max_upload_pixels, std::int64_t(opt.max_side) * opt.max_side));
    } catch (const ImageError& e) {
      throw badRequest(e.what(), maskField);
    }
    if (m.width != img.width || m.height != img.height)
      throw badRequest("the mask is " + std::to_string(m.width) + "x" + std::to_string(m.height) +
                           " but the image is " + std::to_string(img.width) + "x" +
                           std::to_string(img.height) + "; they must have the same size",
                       maskField);
    p.mask_image = saveUpload(inpaintMask(m), "mask");
  }
}

void Handlers::attachReferences(ImagesCall& c, const std::vector<const std::string*>& images,
                                const std::string& field) {
  if (images.size() > static_cast<size_t>(protocol::kMaxReferenceImages))
    throw badRequest(std::to_string(images.size()) + " images given; at most " +
                         std::to_string(protocol::kMaxReferenceImages) + " are accepted",
                     field);
  auto& p = c.job.request.params;
  p.reference_images.clear();
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string name = field + "[" + std::to_string(i) + "]";
    Pixels img;
    try {
      img = decodeImage(
          *images[i], name, opt.max_side,
          std::min<std::int64_t>(opt.max_upload_pixels, std::int64_t(opt.max_side) * opt.max_side));
    } catch (const ImageError& e) {
      throw badRequest(e.what(), field);
    }
    p.reference_images.push_back({saveUpload(img, "reference-" + std::to_string(i + 1)), ""});
  }
  c.echo["reference_images"] = images.size();
}

std::optional<RequestSpec> Handlers::modelSpec(const ImagesCall& c) {
  const std::vector<std::string> ids = pool.models();
  if (ids.empty()) return std::nullopt;
  const json ready = pool.readyInfo(c.job.model.empty() ? ids.front() : c.job.model);
  if (!ready.is_object() || !ready.contains("model") || !ready["model"].is_object() ||
      !ready["model"].contains("request"))
    return std::nullopt;
  try {
    return requestSpecFromJson(ready["model"]["request"]);
  } catch (const std::exception&) {
    return std::nullopt;  // a group that sent no usable spec resolves the request itself
  }
}

bool Handlers::imagesAreReferences(ImagesCall& c, const json& b, bool mask,
                                   const std::string& field) {
  const std::optional<std::string> role = str(b, "image_role");
  if (role && *role != "reference" && *role != "init")
    throw badRequest(
        "'image_role' must be 'reference' (editing) or 'init' (image-to-image), got '" +
            role->substr(0, 64) + "'",
        "image_role");
  const std::optional<RequestSpec> spec = modelSpec(c);
  const bool takesReferences = spec && spec->references.max_count > 0;
  bool refs = takesReferences && !mask;
  if (role) {
    refs = *role == "reference";
    if (refs && mask)
      throw badRequest("a mask goes with image_role 'init' (inpainting), not with references",
                       "image_role");
    if (refs && spec && !takesReferences)
      throw badRequest("reference images are not supported for " + spec->family + " (" +
                           spec->pipeline + "); only editing models take them",
                       field);
    c.echo["image_role"] = *role;
  }
  return refs;
}

void Handlers::attachEditImages(ImagesCall& c, const json& b,
                                const std::vector<const std::string*>& images,
                                const std::string& mask, const std::string& field) {
  if (imagesAreReferences(c, b, !mask.empty(), field)) {
    attachReferences(c, images, field);
    return;
  }
  if (images.size() > 1)
    throw badRequest(std::to_string(images.size()) +
                         " images given; this model takes one init image here (several images "
                         "are reference images, which only editing models take)",
                     field);
  attachImages(c, *images.front(), mask, field + (field == "image" ? "" : "[0]"), "mask");
}

std::vector<std::string> Handlers::jsonImages(const json& b, const std::string& key) {
  std::vector<std::string> out;
  if (!b.contains(key) || b[key].is_null()) return out;
  const json& v = b[key];
  if (!v.is_string() && !v.is_array())
    throw badRequest("'" + key + "' must be a base64 image or an array of them, got " +
                         std::string(v.type_name()),
                     key);
  const size_t n = v.is_string() ? 1 : v.size();
  if (n > static_cast<size_t>(protocol::kMaxReferenceImages))
    throw badRequest(std::to_string(n) + " images given; at most " +
                         std::to_string(protocol::kMaxReferenceImages) + " are accepted",
                     key);
  for (size_t i = 0; i < n; ++i) {
    const json& e = v.is_string() ? v : v[i];
    const std::string name = key + "[" + std::to_string(i) + "]";
    if (!e.is_string()) throw badRequest("'" + name + "' must be a base64 image", key);
    try {
      out.push_back(decodeBase64(e.get_ref<const std::string&>(), name));
    } catch (const ImageError& err) {
      throw badRequest(err.what(), key);
    }
  }
  return out;
}

// Waits for a job's end (the pool's lock in `lock`).
void Handlers::waitFinished(std::unique_lock<std::mutex>& lock, const std::shared_ptr<Job>& job) {
  while (!job->finished()) {
    if (s.stopping())
      throw ApiError(503, "server_error", "the server is shutting down", {}, "shutting_down");
    pool.changed().wait_for(lock, std::chrono::milliseconds(500));
  }
}

ApiError Handlers::jobError(const Job& job) {
  if (job.state == JobState::Cancelled)
    return ApiError(409, "cancelled", "the request " + job.id + " was cancelled", {}, "cancelled");
  const int st = job.error_status ? job.error_status : 500;
  return ApiError(st, st < 500 ? "invalid_request_error" : "server_error",
                  job.error.empty() ? "the request failed" : job.error);
}

// The encoded bytes of a finished image in the requested format (converted files saved next
// to the worker's PNG, never over an existing file), and its path.
std::pair<std::string, std::string> Handlers::outputImage(const JobImage& img,
                                                          const std::string& format,
                                                          int compression) {
  const fs::path path = fs::weakly_canonical(img.path);
  const std::string root = pool.imagesDir() + "/";
  if (path.string().rfind(root, 0) != 0)
    throw ApiError(500, "server_error", "the worker wrote an image outside the images folder");
  std::string bytes = readFile(path.string());
  if (format == "png") return {bytes, path.string()};
  const Pixels px = decodeImage(bytes, "image", 1 << 16, std::int64_t(1) << 32);
  const std::string enc = encodeImage(px, format, compression);
  const std::string out = s.uniqueFile((path.parent_path() / path.stem()).string(),
                                       format == "jpeg" ? ".jpg" : ".webp", enc);
  return {enc, out};
}

std::string Handlers::convertPreview(const std::string& pngB64, const std::string& format, int q) {
  if (format == "png") return pngB64;
  const Pixels px =
      decodeImage(decodeBase64(pngB64, "preview"), "preview", 1 << 16, std::int64_t(1) << 32);
  return encodeBase64(encodeImage(px, format, q));
}

std::string Handlers::baseUrl(const httplib::Request& req) {
  std::string host = req.get_header_value("Host");
  if (host.empty() || host.find_first_of(" /\\\"'<>") != std::string::npos)
    host = opt.host + ":" + std::to_string(s.port_);
  return "http://" + host;
}

// DiT Studio's echo: the values as made (first image's params), plus the fields given.
json Handlers::madeEcho(const ImagesCall& c, const std::vector<JobImage>& imgs) {
  json e = c.echo;
  if (!imgs.empty() && imgs[0].params.is_object()) {
    const json& pm = imgs[0].params;
    for (const char* k : {"steps", "guidance", "width", "height", "options"})
      if (pm.contains(k)) e[k] = pm[k];
    if (pm.contains("strength") && !c.job.request.params.init_image.empty())
      e["strength"] = pm["strength"];
  }
  if (!imgs.empty() && imgs[0].has_seed) e["seed"] = imgs[0].seed;
  return e;
}

json Handlers::imageItems(const httplib::Request& req, const ImagesCall& c,
                          const std::vector<JobImage>& imgs) {
  json data = json::array();
  for (const JobImage& img : imgs) {
    auto [bytes, path] = outputImage(img, c.output_format, c.compression);
    json item = json::object();
    if (c.response_format == "url")
      item["url"] = baseUrl(req) + "/v1/images/files/" + s.registerFile(path);
    else
      item["b64_json"] = encodeBase64(bytes);
    item["seed"] = img.has_seed ? json(img.seed) : json(nullptr);
    data.push_back(item);
  }
  return data;
}

std::vector<JobImage> Handlers::sortedImages(const Job& job) {
  std::vector<JobImage> imgs = job.images;
  std::sort(imgs.begin(), imgs.end(),
            [](const JobImage& a, const JobImage& b) { return a.index < b.index; });
  return imgs;
}

// The denoising steps a request runs: its own, else the model's default (from a ready group).
int Handlers::resolvedSteps(const ImagesCall& c) {
  if (c.job.request.params.steps > 0) return c.job.request.params.steps;
  const std::vector<std::string> ids = pool.models();
  const json ready = pool.readyInfo(c.job.model.empty() ? ids.front() : c.job.model);
  if (ready.is_object() && ready.contains("model"))
    return std::max(1, ready["model"].value("default_steps", 28));
  return 28;
}

// Previews cost a VAE decode each: `count` of them spread over the steps (every
// steps / (count + 1) steps), not one per step.
int Handlers::previewEvery(const ImagesCall& c, int count) {
  return std::max(1, resolvedSteps(c) / (count + 1));
}

// The family's declared request, resolved as the group will resolve it, against the spec a
// ready group of the requested model sent (its ready event's model.request): a refusal is a 400
// naming the field before anything is queued ('size' on the OpenAI routes for a width or
// height), and a size the family floors is echoed as made. Before any group is ready, the
// group resolves it (a refusal then fails the job naming the field).
void Handlers::resolveForModel(ImagesCall& c) {
  const std::optional<RequestSpec> declared = modelSpec(c);
  if (!declared) return;
  const RequestSpec& spec = *declared;
  const auto& p = c.job.request.params;
  std::set<std::string> given;
  for (auto it = c.echo.begin(); it != c.echo.end(); ++it) given.insert(it.key());
  const ResolvedRequest r = resolveRequest(spec, requestValues(p, given));
  if (!r.ok()) {
    const RequestProblem& pr = r.problems.front();
    const bool openAi = c.job.api.rfind("openai", 0) == 0;
    const bool side = pr.field == "width" || pr.field == "height";
    // A family option (declared or not) is named where the client put it.
    const FieldSpec* f = spec.field(pr.field);
    const bool option = c.job.request.params.options.count(pr.field) > 0 || (f && f->knob);
    // Reference images arrive as the OpenAI route's 'image' files / A1111's init_images.
    const std::string refs = openAi                ? "image"
                             : c.job.api == "page" ? "reference_images"
                                                   : "init_images";
    throw badRequest(pr.message, openAi && side                   ? "size"
                                 : option                         ? "options." + pr.field
                                 : pr.field == "reference_images" ? refs
                                                                  : pr.field);
  }
  if (c.size != "auto" && !c.size.empty())
    c.size = std::to_string(r.values.width) + "x" + std::to_string(r.values.height);
}

std::shared_ptr<Job> Handlers::submit(ImagesCall& c) {
  c.job.previews = c.stream && c.partial_images > 0;
  if (c.job.previews) c.job.request.preview_every = previewEvery(c, c.partial_images);
  checkProtocol(c.job.request.params);
  checkRequestLine(c.job.request);
  resolveForModel(c);
  try {
    return pool.submit(c.job);
  } catch (const Refusal& r) {
    throw ApiError(r.status, r.type, r.what(), r.param, r.code);
  }
}

}  // namespace dit::server
