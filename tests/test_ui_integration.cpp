// The main window driving the REAL worker: mpirun -np 2 ditstudio-worker on CPU with the embedded
// tiny model (DITSTUDIO_TEST_WORKER, DITSTUDIO_TEST_MODEL; set by tests/ui.cmake). Covers: an
// image arriving in the gallery with its parameters, per-rank memory and progress, cancel
// mid-way, a rank killed with SIGKILL (error naming it, window recovers, restart works), and an
// invalid strategy that starts nothing.
#include <sys/types.h>

#include <QAction>
#include <QElapsedTimer>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QtTest>
#include <csignal>

#include "ui/main_window.h"

using namespace dit::ui;

namespace {
constexpr int kStartMs = 180000;  // mpirun + model load on a busy 2-core machine
constexpr int kImageMs = 300000;

QString worker() { return qEnvironmentVariable("DITSTUDIO_TEST_WORKER"); }
QString model() { return qEnvironmentVariable("DITSTUDIO_TEST_MODEL"); }
}  // namespace

class TestIntegration : public QObject {
  Q_OBJECT

  std::unique_ptr<MainWindow> makeWindow(QTemporaryDir& data) {
    MainWindowOptions o;
    o.dataDir = data.path();
    o.modelDir = model();
    o.workerPath = worker();
    o.restoreSession = false;
    auto w = std::make_unique<MainWindow>(o);
    w->show();
    // The CPU demo: 2 ranks, ring 2, 64x64 on the tiny model.
    const auto demo = w->presetStore()->find("CPU demo (2 ranks)");
    if (demo) w->applyPreset(*demo);
    return w;
  }

  static void shutdown(MainWindow* w) {
    if (!w->controller()->isRunning()) return;
    w->stopGroup();
    QTRY_VERIFY_WITH_TIMEOUT(!w->controller()->isRunning(), 30000);
  }

 private Q_SLOTS:
  void initTestCase() {
    if (worker().isEmpty() || !QFileInfo(worker()).isExecutable())
      QSKIP("DITSTUDIO_TEST_WORKER is not an executable ditstudio-worker");
    if (model().isEmpty() || !QFileInfo::exists(model() + "/model_index.json"))
      QSKIP("DITSTUDIO_TEST_MODEL is not the embedded tiny model");
    qunsetenv("DITSTUDIO_MPIRUN");
  }

