// Inside ditstudio-server's HTTP faces (not an interface of dit_server): the OpenAI-shape error,
// typed reads of body fields, one images call as the pool takes it, and the route handlers,
// defined by concern in
//   http_common.cpp    errors, typed fields, JSON and form bodies, small helpers
//   routes_images.cpp  what every images face shares: DiT Studio fields, limits, uploads,
//                      the family's resolve, submission, output images
//   routes_openai.cpp  OpenAI Images API (generations, edits, streaming, models, files)
//   routes_sdapi.cpp   AUTOMATIC1111 (txt2img, img2img, progress, interrupt)
//   routes_jobs.cpp    DiT Studio's jobs, groups, health, events, presets and the page
// http_server.cpp binds them to routes behind the pre-routing checks.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "app/common/request_values.h"
#include "app/server/http_server.h"
#include "app/server/image_codec.h"
#include "app/server/pool.h"
#include "app/server/request_guard.h"

namespace dit::server {

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

ApiError badRequest(const std::string& message, const std::string& param = {});
nlohmann::json errorBody(const std::string& message, const std::string& type,
                         const std::string& param, const std::string& code);
void sendJson(httplib::Response& res, int status, const nlohmann::json& body);
void sendError(httplib::Response& res, const ApiError& e);
/// "a string", "a number", ... for messages.
std::string typeName(const nlohmann::json& v);

// Typed body fields: absent or null -> nullopt; another JSON type or out of range -> a 400
// naming the field.
std::optional<std::string> str(const nlohmann::json& b, const char* key);
std::optional<long long> integer(const nlohmann::json& b, const char* key, long long lo,
                                 long long hi);
std::optional<double> number(const nlohmann::json& b, const char* key);
std::optional<bool> boolean(const nlohmann::json& b, const char* key);

/// A JSON body, depth/UTF-8/field types checked (request_guard); throws ApiError 400.
nlohmann::json parseBody(const httplib::Request& req, int maxDepth, BodyKind kind);
/// Multipart fields -> a JSON object (numbers, booleans and `loras` typed); throws ApiError 400.
nlohmann::json formToJson(const httplib::Request& req, int maxDepth);
/// A file name a client may give (letters, digits, . _ -; no "..").
bool safeName(const std::string& n);
/// The file's bytes; throws ApiError 500 naming only its file name.
std::string readFile(const std::string& path);
std::int64_t unixNow();
bool constantTimeEqual(const std::string& a, const std::string& b);

/// One images call (OpenAI or AUTOMATIC1111) translated for the pool.
struct ImagesCall {
  Job job;
  std::string response_format = "b64_json";
  std::string output_format = "png";
  int compression = 100;
  bool stream = false;
  int partial_images = 0;
  std::string size = "auto", quality = "auto", background = "auto";
  nlohmann::json echo = nlohmann::json::object();  ///< DiT Studio fields as given
};

/// The route handlers (one per server, shared by its routes).
struct Handlers {
  using json = nlohmann::json;

  HttpServer& s;
  Pool& pool;
  const ServerOptions& opt;

