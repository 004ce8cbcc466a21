// MainWindow and its worker group: the controller's signals, starting / stopping the group,
// generate and cancel, progress, images and a failed group.
#include <QAction>
#include <QLabel>
#include <QListView>
#include <QPushButton>
#include <QStatusBar>
#include <QTimer>
#include <algorithm>

#include "ui/elided_label.h"
#include "ui/image_input_panel.h"
#include "ui/main_window.h"
#include "ui/seed_text.h"
#include "ui/strategy_json.h"

namespace dit::ui {

void MainWindow::connectController() {
  WorkerController* c = controller_;
  connect(c, &WorkerController::stateChanged, this, [this](WorkerController::State s) {
    if (s == WorkerController::State::Starting) {  // a new group: fresh monitor
      rankModel_->reset(controller_->config().strategy.world);
      log_->setWorld(controller_->config().strategy.world);
    }
    // Between requests: idle, the last step's time and step count stay.
    if (s == WorkerController::State::Ready) rankModel_->setStageAll(QStringLiteral("idle"), false);
    updateActions();
    updateStatus();
    updateTitle();
    if (s == WorkerController::State::Stopped && closing_) close();
  });
  connect(c, &WorkerController::logLine, log_, &LogPanel::append);
  // A hostfile group's pre-flight (ssh to every other host, off this thread): "Checking hosts…"
  // while it runs (Stop abandons it); a host that fails it is named in the error banner and no
  // group starts.
  connect(c, &WorkerController::hostCheckChanged, this, [this](bool checking) {
    if (checking)
      showBanner(tr("Checking hosts…"),
                 tr("Pre-flight of the hostfile %1 over ssh: the worker, the model fingerprint and "
                    "the port range on every other host. Stop cancels it.")
                     .arg(editor_->hostfile()),
                 false, false);
    else if (bannerLabel_->text() == tr("Checking hosts…"))
      hideBanner();
    updateActions();
    updateStatus();
  });
  connect(c, &WorkerController::hostCheckFailed, this,
          [this](const QString& host, const QString& message) {
            const QString stays = queuedStayNote();
            showBanner(host.isEmpty()
                           ? tr("The hostfile group cannot start")
                           : tr("Pre-flight failed on host %1: the group did not start").arg(host),
                       message + stays, true, true);
            updateActions();
            updateStatus();
            if (autoActive_) finishAuto(false, message);
          });
  connect(c, &WorkerController::helloReceived, this, [this](int rank, int world, qint64 pid) {
    if (world > rankModel_->world()) rankModel_->reset(world);
    rankModel_->setPid(rank, pid);
    log_->setWorld(world);
  });
  connect(c, &WorkerController::readyReceived, this, [this](const QJsonObject& info) {
    log_->append(-1, "info",
                 tr("group ready (%1 ranks, model loaded in %2 s)")
                     .arg(info.value("world").toInt(controller_->world()))
                     .arg(info.value("load_seconds").toDouble(), 0, 'f', 1));
    revalidate();
  });
  connect(c, &WorkerController::statusReceived, this,
          [this](const QString&, const QString& msg) { stateLabel_->setToolTip(msg); });
  connect(c, &WorkerController::stageChanged, this, [this] { updateStatus(); });
  connect(c, &WorkerController::eventReceived, this, [this](const WorkerEvent& ev) {
    if (ev.type == QLatin1String("log")) {
      // An encoder truncated the prompt: said at the prompt (still the one sent), not only in
      // the log; the warnings of one request together.
      const QString msg = ev.data.value("message").toString();
      const QString id = ev.data.value("id").toString();
      if (ev.data.value("level").toString() != QLatin1String("warning") ||
          !msg.contains(QLatin1String(" was truncated")))
        return;
      const auto sent = requestParams_.constFind(id);
      const GenerationParams now = genPanel_->params();
      if (sent != requestParams_.constEnd() &&
          (sent->prompt != now.prompt || sent->negative_prompt != now.negative_prompt))
        return;
      QStringList warnings = id == promptWarningId_ ? genPanel_->promptWarnings() : QStringList();
      if (!warnings.contains(msg)) warnings << msg;
      promptWarningId_ = id;
      genPanel_->showPromptWarnings(warnings);
      return;
    }
    if (ev.type != QLatin1String("hello")) return;
    // Host and device of each rank (the device from the event when the worker names it, else
    // the strategy's).
    const int rank = ev.data.value("rank").toInt(-1);
    QString device = ev.data.value("device").toString();
    if (device.isEmpty()) device = QString::fromStdString(controller_->config().strategy.device);
    rankModel_->setPlace(rank, ev.data.value("host").toString(), device);
    // The BLAS kernel the rank runs (issue 36), e.g. "OpenBLAS 0.3.21, core SkylakeX (auto)".
    const QJsonObject blas = ev.data.value("blas").toObject();
    if (!blas.isEmpty()) {
      QString summary = QStringLiteral("%1, core %2 (%3)")
                            .arg(blas.value("library").toString(), blas.value("core").toString(),
                                 blas.value("selection").toString());
      if (const QString tp = blas.value("thread_policy").toString(); !tp.isEmpty())
        summary += QStringLiteral(", ") + tp;
      rankModel_->setBlas(rank, blas.value("core").toString(), summary);
    }
  });
  connect(c, &WorkerController::ranksUpdated, this, [this](const QList<RankStats>& ranks) {
    rankModel_->update(ranks, controller_->elapsedSeconds());
  });
  connect(c, &WorkerController::queueChanged, this, [this] {
    refreshQueue();
    updateActions();
    updateTitle();
  });
  connect(c, &WorkerController::progressReceived, this, &MainWindow::onProgress);
  connect(c, &WorkerController::previewReceived, this,
          [this](const QString& id, int step, int imageIndex, const QImage& img) {
            const int steps = requestParams_.value(id).steps;
            previewId_ = id;
            gallery_->showPreview(img, tr("preview of %1 · image %2 · step %3/%4")
                                           .arg(id)
                                           .arg(imageIndex + 1)
                                           .arg(step)
                                           .arg(steps));
          });
  connect(c, &WorkerController::imageReceived, this, &MainWindow::onImage);
  connect(c, &WorkerController::requestDone, this, [this](const QString& id, double seconds) {
    log_->append(-1, "info", tr("%1 done in %2 s").arg(id).arg(seconds, 0, 'f', 2));
    requestParams_.remove(id);
    if (controller_->queue().isEmpty()) gallery_->setProgress(-1, {});
  });
  connect(c, &WorkerController::requestCancelled, this, [this](const QString& id, int step) {
    requestParams_.remove(id);
    if (requeued_.remove(id)) return;  // moved in the queue: it runs again under a new id
    log_->append(-1, "info", tr("%1 cancelled at step %2").arg(id).arg(step));
    if (controller_->queue().isEmpty()) gallery_->setProgress(-1, {});
    // Its half-denoised preview is not an image: the viewer goes back to the history.
    if (previewId_ == id) {
      previewId_.clear();
      gallery_->clearPreview();
    }
    statusBar()->showMessage(tr("%1 cancelled").arg(id), 3000);
  });
  connect(c, &WorkerController::requestFailed, this, [this](const QString& id, const QString& msg) {
    requestParams_.remove(id);
    gallery_->setProgress(-1, {});
    if (previewId_ == id) {
      previewId_.clear();
      gallery_->clearPreview();
    }
    if (controller_->state() != WorkerController::State::Failed)
      showBanner(tr("Request %1 failed").arg(id), msg, true, false);
    if (autoActive_) finishAuto(false, msg);
  });
  connect(c, &WorkerController::errorReported, this, [this](const WorkerFailure& f) {
    if (f.rank >= 0 && f.fatal) {
      rankModel_->markFailed(f.rank, f.message);
      // Another rank died: what the others do now is not known (they are being torn down).
      rankModel_->setStageAll(QStringLiteral("unknown"));
    }
    // Request errors arrive through requestFailed, fatal ones through groupFailed.
    if (!f.fatal && f.id.isEmpty())
      showBanner(tr("The worker reported an error"), f.message, false, false);
  });
  connect(c, &WorkerController::groupFailed, this, &MainWindow::onGroupFailed);
  connect(c, &WorkerController::groupStopped, this, [this](int) {
    gallery_->setProgress(-1, {});
    gallery_->clearPreview();
    previewId_.clear();
    rankModel_->setStageAll(QStringLiteral("stopped"));
    updateTitle();
    if (closing_) close();
  });
}

bool MainWindow::startGroup() {
  revalidate();
  if (!validation_.canStart()) {
    showBanner(tr("Cannot start: the strategy is invalid"), validation_.startIssues.join('\n'),
               true, false);
    leftTabs_->setCurrentIndex(1);
    return false;
  }
  if (controller_->isRunning() || controller_->checkingHosts()) return false;
  hideBanner();
  const bool ok = controller_->start(launchConfig());
  saveSession();
  updateStatus();
  return ok;
}

void MainWindow::stopGroup() { controller_->stop(); }

bool MainWindow::restartGroup() {
  revalidate();
  if (!validation_.canStart()) {
    showBanner(tr("Cannot restart: the strategy is invalid"), validation_.startIssues.join('\n'),
               true, false);
    return false;
  }
  hideBanner();
  const LaunchConfig cfg = launchConfig();
  if (controller_->isRunning()) {
    log_->append(-1, "info", tr("restarting the group with %1").arg(strategyText(cfg.strategy)));
    controller_->restart(cfg);
    saveSession();
    return true;
  }
  return startGroup();
}

QString MainWindow::generate() {
  revalidate();
  if (!validation_.canGenerate()) {
    showBanner(tr("Cannot generate"), validation_.all().join('\n'), true, false);
    revealIssue();
    return {};
  }
  using S = WorkerController::State;
  if (controller_->checkingHosts()) {
    // The hostfile group starts once its hosts passed the pre-flight: the request waits for it.
  } else if (!controller_->isRunning()) {
    if (!startGroup()) return {};
  } else if (configDiffers()) {
    if (!restartGroup()) return {};
  } else if (controller_->state() == S::Stopping) {
    return {};
  }
  if (!controller_->checkingHosts()) hideBanner();
  GenerationParams p = genPanel_->params();
  controller_->setMaxSequenceLength(0);
  controller_->setPreviewEvery(std::max(1, p.steps / 25));  // about 25 previews per image at most
  // "Repeat": several requests; a fixed seed advances by the images of each (image i of a request
  // uses seed + i), so no two images repeat one.
  lastGenerated_.clear();
  const int repeat = std::max(1, genPanel_->repeatCount());
  for (int i = 0; i < repeat; ++i) {
    const QString id = controller_->submit(p);
    requestParams_[id] = p;
    lastGenerated_ << id;
    if (!p.random_seed) p.seed += static_cast<std::uint64_t>(std::max(1, p.num_images));
  }
  const QString id = lastGenerated_.first();
  gallery_->setProgress(0, repeat > 1 ? tr("%1 and %2 more queued").arg(id).arg(repeat - 1)
                                      : tr("%1 queued").arg(id));
  QString perr;
  if (!prompts_.add(QString::fromStdString(p.prompt), &perr))
    log_->append(-1, "error", tr("prompt history: %1").arg(perr));
  genPanel_->setPromptHistory(prompts_.prompts());
  updateTitle();
  saveSession();
  return id;
}

void MainWindow::cancelCurrent() {
  const QString id = controller_->activeId();
  if (!id.isEmpty())
    controller_->cancel(id);
  else if (!controller_->queue().isEmpty())
    controller_->cancel(controller_->queue().first().id);
}

void MainWindow::cancelAll() { controller_->cancelAll(); }

void MainWindow::onProgress(const QString& id, int step, int steps, double stepMs, double eta,
                            int imageIndex) {
  const GenerationParams p = requestParams_.value(id);
  const int n = std::max(1, p.num_images);
  const int total = std::max(1, steps) * n;
  const int done = std::min(imageIndex, n - 1) * std::max(1, steps) + step;
  QString text = tr("%1 · image %2/%3 · step %4/%5")
                     .arg(id)
                     .arg(std::min(imageIndex, n - 1) + 1)
                     .arg(n)
                     .arg(step)
                     .arg(steps);
  if (stepMs >= 0) text += tr(" · %1 ms/step").arg(stepMs, 0, 'f', 0);
  if (eta >= 0) text += tr(" · ETA %1 s").arg(eta, 0, 'f', eta < 10 ? 1 : 0);
  gallery_->setProgress(static_cast<int>(1000.0 * done / total), text);
  progressPercent_ = static_cast<int>(100.0 * done / total);
  updateTitle();
  refreshQueue();  // in place: the queue's selection stays
  updateStatus();
}

void MainWindow::onImage(const ImageResult& r) {
  HistoryEntry e;
  e.path = r.path;
  e.requestId = r.id;
  e.seed = r.seed;
  e.hasSeed = r.hasSeed;
  e.seconds = r.seconds;
  e.params = r.params;
  if (e.params.isEmpty()) e.params = readPngParameters(r.path);
  if (e.params.isEmpty()) e.params = paramsToQJson(requestParams_.value(r.id));
  if (!e.hasSeed) {
    if (const auto seed = seedFromQJson(e.params.value("seed"))) {
      e.seed = *seed;
      e.hasSeed = true;
    }
  }
  // The params' own "seed" is what was requested (-1 when random): the used one, exactly.
  if (e.hasSeed) e.params.insert("seed", seedToQJson(e.seed));
  // What the image was made with, for "Use parameters" and the gallery's search: the group's
  // strategy and model (the worker's PNG says them as text).
  if (!e.params.value("strategy").isObject())
    e.params.insert("strategy", strategyToJson(controller_->config().strategy));
  if (!e.params.contains("model")) e.params.insert("model", controller_->config().modelDir);
  if (!e.params.contains("components") && !controller_->config().components.isEmpty())
    e.params.insert("components", controller_->config().components.toJson());
  previewId_.clear();
  QString err;
  if (!history_.add(e, &err)) log_->append(-1, "error", err);
  gallery_->addImage(e);
  if (e.hasSeed) genPanel_->setLastSeed(e.seed);
  // The measured effect of step caching (the PNG's cache_report), shown under the cache control.
  genPanel_->imagePanel()->showCacheReport(
      readPngParameters(r.path).value("cache_report").toObject());
  log_->append(-1, "info",
               tr("image %1 (seed %2) in %3 s")
                   .arg(r.path, e.hasSeed ? seedText(e.seed) : tr("unknown"))
                   .arg(r.seconds, 0, 'f', 2));
  if (autoActive_) {
    QTimer::singleShot(400, this, [this, path = r.path] {
      if (!autoFile_.isEmpty()) {
        // Show the strategy editor (with its mesh) beside the image and the per-rank monitor.
        leftTabs_->setCurrentIndex(1);
        const bool ok = grab().save(autoFile_);
        finishAuto(ok, ok ? tr("screenshot written to %1 (image %2)").arg(autoFile_, path)
                          : tr("cannot write the screenshot %1").arg(autoFile_));
      } else {
        finishAuto(true, tr("image %1").arg(path));
      }
    });
  }
}

void MainWindow::onGroupFailed(const WorkerFailure& f) {
  if (f.rank >= 0) rankModel_->markFailed(f.rank, f.message);
  // The group is down: the surviving ranks exited with it (their last stage is stale).
  rankModel_->setStageAll(QStringLiteral("exited"));
  gallery_->setProgress(-1, {});
  gallery_->clearPreview();
  previewId_.clear();
  progressPercent_ = -1;
  updateTitle();
  // Requests the failed group never received stay queued (their parameters with them).
  QMap<QString, GenerationParams> kept;
  for (const auto& r : controller_->queue())
    if (requestParams_.contains(r.id)) kept[r.id] = requestParams_.value(r.id);
  requestParams_ = kept;
  const QString stays = queuedStayNote();
  if (f.rank < 0 && !f.host.isEmpty()) {
    // ssh could not reach a host of the hostfile: the host and ssh's cause in the banner.
    const QString cause =
        f.message.section(QStringLiteral(": "), 1).section(QLatin1Char(';'), 0, 0);
    // The launcher's fix for ssh's words when it has one (refused, timed out, key, host key).
    const QString fix =
        f.message.contains(QLatin1String("Fix: "))
            ? QString()
            : "\n" + tr("Check the host name and ssh access in the hostfile %1 (Strategy tab).")
                         .arg(editor_->hostfile());
    showBanner(tr("Host %1 could not be reached: %2").arg(f.host, cause), f.message + fix + stays,
               true, true);
  } else {
    const QString head = f.rank >= 0 ? tr("Rank %1 failed: the process group went down").arg(f.rank)
                                     : tr("The process group went down");
    showBanner(head, f.message + (f.detail.isEmpty() ? QString() : "\n" + f.detail) + stays, true,
               true);
  }
  updateActions();
  updateStatus();
  if (autoActive_) finishAuto(false, f.message);
  if (closing_) close();
}

}  // namespace dit::ui
