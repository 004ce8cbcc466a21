// The GUI's "Serve API" switch: ditstudio-server's HTTP front end (dit_server's HttpServer: the
// OpenAI Images API, the AUTOMATIC1111 subset, the page at /) run inside the window's process on
// 127.0.0.1 only, serving through the WINDOW'S OWN group (issue 45): one model copy in memory.
// Its jobs go to a dit_server Pool over an attached group (server::AttachedGroup) whose job sink
// is the window's WorkerController: each API request joins the window's queue beside the
// window's own requests, shows there and in the gallery, and its progress and result come back
// to the HTTP client through the controller's session observer. No second mpirun is started;
// when the window's group is not running yet, switching the API on starts it (the window's
// group, with the window's launch configuration). No Torch; plain C++ with Qt types in.
#pragma once

#include <QPointer>
#include <QString>
#include <memory>
#include <thread>

#include "ui/worker_command.h"

namespace dit::server {
class Pool;
class HttpServer;
}  // namespace dit::server

namespace dit::ui {

class WorkerController;

class ApiServe {
 public:
  /// Listens on 127.0.0.1:`port` (0: any free port) in a thread of its own and serves through
  /// `controller`'s group; starts it with `config` when no group runs (nor is being checked).
  /// The API's images go to `imagesDir`. `controller` must outlive this object. Throws
  /// std::exception naming the cause (port taken, ...); nothing is started then.
  ApiServe(WorkerController& controller, const LaunchConfig& config, int port,
           const QString& imagesDir);
  /// Stops the HTTP server; the API's requests still in the window's queue are cancelled there.
  /// The window's group keeps running.
  ~ApiServe();
  ApiServe(const ApiServe&) = delete;
  ApiServe& operator=(const ApiServe&) = delete;
  /// http://127.0.0.1:PORT
  QString url() const;
  int port() const { return port_; }
  /// The model id the API serves (the window's model folder or file name).
  QString modelId() const { return modelId_; }

 private:
  class Sink;
  QPointer<WorkerController> controller_;
  std::unique_ptr<Sink> sink_;
  std::unique_ptr<dit::server::Pool> pool_;
  std::unique_ptr<dit::server::HttpServer> http_;
  std::thread thread_;
  int port_ = 0;
  QString modelId_;
};

/// The port of the switch: $DITSTUDIO_SERVE_PORT when set (0 = any free port), else 8000.
int defaultServePort();

}  // namespace dit::ui
