// Test helper (not a test): DiT Studio's main window (offscreen) driven as a user would against a
// hostfile group, for tests/test_multihost.cpp. It opens the window on a model, sets the strategy
// editor's hostfile and host settings and tp 2, sets the steps and size, and presses Generate.
// On stderr: the group's log lines ("[mpirun] info: pre-flight H: ok ..."), each rank's pid
// ("rank R (pid P)"), each step ("image 0 step S/N"), and what the window shows when the group
// fails or its pre-flight does ("banner: <head>\n<detail>"), after which it exits 1; 0 after an
// image; 124 after 110 s.
//   multihost_gui_driver MODEL HOSTFILE SSH_OPTIONS NETWORK DATA_DIR STEPS
#include <QApplication>
#include <QTimer>
#include <cstdio>

#include "ui/main_window.h"

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr,
                 "usage: multihost_gui_driver MODEL HOSTFILE SSH_OPTIONS NETWORK DATA_DIR STEPS\n");
    return 2;
  }
  qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  dit::ui::MainWindowOptions o;
  o.modelDir = QString::fromLocal8Bit(argv[1]);
  o.dataDir = QString::fromLocal8Bit(argv[5]);
  o.workerPath = QStringLiteral(DITSTUDIO_WORKER_PATH);
  o.restoreSession = false;
  dit::ui::MainWindow w(o);
  w.show();
  dit::Strategy s;
  s.world = 2;
  s.tp_degree = 2;
  s.device = "cpu";
  w.strategyEditor()->setStrategy(s);
  w.strategyEditor()->setHostfile(QString::fromLocal8Bit(argv[2]));
  dit::ui::HostSettings h;
  h.sshOptions = QString::fromLocal8Bit(argv[3]);
  h.networkInterface = QString::fromLocal8Bit(argv[4]);
  w.strategyEditor()->setHostSettings(h);
  dit::ui::GenerationParams p = w.generationPanel()->params();
  p.steps = QString::fromLocal8Bit(argv[6]).toInt();
  p.width = p.height = 64;
  p.num_images = 1;
  p.seed = 42;
  p.random_seed = false;
  w.generationPanel()->setParams(p);

  dit::ui::WorkerController* c = w.controller();
  QObject::connect(
      c, &dit::ui::WorkerController::logLine, &app,
      [](int rank, const QString& level, const QString& text) {
        std::fprintf(stderr, "[%s] %s: %s\n",
                     rank < 0 ? "mpirun" : QStringLiteral("rank %1").arg(rank).toUtf8().constData(),
                     level.toUtf8().constData(), text.toUtf8().constData());
      });
  QObject::connect(
      c, &dit::ui::WorkerController::helloReceived, &app, [](int rank, int, qint64 pid) {
        std::fprintf(stderr, "rank %d (pid %lld)\n", rank, static_cast<long long>(pid));
      });
  QObject::connect(c, &dit::ui::WorkerController::progressReceived, &app,
                   [](const QString&, int step, int steps, double, double, int image) {
                     std::fprintf(stderr, "image %d step %d/%d\n", image, step, steps);
                   });
  QObject::connect(c, &dit::ui::WorkerController::hostCheckChanged, &app, [&w](bool checking) {
    if (checking) std::fprintf(stderr, "status: %s\n", w.statusText().toUtf8().constData());
  });
  // What the window shows: read after its own handlers ran (they were connected first).
  auto showBannerAndQuit = [&w, &app] {
    QTimer::singleShot(0, &app, [&w, &app] {
      std::fprintf(stderr, "banner: %s\n", w.bannerText().toUtf8().constData());
      std::fflush(stderr);
      app.exit(1);
    });
  };
  QObject::connect(c, &dit::ui::WorkerController::groupFailed, &app, showBannerAndQuit);
  QObject::connect(c, &dit::ui::WorkerController::hostCheckFailed, &app, showBannerAndQuit);
  QObject::connect(c, &dit::ui::WorkerController::imageReceived, &app, [&app] {
    std::fprintf(stderr, "image received\n");
    app.exit(0);
  });
  QTimer::singleShot(110000, &app, [&app] {
    std::fprintf(stderr, "multihost_gui_driver: no outcome within 110 s\n");
    app.exit(124);
  });
  QTimer::singleShot(0, &w, [&w, &app] {
    if (w.generate().isEmpty()) {
      std::fprintf(stderr, "banner: %s\n", w.bannerText().toUtf8().constData());
      app.exit(3);
    }
  });
  return app.exec();
}
