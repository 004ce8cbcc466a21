// ditstudio-server's HTTP faces on one Pool (cpp-httplib, Debian's libcpp-httplib-dev):
//   OpenAI Images API   POST /v1/images/generations, POST /v1/images/edits, GET /v1/models,
//                       GET /v1/images/files/NAME (response_format "url")
//   AUTOMATIC1111       POST /sdapi/v1/txt2img, /sdapi/v1/img2img, GET /sdapi/v1/progress,
//                       POST /sdapi/v1/interrupt
//   DiT Studio          GET/POST /v1/jobs, GET/DELETE /v1/jobs/ID, POST /v1/jobs/ID/cancel,
//                       GET /v1/groups, GET /v1/events (server-sent events), GET /v1/presets,
//                       GET /v1/health, GET / (the page, compiled in)
// Errors use OpenAI's shape {"error": {"message", "type", "param", "code"}}. Security: the
// caller binds the host (127.0.0.1 by default); with a token every route except the page needs
// "Authorization: Bearer TOKEN"; body (while reading, chunked too), JSON depth, prompt, image, n,
// queue, connection and read-deadline limits (http_listener.h, request_guard.h); the Host header
// must name this server and a browser's Origin must be its own or a configured CORS origin;
// requests name no file except images the server made (by file name) and LoRAs by file name inside
// --lora-dir. docs/server.md describes it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "app/server/http_listener.h"
#include "app/server/pool.h"

namespace httplib {
class Server;
}

namespace dit::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                        ///< 0: any free port (see HttpServer::port())
  std::string token;                      ///< bearer token; "" = none (loopback only)
  std::vector<std::string> cors_origins;  ///< "" = no CORS headers; "*" = any origin
  std::size_t max_body_bytes = std::size_t(32) << 20;
  int max_side = 2048;  ///< width/height of a request and of uploads
  std::int64_t max_upload_pixels = std::int64_t(4096) * 4096;
  int max_n = 10;        ///< images per request (OpenAI's own limit is 10)
  std::string lora_dir;  ///< LoRA files requests may name; "" = LoRAs refused
  int threads = 0;       ///< unused: every connection has a thread of its own (max_connections)
  // Limits checked before any work starts (docs/security.md lists them with their flags):
  int max_json_depth = 16;                   ///< JSON nesting of a body (--max-json-depth)
  std::size_t max_prompt_bytes = 256 << 10;  ///< prompt, negative prompt (--max-prompt-bytes)
  int request_timeout_s = 60;                ///< a whole request, first byte to last
  std::size_t max_connections = 512;         ///< open connections (--max-connections)
  std::size_t max_client_connections = 256;  ///< from one address (--max-client-connections)
  /// Open /v1/events streams at once (--max-event-streams): each holds its connection's thread
  /// while open; past it a stream is refused 503 `too_many_event_streams`, and health,
  /// generations and the other routes keep the remaining connections.
  std::size_t max_event_streams = 128;
  /// Host header names accepted (DNS rebinding); empty = defaultAllowedHosts(host); "*" = any.
  std::vector<std::string> allowed_hosts;
};

class HttpServer {
 public:
  HttpServer(Pool& pool, ServerOptions options);
  ~HttpServer();
  /// Binds host:port; returns the bound port. Throws std::runtime_error when it cannot.
  int bind();
  /// Serves until stop() (blocking).
  void listen();
  void stop();
  int port() const { return port_; }
  bool stopping() const;

 private:
  void routes();
  std::string uniqueFile(const std::string& stem, const std::string& ext, const std::string& bytes);
  std::string registerFile(const std::string& path);  ///< returns the served name
  bool servedPath(const std::string& name, std::string& path) const;

  Pool& pool_;
  ServerOptions opt_;
  /// Open /v1/events streams (before svr_ and listener_: the connections that hold them end first).
  std::atomic<std::size_t> eventStreams_{0};
  std::unique_ptr<httplib::Server> svr_;
  std::unique_ptr<Listener> listener_;  ///< after svr_: destroyed first, waits for connections
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  mutable std::mutex filesMu_;
  std::map<std::string, std::string> files_;  ///< served name -> absolute path
  std::uint64_t uploads_ = 0;

  friend struct Handlers;
};

}  // namespace dit::server
