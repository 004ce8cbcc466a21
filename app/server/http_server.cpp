#include "app/server/http_server.h"

#include <fcntl.h>
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/server/http_routes.h"

namespace dit::server {

namespace fs = std::filesystem;
using nlohmann::json;

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
            "POST " + req.path.substr(0, 100) + " expects Content-Type: " +
                (edits ? "multipart/form-data or application/json" : "application/json") +
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
