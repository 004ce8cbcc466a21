// MainWindow across runs: presets and the model they restore, the advisor, automated runs
// (--auto-generate), the saved session, and quitting with work in flight.
#include <QAction>
#include <QByteArray>
#include <QCloseEvent>
#include <QDir>
#include <QFileInfo>
#include <QJsonDocument>
#include <QLabel>
#include <QMessageBox>
#include <QPushButton>
#include <QSpinBox>
#include <QSplitter>
#include <QStatusBar>
#include <QTimer>
#include <algorithm>

#include "backend/models/memory_estimate.h"
#include "backend/models/placement_planner.h"
#include "ui/advisor_dialog.h"
#include "ui/image_input_panel.h"
#include "ui/json_io.h"
#include "ui/main_window.h"
#include "ui/preset_plan.h"
#include "ui/reference_strip.h"
#include "ui/strategy_json.h"

namespace dit::ui {

void MainWindow::applyPreset(const Preset& p, bool withGeneration) {
  editor_->setStrategy(p.strategy);
  editor_->setHostfile(p.hostfile);
  editor_->setHostSettings(p.hosts);
  editor_->setRunOptions(p.run);
  if (withGeneration && !p.model.model.isEmpty())
    restoreModel(p.model, tr("preset \"%1\"").arg(p.name));
  if (p.hasGeneration && withGeneration) {
    genPanel_->setParams(p.generation);
    // Its reference images missing here or changed since are named (the strip keeps them).
    if (const QStringList refs = genPanel_->referenceStrip()->notices(); !refs.isEmpty()) {
      showBanner(tr("Reference images of preset \"%1\" are missing here or changed").arg(p.name),
                 refs.join('\n'), false, false);
      for (const QString& n : refs) log_->append(-1, "warning", n);
    }
  }
  log_->append(-1, "info", tr("preset \"%1\": %2").arg(p.name, strategyText(p.strategy)));
  // A preset saved from a plan: what no longer fits on this machine, named.
  if (const QStringList shortfalls = planShortfallsOf(p); !shortfalls.isEmpty()) {
    showBanner(tr("The plan of preset \"%1\" no longer fits this machine").arg(p.name),
               shortfalls.join('\n'), false, false);
    for (const QString& s : shortfalls)
      log_->append(-1, "warning", tr("preset \"%1\": %2").arg(p.name, s));
  }
  revalidate();
}

QStringList MainWindow::planShortfallsOf(const Preset& p) const {
  if (p.plan.isEmpty()) return {};
  // A hostfile group runs elsewhere: this machine's memory says nothing about its ranks.
  if (!p.hostfile.isEmpty()) return {};
  return planShortfalls(p.plan, machineMemoryFor(p.plan, caps_));
}

QString MainWindow::savePlanPreset(const dit::Plan& plan) {
  const QString name = presets_.uniqueName(
      tr("Plan: %1 on %2 x %3")
          .arg(QString::fromStdString(plan.model))
          .arg(plan.ranks.count)
          .arg(QString::fromStdString(dit::formatBytes(plan.ranks.memory_per_rank))));
  Preset p = presetFromPlan(plan, currentPreset(), name);
  QString err;
  if (!presets_.save(p, &err)) {
    log_->append(-1, "error", tr("the plan could not be saved as a preset: %1").arg(err));
    return {};
  }
  presetPanel_->refresh(name);
  log_->append(-1, "info", tr("saved the plan as preset \"%1\"").arg(name));
  return name;
}

AdvisorDialog* MainWindow::advisor() const { return advisor_.data(); }

bool MainWindow::restoreModel(const ModelSourcePaths& s, const QString& what) {
  const QStringList missing = s.missingHere();
  if (!missing.isEmpty()) {
    showBanner(tr("The model of %1 is not on this machine; the model stays %2")
                   .arg(what, genPanel_->modelDir()),
               tr("Missing here:") + "\n" + missing.join('\n'), true, false);
    for (const QString& m : missing)
      log_->append(-1, "warning", tr("%1: missing here: %2").arg(what, m));
    return false;
  }
  if (!(genPanel_->sources() == s)) {
    genPanel_->setSources(s);
    log_->append(-1, "info", tr("model of %1: %2").arg(what, s.model));
  }
  return true;
}

Preset MainWindow::currentPreset() const {
  Preset p;
  p.strategy = editor_->strategy();
  p.hostfile = editor_->hostfile();
  p.hosts = editor_->hostSettings();
  p.run = editor_->runOptions();
  p.hasGeneration = true;
  p.generation = genPanel_->params();
  // Reference images with the SHA-256 of the files as they are now (the request leaves a file
  // added in the strip unhashed; a preset records it, so that a file changed since is named).
  for (auto& ref : p.generation.reference_images)
    if (ref.sha256.empty()) ref.sha256 = fileSha256(QString::fromStdString(ref.file)).toStdString();
  p.model = genPanel_->sources();
  return p;
}

void MainWindow::openAdvisor() {
  if (!advisor_) {
    advisor_ = new AdvisorDialog(this);
    advisor_->setAttribute(Qt::WA_DeleteOnClose);
    connect(advisor_, &AdvisorDialog::applyRequested, this, [this](const dit::Strategy& s) {
      editor_->setStrategy(s);
      revalidate();
    });
    connect(advisor_, &AdvisorDialog::planApplied, this,
            [this](const dit::Plan& plan) { savePlanPreset(plan); });
    advisor_->setChecker([this](const dit::Strategy& s) { return strategyIssues(s); });
  }
  AdvisorInput in;
  const ModelInfo& m = genPanel_->modelInfo();
  const dit::Strategy s = editor_->strategy();
  const GenerationParams p = genPanel_->params();
  if (m.ok) {
    const ComponentSize* t = m.component("transformer");
    in.transformer = m.dims();  // the family's declared parameters and plan
    in.other_params = double(m.totalParameters()) - (t ? double(t->parameters) : 0.0);
    in.text_len = textLength();
    in.bytes_per_param = (t && t->dtype == "F32") ? 4.0 : 2.0;
  }
  in.num_devices = s.world;
  // GPUs only where this build and machine have them.
  const bool cudaHere =
      caps_.cudaBuild && (caps_.cudaDevices > 0 || !editor_->hostfile().isEmpty());
  in.interconnect = s.device == "cpu" || !cudaHere ? Interconnect::CPU : Interconnect::NVLink;
  in.memory_gib_per_device = in.interconnect == Interconnect::CPU ? 8 : 80;
  in.width = p.width;
  in.height = p.height;
  in.true_cfg = genPanel_->modelInfo().resolve(p).cfg;
  in.images_per_request = p.num_images;
  advisor_->setInput(in);
  advisor_->show();
  advisor_->raise();
}

void MainWindow::autoGenerate(const QString& file, int timeoutSeconds) {
  autoActive_ = true;
  autoFile_ = file;
  QTimer::singleShot(timeoutSeconds * 1000, this, [this, timeoutSeconds] {
    if (autoActive_) finishAuto(false, tr("no image after %1 s").arg(timeoutSeconds));
  });
  if (generate().isEmpty()) finishAuto(false, bannerText());
}

void MainWindow::finishAuto(bool ok, const QString& message) {
  if (!autoActive_) return;
  autoActive_ = false;
  Q_EMIT autoGenerateFinished(ok, message);
}

void MainWindow::loadSession() {
  QJsonDocument doc;
  bool have = false;
  if (options_.restoreSession && readJsonFile(QDir(dataDir_).filePath("session.json"), &doc)) {
    const QJsonObject s = doc.object();
    // The model first: choosing it applies its declared default settings, which the session's
    // own settings (steps included) then replace.
    if (!options_.modelDir.isEmpty())
      genPanel_->setSources({options_.modelDir, options_.components});
    else if (!s.value("model").toString().isEmpty() &&
             QFileInfo::exists(s.value("model").toString()))
      genPanel_->setModelDir(s.value("model").toString());
    if (auto p = Preset::fromJson(s.value("preset").toObject())) {
      // A model given to the program wins over the session's; a session model gone since is
      // dropped (the default model then, as before).
      if (!options_.modelDir.isEmpty() || !p->model.missingHere().isEmpty()) p->model = {};
      applyPreset(*p, true);  // the last session, model, prompt and settings included
      have = true;
    }
    genPanel_->repeatSpin()->setValue(std::max(1, s.value("repeat").toInt(1)));
    genPanel_->loraList()->setBrowseFolder(s.value("lora_folder").toString());
    // The window: geometry (Qt keeps it on a screen that exists), splitters, tabs.
    const QJsonObject win = s.value("window").toObject();
    if (!win.isEmpty()) {
      restoreGeometry(QByteArray::fromBase64(win.value("geometry").toString().toLatin1()));
      const QJsonObject sp = win.value("splitters").toObject();
      for (QSplitter* sp2 : {mainSplit_, workSplit_, topSplit_})
        if (sp.contains(sp2->objectName()))
          sp2->restoreState(
              QByteArray::fromBase64(sp.value(sp2->objectName()).toString().toLatin1()));
      leftTabs_->setCurrentIndex(win.value("left_tab").toInt(0));
      rightTabs_->setCurrentIndex(win.value("right_tab").toInt(0));
    }
  }
  if (!have) {
    // First run: the CPU demo preset if it exists.
    for (const Preset& p : presets_.presets()) {
      if (p.builtin && p.strategy.device == "cpu") {
        applyPreset(p, true);
        presetPanel_->select(p.name);
        break;
      }
    }
  }
  if (!options_.modelDir.isEmpty()) {
    if (QDir::cleanPath(genPanel_->modelDir()) != QDir::cleanPath(options_.modelDir) ||
        !(genPanel_->components() == options_.components))
      genPanel_->setSources({options_.modelDir, options_.components});
  } else if (genPanel_->modelDir().isEmpty()) {
    genPanel_->setModelDir(defaultModelDir());
  }
}

void MainWindow::saveSession() const {
  if (!options_.restoreSession) return;
  Preset p = currentPreset();
  p.name = QStringLiteral("session");
  QJsonObject splitters;
  for (QSplitter* sp : {mainSplit_, workSplit_, topSplit_})
    splitters.insert(sp->objectName(), QString::fromLatin1(sp->saveState().toBase64()));
  const QJsonObject window{{"geometry", QString::fromLatin1(saveGeometry().toBase64())},
                           {"splitters", splitters},
                           {"left_tab", leftTabs_->currentIndex()},
                           {"right_tab", rightTabs_->currentIndex()}};
  writeJsonAtomic(QDir(dataDir_).filePath("session.json"),
                  QJsonDocument(QJsonObject{{"preset", p.toJson()},
                                            {"model", genPanel_->modelDir()},
                                            {"repeat", genPanel_->repeatCount()},
                                            {"lora_folder", genPanel_->loraList()->browseFolder()},
                                            {"window", window}}));
}

bool MainWindow::confirmQuit() {
  const auto q = controller_->queue();
  if (q.isEmpty()) return true;
  const int waiting = static_cast<int>(q.size()) - (controller_->activeId().isEmpty() ? 0 : 1);
  QString text = controller_->activeId().isEmpty()
                     ? tr("%n request(s) are waiting in the queue.", nullptr, waiting)
                     : (waiting > 0 ? tr("A generation is running and %n more wait(s) in the "
                                         "queue.",
                                         nullptr, waiting)
                                    : tr("A generation is running."));
  QMessageBox box(QMessageBox::Question, tr("Quit DiT Studio"),
                  text + "\n" + tr("Quit anyway? They are cancelled and the group is stopped."),
                  QMessageBox::Yes | QMessageBox::No, this);
  box.setObjectName("quitConfirm");
  box.setDefaultButton(QMessageBox::No);
  box.button(QMessageBox::Yes)->setText(tr("Quit"));
  box.button(QMessageBox::No)->setText(tr("Keep running"));
  return box.exec() == QMessageBox::Yes;
}

void MainWindow::closeEvent(QCloseEvent* event) {
  // The user closing the window (its close button, Alt+F4) while requests run or wait is asked
  // first; File > Quit asked already, and a close from the program itself does not ask.
  if (!closing_ && !quitConfirmed_ && event->spontaneous() && !confirmQuit()) {
    event->ignore();
    return;
  }
  quitConfirmed_ = false;
  saveSession();
  if (controller_->isRunning()) {
    closing_ = true;
    statusBar()->showMessage(tr("stopping the process group…"));
    controller_->stop(3000);
    event->ignore();
    return;
  }
  if (advisor_) advisor_->close();
  event->accept();
}

}  // namespace dit::ui
