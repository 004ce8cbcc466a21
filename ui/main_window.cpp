#include "ui/main_window.h"

#include <QAction>
#include <QApplication>
#include <QByteArray>
#include <QChartView>
#include <QCloseEvent>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QFrame>
#include <QHBoxLayout>
#include <QJsonDocument>
#include <QLabel>
#include <QLineEdit>
#include <QListView>
#include <QMenuBar>
#include <QMessageBox>
#include <QPushButton>
#include <QScreen>
#include <QScrollArea>
#include <QScrollBar>
#include <QSignalBlocker>
#include <QSpinBox>
#include <QSplitter>
#include <QStatusBar>
#include <QStyle>
#include <QTabWidget>
#include <QTimer>
#include <QToolBar>
#include <QToolButton>
#include <QVBoxLayout>
#include <algorithm>

#include "ui/advisor_dialog.h"
#include "ui/elided_label.h"
#include "ui/image_input_panel.h"
#include "ui/json_io.h"
#include "ui/seed_text.h"
#include "ui/strategy_json.h"
#include "ui/wheel_guard.h"

namespace dit::ui {

MainWindow::MainWindow(const MainWindowOptions& options, QWidget* parent)
    : QMainWindow(parent),
      options_(options),
      dataDir_(options.dataDir.isEmpty() ? appDataDir() : options.dataDir),
      presets_(dataDir_, options.builtinPresets),
      history_(dataDir_),
      caps_(currentCapabilities()),
      prompts_(dataDir_) {
  // The wheel scrolls the panels; a spin box, slider or combo box takes it only when focused.
  installWheelGuard();
  setWindowTitle(tr("DiT Studio"));
  setWindowIcon(QIcon(QStringLiteral(":/ditstudio/icons/ditstudio.svg")));
  controller_ = new WorkerController(this);
  controller_->setOutputDir(QDir(dataDir_).filePath(QStringLiteral("images")));
  rankModel_ = new RankMonitorModel(this);
  taskbar_ = new TaskbarProgress(this);
  QString err;
  presets_.load(&err);
  QString herr;
  history_.load(&herr);
  QString perr;
  prompts_.load(&perr);
  buildUi();
  buildMenus();
  connectController();
  fitToScreen();
  loadSession();  // the last geometry, splitters and settings over the defaults
  genPanel_->setPromptHistory(prompts_.prompts());
  if (!err.isEmpty()) log_->append(-1, "error", tr("presets: %1").arg(err));
  if (!herr.isEmpty()) log_->append(-1, "error", tr("history: %1").arg(herr));
  if (!perr.isEmpty()) log_->append(-1, "error", tr("prompt history: %1").arg(perr));
  revalidate();
}

void MainWindow::fitToScreen() {
  QScreen* scr = screen();
  if (!scr) scr = QGuiApplication::primaryScreen();
  if (!scr) {
    resize(1500, 900);
    return;
  }
  const QRect avail = scr->availableGeometry();
  // At most 1500 x 900, never more than the screen minus room for the window frame.
  const QSize room = avail.size() - QSize(24, 48);
  const QSize size = QSize(1500, 900).boundedTo(room).expandedTo(minimumSizeHint().boundedTo(room));
  resize(size);
  move(avail.topLeft() + QPoint(std::max(0, (avail.width() - size.width()) / 2),
                                std::max(0, (avail.height() - size.height()) / 2)));
}

MainWindow::~MainWindow() = default;

void MainWindow::setServing(bool on) {
  if (!on) {
    if (serve_) log_->append(-1, "info", tr("stopping the API server at %1").arg(serve_->url()));
    serve_.reset();
    return;
  }
  if (serve_) return;
  try {
    serve_ = std::make_unique<ApiServe>(launchConfig(), defaultServePort(),
                                        QDir(dataDir_).filePath(QStringLiteral("server-images")));
    log_->append(
        -1, "info",
        tr("serving the OpenAI Images API at %1/v1 and the page at %1/ (its own group: %2)")
            .arg(serve_->url(), strategyText(launchConfig().strategy)));
    statusBar()->showMessage(tr("API at %1").arg(serve_->url()), 5000);
  } catch (const std::exception& e) {
    serve_.reset();
    log_->append(-1, "error", tr("Serve API: %1").arg(QString::fromStdString(e.what())));
    const QSignalBlocker block(serveAct_);
    serveAct_->setChecked(false);
  }
}

void MainWindow::buildUi() {
  // Toolbar.
  auto* tb = addToolBar(tr("Group"));
  tb->setMovable(false);
  tb->setObjectName("maintoolbar");
  startAct_ = tb->addAction(tr("▶ Start group"), this, &MainWindow::startGroup);
  stopAct_ = tb->addAction(tr("■ Stop"), this, &MainWindow::stopGroup);
  restartAct_ = tb->addAction(tr("⟳ Restart"), this, &MainWindow::restartGroup);
  tb->addSeparator();
  generateAct_ = tb->addAction(tr("✦ Generate"), this, [this] { generate(); });
  generateAct_->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Return));
  cancelAct_ = tb->addAction(tr("✕ Cancel"), this, &MainWindow::cancelCurrent);
  cancelAct_->setShortcut(QKeySequence(Qt::Key_Escape));
  cancelAct_->setShortcutContext(Qt::WindowShortcut);
  cancelAct_->setToolTip(tr("Cancel the running request at its next step (Esc)"));
  tb->addSeparator();
  serveAct_ = tb->addAction(tr("Serve API"));
  serveAct_->setObjectName("serveApi");
  serveAct_->setCheckable(true);
  serveAct_->setToolTip(
      tr("Serve the OpenAI Images API, the AUTOMATIC1111 subset and a page on 127.0.0.1 (a group "
         "of its own with this model and strategy; docs/server.md)"));
  connect(serveAct_, &QAction::toggled, this, &MainWindow::setServing);
  startAct_->setToolTip(tr("Start the worker process group (mpirun) with this strategy"));
  generateAct_->setToolTip(
      tr("Queue a request (Ctrl+Enter); starts or restarts the group if needed"));

  auto* split = new QSplitter(Qt::Horizontal, this);
  split->setObjectName("mainSplitter");
  split->setChildrenCollapsible(false);
  mainSplit_ = split;
  setCentralWidget(split);

  // Left: tabs.
  leftTabs_ = new QTabWidget(split);
  genPanel_ = new GenerationPanel;
  genPanel_->imagePanel()->setMaskDir(QDir(dataDir_).filePath(QStringLiteral("masks")));
  auto* genScroll = new QScrollArea;
  genScroll->setObjectName("generateScroll");
  genScroll->setWidget(genPanel_);
  genScroll->setWidgetResizable(true);
  genScroll->setFrameShape(QFrame::NoFrame);
  // The panel follows the column's width (its texts elide or wrap): never a sideways scroll.
  genScroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  genScroll_ = genScroll;
  leftTabs_->addTab(genScroll, tr("Generate"));
  editor_ = new StrategyEditor;
  auto* edScroll = new QScrollArea;
  edScroll->setObjectName("strategyScroll");
  edScroll->setWidget(editor_);
  edScroll->setWidgetResizable(true);
  edScroll->setFrameShape(QFrame::NoFrame);
  edScroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);  // its rows wrap instead
  leftTabs_->addTab(edScroll, tr("Strategy"));
  presetPanel_ = new PresetPanel(&presets_, [this] { return currentPreset(); });
  leftTabs_->addTab(presetPanel_, tr("Presets"));
  leftTabs_->setMinimumWidth(280);

  // Right of the tabs: gallery beside the memory chart / queue / log tabs, and the per-rank table
  // across the whole width below them (every column fits at 1024 x 700).
  auto* work = new QSplitter(Qt::Vertical, split);
  work->setObjectName("workSplitter");
  work->setChildrenCollapsible(false);
  workSplit_ = work;
  auto* top = new QSplitter(Qt::Horizontal, work);
  top->setObjectName("topSplitter");
  top->setChildrenCollapsible(false);
  topSplit_ = top;
  // Center: why Generate is disabled, banner, gallery.
  auto* center = new QWidget(top);
  auto* cl = new QVBoxLayout(center);
  cl->setContentsMargins(4, 0, 4, 0);
  // One line, elided to the column's width ("…"), the whole reason in its tooltip.
  generateReason_ = new ElidedLabel(QString(), center);
  generateReason_->setObjectName("issues");
  generateReason_->setAccessibleName(tr("Why Generate is disabled"));
  cl->addWidget(generateReason_);
  banner_ = new QFrame(center);
  banner_->setObjectName("banner");
  auto* bl = new QHBoxLayout(banner_);
  auto* btext = new QVBoxLayout;
  bannerLabel_ = new QLabel(banner_);
  bannerLabel_->setWordWrap(true);
  bannerLabel_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  QFont bf = bannerLabel_->font();
  bf.setBold(true);
  bannerLabel_->setFont(bf);
  bannerDetail_ = new QLabel(banner_);
  bannerDetail_->setWordWrap(true);
  bannerDetail_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  btext->addWidget(bannerLabel_);
  btext->addWidget(bannerDetail_);
  bl->addLayout(btext, 1);
  bannerRestart_ = new QPushButton(tr("Restart group"), banner_);
  auto* dismiss = new QPushButton(tr("Dismiss"), banner_);
  bl->addWidget(bannerRestart_);
  bl->addWidget(dismiss);
  connect(bannerRestart_, &QPushButton::clicked, this, [this] { restartGroup(); });
  connect(dismiss, &QPushButton::clicked, this, &MainWindow::hideBanner);
  banner_->hide();
  cl->addWidget(banner_);
  gallery_ = new Gallery(&history_, center);
  cl->addWidget(gallery_, 1);

  // Monitor table below; its memory chart, the queue and the log in tabs beside the gallery.
  rankMonitor_ = new RankMonitor(rankModel_, work);
  auto* rtabs = new QTabWidget(top);
  rightTabs_ = rtabs;
  rtabs->addTab(rankMonitor_->chartView(), tr("Memory"));
  log_ = new LogPanel;
  rtabs->addTab(log_, tr("Log"));
  auto* qw = new QWidget;
  auto* ql = new QVBoxLayout(qw);
  queueModel_ = new QueueModel(this);
  queueView_ = new QListView(qw);
  queueView_->setObjectName("queueView");
  queueView_->setModel(queueModel_);
  queueView_->setSelectionMode(QAbstractItemView::SingleSelection);
  ql->addWidget(queueView_, 1);
  auto* mb = new QHBoxLayout;
  moveUp_ = new QPushButton(tr("Move up"), qw);
  moveUp_->setObjectName("moveUp");
  moveUp_->setToolTip(tr("Run the selected waiting request earlier (Ctrl+Up)"));
  moveDown_ = new QPushButton(tr("Move down"), qw);
  moveDown_->setObjectName("moveDown");
  moveDown_->setToolTip(tr("Run the selected waiting request later (Ctrl+Down)"));
  mb->addWidget(moveUp_);
  mb->addWidget(moveDown_);
  ql->addLayout(mb);
  auto* qb = new QHBoxLayout;
  auto* cancelSel = new QPushButton(tr("Cancel selected"), qw);
  cancelSel->setObjectName("cancelSelected");
  auto* cancelAllBtn = new QPushButton(tr("Cancel all"), qw);
  qb->addWidget(cancelSel);
  qb->addWidget(cancelAllBtn);
  ql->addLayout(qb);
  rtabs->addTab(qw, tr("Queue"));
  auto moveSelected = [this](int delta) {
    const QModelIndex cur = queueView_->currentIndex();
    if (!cur.isValid()) return;
    moveQueued(queueModel_->idAt(cur.row()), delta);
  };
  connect(moveUp_, &QPushButton::clicked, this, [moveSelected] { moveSelected(-1); });
  connect(moveDown_, &QPushButton::clicked, this, [moveSelected] { moveSelected(1); });
  auto* upKey = new QAction(queueView_);
  upKey->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Up));
  upKey->setShortcutContext(Qt::WidgetShortcut);
  connect(upKey, &QAction::triggered, this, [moveSelected] { moveSelected(-1); });
  auto* downKey = new QAction(queueView_);
  downKey->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Down));
  downKey->setShortcutContext(Qt::WidgetShortcut);
  connect(downKey, &QAction::triggered, this, [moveSelected] { moveSelected(1); });
  queueView_->addAction(upKey);
  queueView_->addAction(downKey);
  connect(cancelSel, &QPushButton::clicked, this, [this] { cancelSelected(); });
  connect(cancelAllBtn, &QPushButton::clicked, this, &MainWindow::cancelAll);
  top->setStretchFactor(0, 3);
  top->setStretchFactor(1, 2);
  top->setSizes({640, 420});
  work->setStretchFactor(0, 1);
  work->setStretchFactor(1, 0);  // extra height goes to the image, not to empty table rows
  work->setSizes({700, 150});
  split->setStretchFactor(0, 0);
  split->setStretchFactor(1, 1);
  split->setSizes({350, 1150});

  // Status bar.
  stateLabel_ = new QLabel(this);
  groupLabel_ = new QLabel(this);
  groupLabel_->setObjectName("hint");
  statusBar()->addWidget(stateLabel_);
  statusBar()->addPermanentWidget(groupLabel_);

  connect(genPanel_, &GenerationPanel::changed, this, &MainWindow::revalidate);
  connect(genPanel_, &GenerationPanel::modelChanged, this, [this] { presetPanel_->refresh(); });
  connect(editor_, &StrategyEditor::changed, this, &MainWindow::revalidate);
  connect(editor_, &StrategyEditor::advisorRequested, this, &MainWindow::openAdvisor);
  connect(presetPanel_, &PresetPanel::applyRequested, this,
          [this](const Preset& p) { applyPreset(p, presetPanel_->applyGeneration()); });
  presetPanel_->setChecker([this](const Preset& p) {
    QStringList issues;
    for (const auto& i : dit::validateDegrees(p.strategy))
      issues << QString::fromStdString(i.message);
    if (genPanel_ && genPanel_->modelInfo().ok)
      for (const auto& i : dit::validateForModel(p.strategy, genPanel_->modelInfo().dims()))
        issues << QString::fromStdString(i.message);
    return issues + capabilityIssuesOf(p.strategy, p.hostfile);
  });
  connect(gallery_, &Gallery::useParameters, this, [this](const HistoryEntry& e) {
    // The strategy the image was made with (the history's object or the PNG's text) first, so
    // that the recalled request is validated against it.
    const QJsonValue sv = e.params.value("strategy");
    if (const auto s = strategyFromParams(sv)) {
      {
        const QSignalBlocker block(editor_);
        editor_->setStrategy(*s);
      }
      log_->append(-1, "info", tr("image strategy: %1").arg(strategyText(*s)));
    } else if (!sv.isUndefined() && !sv.isNull()) {
      log_->append(
          -1, "warning",
          tr("image strategy unreadable: %1")
              .arg(sv.isString()
                       ? sv.toString()
                       : QString::fromUtf8(
                             QJsonDocument(sv.toObject()).toJson(QJsonDocument::Compact))));
    }
    // The model and components it was made with (before the parameters: choosing a model
    // applies its declared defaults, which the image's own settings then replace).
    const ModelSourcePaths made = ModelSourcePaths::readFrom(e.params);
    if (!made.model.isEmpty()) restoreModel(made, tr("the image"));
    genPanel_->setParams(e.generation(genPanel_->params()));
    // Recalled LoRAs that cannot be found (moved, deleted) are named, and stay listed.
    for (const QString& problem : genPanel_->loraList()->problems())
      log_->append(-1, "warning", problem);
    revalidate();
    leftTabs_->setCurrentIndex(0);
  });
  connect(gallery_, &Gallery::useSeed, this, [this](std::uint64_t seed) {
    GenerationParams p = genPanel_->params();
    p.seed = seed;
    p.random_seed = false;
    genPanel_->setParams(p);
    leftTabs_->setCurrentIndex(0);
  });
  connect(gallery_, &Gallery::errorMessage, this,
          [this](const QString& m) { showBanner(m, {}, false, false); });
  connect(queueView_->selectionModel(), &QItemSelectionModel::currentChanged, this,
          [this] { updateActions(); });
}

