// Issue 11, GUI half ("nothing lost, nothing misreported"), against the scripted mpirun stand-in
// (tests/test_ui_fake_worker.cpp) on the offscreen platform: a relaunch keeps the earlier
// launch's images; seeds >= 2^53 and >= 2^63 round-trip bit-exactly through the image event,
// history, Reuse, "Use parameters" after a relaunch and Open PNG, and malformed seeds are refused
// naming the range; Stop cancels the running request at its next step and shuts the group down
// cleanly (no re-run on the next Start, no base64 in the log, the true stage in the status bar and
// the monitor); the queue keeps its selection while progress events arrive and "Cancel selected"
// and Esc cancel what they should; presets keep the prompt; the Advisor's strategies are valid;
// the window fits at 1024x700.
#include <QAbstractItemView>
#include <QAction>
#include <QCheckBox>
#include <QClipboard>
#include <QDir>
#include <QFile>
#include <QHeaderView>
#include <QImage>
#include <QLineEdit>
#include <QListView>
#include <QListWidget>
#include <QMimeData>
#include <QMouseEvent>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QScrollBar>
#include <QSignalSpy>
#include <QTableView>
#include <QTemporaryDir>
#include <QtTest>

#include "ui/advisor_dialog.h"
#include "ui/main_window.h"
#include "ui/seed_text.h"
#include "ui/strategy_json.h"

using namespace dit::ui;

namespace dit::ui::testing {
QString writeFakeMpirun(const QString& dir);
}

namespace {
QString fixture() { return qEnvironmentVariable("DITSTUDIO_TEST_FIXTURE"); }

QByteArray fileBytes(const QString& path) {
  QFile f(path);
  return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
}

int countOf(const QByteArray& hay, const QByteArray& needle) {
  int n = 0;
  for (qsizetype at = hay.indexOf(needle); at >= 0; at = hay.indexOf(needle, at + 1)) ++n;
  return n;
}

QPushButton* buttonWithText(QWidget* root, const QString& text) {
  for (QPushButton* b : root->findChildren<QPushButton*>())
    if (b->text() == text) return b;
  return nullptr;
}
}  // namespace

class TestLossless : public QObject {
  Q_OBJECT
  QTemporaryDir fakeDir_;
  QString fake_;

  std::unique_ptr<MainWindow> makeWindow(QTemporaryDir& data) {
    MainWindowOptions o;
    o.dataDir = data.path();
    o.modelDir = fixture();
    o.mpirunPath = fake_;
    o.workerPath = "/opt/fake/ditstudio-worker";
    auto w = std::make_unique<MainWindow>(o);
    w->show();
    return w;
  }

  void stopAndWait(MainWindow* w) {
    w->stopGroup();
    QTRY_VERIFY_WITH_TIMEOUT(!w->controller()->isRunning(), 15000);
  }

 private Q_SLOTS:
  void initTestCase() {
    if (fixture().isEmpty() || !QFileInfo::exists(fixture() + "/model_index.json"))
      QFAIL("DITSTUDIO_TEST_FIXTURE does not point at tests/data/tiny-flux-A");
    fake_ = dit::ui::testing::writeFakeMpirun(fakeDir_.path());
    QVERIFY(!fake_.isEmpty());
  }

  void init() {
    qputenv("FAKE_MODE", "ok");
    qunsetenv("DITSTUDIO_CUDA_BUILD");
    qunsetenv("DITSTUDIO_CUDA_DEVICES");
    qunsetenv("FAKE_STEP_SLEEP");
    qunsetenv("FAKE_SEED");
    qputenv("FAKE_IMAGE", fakeDir_.filePath("out.png").toLocal8Bit());
    QFile::remove(fakeDir_.filePath("requests.txt"));
  }