  // routes_images.cpp: what the images faces share
  void applyDitFields(const json& b, protocol::GenerationParams& p, json& echo);
  void checkProtocol(const protocol::GenerationParams& p);
  void checkRequestLine(const protocol::GenerateRequest& r);
  void parseSize(const std::string& size, protocol::GenerationParams& p);
  std::string saveUpload(const Pixels& px, const std::string& what);
  void attachImages(ImagesCall& c, const std::string& imageBytes, const std::string& maskBytes,
                    const std::string& imageField, const std::string& maskField);
  /// Editing: each upload decoded (limits checked, 400 naming `field`[i]) and saved, in order,
  /// as the request's reference images (at most protocol::kMaxReferenceImages at the door; the
  /// model's own limit is its resolve's).
  void attachReferences(ImagesCall& c, const std::vector<const std::string*>& images,
                        const std::string& field);
  /// The declared request of the model the call goes to, from a ready group (its ready event's
  /// model.request); nullopt before any group of it is ready.
  std::optional<RequestSpec> modelSpec(const ImagesCall& c);
  /// Whether the call's images are reference images (editing) or the init image: the body's
  /// DiT Studio field "image_role" ("reference" | "init"), else references on a model that takes
  /// them (FLUX.2 [klein], FLUX.1 Kontext) when no mask is given. 400 naming image_role for
  /// another value, a mask with references or references for a model that takes none.
  bool imagesAreReferences(ImagesCall& c, const nlohmann::json& b, bool mask,
                           const std::string& field);
  /// The images of an edit call: reference images when imagesAreReferences says so (every one,
  /// in order), else the one init image with `mask` (image-to-image, inpainting; several images
  /// are then a 400 naming `field`).
  void attachEditImages(ImagesCall& c, const nlohmann::json& b,
                        const std::vector<const std::string*>& images, const std::string& mask,
                        const std::string& field);
  /// The base64 images (or data: URLs) of JSON field `key`: a string or an array of strings,
  /// decoded, in order; empty when absent. 400 naming `key` for another type or bad base64.
  std::vector<std::string> jsonImages(const nlohmann::json& b, const std::string& key);
  void waitFinished(std::unique_lock<std::mutex>& lock, const std::shared_ptr<Job>& job);
  ApiError jobError(const Job& job);
  std::pair<std::string, std::string> outputImage(const JobImage& img, const std::string& format,
                                                  int compression);
  std::string convertPreview(const std::string& pngB64, const std::string& format, int q);
  std::string baseUrl(const httplib::Request& req);
  json madeEcho(const ImagesCall& c, const std::vector<JobImage>& imgs);
  json imageItems(const httplib::Request& req, const ImagesCall& c,
                  const std::vector<JobImage>& imgs);
  std::vector<JobImage> sortedImages(const Job& job);
  int resolvedSteps(const ImagesCall& c);
  int previewEvery(const ImagesCall& c, int count);
  void resolveForModel(ImagesCall& c);
  std::shared_ptr<Job> submit(ImagesCall& c);

  // routes_openai.cpp: OpenAI Images API
  struct StreamState {
    std::uint64_t seq = 0;
    int partials = 0;
    bool ended = false;
    std::chrono::steady_clock::time_point lastWrite = std::chrono::steady_clock::now();
  };
  ImagesCall openAiCall(const json& b, const std::string& api);
  void respondImages(const httplib::Request& req, httplib::Response& res, ImagesCall& c);
  void streamImages(const httplib::Request& req, httplib::Response& res, ImagesCall& c,
                    const std::string& prefix);
  bool streamStep(const std::shared_ptr<Job>& job, StreamState& stRef, const ImagesCall& callRef,
                  const std::string& prefix, const std::string& base, httplib::DataSink& sink);
  void generations(const httplib::Request& req, httplib::Response& res);
  void edits(const httplib::Request& req, httplib::Response& res);
  void models(const httplib::Request&, httplib::Response& res);
  void file(const httplib::Request& req, httplib::Response& res);

  // routes_sdapi.cpp: AUTOMATIC1111
  ImagesCall sdapiCall(const json& b, const std::string& api);
  void sdapiRespond(httplib::Response& res, ImagesCall& c, json body);
  void txt2img(const httplib::Request& req, httplib::Response& res);
  void img2img(const httplib::Request& req, httplib::Response& res);
  void progress(const httplib::Request&, httplib::Response& res);
  void interrupt(const httplib::Request&, httplib::Response& res);

  // routes_jobs.cpp: DiT Studio's own endpoints
  void jobs(const httplib::Request&, httplib::Response& res);
  void jobGet(const httplib::Request& req, httplib::Response& res);
  void jobCancel(const httplib::Request& req, httplib::Response& res);
  void jobCreate(const httplib::Request& req, httplib::Response& res);
  void groups(const httplib::Request&, httplib::Response& res);
  void health(const httplib::Request&, httplib::Response& res);
  void events(const httplib::Request& req, httplib::Response& res);
  void presets(const httplib::Request&, httplib::Response& res);
  void page(const httplib::Request&, httplib::Response& res);
};

}  // namespace dit::server