void MainWindow::buildMenus() {
  QMenuBar* bar = menuBar();
  QMenu* file = bar->addMenu(tr("&File"));
  QAction* open = file->addAction(tr("&Open PNG…"), this, [this] {
    if (auto* b = gallery_->findChild<QPushButton*>("openPng")) b->click();
  });
  open->setShortcut(QKeySequence::Open);
  QAction* saveAs = file->addAction(tr("&Save image as…"), this, [this] {
    const HistoryEntry& e = gallery_->shownEntry();
    if (e.path.isEmpty()) return;
    const QString dest = QFileDialog::getSaveFileName(
        this, tr("Save image"), QFileInfo(e.path).fileName(), tr("PNG images (*.png)"));
    if (!dest.isEmpty()) gallery_->saveImageAs(e.path, dest);
  });
  saveAs->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_S));
  file->addSeparator();
  quitAct_ = file->addAction(tr("&Quit"), this, [this] {
    if (!confirmQuit()) return;
    quitConfirmed_ = true;
    close();
  });
  quitAct_->setObjectName("quit");
  quitAct_->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Q));
  quitAct_->setMenuRole(QAction::QuitRole);

  QMenu* group = bar->addMenu(tr("&Group"));
  startAct_->setShortcut(QKeySequence(Qt::Key_F5));
  stopAct_->setShortcut(QKeySequence(Qt::SHIFT | Qt::Key_F5));
  restartAct_->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_F5));
  group->addAction(startAct_);
  group->addAction(stopAct_);
  group->addAction(restartAct_);
  group->addSeparator();
  group->addAction(serveAct_);

  QMenu* gen = bar->addMenu(tr("G&enerate"));
  gen->addAction(generateAct_);
  gen->addAction(cancelAct_);
  QAction* cancelAllAct = gen->addAction(tr("Cancel &all"), this, &MainWindow::cancelAll);
  cancelAllAct->setShortcut(QKeySequence(Qt::SHIFT | Qt::Key_Escape));
  QAction* history = gen->addAction(tr("Prompt &history…"), this, [this] {
    leftTabs_->setCurrentIndex(0);
    genPanel_->promptHistoryButton()->showMenu();
  });
  history->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_H));

  QMenu* view = bar->addMenu(tr("&View"));
  const QStringList tabs{tr("&Generate tab"), tr("&Strategy tab"), tr("&Presets tab")};
  for (int i = 0; i < tabs.size(); ++i) {
    QAction* a = view->addAction(tabs[i], this, [this, i] { leftTabs_->setCurrentIndex(i); });
    a->setShortcut(QKeySequence(Qt::ALT | static_cast<Qt::Key>(Qt::Key_1 + i)));
  }
  view->addSeparator();
  QAction* search = view->addAction(tr("Search the &gallery"), this, [this] {
    gallery_->filterEdit()->setFocus();
    gallery_->filterEdit()->selectAll();
  });
  search->setShortcut(QKeySequence::Find);
  QAction* cmp = view->addAction(tr("&Compare selected images"), this,
                                 [this] { gallery_->compareButton()->click(); });
  cmp->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_K));
  QAction* grid =
      view->addAction(tr("Batch g&rid"), this, [this] { gallery_->gridButton()->click(); });
  grid->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_G));
  QAction* back =
      view->addAction(tr("Back to the &single image"), this, [this] { gallery_->closeCompare(); });
  back->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Backspace));
  view->addSeparator();
  for (const auto& [label, tab] :
       {std::pair{tr("&Memory chart"), 0}, std::pair{tr("&Log"), 1}, std::pair{tr("&Queue"), 2}}) {
    QAction* a =
        view->addAction(label, this, [this, tab = tab] { rightTabs_->setCurrentIndex(tab); });
    a->setShortcut(QKeySequence(Qt::ALT | static_cast<Qt::Key>(Qt::Key_4 + tab)));
  }

  QMenu* help = bar->addMenu(tr("&Help"));
  QAction* keys = help->addAction(tr("&Keyboard shortcuts"), this, [this] {
    QMessageBox box(QMessageBox::Information, tr("Keyboard shortcuts"), shortcutList().join('\n'),
                    QMessageBox::Close, this);
    box.setObjectName("shortcuts");
    box.exec();
  });
  keys->setShortcut(QKeySequence::HelpContents);
  help->addAction(tr("Image viewer: wheel zoom, double-click or 1: 1:1 / fit, 0: fit, drag: pan"))
      ->setEnabled(false);
  help->addAction(tr("Compare: drag or Left / Right moves the swipe, Space blinks"))
      ->setEnabled(false);
}

