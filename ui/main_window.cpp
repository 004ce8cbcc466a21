// MainWindow: construction, the widgets and their layout, the menus and shortcuts. The other
// parts of the class: main_window_group.cpp (the worker group and its events),
// main_window_state.cpp (validation, actions, status, queue, banner) and
// main_window_session.cpp (presets, the saved session, automation, quitting).
#include "ui/main_window.h"

#include <QAction>
#include <QApplication>
#include <QChartView>
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
#include <QSignalBlocker>
#include <QSplitter>
#include <QStatusBar>
#include <QTabWidget>
#include <QToolBar>
#include <QToolButton>
#include <QVBoxLayout>
#include <algorithm>

#include "ui/elided_label.h"
#include "ui/image_input_panel.h"
#include "ui/json_io.h"
#include "ui/reference_strip.h"
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
    // Through this window's group (one model copy): started now when none runs.
    serve_ = std::make_unique<ApiServe>(*controller_, launchConfig(), defaultServePort(),
                                        QDir(dataDir_).filePath(QStringLiteral("server-images")));
    log_->append(
        -1, "info",
        tr("serving the OpenAI Images API at %1/v1 and the page at %1/ through this window's "
           "group (%2): its requests join the queue")
            .arg(serve_->url(), strategyText(controller_->config().strategy)));
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
      tr("Serve the OpenAI Images API, the AUTOMATIC1111 subset and a page on 127.0.0.1 through "
         "this window's group: its requests join the queue (docs/server.md)"));
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
  genPanel_->referenceStrip()->setPasteDir(QDir(dataDir_).filePath(QStringLiteral("references")));
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
    return issues + capabilityIssuesOf(p.strategy, p.hostfile) + planShortfallsOf(p);
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
    // So are recalled reference images missing here or changed since (the strip keeps them).
    if (const QStringList refs = genPanel_->referenceStrip()->notices(); !refs.isEmpty()) {
      showBanner(tr("Reference images of the image are missing here or changed"), refs.join('\n'),
                 false, false);
      for (const QString& n : refs) log_->append(-1, "warning", n);
    }
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

}  // namespace dit::ui