  void imageArrivesWithRankFigures() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    QVERIFY2(w->validation().canGenerate(), qPrintable(w->validation().all().join("; ")));
    QSignalSpy progress(w->controller(), &WorkerController::progressReceived);
    QSignalSpy ranks(w->controller(), &WorkerController::ranksUpdated);
    QSignalSpy hello(w->controller(), &WorkerController::helloReceived);
    GenerationParams p = w->generationPanel()->params();
    p.steps = 4;
    p.seed = 1234;
    p.random_seed = false;
    w->generationPanel()->setParams(p);
    const QString id = w->generate();
    QVERIFY(!id.isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, kImageMs);
    QVERIFY2(w->controller()->lastFailure().message.isEmpty(),
             qPrintable(w->controller()->lastFailure().message));
    // The image and its parameters.
    const HistoryEntry e = w->historyStore()->entries().first();
    QVERIFY(QFileInfo::exists(e.path));
    QCOMPARE(e.seed, std::uint64_t(1234));
    QCOMPARE(w->generationPanel()->lastSeed(), std::uint64_t(1234));
    QString err;
    const QJsonObject png = readPngParameters(e.path, &err);
    QVERIFY2(!png.isEmpty(), qPrintable(err));
    QCOMPARE(png.value("prompt").toString(), QString::fromStdString(p.prompt));
    QCOMPARE(png.value("width").toInt(), 64);
    QCOMPARE(png.value("steps").toInt(), 4);
    QCOMPARE(static_cast<qint64>(png.value("seed").toDouble()), 1234);
    QCOMPARE(QImage(e.path).size(), QSize(64, 64));
    // Both ranks said hello with their pids; memory and progress were reported per rank.
    QCOMPARE(hello.count(), 2);
    QCOMPARE(w->controller()->rankPids().size(), 2);
    QTRY_VERIFY_WITH_TIMEOUT(progress.count() >= 4, 10000);
    QVERIFY(ranks.count() >= 1);
    RankMonitorModel* m = w->rankModel();
    QCOMPARE(m->world(), 2);
    for (int r = 0; r < 2; ++r) {
      QVERIFY(m->pid(r) > 0);
      QVERIFY2(m->stats(r).rss > 0, qPrintable(QString("rank %1 rss").arg(r)));
      QVERIFY(m->stats(r).rss_peak >= m->stats(r).rss);
      QVERIFY(!m->samples(r).isEmpty());
    }
    QVERIFY(w->rankMonitor()->seriesCount() >= 2);
    // Random seed: the seed used is reported back.
    p.random_seed = true;
    p.steps = 1;
    w->generationPanel()->setParams(p);
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 2, kImageMs);
    QVERIFY(w->historyStore()->entries().first().hasSeed);
    QCOMPARE(w->generationPanel()->lastSeed(), w->historyStore()->entries().first().seed);
    shutdown(w.get());
    QCOMPARE(w->controller()->state(), WorkerController::State::Stopped);
  }

  void cancelMidway() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    QSignalSpy progress(w->controller(), &WorkerController::progressReceived);
    QSignalSpy cancelled(w->controller(), &WorkerController::requestCancelled);
    QSignalSpy done(w->controller(), &WorkerController::requestDone);
    GenerationParams p = w->generationPanel()->params();
    p.steps = 400;
    w->generationPanel()->setParams(p);
    const QString id = w->generate();
    QVERIFY(!id.isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(progress.count() >= 1, kStartMs);
    QVERIFY(w->cancelAction()->isEnabled());
    w->cancelAction()->trigger();
    QTRY_COMPARE_WITH_TIMEOUT(cancelled.count(), 1, 120000);
    QCOMPARE(cancelled.first().at(0).toString(), id);
    QVERIFY(cancelled.first().at(1).toInt() < 400);
    QCOMPARE(done.count(), 0);
    QCOMPARE(w->gallery()->count(), 0);
    QVERIFY(w->controller()->queue().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Ready, 10000);
    // The group keeps serving.
    p.steps = 1;
    w->generationPanel()->setParams(p);
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, kImageMs);
    shutdown(w.get());
  }

  // Stop during a generation with the real worker: the request is cancelled at its next step,
  // the group exits cleanly (bye, no terminate), the status bar showed the worker's real stage,
  // and the next Start does not re-run the interrupted request.
  void stopDuringGeneration() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    QSignalSpy progress(w->controller(), &WorkerController::progressReceived);
    QSignalSpy cancelled(w->controller(), &WorkerController::requestCancelled);
    QSignalSpy stages(w->controller(), &WorkerController::statusReceived);
    GenerationParams p = w->generationPanel()->params();
    p.steps = 400;
    w->generationPanel()->setParams(p);
    const QString id = w->generate();
    QVERIFY(!id.isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(progress.count() >= 2, kStartMs);
    QVERIFY2(w->statusText().contains("busy (denoising"), qPrintable(w->statusText()));
    QStringList seen;
    for (const auto& a : stages) seen << a.at(0).toString();
    QVERIFY2(seen.contains("encoding") && seen.contains("denoising"), qPrintable(seen.join(",")));
    QElapsedTimer t;
    t.start();
    w->stopGroup();
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Stopped, 30000);
    QVERIFY2(!w->logPanel()->text().contains("terminating mpirun"),
             "the group had to be terminated");
    qInfo("stopped %lld ms after Stop", static_cast<long long>(t.elapsed()));
    QCOMPARE(cancelled.count(), 1);
    QCOMPARE(cancelled.first().at(0).toString(), id);
    QVERIFY(cancelled.first().at(1).toInt() < 400);
    QCOMPARE(w->gallery()->count(), 0);
    QCOMPARE(w->rankModel()->stats(0).stage, QString("stopped"));
    QVERIFY(w->startGroup());
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Ready, kStartMs);
    QTest::qWait(1000);
    QCOMPARE(progress.count() > 0, true);
    const int before = progress.count();
    QTest::qWait(1000);
    QCOMPARE(progress.count(), before);  // nothing re-run by itself
    QCOMPARE(w->controller()->state(), WorkerController::State::Ready);
    shutdown(w.get());
  }

  void killedRankIsNamedAndWindowRecovers() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    QSignalSpy progress(w->controller(), &WorkerController::progressReceived);
    QSignalSpy failed(w->controller(), &WorkerController::groupFailed);
    GenerationParams p = w->generationPanel()->params();
    p.steps = 400;
    w->generationPanel()->setParams(p);
    QVERIFY(!w->generate().isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(progress.count() >= 1, kStartMs);
    const qint64 pid = w->controller()->rankPids().value(1, -1);
    QVERIFY(pid > 0);
    QCOMPARE(::kill(static_cast<pid_t>(pid), SIGKILL), 0);
    QTRY_COMPARE_WITH_TIMEOUT(failed.count(), 1, 120000);
    const WorkerFailure f = failed.first().at(0).value<WorkerFailure>();
    QVERIFY2(
        f.rank == 1,
        qPrintable(
            QString("rank %1: %2\n%3").arg(f.rank).arg(f.message, w->controller()->stderrTail())));
    QCOMPARE(w->controller()->state(), WorkerController::State::Failed);
    QVERIFY(w->bannerVisible());
    QVERIFY2(w->bannerText().contains("Rank 1"), qPrintable(w->bannerText()));
    QVERIFY(w->rankModel()->failed(1));
    QVERIFY(w->logPanel()->text().contains("rank 1"));
    QVERIFY(w->isVisible());
    QVERIFY(w->restartAction()->isEnabled());
    // Restart and generate again.
    QVERIFY(w->restartGroup());
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Ready, kStartMs);
    QVERIFY(!w->bannerVisible());
    p.steps = 1;
    w->generationPanel()->setParams(p);
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, kImageMs);
    shutdown(w.get());
  }

  void invalidStrategyStartsNothing() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    QSignalSpy hello(w->controller(), &WorkerController::helloReceived);
    dit::Strategy s;
    s.world = 2;
    s.tp_degree = 3;  // 4 heads: not divisible; product 3 != 2
    w->strategyEditor()->setStrategy(s);
    const auto issues = dit::validateForModel(s, w->generationPanel()->modelInfo().dims());
    QVERIFY(issues.size() >= 2);
    for (const auto& i : issues)
      QVERIFY(w->strategyEditor()->issuesText().contains(QString::fromStdString(i.message)));
    QVERIFY(!w->startAction()->isEnabled());
    w->startAction()->trigger();  // disabled: nothing happens
    QVERIFY(!w->startGroup());
    QVERIFY(w->generate().isEmpty());
    QVERIFY(w->bannerText().contains(QString::fromStdString(issues.front().message)));
    QTest::qWait(1000);
    QVERIFY(!w->controller()->isRunning());
    QCOMPARE(hello.count(), 0);
  }
};

QTEST_MAIN(TestIntegration)
#include "test_ui_integration.moc"