QStringList MainWindow::shortcutList() const {
  QStringList out;
  for (QAction* m : menuBar()->actions()) {
    if (!m->menu()) continue;
    const QString menu = m->text().remove(QLatin1Char('&'));
    for (QAction* a : m->menu()->actions()) {
      if (a->isSeparator() || a->shortcut().isEmpty()) continue;
      out << QStringLiteral("%1 > %2: %3")
                 .arg(menu, a->text().remove(QLatin1Char('&')).remove(QStringLiteral("…")),
                      a->shortcut().toString(QKeySequence::NativeText));
    }
  }
  return out;
}

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

LaunchConfig MainWindow::launchConfig() const {
  LaunchConfig c;
  c.strategy = editor_->strategy();
  c.modelDir = genPanel_->modelInfo().ok ? genPanel_->modelInfo().path : genPanel_->modelDir();
  c.components = genPanel_->components();
  c.hostfile = editor_->hostfile();
  c.hosts = editor_->hostSettings();
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
         (!now.hostfile.isEmpty() && !(now.hosts == run.hosts));
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
  QWidget* field = nullptr;
  for (const QString& i : validation_.requestIssues) {
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

void MainWindow::applyPreset(const Preset& p, bool withGeneration) {
  editor_->setStrategy(p.strategy);
  editor_->setHostfile(p.hostfile);
  editor_->setHostSettings(p.hosts);
  if (withGeneration && !p.model.model.isEmpty())
    restoreModel(p.model, tr("preset \"%1\"").arg(p.name));
  if (p.hasGeneration && withGeneration) genPanel_->setParams(p.generation);
  log_->append(-1, "info", tr("preset \"%1\": %2").arg(p.name, strategyText(p.strategy)));
  revalidate();
}

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
  p.hasGeneration = true;
  p.generation = genPanel_->params();
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
