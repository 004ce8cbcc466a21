// MainWindow's derived state: the launch config, validation of the request and strategy, the
// actions' enabled state, the status line, title, queue view and the banner.
#include <QAction>
#include <QDir>
#include <QFileInfo>
#include <QLabel>
#include <QLineEdit>
#include <QListView>
#include <QPushButton>
#include <QScrollArea>
#include <QScrollBar>
#include <QStatusBar>
#include <QTabWidget>
#include <QToolButton>
#include <algorithm>

#include "ui/elided_label.h"
#include "ui/image_input_panel.h"
#include "ui/main_window.h"
#include "ui/reference_strip.h"
#include "ui/strategy_json.h"

namespace dit::ui {

LaunchConfig MainWindow::launchConfig() const {
  LaunchConfig c;
  c.strategy = editor_->strategy();
  c.modelDir = genPanel_->modelInfo().ok ? genPanel_->modelInfo().path : genPanel_->modelDir();
  c.components = genPanel_->components();
  c.hostfile = editor_->hostfile();
  c.hosts = editor_->hostSettings();
  c.run = editor_->runOptions();
  c.workerPath = options_.workerPath;
  c.mpirunPath = options_.mpirunPath;
  return c;
}

int MainWindow::textLength() const {
  const QJsonObject model = controller_->readyInfo().value("model").toObject();
  if (model.contains("max_sequence_length") && !configDiffers())
    return model.value("max_sequence_length").toInt();
  return genPanel_->modelInfo().max_sequence_length;
}

bool MainWindow::configDiffers() const {
  if (!controller_->isRunning()) return false;
  const LaunchConfig now = launchConfig();
  const LaunchConfig& run = controller_->config();
  return !sameStrategy(now.strategy, run.strategy) ||
         QDir::cleanPath(now.modelDir) != QDir::cleanPath(run.modelDir) ||
         !(now.components == run.components) || now.hostfile != run.hostfile ||
         !(now.run == run.run) || (!now.hostfile.isEmpty() && !(now.hosts == run.hosts));
}

void MainWindow::revalidate() {
  validation_ = validate(editor_->strategy(), genPanel_->modelInfo(), genPanel_->params(),
                         textLength(), editor_->hostfile());
  for (const QString& i : capabilityIssuesOf(editor_->strategy(), editor_->hostfile()))
    if (!validation_.startIssues.contains(i)) validation_.startIssues << i;
  if (const QString seedErr = genPanel_->seedError(); !seedErr.isEmpty())
    validation_.requestIssues << seedErr;
  // What the worker would refuse in the panel (LoRAs for another model, img2img the family
  // cannot run, unreadable cache settings), refused here as typed, in its words.
  for (const QString& i : genPanel_->requestIssues())
    if (!validation_.requestIssues.contains(i)) validation_.requestIssues << i;
  editor_->setIssues(validation_.startIssues, validation_.requestIssues);
  rankMonitor_->setDevice(QString::fromStdString(editor_->strategy().device));
  updateActions();
  updateStatus();
}

void MainWindow::updateActions() {
  using S = WorkerController::State;
  const S s = controller_->state();
  const bool running = controller_->isRunning();
  const bool checking = controller_->checkingHosts();  // a hostfile group's pre-flight
  startAct_->setEnabled(!running && !checking && validation_.canStart());
  stopAct_->setEnabled((running && s != S::Stopping) || checking);
  restartAct_->setEnabled(validation_.canStart() && s != S::Stopping &&
                          (running || s == S::Failed));
  generateAct_->setEnabled(validation_.canGenerate() && s != S::Stopping);
  cancelAct_->setEnabled(!controller_->queue().isEmpty());
  QStringList tips = validation_.all();
  startAct_->setToolTip(tips.isEmpty()
                            ? tr("Start the worker process group (mpirun) with this strategy")
                            : tips.join('\n'));
  const QString reason = generateBlockedReason();
  generateAct_->setToolTip(
      reason.isEmpty() ? tr("Queue a request (Ctrl+Enter); starts or restarts the group if needed")
                       : tr("Generate is disabled: %1").arg(reason));
  generateReason_->setText(
      reason.isEmpty() ? QString() : tr("Cannot generate: %1").arg(reason.section('\n', 0, 0)));
  generateReason_->setBaseToolTip(reason);
  generateReason_->setVisible(!reason.isEmpty());
  // Move up / down: a waiting request is selected (not the running one).
  const QModelIndex cur = queueView_->currentIndex();
  const QString sel = cur.isValid() ? queueModel_->idAt(cur.row()) : QString();
  const bool movable = !sel.isEmpty() && sel != controller_->activeId();
  moveUp_->setEnabled(movable);
  moveDown_->setEnabled(movable);
}

QString MainWindow::generateBlockedReason() const {
  if (controller_->state() == WorkerController::State::Stopping) return tr("the group is stopping");
  if (!validation_.canGenerate()) return validation_.all().join('\n');
  return {};
}

void MainWindow::updateStatus() {
  const WorkerController::State s = controller_->state();
  QString text = tr("Group: %1").arg(WorkerController::stateName(s));
  if (controller_->checkingHosts()) {
    text = tr("Group: checking hosts… (pre-flight over ssh)");
  } else if (controller_->isRunning()) {
    // The real stage (from the worker's status and ranks events), with the step while denoising.
    const QString stage = controller_->stage();
    if (!stage.isEmpty() && s != WorkerController::State::Ready) {
      QString detail = stage;
      const auto q = controller_->queue();
      for (const auto& r : q) {
        if (r.sent && r.step > 0 && stage == QLatin1String("denoising")) {
          detail += QStringLiteral(" %1 step %2/%3").arg(r.id).arg(r.step).arg(r.steps);
          break;
        }
      }
      text += QStringLiteral(" (%1)").arg(detail);
    }
    text += QStringLiteral(" · %1").arg(strategyText(controller_->config().strategy));
    if (configDiffers()) {
      // Only offer what can be done: Restart needs a valid strategy, Generate a valid request.
      const bool canRestart = restartAct_->isEnabled();
      const bool canGenerate = generateAct_->isEnabled();
      if (canRestart && canGenerate)
        text += tr(" · strategy changed: Restart (or Generate) applies it");
      else if (canRestart)
        text += tr(" · strategy changed: Restart applies it (Generate is disabled: %1)")
                    .arg(generateBlockedReason().section('\n', 0, 0));
      else
        text += tr(" · strategy changed, not applicable: %1").arg(validation_.all().value(0));
    }
  } else if (!validation_.canStart()) {
    text += tr(" · %1 problem(s) in the strategy/model").arg(validation_.startIssues.size());
  }
  stateLabel_->setText(text);
  const ModelInfo& m = genPanel_->modelInfo();
  groupLabel_->setText(
      m.ok ? tr("model %1 · %2 params")
                 .arg(QFileInfo(m.path).fileName(), formatCount(m.totalParameters()))
           : tr("no model"));
}

void MainWindow::refreshQueue() {
  QList<WorkerController::Request> q = controller_->queue();
  // Requests being moved are shown once, under their new ids.
  if (!requeued_.isEmpty())
    q.erase(std::remove_if(
                q.begin(), q.end(),
                [this](const WorkerController::Request& r) { return requeued_.contains(r.id); }),
            q.end());
  queueModel_->sync(q);
}

QString MainWindow::moveQueued(const QString& id, int delta) {
  const QString active = controller_->activeId();
  QList<WorkerController::Request> waiting;
  for (const auto& r : controller_->queue())
    if (r.id != active && !requeued_.contains(r.id)) waiting << r;
  int from = -1;
  for (int i = 0; i < waiting.size(); ++i)
    if (waiting[i].id == id) from = i;
  if (from < 0) return {};
  const int to = std::clamp(from + delta, 0, static_cast<int>(waiting.size()) - 1);
  if (to == from) return id;
  QList<WorkerController::Request> order = waiting;
  order.move(from, to);
  // The worker runs its queue in arrival order and none of these has started: from the first
  // changed place on, they are withdrawn and sent again in the new order.
  const int first = std::min(from, to);
  for (int i = first; i < waiting.size(); ++i) {
    requeued_.insert(waiting[i].id);
    controller_->cancel(waiting[i].id);
  }
  QString moved;
  for (int i = first; i < order.size(); ++i) {
    const GenerationParams p = order[i].params;
    const QString nid = controller_->submit(p);
    requestParams_[nid] = p;
    if (order[i].id == id) moved = nid;
    log_->append(-1, "info", tr("%1 moved in the queue: now %2").arg(order[i].id, nid));
  }
  refreshQueue();
  const int row = queueModel_->rowOf(moved);
  if (row >= 0) queueView_->setCurrentIndex(queueModel_->index(row, 0));
  updateActions();
  return moved;
}

void MainWindow::updateTitle() {
  const auto q = controller_->queue();
  QString title = tr("DiT Studio");
  if (!q.isEmpty() && progressPercent_ >= 0) {
    const int waiting = static_cast<int>(q.size()) - 1;
    title = waiting > 0 ? tr("%1% (+%2 queued) · DiT Studio").arg(progressPercent_).arg(waiting)
                        : tr("%1% · DiT Studio").arg(progressPercent_);
  } else if (!q.isEmpty()) {
    title = tr("%n queued · DiT Studio", nullptr, static_cast<int>(q.size()));
  } else {
    progressPercent_ = -1;
  }
  if (windowTitle() != title) setWindowTitle(title);
  // The same on the taskbar / dock where the platform offers it: the bar and the waiting count.
  const int total = static_cast<int>(q.size());
  if (!q.isEmpty() && progressPercent_ >= 0)
    taskbar_->setProgress(progressPercent_ / 100.0, total - 1);
  else
    taskbar_->setProgress(-1, total);
}

void MainWindow::revealIssue() {
  // The field behind the first issue, in its tab and scrolled into view.
  if (!validation_.startIssues.isEmpty()) {
    const bool model = !genPanel_->modelInfo().ok;
    leftTabs_->setCurrentIndex(model ? 0 : 1);
    if (model) genScroll_->ensureWidgetVisible(genPanel_->modelEdit());
    return;
  }
  leftTabs_->setCurrentIndex(0);
  const QStringList lora = genPanel_->loraList()->problems();
  const QStringList image = genPanel_->imagePanel()->issues();
  // The reference strip's own (a changed file) and the resolve's about the references.
  QStringList refs = genPanel_->referenceStrip()->issues();
  for (const dit::RequestProblem& pr : genPanel_->modelInfo().resolve(genPanel_->params()).problems)
    if (pr.field == "reference_images") refs << QString::fromStdString(pr.message);
  QWidget* field = nullptr;
  for (const QString& i : validation_.requestIssues) {
    if (refs.contains(i)) {
      field = genPanel_->referenceStrip();
      break;
    }
    if (lora.contains(i)) {
      field = genPanel_->loraList();
      break;
    }
    if (image.contains(i)) {
      field = genPanel_->imagePanel();
      break;
    }
    if (i == genPanel_->seedError()) {
      field = genPanel_->seedEdit();
      break;
    }
  }
  if (field) {
    genScroll_->ensureWidgetVisible(field, 8, 40);
  } else if (!validation_.requestIssues.isEmpty()) {
    leftTabs_->setCurrentIndex(1);  // a request issue of the strategy (cfg_degree, sizes)
  }
}

QString MainWindow::cancelSelected() {
  const QModelIndexList sel = queueView_->selectionModel()->selectedIndexes();
  const QModelIndex cur = sel.isEmpty() ? queueView_->currentIndex() : sel.first();
  if (!cur.isValid()) return {};
  const QString id = queueModel_->idAt(cur.row());
  if (!id.isEmpty()) controller_->cancel(id);
  return id;
}

bool MainWindow::bannerVisible() const { return !banner_->isHidden(); }

QString MainWindow::bannerText() const {
  return bannerLabel_->text() +
         (bannerDetail_->text().isEmpty() ? QString() : "\n" + bannerDetail_->text());
}

QString MainWindow::statusText() const { return stateLabel_->text(); }

void MainWindow::showBanner(const QString& text, const QString& detail, bool error,
                            bool offerRestart) {
  bannerLabel_->setText(text);
  bannerDetail_->setText(detail);
  bannerDetail_->setVisible(!detail.isEmpty());
  bannerRestart_->setVisible(offerRestart);
  banner_->setProperty("severity", error ? "error" : "warning");
  banner_->style()->unpolish(banner_);
  banner_->style()->polish(banner_);
  banner_->show();
}

void MainWindow::hideBanner() { banner_->hide(); }

QString MainWindow::queuedStayNote() const {
  const int queued = static_cast<int>(controller_->queue().size());
  return queued > 0 ? "\n" + tr("%n request(s) stay queued: Start (or Restart) runs them once the "
                                "group starts.",
                                nullptr, queued)
                    : QString();
}

QStringList MainWindow::capabilityIssuesOf(const dit::Strategy& s, const QString& hostfile) const {
  return capabilityIssues(s, caps_, !hostfile.trimmed().isEmpty());
}

QStringList MainWindow::strategyIssues(const dit::Strategy& s) const {
  const Validation v =
      validate(s, genPanel_->modelInfo(), genPanel_->params(), textLength(), editor_->hostfile());
  QStringList out = v.all();
  for (const QString& i : capabilityIssuesOf(s, editor_->hostfile()))
    if (!out.contains(i)) out << i;
  return out;
}

}  // namespace dit::ui
