#include "app/server/http_server.h"

#include <fcntl.h>
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "app/common/request_values.h"
#include "app/server/image_codec.h"
#include "app/server/request_guard.h"
#include "app/server/resources.h"

namespace dit::server {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// A refused HTTP request: status and OpenAI's error fields.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, const std::string& message, std::string param = {},
           std::string code = {})
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type, param, code;
};

ApiError badRequest(const std::string& message, const std::string& param = {}) {
  return ApiError(400, "invalid_request_error", message, param);
}

json errorBody(const std::string& message, const std::string& type, const std::string& param,
               const std::string& code) {
  return json{{"error",
               {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

void sendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  // A message may quote client bytes that are not UTF-8 (a path with %ff): replaced, never a
  // throw from dump() (it escaped the handlers and dropped the connection unanswered).
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void sendError(httplib::Response& res, const ApiError& e) {
  sendJson(res, e.status, errorBody(e.what(), e.type, e.param, e.code));
}

std::string typeName(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// --- typed body fields (absent or null: nullopt) ------------------------------------------
std::optional<std::string> str(const json& b, const char* key) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  if (!b[key].is_string())
    throw badRequest(std::string("'") + key + "' must be a string, got " + typeName(b[key]), key);
  return b[key].get<std::string>();
}
std::optional<long long> integer(const json& b, const char* key, long long lo, long long hi) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  const json& v = b[key];
  if (!v.is_number_integer())
    throw badRequest(std::string("'") + key + "' must be an integer, got " + v.dump(), key);
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
    throw badRequest(std::string("'") + key + "' must be in " + std::to_string(lo) + " .. " +
                         std::to_string(hi) + ", got " + v.dump(),
                     key);
  const long long x = v.get<long long>();
  if (x < lo || x > hi)
    throw badRequest(std::string("'") + key + "' must be in " + std::to_string(lo) + " .. " +
                         std::to_string(hi) + ", got " + v.dump(),
                     key);
  return x;
}
std::optional<double> number(const json& b, const char* key) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  if (!b[key].is_number())
    throw badRequest(std::string("'") + key + "' must be a number, got " + b[key].dump(), key);
  return b[key].get<double>();
}
std::optional<bool> boolean(const json& b, const char* key) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  if (!b[key].is_boolean())
    throw badRequest(std::string("'") + key + "' must be a boolean, got " + b[key].dump(), key);
  return b[key].get<bool>();
}

// A JSON body: depth and UTF-8 scanned before the parser sees it, our words for every refusal,
// the JSON types of the fields the route reads checked before it reads them.
json parseBody(const httplib::Request& req, int maxDepth, BodyKind kind) {
  json b;
  if (auto e = parseJsonBody(req.body, maxDepth, b)) throw badRequest(e->message, e->param);
  if (auto e = checkFieldTypes(b, kind)) throw badRequest(e->message, e->param);
  return b;
}

// Multipart fields -> a JSON object: numbers, booleans and the JSON-valued `loras` typed.
json formToJson(const httplib::Request& req, int maxDepth) {
  static const std::vector<std::string> ints{
      "n", "seed", "steps", "partial_images", "output_compression", "max_sequence_length"};
  static const std::vector<std::string> reals{"guidance", "true_cfg_scale", "strength"};
  static const std::vector<std::string> bools{"stream"};
  json b = json::object();
  for (const auto& [name, item] : req.files) {
    if (!item.filename.empty() || name == "image" || name == "image[]" || name == "mask")
      continue;  // files
    const std::string& v = item.content;
    if (auto at = invalidUtf8At(name))
      throw badRequest("a form field's name is not valid UTF-8 text (byte at offset " +
                       std::to_string(*at) + ")");
    if (auto at = invalidUtf8At(v))
      throw badRequest("form field '" + name + "' is not valid UTF-8 text (byte at offset " +
                           std::to_string(*at) + ")",
                       name);
    auto has = [&](const std::vector<std::string>& l) {
      return std::find(l.begin(), l.end(), name) != l.end();
    };
    try {
      if (has(ints)) {
        size_t used = 0;
        if (!v.empty() && v[0] == '-') {
          const long long x = std::stoll(v, &used);
          if (used != v.size()) throw std::invalid_argument(v);
          b[name] = x;
        } else {
          const unsigned long long x = std::stoull(v, &used);
          if (used != v.size()) throw std::invalid_argument(v);
          b[name] = x;
        }
      } else if (has(reals)) {
        size_t used = 0;
        const double x = std::stod(v, &used);
        if (used != v.size()) throw std::invalid_argument(v);
        b[name] = x;
      } else if (has(bools)) {
        if (v != "true" && v != "false") throw std::invalid_argument(v);
        b[name] = v == "true";
      } else if (name == "loras") {
        json l;
        if (auto e = parseJsonBody("{\"loras\":" + v + "}", maxDepth, l))
          throw badRequest(
              "form field 'loras' is not a JSON array of {name, strength}: " + e->message, name);
        b[name] = std::move(l["loras"]);
      } else {
        b[name] = v;
      }
    } catch (const ApiError&) {
      throw;
    } catch (const std::exception&) {
      throw badRequest("form field '" + name + "' has an invalid value '" + v.substr(0, 64) + "'",
                       name);
    }
  }
  if (auto e = checkFieldTypes(b, BodyKind::OpenAi)) throw badRequest(e->message, e->param);
  return b;
}

bool safeName(const std::string& n) {
  static const std::regex re("[A-Za-z0-9_][A-Za-z0-9._-]{0,199}");
  return std::regex_match(n, re) && n.find("..") == std::string::npos;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ApiError(500, "server_error",
                   "cannot read the image " + fs::path(path).filename().string());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::int64_t unixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool constantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

/// One images call (OpenAI or AUTOMATIC1111) translated for the pool.
struct ImagesCall {
  Job job;
  std::string response_format = "b64_json";
  std::string output_format = "png";
  int compression = 100;
  bool stream = false;
  int partial_images = 0;
  std::string size = "auto", quality = "auto", background = "auto";
  json echo = json::object();  ///< DiT Studio fields as given
};

}  // namespace

// --------------------------------------------------------------------------------------------

struct Handlers {
  HttpServer& s;
  Pool& pool;
  const ServerOptions& opt;

  // The DiT Studio fields shared by every face (seed, steps, guidance, true CFG, negative
  // prompt, LoRAs, strength, max_sequence_length, cache), checked with the protocol's checks.
  void applyDitFields(const json& b, protocol::GenerationParams& p, json& echo) {
    if (b.contains("seed") && !b["seed"].is_null()) {
      const json& v = b["seed"];
      if (!v.is_number_integer())
        throw badRequest(
            "'seed' must be an integer (0 .. 2^64-1, or -1 for random), got " + v.dump(), "seed");
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
    if (auto v = number(b, "true_cfg_scale")) p.true_cfg_scale = *v, echo["true_cfg_scale"] = *v;
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
          throw badRequest("'" + key + "': no LoRA '" + name + "' in the server's LoRA folder",
                           key);
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

  void checkProtocol(const protocol::GenerationParams& p) {
    for (const auto& [field, text] :
         {std::pair<const char*, const std::string*>{"prompt", &p.prompt},
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
  void checkRequestLine(const protocol::GenerateRequest& r) {
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
              " bytes as the workers receive it (prompts escaped); at most " +
              std::to_string(limit) + " are accepted",
          r.params.prompt.size() >= r.params.negative_prompt.size() ? "prompt" : "negative_prompt");
  }

  void parseSize(const std::string& size, protocol::GenerationParams& p) {
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

  // The OpenAI body (JSON, or an edit's form fields) -> ImagesCall.
  ImagesCall openAiCall(const json& b, const std::string& api) {
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

  // Saves an upload (decoded, limits checked) as a PNG in the images folder's uploads/.
  std::string saveUpload(const Pixels& px, const std::string& what) {
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

  void attachImages(ImagesCall& c, const std::string& imageBytes, const std::string& maskBytes,
                    const std::string& imageField, const std::string& maskField) {
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
        m = decodeImage(maskBytes, maskField, opt.max_side,
                        std::min<std::int64_t>(opt.max_upload_pixels,
                                               std::int64_t(opt.max_side) * opt.max_side));
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

  // Waits for a job's end (the pool's lock in `lock`).
  void waitFinished(std::unique_lock<std::mutex>& lock, const std::shared_ptr<Job>& job) {
    while (!job->finished()) {
      if (s.stopping())
        throw ApiError(503, "server_error", "the server is shutting down", {}, "shutting_down");
      pool.changed().wait_for(lock, std::chrono::milliseconds(500));
    }
  }

  ApiError jobError(const Job& job) {
    if (job.state == JobState::Cancelled)
      return ApiError(409, "cancelled", "the request " + job.id + " was cancelled", {},
                      "cancelled");
    const int st = job.error_status ? job.error_status : 500;
    return ApiError(st, st < 500 ? "invalid_request_error" : "server_error",
                    job.error.empty() ? "the request failed" : job.error);
  }

  // The encoded bytes of a finished image in the requested format (converted files saved next
  // to the worker's PNG, never over an existing file), and its path.
  std::pair<std::string, std::string> outputImage(const JobImage& img, const std::string& format,
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

  std::string convertPreview(const std::string& pngB64, const std::string& format, int q) {
    if (format == "png") return pngB64;
    const Pixels px =
        decodeImage(decodeBase64(pngB64, "preview"), "preview", 1 << 16, std::int64_t(1) << 32);
    return encodeBase64(encodeImage(px, format, q));
  }

  std::string baseUrl(const httplib::Request& req) {
    std::string host = req.get_header_value("Host");
    if (host.empty() || host.find_first_of(" /\\\"'<>") != std::string::npos)
      host = opt.host + ":" + std::to_string(s.port_);
    return "http://" + host;
  }

  // DiT Studio's echo: the values as made (first image's params), plus the fields given.
  json madeEcho(const ImagesCall& c, const std::vector<JobImage>& imgs) {
    json e = c.echo;
    if (!imgs.empty() && imgs[0].params.is_object()) {
      const json& pm = imgs[0].params;
      for (const char* k : {"steps", "guidance", "true_cfg_scale", "width", "height"})
        if (pm.contains(k)) e[k] = pm[k];
      if (pm.contains("strength") && !c.job.request.params.init_image.empty())
        e["strength"] = pm["strength"];
    }
    if (!imgs.empty() && imgs[0].has_seed) e["seed"] = imgs[0].seed;
    return e;
  }

  json imageItems(const httplib::Request& req, const ImagesCall& c,
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

  std::vector<JobImage> sortedImages(const Job& job) {
    std::vector<JobImage> imgs = job.images;
    std::sort(imgs.begin(), imgs.end(),
              [](const JobImage& a, const JobImage& b) { return a.index < b.index; });
    return imgs;
  }

  // The denoising steps a request runs: its own, else the model's default (from a ready group).
  int resolvedSteps(const ImagesCall& c) {
    if (c.job.request.params.steps > 0) return c.job.request.params.steps;
    const std::vector<std::string> ids = pool.models();
    const json ready = pool.readyInfo(c.job.model.empty() ? ids.front() : c.job.model);
    if (ready.is_object() && ready.contains("model"))
      return std::max(1, ready["model"].value("default_steps", 28));
    return 28;
  }

  // Previews cost a VAE decode each: `count` of them spread over the steps (every
  // steps / (count + 1) steps), not one per step.
  int previewEvery(const ImagesCall& c, int count) {
    return std::max(1, resolvedSteps(c) / (count + 1));
  }

  // The family's declared request, resolved as the group will resolve it, against the spec a
  // ready group of the requested model sent (its ready event's model.request): a refusal is a 400
  // naming the field before anything is queued ('size' on the OpenAI routes for a width or
  // height), and a size the family floors is echoed as made. Before any group is ready, the
  // group resolves it (a refusal then fails the job naming the field).
  void resolveForModel(ImagesCall& c) {
    const std::vector<std::string> ids = pool.models();
    if (ids.empty()) return;
    const json ready = pool.readyInfo(c.job.model.empty() ? ids.front() : c.job.model);
    if (!ready.is_object() || !ready.contains("model") || !ready["model"].is_object() ||
        !ready["model"].contains("request"))
      return;
    RequestSpec spec;
    try {
      spec = requestSpecFromJson(ready["model"]["request"]);
    } catch (const std::exception&) {
      return;  // a group that sent no usable spec resolves the request itself
    }
    // AUTOMATIC1111's cfg_scale is the model's CFG scale: true_cfg_scale where the family runs
    // true CFG (FLUX.1, Qwen-Image), guidance where its CFG is classic (FLUX.2 [klein], Z-Image).
    auto& p = c.job.request.params;
    if (c.job.api.rfind("sdapi", 0) == 0 && c.echo.contains("cfg_scale") &&
        spec.guider.kind == GuiderSpec::Kind::ClassicCfg && spec.guider.scale_field == "guidance") {
      p.guidance = p.true_cfg_scale;
      p.true_cfg_scale = 1.0;
    }
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
      throw badRequest(pr.message, openAi && side ? "size"
                                   : option       ? "options." + pr.field
                                                  : pr.field);
    }
    if (c.size != "auto" && !c.size.empty())
      c.size = std::to_string(r.values.width) + "x" + std::to_string(r.values.height);
  }

  std::shared_ptr<Job> submit(ImagesCall& c) {
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

  // Non-streaming OpenAI response.
  void respondImages(const httplib::Request& req, httplib::Response& res, ImagesCall& c) {
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
  void streamImages(const httplib::Request& req, httplib::Response& res, ImagesCall& c,
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

  struct StreamState {
    std::uint64_t seq = 0;
    int partials = 0;
    bool ended = false;
    std::chrono::steady_clock::time_point lastWrite = std::chrono::steady_clock::now();
  };

  bool streamStep(const std::shared_ptr<Job>& job, StreamState& stRef, const ImagesCall& callRef,
                  const std::string& prefix, const std::string& base, httplib::DataSink& sink) {
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

  void generations(const httplib::Request& req, httplib::Response& res) {
    ImagesCall c =
        openAiCall(parseBody(req, opt.max_json_depth, BodyKind::OpenAi), "openai.generations");
    if (c.stream)
      streamImages(req, res, c, "image_generation");
    else
      respondImages(req, res, c);
  }

  void edits(const httplib::Request& req, httplib::Response& res) {
    if (!req.is_multipart_form_data())
      throw badRequest(
          "POST /v1/images/edits expects multipart/form-data with 'image' (and "
          "optionally 'mask')");
    ImagesCall c = openAiCall(formToJson(req, opt.max_json_depth), "openai.edits");
    const char* key = req.has_file("image") ? "image" : "image[]";
    if (!req.has_file(key))
      throw badRequest("'image' is required (a PNG, JPEG or WebP file)", "image");
    if (req.files.count(key) > 1)
      throw badRequest("only one 'image' is accepted per request", "image");
    const std::string mask = req.has_file("mask") ? req.get_file_value("mask").content : "";
    if (req.has_file("mask") && mask.empty()) throw badRequest("'mask' is empty", "mask");
    attachImages(c, req.get_file_value(key).content, mask, "image", "mask");
    if (c.stream)
      streamImages(req, res, c, "image_edit");
    else
      respondImages(req, res, c);
  }

  void models(const httplib::Request&, httplib::Response& res) {
    sendJson(res, 200, pool.modelsJson());
  }

  void file(const httplib::Request& req, httplib::Response& res) {
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

  // --- AUTOMATIC1111 --------------------------------------------------------------------------
  ImagesCall sdapiCall(const json& b, const std::string& api) {
    ImagesCall c;
    c.job.api = api;
    auto& p = c.job.request.params;
    if (auto v = str(b, "prompt")) p.prompt = *v;
    if (auto v = str(b, "negative_prompt"); v && !v->empty()) {
      p.negative_prompt = *v;
      p.negative_prompt_given = true;
    }
    json d = b;
    d.erase("negative_prompt");  // handled above (A1111 clients send "" by default)
    if (auto v = number(b, "cfg_scale")) p.true_cfg_scale = *v, c.echo["cfg_scale"] = *v;
    if (auto v = number(b, "distilled_guidance")) p.guidance = *v;
    if (auto v = number(b, "denoising_strength")) d["strength"] = *v;
    d.erase("cfg_scale");
    applyDitFields(d, p, c.echo);
    const long long batch = integer(b, "batch_size", 1, opt.max_n).value_or(1);
    const long long iter = integer(b, "n_iter", 1, opt.max_n).value_or(1);
    if (batch * iter > opt.max_n)
      throw badRequest("batch_size x n_iter must be at most " + std::to_string(opt.max_n),
                       "batch_size");
    p.num_images = static_cast<int>(batch * iter);
    if (auto w = integer(b, "width", 1, opt.max_side)) p.width = static_cast<int>(*w);
    if (auto h = integer(b, "height", 1, opt.max_side)) p.height = static_cast<int>(*h);
    if (auto m = str(b, "model")) c.job.model = *m;
    return c;
  }

  void sdapiRespond(httplib::Response& res, ImagesCall& c, const json& body) {
    auto job = submit(c);
    std::vector<JobImage> imgs;
    {
      std::unique_lock lock(pool.mutex());
      waitFinished(lock, job);
      if (job->state != JobState::Done) throw jobError(*job);
      imgs = sortedImages(*job);
    }
    json images = json::array(), seeds = json::array();
    for (const JobImage& img : imgs) {
      images.push_back(encodeBase64(outputImage(img, "png", 100).first));
      seeds.push_back(img.has_seed ? json(img.seed) : json(nullptr));
    }
    json info = madeEcho(c, imgs);
    info["prompt"] = c.job.request.params.prompt;
    info["all_seeds"] = seeds;
    info["job"] = job->id;
    json params = body;
    params.erase("init_images");
    params.erase("mask");
    sendJson(res, 200, json{{"images", images}, {"parameters", params}, {"info", info.dump()}});
  }

  void txt2img(const httplib::Request& req, httplib::Response& res) {
    const json b = parseBody(req, opt.max_json_depth, BodyKind::Sdapi);
    ImagesCall c = sdapiCall(b, "sdapi.txt2img");
    sdapiRespond(res, c, b);
  }

  void img2img(const httplib::Request& req, httplib::Response& res) {
    const json b = parseBody(req, opt.max_json_depth, BodyKind::SdapiImg2Img);
    ImagesCall c = sdapiCall(b, "sdapi.img2img");
    if (!b.contains("init_images") || !b["init_images"].is_array() || b["init_images"].empty() ||
        !b["init_images"][0].is_string())
      throw badRequest("'init_images' must be an array with one base64 image", "init_images");
    if (b["init_images"].size() > 1)
      throw badRequest("only one init image is accepted per request", "init_images");
    std::string mask;
    if (auto m = str(b, "mask"); m && !m->empty()) mask = decodeBase64(*m, "mask");
    std::string image;
    try {
      image = decodeBase64(b["init_images"][0].get<std::string>(), "init_images[0]");
      if (!mask.empty() && b.value("inpainting_mask_invert", 0) == 1) {
        Pixels m = inpaintMask(decodeImage(mask, "mask", opt.max_side, opt.max_upload_pixels));
        for (auto& v : m.data) v = static_cast<std::uint8_t>(255 - v);
        mask = encodeImage(m, "png", 100);
      }
    } catch (const ImageError& e) {
      throw badRequest(e.what(), "init_images");
    }
    // A1111 masks are white = repaint already: no alpha conversion unless the mask has alpha.
    attachImages(c, image, mask, "init_images[0]", "mask");
    sdapiRespond(res, c, b);
  }

  void progress(const httplib::Request&, httplib::Response& res) {
    json out{{"progress", 0.0},
             {"eta_relative", 0.0},
             {"current_image", nullptr},
             {"textinfo", nullptr}};
    int jobCount = 0;
    const Job* best = nullptr;
    json state{{"skipped", false},   {"interrupted", false}, {"job", ""},
               {"job_count", 0},     {"job_timestamp", "0"}, {"job_no", 0},
               {"sampling_step", 0}, {"sampling_steps", 0}};
    pool.forEachJob([&](const Job& j) {
      if (j.finished()) return;
      ++jobCount;
      if (j.state == JobState::Running &&
          (!best || (j.api.rfind("sdapi", 0) == 0 && best->api.rfind("sdapi", 0) != 0)))
        best = &j;
      if (best) {
        const int n = std::max(1, best->request.imageCount());
        const double perImage = best->steps > 0 ? double(best->step) / best->steps : 0.0;
        out["progress"] = (best->image_index + perImage) / n;
        out["eta_relative"] = best->eta_s > 0 ? best->eta_s : 0.0;
        state["job"] = best->id;
        state["sampling_step"] = best->step;
        state["sampling_steps"] = best->steps;
        state["job_timestamp"] = std::to_string(best->created);
        if (!best->preview_list.empty()) out["current_image"] = best->preview_list.back().png_b64;
      }
    });
    state["job_count"] = jobCount;
    out["state"] = state;
    sendJson(res, 200, out);
  }

  void interrupt(const httplib::Request&, httplib::Response& res) {
    std::vector<std::string> ids;
    pool.forEachJob([&](const Job& j) {
      if (j.state == JobState::Running && j.api.rfind("sdapi", 0) == 0) ids.push_back(j.id);
    });
    for (const auto& id : ids) pool.cancel(id);
    sendJson(res, 200, json{{"interrupted", ids}});
  }

  // --- DiT Studio's own endpoints -------------------------------------------------------------
  void jobs(const httplib::Request&, httplib::Response& res) {
    sendJson(res, 200, pool.jobsJson());
  }

  void jobGet(const httplib::Request& req, httplib::Response& res) {
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

  void jobCancel(const httplib::Request& req, httplib::Response& res) {
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
  void jobCreate(const httplib::Request& req, httplib::Response& res) {
    ImagesCall c = openAiCall(parseBody(req, opt.max_json_depth, BodyKind::OpenAi), "page");
    c.job.previews = true;
    c.job.request.preview_every = previewEvery(c, 12);  // about 12 live previews per image
    checkProtocol(c.job.request.params);
    checkRequestLine(c.job.request);
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

  void groups(const httplib::Request&, httplib::Response& res) {
    sendJson(res, 200, pool.groupsJson());
  }

  void health(const httplib::Request&, httplib::Response& res) {
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

  void events(const httplib::Request& req, httplib::Response& res) {
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
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [this, seen, first](
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

  void presets(const httplib::Request&, httplib::Response& res) {
    res.set_content(kBuiltinPresetsJson, "application/json");
  }

  void page(const httplib::Request&, httplib::Response& res) {
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; img-src 'self' data: blob:; style-src 'self' "
                   "'unsafe-inline'; script-src 'self' 'unsafe-inline'; connect-src 'self'");
    res.set_content(kPageHtml, "text/html; charset=utf-8");
  }
};

// --------------------------------------------------------------------------------------------

HttpServer::HttpServer(Pool& pool, ServerOptions options)
    : pool_(pool), opt_(std::move(options)), svr_(std::make_unique<httplib::Server>()) {
  if (opt_.allowed_hosts.empty()) opt_.allowed_hosts = defaultAllowedHosts(opt_.host);
  ListenerOptions lo;
  lo.max_connections = opt_.max_connections;
  lo.max_client_connections = opt_.max_client_connections;
  lo.request_timeout_s = opt_.request_timeout_s;
  lo.max_body_bytes = opt_.max_body_bytes;
  listener_ = std::make_unique<Listener>(*svr_, lo);
  routes();
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  if (opt_.port == 0) {
    port_ = svr_->bind_to_any_port(opt_.host);
    if (port_ <= 0) {
      listener_->adoptListenSocket(-1);
      throw std::runtime_error("cannot listen on " + opt_.host + " (any port)");
    }
  } else {
    if (!svr_->bind_to_port(opt_.host, opt_.port)) {
      listener_->adoptListenSocket(-1);
      throw std::runtime_error("cannot listen on " + opt_.host + ":" + std::to_string(opt_.port) +
                               " (" + std::strerror(errno) +
                               "; in use, or not an address of this host?)");
    }
    port_ = opt_.port;
  }
  listener_->afterBind();
  return port_;
}

void HttpServer::listen() { listener_->run(); }

void HttpServer::stop() {
  stopping_ = true;
  if (listener_) listener_->stop();
}

bool HttpServer::stopping() const { return stopping_; }

std::string HttpServer::uniqueFile(const std::string& stem, const std::string& ext,
                                   const std::string& bytes) {
  for (int i = 0; i < 10000; ++i) {
    const std::string path = stem + (i ? "-" + std::to_string(i) : "") + ext;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      throw ApiError(
          500, "server_error",
          "cannot write " + fs::path(path).filename().string() + ": " + std::strerror(errno));
    }
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        ::close(fd);
        throw ApiError(500, "server_error", "cannot write " + fs::path(path).filename().string());
      }
      off += static_cast<size_t>(w);
    }
    ::close(fd);
    return path;
  }
  throw ApiError(500, "server_error", "no free file name for " + stem + ext);
}

std::string HttpServer::registerFile(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  std::lock_guard lock(filesMu_);
  files_[name] = path;
  return name;
}

bool HttpServer::servedPath(const std::string& name, std::string& path) const {
  {
    std::lock_guard lock(filesMu_);
    if (auto it = files_.find(name); it != files_.end()) {
      path = it->second;
      return true;
    }
  }
  path = pool_.imagePath(name);  // an image a job of this session made
  return !path.empty();
}

namespace {

constexpr std::size_t kMaxFormParts = 64;

std::string lower(std::string v) {
  std::transform(v.begin(), v.end(), v.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return v;
}

// Reads a request body into `out` within the limits: at most `max` bytes counted while reading
// (Content-Length and chunked alike), before the request's read deadline, at most kMaxFormParts
// multipart parts. False: `res` holds the refusal and the connection closes after it.
bool readBody(const httplib::Request& req, httplib::Response& res,
              const httplib::ContentReader& reader, httplib::Request& out, std::size_t max,
              int timeoutS) {
  out.body.clear();
  out.files.clear();
  std::size_t total = 0;
  bool tooBig = false, late = false, tooMany = false;
  auto count = [&](std::size_t n) {
    total += n;
    if (total > max) tooBig = true;
    if (Listener::secondsLeft() < 0) late = true;
    return !tooBig && !late;
  };
  bool ok;
  if (req.is_multipart_form_data()) {
    auto cur = out.files.end();
    std::size_t parts = 0;
    ok = reader(
        [&](const httplib::MultipartFormData& f) {
          if (++parts > kMaxFormParts) {
            tooMany = true;
            return false;
          }
          cur = out.files.emplace(f.name, f);
          return count(f.name.size() + f.filename.size() + f.content_type.size());
        },
        [&](const char* d, std::size_t n) {
          if (!count(n) || cur == out.files.end()) return false;
          cur->second.content.append(d, n);
          return true;
        });
  } else {
    ok = reader([&](const char* d, std::size_t n) {
      if (!count(n)) return false;
      out.body.append(d, n);
      return true;
    });
  }
  if (ok && !tooBig && !late) return true;
  Listener::closeAfterResponse();
  if (tooBig || res.status == 413)
    sendError(res, ApiError(413, "invalid_request_error",
                            "the request body is larger than " + std::to_string(max) +
                                " bytes (--max-body-mb)"));
  else if (late)
    sendError(res, ApiError(408, "invalid_request_error",
                            "the request did not arrive whole within " + std::to_string(timeoutS) +
                                " s (--request-timeout-s)"));
  else if (tooMany)
    sendError(res,
              badRequest("the form has more than " + std::to_string(kMaxFormParts) + " parts"));
  else if (res.status == 415)
    sendError(res, ApiError(415, "invalid_request_error",
                            "the body's Content-Encoding is not accepted; send it uncompressed"));
  else
    sendError(res, badRequest("the request body is malformed or cut short (its length, chunked "
                              "encoding or multipart framing)"));
  return false;
}

// POST and DELETE routes (they read their bodies within the limits); any other path with a body
// is refused before its body is read.
bool bodyRoute(const std::string& method, const std::string& path) {
  auto jobPath = [&](const std::string& tail) {
    const std::string pre = "/v1/jobs/";
    if (path.rfind(pre, 0) != 0 || path.size() <= pre.size() + tail.size()) return false;
    if (path.compare(path.size() - tail.size(), tail.size(), tail) != 0) return false;
    const std::string id = path.substr(pre.size(), path.size() - pre.size() - tail.size());
    return id.find_first_not_of(
               "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-") ==
           std::string::npos;
  };
  if (method == "DELETE") return jobPath("");
  if (method != "POST") return false;
  return path == "/v1/images/generations" || path == "/v1/images/edits" ||
         path == "/sdapi/v1/txt2img" || path == "/sdapi/v1/img2img" ||
         path == "/sdapi/v1/interrupt" || path == "/v1/jobs" || jobPath("/cancel");
}

}  // namespace

void HttpServer::routes() {
  auto h = std::make_shared<Handlers>(Handlers{*this, pool_, opt_});
  // Every refusal in our words: ApiError as is; a JSON type the field checks did not foresee
  // still a 400, never the JSON library's text.
  auto guarded = [](httplib::Response& res, const auto& call) {
    try {
      call();
    } catch (const ApiError& e) {
      sendError(res, e);
    } catch (const ImageError& e) {
      sendError(res, badRequest(e.what()));
    } catch (const json::exception&) {
      sendError(res, badRequest("a field of the request has the wrong JSON type or value"));
    }
  };
  using Fn = void (Handlers::*)(const httplib::Request&, httplib::Response&);
  auto wrap = [h, guarded](Fn fn) {
    return [h, fn, guarded](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] { ((*h).*fn)(req, res); });
    };
  };
  // POST and DELETE routes read their bodies themselves, within the limits; the handler gets a
  // copy of the request holding the body.
  auto wrapBody = [this, h, guarded](Fn fn) {
    return [this, h, fn, guarded](const httplib::Request& req, httplib::Response& res,
                                  const httplib::ContentReader& reader) {
      httplib::Request r = req;
      if (!readBody(req, res, reader, r, opt_.max_body_bytes, opt_.request_timeout_s)) return;
      Listener::bodyRead();
      guarded(res, [&] { ((*h).*fn)(r, res); });
    };
  };
  httplib::Server& svr = *svr_;
  svr.set_payload_max_length(opt_.max_body_bytes);
  // Clients (undici, requests) keep connections open between calls: a low per-connection
  // request cap (httplib's default is 5) makes them race the server's close.
  svr.set_keep_alive_max_count(100000);
  svr.set_keep_alive_timeout(30);
  svr.set_read_timeout(30, 0);
  svr.set_write_timeout(30, 0);
  svr.set_logger(
      [](const httplib::Request&, const httplib::Response&) { Listener::responseWritten(); });

  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    using HR = httplib::Server::HandlerResponse;
    const std::string te = lower(req.get_header_value("Transfer-Encoding"));
    const std::string cl = req.get_header_value("Content-Length");
    const bool hasBody = !te.empty() || (!cl.empty() && cl != "0");
    auto refuse = [&](const ApiError& e) {
      sendError(res, e);
      if (hasBody) Listener::closeAfterResponse();
      Listener::headRead(false);
      return HR::Handled;
    };
    // Over a connection limit: 503, except /v1/health (answered on the refusal's own thread, so
    // a monitor still sees the server while it is full).
    if (Listener::overLimit() && req.path != "/v1/health") {
      Listener::closeAfterResponse();
      res.set_header("Retry-After", "1");
      return refuse(ApiError(503, "server_error",
                             "too many open connections (--max-connections, "
                             "--max-client-connections); try again later",
                             {}, "too_many_connections"));
    }
    const std::string host = req.get_header_value("Host");
    if (!hostAllowed(host, opt_.allowed_hosts))
      return refuse(ApiError(403, "invalid_request_error",
                             "the Host header '" + host.substr(0, 100) +
                                 "' is not a name of this server (a page on another site "
                                 "reaching it through DNS?); start the server with "
                                 "--allowed-host NAME to accept that name"));
    const std::string origin = req.get_header_value("Origin");
    bool corsOk = false;
    if (!origin.empty())
      for (const std::string& o : opt_.cors_origins)
        if (o == "*" || o == origin) corsOk = true;
    if (corsOk) {
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Vary", "Origin");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    }
    if (req.method == "OPTIONS") {
      if (!corsOk)
        return refuse(ApiError(403, "invalid_request_error",
                               "cross-origin requests are not allowed (start the server with "
                               "--cors-origin ORIGIN)"));
      res.status = 204;
      Listener::headRead(false);
      return HR::Handled;
    }
    if (!originAllowed(origin, host, opt_.cors_origins))
      return refuse(ApiError(403, "invalid_request_error",
                             "requests from the web page at '" + origin.substr(0, 100) +
                                 "' are not allowed (start the server with --cors-origin " +
                                 origin.substr(0, 100) + " to allow them)"));
    if (!opt_.token.empty() && req.path != "/" && req.path != "/favicon.ico") {
      const std::string auth = req.get_header_value("Authorization");
      if (!constantTimeEqual(auth, "Bearer " + opt_.token))
        return refuse(ApiError(401, "invalid_request_error",
                               auth.empty() ? "missing bearer token (Authorization: Bearer TOKEN)"
                                            : "incorrect bearer token",
                               {}, "invalid_api_key"));
    }
    // The body: bounded before a byte of it is read.
    const bool takesBody = req.method == "POST" || req.method == "DELETE";
    if (!te.empty() && te != "chunked")
      return refuse(ApiError(400, "invalid_request_error",
                             "Transfer-Encoding '" + te.substr(0, 40) + "' is not accepted"));
    if (const std::string enc = lower(req.get_header_value("Content-Encoding"));
        !enc.empty() && enc != "identity")
      return refuse(ApiError(415, "invalid_request_error",
                             "Content-Encoding '" + enc.substr(0, 40) +
                                 "' is not accepted; send the body uncompressed"));
    if (!cl.empty()) {
      std::uint64_t n = 0;
      const bool digits =
          cl.size() <= 19 && cl.find_first_not_of("0123456789") == std::string::npos;
      if (digits) n = std::stoull(cl);
      if (!digits || !te.empty())
        return refuse(badRequest("malformed Content-Length '" + cl.substr(0, 40) + "'"));
      if (n > opt_.max_body_bytes)
        return refuse(ApiError(413, "invalid_request_error",
                               "the request body is larger than " +
                                   std::to_string(opt_.max_body_bytes) + " bytes (--max-body-mb)"));
    }
    if (hasBody && !takesBody)
      return refuse(
          badRequest(req.method + " " + req.path.substr(0, 100) + " takes no request body"));
    if (takesBody && !bodyRoute(req.method, req.path))
      return refuse(ApiError(404, "invalid_request_error",
                             "unknown route " + req.method + " " + req.path.substr(0, 100)));
    if (takesBody && !hasBody && cl.empty()) {
      // No Content-Length and not chunked: no body (RFC 9112 6.3). cpp-httplib 0.11 would read
      // one until the client closes; the header tells it there is none. `req` is the server's
      // own non-const object, passed here as const.
      const_cast<httplib::Request&>(req).set_header("Content-Length", "0");
    }
    if (hasBody && req.method == "POST") {
      const std::string ct = req.get_header_value("Content-Type");
      const bool edits = req.path == "/v1/images/edits";
      if (!isJsonContentType(ct) && !isMultipartContentType(ct))
        return refuse(ApiError(
            415, "invalid_request_error",
            "POST " + req.path.substr(0, 100) +
                " expects Content-Type: " + (edits ? "multipart/form-data" : "application/json") +
                (ct.empty() ? std::string(" (none given)") : ", got '" + ct.substr(0, 100) + "'")));
    }
    Listener::headRead(hasBody && takesBody);
    return HR::Unhandled;
  });
  svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                    httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg;
    if (res.status == 404)
      msg = "unknown route " + req.method + " " + req.path.substr(0, 100);
    else if (res.status == 413)
      msg = "the request body is larger than " + std::to_string(opt_.max_body_bytes) +
            " bytes (--max-body-mb)";
    else if (res.status == 400)
      msg = "malformed HTTP request";
    else if (res.status == 405)
      msg = "method not allowed";
    else if (res.status == 414)
      msg = "the request's path is too long";
    else
      msg = "HTTP error " + std::to_string(res.status);
    sendJson(res, res.status,
             errorBody(msg, res.status >= 500 ? "server_error" : "invalid_request_error", "", ""));
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string msg = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const json::exception&) {  // never the JSON library's text
          sendJson(res, 400,
                   errorBody("a field of the request has the wrong JSON type or value",
                             "invalid_request_error", "", ""));
          return;
        } catch (const std::exception& e) {
          msg = clientMessage(e.what());  // no folder of the server
        } catch (...) {
        }
        sendJson(res, 500, errorBody(msg, "server_error", "", ""));
      });

  svr.Post("/v1/images/generations", wrapBody(&Handlers::generations));
  svr.Post("/v1/images/edits", wrapBody(&Handlers::edits));
  svr.Get("/v1/models", wrap(&Handlers::models));
  svr.Get(R"(/v1/images/files/([^/]+))", wrap(&Handlers::file));
  svr.Post("/sdapi/v1/txt2img", wrapBody(&Handlers::txt2img));
  svr.Post("/sdapi/v1/img2img", wrapBody(&Handlers::img2img));
  svr.Get("/sdapi/v1/progress", wrap(&Handlers::progress));
  svr.Post("/sdapi/v1/interrupt", wrapBody(&Handlers::interrupt));
  svr.Get("/v1/jobs", wrap(&Handlers::jobs));
  svr.Post("/v1/jobs", wrapBody(&Handlers::jobCreate));
  svr.Get(R"(/v1/jobs/([A-Za-z0-9._:-]+))", wrap(&Handlers::jobGet));
  svr.Delete(R"(/v1/jobs/([A-Za-z0-9._:-]+))", wrapBody(&Handlers::jobCancel));
  svr.Post(R"(/v1/jobs/([A-Za-z0-9._:-]+)/cancel)", wrapBody(&Handlers::jobCancel));
  svr.Get("/v1/groups", wrap(&Handlers::groups));
  svr.Get("/v1/health", wrap(&Handlers::health));
  svr.Get("/v1/events", wrap(&Handlers::events));
  svr.Get("/v1/presets", wrap(&Handlers::presets));
  svr.Get("/", wrap(&Handlers::page));
}

}  // namespace dit::server
