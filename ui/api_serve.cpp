#include "ui/api_serve.h"

#include <QFileInfo>

#include "app/server/http_server.h"
#include "app/server/pool.h"

namespace dit::ui {

ApiServe::ApiServe(const LaunchConfig& config, int port, const QString& imagesDir) {
  dit::server::GroupSpec g;
  g.name = "gui";
  g.model =
      config.modelDir.isEmpty() ? defaultModelDir().toStdString() : config.modelDir.toStdString();
  g.strategy = config.strategy;
  g.np = config.strategy.world;
  g.device = config.strategy.device.empty() ? "cpu" : config.strategy.device;
  g.hostfile = config.hostfile.toStdString();
  g.network_interface = config.hosts.networkInterface.toStdString();
  // The model's components (--config, --vae, ...) and the window's extra worker arguments;
  // --dtype is the group's own field.
  for (const QString& a : config.components.workerArgs()) g.model_args.push_back(a.toStdString());
  for (int i = 0; i < config.extraWorkerArgs.size(); ++i) {
    if (config.extraWorkerArgs[i] == QLatin1String("--dtype") &&
        i + 1 < config.extraWorkerArgs.size())
      g.dtype = config.extraWorkerArgs[++i].toStdString();
    else
      g.model_args.push_back(config.extraWorkerArgs[i].toStdString());
  }
  dit::server::PoolOptions po;
  po.images_dir = imagesDir.toStdString();
  const QString worker = config.workerPath.isEmpty() ? defaultWorkerPath() : config.workerPath;
  po.exe_dir = QFileInfo(worker).absolutePath().toStdString();
  dit::server::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = port;
  pool_ = std::make_unique<dit::server::Pool>(std::vector<dit::server::GroupSpec>{g}, po);
  http_ = std::make_unique<dit::server::HttpServer>(*pool_, so);
  port_ = http_->bind();
  pool_->start();
  thread_ = std::thread([this] { http_->listen(); });
}

ApiServe::~ApiServe() {
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
  if (pool_) pool_->stop();
}

QString ApiServe::url() const { return QStringLiteral("http://127.0.0.1:%1").arg(port_); }

int defaultServePort() {
  bool ok = false;
  const int p = qEnvironmentVariableIntValue("DITSTUDIO_SERVE_PORT", &ok);
  return ok && p >= 0 && p < 65536 ? p : 8000;
}

}  // namespace dit::ui
