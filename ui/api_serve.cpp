#include "ui/api_serve.h"

#include <QMetaObject>

#include "app/server/http_server.h"
#include "app/server/pool.h"
#include "ui/worker_controller.h"

namespace dit::ui {

// The pool's job sink: the window's queue. The pool calls it on its scheduler thread; the work
// is posted to the controller's thread (dropped when the controller is gone).
class ApiServe::Sink : public dit::server::AttachedGroup {
 public:
  explicit Sink(WorkerController* c) : c_(c) {}
  void submit(dit::protocol::GenerateRequest request) override {
    QMetaObject::invokeMethod(
        c_.data(),
        [c = c_, r = std::move(request)]() mutable {
          if (c) c->submitRequest(std::move(r));
        },
        Qt::QueuedConnection);
  }
  void cancel(const std::string& id) override {
    QMetaObject::invokeMethod(
        c_.data(),
        [c = c_, id = QString::fromStdString(id)] {
          if (c) c->cancel(id);
        },
        Qt::QueuedConnection);
  }

 private:
  QPointer<WorkerController> c_;  // read-only after construction: safe to copy on any thread
};

ApiServe::ApiServe(WorkerController& controller, const LaunchConfig& config, int port,
                   const QString& imagesDir)
    : controller_(&controller), sink_(std::make_unique<Sink>(&controller)) {
  // The group the API serves through: the window's running one, else the one it starts now.
  // (A hostfile group still in its pre-flight is `config`'s: the window started it just now.)
  const bool running = controller.isRunning() || controller.checkingHosts();
  const LaunchConfig& group = controller.isRunning() ? controller.config() : config;
  dit::server::GroupSpec g;
  g.name = "gui";
  g.model =
      group.modelDir.isEmpty() ? defaultModelDir().toStdString() : group.modelDir.toStdString();
  g.strategy = group.strategy;
  g.np = group.strategy.world;
  g.device = group.strategy.device.empty() ? "cpu" : group.strategy.device;
  g.hostfile = group.hostfile.toStdString();
  g.network_interface = group.hosts.networkInterface.toStdString();
  for (const QString& a : group.components.workerArgs()) g.model_args.push_back(a.toStdString());
  dit::server::PoolOptions po;
  po.images_dir = imagesDir.toStdString();
  dit::server::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = port;
  pool_ = std::make_unique<dit::server::Pool>(g, *sink_, po);
  modelId_ = QString::fromStdString(dit::server::modelId(g.model));
  http_ = std::make_unique<dit::server::HttpServer>(*pool_, so);
  port_ = http_->bind();  // a taken port fails here, before anything starts
  controller.addObserver(&pool_->attachedObserver());
  pool_->start();
  thread_ = std::thread([this] { http_->listen(); });
  if (!running) controller.start(config);
}

ApiServe::~ApiServe() {
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
  if (pool_) pool_->stop();  // the API's jobs still queued are cancelled in the window
  if (controller_ && pool_) controller_->removeObserver(&pool_->attachedObserver());
}

QString ApiServe::url() const { return QStringLiteral("http://127.0.0.1:%1").arg(port_); }

int defaultServePort() {
  bool ok = false;
  const int p = qEnvironmentVariableIntValue("DITSTUDIO_SERVE_PORT", &ok);
  return ok && p >= 0 && p < 65536 ? p : 8000;
}

}  // namespace dit::ui
