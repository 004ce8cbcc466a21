// The GUI's "Serve API" switch: ditstudio-server's code (dit_server: Pool + HttpServer, the OpenAI
// Images API, the AUTOMATIC1111 subset, the page at /) run inside the window's process, over ONE
// group started from the window's launch configuration (model, strategy, hostfile), on
// 127.0.0.1 only. The served group is the server's own (a second group beside the window's
// interactive one), so the two never share a queue. No Torch; plain C++ with Qt types in.
#pragma once

#include <QString>
#include <memory>
#include <thread>

#include "ui/worker_command.h"

namespace dit::server {
class Pool;
class HttpServer;
}  // namespace dit::server

namespace dit::ui {

class ApiServe {
 public:
  /// Starts the group and listens on 127.0.0.1:`port` (0: any free port) in a thread of its own.
  /// Images go to `imagesDir`. Throws std::exception naming the cause (port taken, strategy
  /// refused, ...).
  ApiServe(const LaunchConfig& config, int port, const QString& imagesDir);
  /// Stops the HTTP server and the group (bounded by the teardown policy).
  ~ApiServe();
  ApiServe(const ApiServe&) = delete;
  ApiServe& operator=(const ApiServe&) = delete;
  /// http://127.0.0.1:PORT
  QString url() const;
  int port() const { return port_; }

 private:
  std::unique_ptr<dit::server::Pool> pool_;
  std::unique_ptr<dit::server::HttpServer> http_;
  std::thread thread_;
  int port_ = 0;
};

/// The port of the switch: $DITSTUDIO_SERVE_PORT when set (0 = any free port), else 8000.
int defaultServePort();

}  // namespace dit::ui