  // Request ids (and so the image files named after them) do not restart at r1 on a new launch;
  // the history keeps pointing at each launch's own file.
  void relaunchKeepsOldImages() {
    QTemporaryDir data;
    QString firstId, firstPath;
    {
      auto w = makeWindow(data);
      firstId = w->generate();
      QVERIFY(!firstId.isEmpty());
      QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, 15000);
      firstPath = w->historyStore()->entries().first().path;
      QVERIFY2(firstPath.startsWith(QDir(data.path()).filePath("images")), qPrintable(firstPath));
      stopAndWait(w.get());
    }
    // Mark the first launch's file so an overwrite would show.
    QImage marked(firstPath);
    QVERIFY(!marked.isNull());
    marked.setText("marker", "first launch");
    QVERIFY(marked.save(firstPath));
    {
      auto w = makeWindow(data);  // a new window and controller on the same data folder
      QCOMPARE(w->historyStore()->entries().size(), 1);
      const QString secondId = w->generate();
      QVERIFY(!secondId.isEmpty());
      QVERIFY2(secondId != firstId, qPrintable(secondId));
      QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 2, 15000);
      const auto& es = w->historyStore()->entries();
      QVERIFY(es[0].path != es[1].path);
      QCOMPARE(es[1].path, firstPath);
      QCOMPARE(es[1].requestId, firstId);
      QCOMPARE(es[0].requestId, secondId);
      QVERIFY(QFileInfo::exists(es[0].path));
      QCOMPARE(QImage(firstPath).text("marker"), QString("first launch"));
      stopAndWait(w.get());
    }
  }

  void randomSeedRoundTripIsBitExact_data() {
    QTest::addColumn<QString>("seed");
    QTest::newRow("2^53+1") << "9007199254740993";
    QTest::newRow("2^63+1") << "9223372036854775809";
    QTest::newRow("2^64-1") << "18446744073709551615";
  }

  // A random seed reported by the worker reaches the history, Reuse, "Use parameters" after a
  // relaunch and Open PNG without ever passing through a double.
  void randomSeedRoundTripIsBitExact() {
    QFETCH(QString, seed);
    const std::uint64_t expected = seed.toULongLong();
    QCOMPARE(seedText(expected), seed);
    QTemporaryDir data;
    // The PNG the worker writes: parameters with the exact seed as a JSON integer.
    const QString png = data.filePath("seeded.png");
    QImage img(8, 8, QImage::Format_RGB32);
    img.fill(Qt::blue);
    img.setText("parameters", QStringLiteral("{\"prompt\":\"fake\",\"width\":64,\"height\":64,"
                                             "\"steps\":2,\"seed\":%1}")
                                  .arg(seed));
    QVERIFY(img.save(png));
    qputenv("FAKE_IMAGE", png.toLocal8Bit());
    qputenv("FAKE_SEED", seed.toLatin1());
    {
      auto w = makeWindow(data);
      GenerationParams p = w->generationPanel()->params();
      p.random_seed = true;
      p.steps = 2;
      w->generationPanel()->setParams(p);
      QVERIFY(!w->generate().isEmpty());
      QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, 15000);
      const HistoryEntry e = w->historyStore()->entries().first();
      QVERIFY(e.hasSeed);
      QCOMPARE(e.seed, expected);
      QVERIFY(w->generationPanel()->hasLastSeed());
      QCOMPARE(w->generationPanel()->lastSeed(), expected);
      QVERIFY(w->logPanel()->text().contains(seed));
      // Reuse copies it exactly.
      QTest::mouseClick(w->generationPanel()->reuseSeedButton(), Qt::LeftButton);
      QCOMPARE(w->generationPanel()->seedEdit()->text(), seed);
      const GenerationParams q = w->generationPanel()->params();
      QVERIFY(!q.random_seed);
      QCOMPARE(q.seed, expected);
      QVERIFY(w->generationPanel()->seedError().isEmpty());
      // What is sent next: the exact integer.
      QVERIFY(!w->generate().isEmpty());
      QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 2, 15000);
      const QByteArray sent = fileBytes(fakeDir_.filePath("requests.txt"));
      QVERIFY2(sent.contains("\"seed\":" + seed.toLatin1()), sent.constData());
      stopAndWait(w.get());
    }
    {
      // history.json after a relaunch, then "Use parameters".
      auto w = makeWindow(data);
      QCOMPARE(w->historyStore()->entries().first().seed, expected);
      w->generationPanel()->setParams(startingParams());
      w->gallery()->thumbnails()->setCurrentRow(0);
      QPushButton* use = buttonWithText(w->gallery(), "Use parameters");
      QVERIFY(use);
      QTest::mouseClick(use, Qt::LeftButton);
      QCOMPARE(w->generationPanel()->params().seed, expected);
      QVERIFY(!w->generationPanel()->params().random_seed);
      // Open PNG.
      w->generationPanel()->setParams(startingParams());
      QString err;
      QVERIFY2(w->gallery()->openPng(png, &err), qPrintable(err));
      QCOMPARE(w->generationPanel()->params().seed, expected);
      QVERIFY(w->gallery()->caption().contains(seed));
    }
  }

  // The seed field: the whole uint64 range; malformed or out-of-range text is refused naming the
  // range (Generate disabled, saying why), never silently 0.
  void seedFieldRefusesOutOfRange() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    GenerationPanel* g = w->generationPanel();
    GenerationParams p = g->params();
    p.random_seed = false;
    g->setParams(p);
    g->seedEdit()->setText("18446744073709551615");
    QVERIFY(g->seedError().isEmpty());
    QCOMPARE(g->params().seed, std::uint64_t(18446744073709551615ULL));
    QVERIFY(w->generateAction()->isEnabled());
    for (const char* bad : {"18446744073709551616", "99999999999999999999", "", "12x", "-1"}) {
      g->seedEdit()->setText(bad);
      QVERIFY2(!g->seedError().isEmpty(), bad);
      QVERIFY2(g->seedError().contains("18446744073709551615"), qPrintable(g->seedError()));
      QVERIFY(!w->generateAction()->isEnabled());
      QVERIFY2(w->generateAction()->toolTip().contains("seed"),
               qPrintable(w->generateAction()->toolTip()));
      QVERIFY(w->generateBlockedReason().contains("seed"));
      QVERIFY(w->generate().isEmpty());
      QVERIFY(!w->controller()->isRunning());
    }
    // Typing: the validator lets only digits in.
    g->seedEdit()->clear();
    QTest::keyClicks(g->seedEdit(), "12ab3");
    QCOMPARE(g->seedEdit()->text(), QString("123"));
  }

  // Stop during a generation: the running request is cancelled at its next step, the group shuts
  // down cleanly (no terminate), the request is not re-run by the next Start, previews' base64
  // never reaches the log, and the status bar and monitor show the real stage.
  void stopDuringGeneration() {
    qputenv("FAKE_STEP_SLEEP", "0.2");
    QTemporaryDir data;
    auto w = makeWindow(data);
    GenerationParams p = w->generationPanel()->params();
    p.steps = 40;
    w->generationPanel()->setParams(p);
    QSignalSpy cancelled(w->controller(), &WorkerController::requestCancelled);
    const QString id = w->generate();
    QVERIFY(!id.isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(
        !w->controller()->queue().isEmpty() && w->controller()->queue().first().step >= 2, 15000);
    // The real stage, not "busy (loading)".
    QVERIFY2(w->statusText().contains("busy (denoising"), qPrintable(w->statusText()));
    QCOMPARE(w->controller()->stage(), QString("denoising"));
    QCOMPARE(w->rankModel()->stats(0).stage, QString("denoising"));
    // A preview line cut by mpirun: summarised, its base64 is not logged.
    const QByteArray b64 = qgetenv("FAKE_PREVIEW");
    QVERIFY(b64.size() > 100);
    w->controller()->feedStdoutForTest("@@DIT {\"event\":\"preview\",\"id\":\"" + id.toLatin1() +
                                       "\",\"step\":2,\"image_index\":0,\"png\":\"" +
                                       b64.left(b64.size() / 2) + "\n");
    w->controller()->feedStdoutForTest("noise " + QByteArray(300, 'A') + "\n");
    QElapsedTimer t;
    t.start();
    w->stopGroup();
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Stopped, 15000);
    QVERIFY2(t.elapsed() < 4000, qPrintable(QString::number(t.elapsed())));  // no terminate (5 s)
    QVERIFY(!w->logPanel()->text().contains("terminating mpirun"));
    QVERIFY(!w->logPanel()->text().contains(QString::fromLatin1(b64.mid(40, 60))));
    QVERIFY(!w->logPanel()->text().contains(QString(300, 'A')));
    QVERIFY(w->logPanel()->text().contains("cut worker event \"preview\""));
    bool sawCancel = false;
    for (const auto& args : cancelled) sawCancel |= args.at(0).toString() == id;
    QVERIFY(sawCancel);
    const QByteArray reqs = fileBytes(fakeDir_.filePath("requests.txt"));
    const qsizetype cancelAt = reqs.indexOf("\"type\":\"cancel\"");
    QVERIFY2(cancelAt >= 0 && cancelAt < reqs.indexOf("\"type\":\"shutdown\""), reqs.constData());
    QVERIFY(w->controller()->queue().isEmpty());
    QVERIFY2(w->statusText().contains("stopped"), qPrintable(w->statusText()));
    QCOMPARE(w->rankModel()->stats(0).stage, QString("stopped"));
    // The next Start does not re-run the interrupted request.
    QVERIFY(w->startGroup());
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Ready, 15000);
    QTest::qWait(500);
    QCOMPARE(countOf(fileBytes(fakeDir_.filePath("requests.txt")), "\"type\":\"generate\""), 1);
    QCOMPARE(w->gallery()->count(), 0);
    stopAndWait(w.get());
  }

  // The queue is a model updated in place: a selection made at human speed survives the progress
  // events, "Cancel selected" cancels that request, Esc the running one.
  void queueCancelAtHumanSpeed() {
    qputenv("FAKE_STEP_SLEEP", "0.05");
    QTemporaryDir data;
    auto w = makeWindow(data);
    w->activateWindow();
    QVERIFY(QTest::qWaitForWindowActive(w.get()));
    GenerationParams p = w->generationPanel()->params();
    p.steps = 200;
    w->generationPanel()->setParams(p);
    QSignalSpy cancelled(w->controller(), &WorkerController::requestCancelled);
    const QString a = w->generate(), b = w->generate(), c = w->generate();
    QVERIFY(!a.isEmpty() && !b.isEmpty() && !c.isEmpty());
    QListView* view = w->findChild<QListView*>("queueView");
    QVERIFY(view);
    QPushButton* cancelSel = w->findChild<QPushButton*>("cancelSelected");
    QVERIFY(cancelSel);
    QTRY_VERIFY_WITH_TIMEOUT(
        !w->controller()->queue().isEmpty() && w->controller()->queue().first().step >= 2, 15000);
    QCOMPARE(view->model()->rowCount(), 3);
    // The user selects the second request...
    view->setCurrentIndex(view->model()->index(1, 0));
    QCOMPARE(view->currentIndex().data(Qt::UserRole).toString(), b);
    const int stepBefore = w->controller()->queue().first().step;
    // ...and takes a moment to click: progress events keep arriving.
    QTest::qWait(700);
    QVERIFY(w->controller()->queue().first().step > stepBefore);
    QVERIFY(view->currentIndex().isValid());
    QCOMPARE(view->currentIndex().data(Qt::UserRole).toString(), b);
    QVERIFY(view->selectionModel()->isSelected(view->currentIndex()));
    QTest::mouseClick(cancelSel, Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(
        [&] {
          for (const auto& args : cancelled)
            if (args.at(0).toString() == b) return true;
          return false;
        }(),
        10000);
    QCOMPARE(w->controller()->queue().size(), 2);
    QCOMPARE(w->controller()->queue().first().id, a);  // the running one was not touched
    // Esc cancels the running request.
    QTest::keyClick(w.get(), Qt::Key_Escape);
    QTRY_VERIFY_WITH_TIMEOUT(
        [&] {
          for (const auto& args : cancelled)
            if (args.at(0).toString() == a) return true;
          return false;
        }(),
        10000);
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->activeId(), c, 10000);
    stopAndWait(w.get());
  }

  // Loading a preset sets its strategy and leaves the prompt and generation settings alone unless
  // the user opts in; a GPU preset on a CPU-only build shows as unusable before it is loaded.
  void presetApplyKeepsPrompt() {
    qputenv("DITSTUDIO_CUDA_BUILD", "0");
    QTemporaryDir data;
    auto w = makeWindow(data);
    GenerationParams mine = w->generationPanel()->params();
    mine.prompt = "my own prompt, not the preset's";
    mine.width = 128;
    mine.height = 96;
    mine.steps = 5;
    mine.seed = 777;
    mine.random_seed = false;
    w->generationPanel()->setParams(mine);
    PresetPanel* pp = w->presetPanel();
    QVERIFY(!pp->applyGeneration());
    const QString gpu = "4 GPUs, Ulysses";
    QVERIFY(w->presetStore()->find(gpu)->hasGeneration);
    // Marked before loading.
    QVERIFY2(pp->issuesOf(gpu).join(' ').contains("no CUDA"),
             qPrintable(pp->issuesOf(gpu).join(' ')));
    QVERIFY(pp->issuesOf("CPU demo (2 ranks)").isEmpty());
    bool marked = false;
    for (int i = 0; i < pp->list()->count(); ++i)
      if (pp->list()->item(i)->data(Qt::UserRole).toString() == gpu)
        marked = pp->list()->item(i)->text().startsWith(QStringLiteral("✕")) &&
                 pp->list()->item(i)->toolTip().contains("Cannot run here");
    QVERIFY(marked);
    pp->select(gpu);
    QPushButton* load = buttonWithText(pp, "Load");
    QVERIFY(load);
    QTest::mouseClick(load, Qt::LeftButton);
    QCOMPARE(w->strategyEditor()->strategy().ulysses_degree, 4);
    const GenerationParams after = w->generationPanel()->params();
    QCOMPARE(after.prompt, mine.prompt);
    QCOMPARE(after.width, 128);
    QCOMPARE(after.height, 96);
    QCOMPARE(after.steps, 5);
    QCOMPARE(after.seed, std::uint64_t(777));
    // Start refuses up front, saying why.
    QVERIFY(!w->startAction()->isEnabled());
    QVERIFY(w->validation().startIssues.join(' ').contains("no CUDA"));
    QVERIFY(!w->generateAction()->isEnabled());
    QVERIFY(w->generateBlockedReason().contains("no CUDA"));
    QVERIFY(!w->startGroup());
    QVERIFY(!w->controller()->isRunning());
    // Opting in loads the preset's settings too.
    pp->applyGenerationCheck()->setChecked(true);
    QTest::mouseClick(load, Qt::LeftButton);
    QCOMPARE(w->generationPanel()->params().width, 1024);
    QCOMPARE(w->generationPanel()->params().prompt, w->presetStore()->find(gpu)->generation.prompt);
  }

  // On a build with CUDA and GPUs the same preset is usable.
  void gpuPresetValidWhereCudaIs() {
    qputenv("DITSTUDIO_CUDA_BUILD", "1");
    qputenv("DITSTUDIO_CUDA_DEVICES", "4");
    QTemporaryDir data;
    auto w = makeWindow(data);
    QVERIFY(w->presetPanel()->issuesOf("4 GPUs, Ulysses").isEmpty());
    qputenv("DITSTUDIO_CUDA_DEVICES", "0");
    auto w2 = makeWindow(data);
    QVERIFY(w2->presetPanel()->issuesOf("4 GPUs, Ulysses").join(' ').contains("no NVIDIA GPU"));
  }

  // Every strategy the Advisor lets the user apply is one the editor accepts at the current
  // resolution and request; one it would refuse is not applicable, with the reasons shown.
  void advisorApplyIsValid_data() {
    QTest::addColumn<int>("link");
    QTest::newRow("CPU build, CPU ranks") << int(Interconnect::CPU);
    QTest::newRow("CUDA build, NVLink") << int(Interconnect::NVLink);
    QTest::newRow("CUDA build, PCIe") << int(Interconnect::PCIe);
  }

  void advisorApplyIsValid() {
    QFETCH(int, link);
    const auto interconnect = static_cast<Interconnect>(link);
    const bool cuda = interconnect != Interconnect::CPU;
    qputenv("DITSTUDIO_CUDA_BUILD", cuda ? "1" : "0");
    qputenv("DITSTUDIO_CUDA_DEVICES", "8");
    QTemporaryDir data;
    auto w = makeWindow(data);
    if (cuda) {
      dit::Strategy s = w->strategyEditor()->strategy();
      s.device = "cuda";
      w->strategyEditor()->setStrategy(s);
    }
    int applied = 0, refused = 0;
    QStringList refusedCases;
    const QList<QSize> sizes{{64, 64}, {68, 68}, {128, 96}, {40, 72}};
    for (const QSize& size : sizes) {
      for (bool cfg : {false, true}) {
        for (int images : {1, 3}) {
          GenerationParams p = w->generationPanel()->params();
          p.width = size.width();
          p.height = size.height();
          p.num_images = images;
          p.negative_prompt = cfg ? "blurry" : "";
          p.options["true_cfg_scale"] = cfg ? 3.0 : 1.0;
          w->generationPanel()->setParams(p);
          for (int devices = 1; devices <= 8; ++devices) {
            Q_EMIT w->strategyEditor()->advisorRequested();
            auto* dlg = w->findChild<AdvisorDialog*>();
            QVERIFY(dlg);
            AdvisorInput in = dlg->input();
            QCOMPARE(in.width, size.width());
            if (!cuda) QCOMPARE(in.interconnect, Interconnect::CPU);  // no CUDA in this build
            in.interconnect = interconnect;
            in.num_devices = devices;
            dlg->setInput(in);
            const QString what = QStringLiteral("%1x%2 cfg %3 images %4 devices %5: %6")
                                     .arg(size.width())
                                     .arg(size.height())
                                     .arg(cfg)
                                     .arg(images)
                                     .arg(devices)
                                     .arg(dlg->advice().title);
            if (!dlg->applyButton()->isEnabled()) {
              QVERIFY2(!dlg->issues().isEmpty(), qPrintable(what));
              ++refused;
              refusedCases << what + " -> " + dlg->issues().join("; ");
              continue;
            }
            QTest::mouseClick(dlg->applyButton(), Qt::LeftButton);
            QVERIFY2(sameStrategy(w->strategyEditor()->strategy(), dlg->advice().strategy),
                     qPrintable(what));
            QVERIFY2(w->validation().canGenerate(),
                     qPrintable(what + " -> " + w->validation().all().join("; ")));
            ++applied;
          }
        }
      }
    }
    qInfo("advisor sweep: %d applied, %d refused", applied, refused);
    for (const QString& r : refusedCases) qInfo("refused: %s", qPrintable(r));
    QCOMPARE(refused, 0);
    if (cuda) return;
    // A GPU interconnect on this CPU-only build: not applicable, and the dialog says why.
    Q_EMIT w->strategyEditor()->advisorRequested();
    auto* dlg = w->findChild<AdvisorDialog*>();
    AdvisorInput in = dlg->input();
    in.interconnect = Interconnect::NVLink;
    in.num_devices = 2;
    dlg->setInput(in);
    QVERIFY(!dlg->applyButton()->isEnabled());
    QVERIFY(dlg->issues().join(' ').contains("no CUDA"));
  }

  // At 1024x700 every monitor column (Dev peak and Sent included) and every gallery button is on
  // screen and unclipped; the monitor names each rank's host and device. With
  // DITSTUDIO_UI_SNAPSHOT_DIR set the window is saved as main-window-1024x700.png there.
  void layoutFitsAt1024x700() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    w->resize(1024, 700);
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, 15000);
    QTRY_VERIFY_WITH_TIMEOUT(w->statusText().contains("ready"), 5000);
    QTest::qWait(200);
    QCOMPARE(w->size(), QSize(1024, 700));
    const QString dir = qEnvironmentVariable("DITSTUDIO_UI_SNAPSHOT_DIR");
    if (!dir.isEmpty()) QVERIFY(w->grab().save(QDir(dir).filePath("main-window-1024x700.png")));
    // Host and device per rank (hello's "host"; the device from the strategy).
    QTableView* table = w->rankMonitor()->table();
    for (int r = 0; r < 2; ++r)
      QVERIFY2(w->rankModel()->place(r) == "fakehost · cpu", qPrintable(w->rankModel()->place(r)));
    QHeaderView* h = table->horizontalHeader();
    const int viewport = table->viewport()->width();
    for (int c = 0; c < table->model()->columnCount(); ++c) {
      const QString name = table->model()->headerData(c, Qt::Horizontal).toString();
      const int right = h->sectionViewportPosition(c) + h->sectionSize(c);
      QVERIFY2(
          !h->isSectionHidden(c) && h->sectionViewportPosition(c) >= 0 && right <= viewport,
          qPrintable(
              QStringLiteral("column %1 ends at %2 of %3").arg(name).arg(right).arg(viewport)));
      // Wide enough for its header and its cells (not elided).
      int need = h->fontMetrics().horizontalAdvance(name) + 8;
      for (int r = 0; r < table->model()->rowCount(); ++r)
        need = std::max(need, table->sizeHintForIndex(table->model()->index(r, c)).width());
      QVERIFY2(h->sectionSize(c) >= need - 2,
               qPrintable(QStringLiteral("column %1 is %2 px, needs %3")
                              .arg(name)
                              .arg(h->sectionSize(c))
                              .arg(need)));
    }
    QCOMPARE(table->horizontalScrollBar()->maximum(), 0);
    QVERIFY(table->isVisible() && table->height() >= 60);
    // Gallery buttons: visible, inside the window, not narrower than their text.
    const QRect win = w->rect();
    int buttons = 0;
    for (QPushButton* b : w->gallery()->findChildren<QPushButton*>()) {
      QVERIFY2(b->isVisible(), qPrintable(b->text()));
      const QRect g(b->mapTo(w.get(), QPoint(0, 0)), b->size());
      QVERIFY2(win.contains(g), qPrintable(b->text()));
      QVERIFY2(b->width() >= b->minimumSizeHint().width(),
               qPrintable(QStringLiteral("%1: %2 < %3")
                              .arg(b->text())
                              .arg(b->width())
                              .arg(b->minimumSizeHint().width())));
      ++buttons;
    }
    QVERIFY(buttons >= 5);
    stopAndWait(w.get());
  }

  // The image context menu (copy, open folder, use seed, delete file), zoom / 1:1 with pan, and
  // a PNG dropped on the gallery recalling its parameters.
  void imageMenuZoomAndDrop() {
    qputenv("FAKE_SEED", "18446744073709551557");
    QTemporaryDir data;
    auto w = makeWindow(data);
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, 15000);
    Gallery* g = w->gallery();
    const QList<QAction*> actions = g->imageActions(0);
    auto find = [&](const QString& prefix) -> QAction* {
      for (QAction* a : actions)
        if (a->text().startsWith(prefix)) return a;
      return nullptr;
    };
    QVERIFY(find("Copy image") && find("Open containing folder") && find("Use seed") &&
            find("Delete file"));
    QCOMPARE(find("Use seed")->text(), QString("Use seed 18446744073709551557"));
    find("Copy image")->trigger();
    QCOMPARE(QGuiApplication::clipboard()->image().size(), QImage(g->currentPath()).size());
    GenerationParams p = w->generationPanel()->params();
    p.random_seed = true;
    w->generationPanel()->setParams(p);
    find("Use seed")->trigger();
    QVERIFY(!w->generationPanel()->params().random_seed);
    QCOMPARE(w->generationPanel()->params().seed, std::uint64_t(18446744073709551557ULL));
    qDeleteAll(actions);
    // Zoom: 1:1 shows one image pixel per screen pixel, a drag pans, "0" fits again.
    ImageView* v = g->view();
    v->resize(300, 300);
    QImage big(600, 400, QImage::Format_RGB32);
    big.fill(Qt::red);
    v->setImage(big);
    QVERIFY(v->imageRect().width() < 300);  // fit
    QTest::mouseDClick(v, Qt::LeftButton, {}, QPoint(150, 150));
    QCOMPARE(v->zoom(), 1.0);
    QCOMPARE(v->imageRect().size(), QSizeF(600, 400));
    QTest::mousePress(v, Qt::LeftButton, {}, QPoint(150, 150));
    QMouseEvent move(QEvent::MouseMove, QPointF(110, 130), v->mapToGlobal(QPointF(110, 130)),
                     Qt::NoButton, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(v, &move);
    QTest::mouseRelease(v, Qt::LeftButton, {}, QPoint(110, 130));
    QCOMPARE(v->pan(), QPointF(-40, -20));
    QTest::keyClick(v, Qt::Key_0);
    QCOMPARE(v->zoom(), 0.0);
    QCOMPARE(v->pan(), QPointF());
    // Drop a PNG: its parameters (seed exact) go to the panel.
    const QString png = data.filePath("dropped.png");
    QImage img(8, 8, QImage::Format_RGB32);
    img.fill(Qt::yellow);
    img.setText("parameters", R"({"prompt":"dropped","width":72,"height":64,"steps":3,)"
                              R"("seed":9223372036854775809})");
    QVERIFY(img.save(png));
    QMimeData mime;
    mime.setUrls({QUrl::fromLocalFile(png)});
    QDragEnterEvent enter(QPoint(10, 10), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(g, &enter);
    QVERIFY(enter.isAccepted());
    QDropEvent drop(QPointF(10, 10), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(g, &drop);
    QCOMPARE(QString::fromStdString(w->generationPanel()->params().prompt), QString("dropped"));
    QCOMPARE(w->generationPanel()->params().seed, std::uint64_t(9223372036854775809ULL));
    QCOMPARE(w->generationPanel()->params().width, 72);
    // Delete file: gone from the disk and the history.
    const QString path = w->historyStore()->entries().first().path;
    QVERIFY(QFileInfo::exists(path));
    QVERIFY(g->deleteFile(0, false));
    QVERIFY(!QFileInfo::exists(path));
    QCOMPARE(w->historyStore()->entries().size(), 0);
    QCOMPARE(g->count(), 0);
    stopAndWait(w.get());
  }

  // Stop forgets the requests not yet sent; Restart keeps them for the new group (and cancels the
  // ones in flight).
  void stopDropsUnsentRestartKeepsThem() {
    LaunchConfig cfg;
    cfg.strategy.world = 2;
    cfg.strategy.ring_degree = 2;
    cfg.modelDir = "/models/tiny";
    cfg.workerPath = "/bin/ditstudio-worker";
    cfg.mpirunPath = fake_;
    {
      WorkerController c;
      QSignalSpy images(&c, &WorkerController::imageReceived);
      QVERIFY(c.start(cfg));
      c.submit(startingParams());  // before `ready`: not sent yet
      c.submit(startingParams());
      QCOMPARE(c.queue().size(), 2);
      c.restart(cfg);
      QTRY_COMPARE_WITH_TIMEOUT(images.count(), 2, 15000);
      c.stop();
      QTRY_COMPARE_WITH_TIMEOUT(c.state(), WorkerController::State::Stopped, 10000);
    }
    {
      WorkerController c;
      QSignalSpy cancelled(&c, &WorkerController::requestCancelled);
      QVERIFY(c.start(cfg));
      c.submit(startingParams());
      c.stop();
      QCOMPARE(cancelled.count(), 1);
      QVERIFY(c.queue().isEmpty());
      QTRY_COMPARE_WITH_TIMEOUT(c.state(), WorkerController::State::Stopped, 10000);
      QVERIFY(c.start(cfg));
      QTRY_COMPARE_WITH_TIMEOUT(c.state(), WorkerController::State::Ready, 10000);
      QTest::qWait(300);
      QCOMPARE(countOf(fileBytes(fakeDir_.filePath("requests.txt")), "\"type\":\"generate\""), 2);
      c.stop();
      QTRY_COMPARE_WITH_TIMEOUT(c.state(), WorkerController::State::Stopped, 10000);
    }
  }
};

QTEST_MAIN(TestLossless)
#include "test_ui_lossless.moc"
