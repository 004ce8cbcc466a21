// WorkerController (ui/worker_controller.h) process plumbing against a scripted stand-in for
// mpirun + worker (a POSIX sh script written at run time that speaks app/PROTOCOL.md): start,
// events among noise, queue, cancel, stop (shutdown, then terminate), crash reports naming the
// rank, failed start. The real worker is exercised by test_ui_integration.
#include <QBuffer>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QImage>
#include <QJsonDocument>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QThread>
#include <QtTest>
#include <atomic>

#include "app/launcher/launch.h"
#include "ui/worker_controller.h"

using namespace dit::ui;

namespace dit::ui::testing {
/// Writes the scripted mpirun stand-in into `dir` and sets FAKE_DIR/FAKE_IMAGE/FAKE_PREVIEW
/// (test_ui_fake_worker.cpp). Returns the script path.
QString writeFakeMpirun(const QString& dir);
}  // namespace dit::ui::testing

namespace {
QByteArray fileBytes(const QString& path) {
  QFile f(path);
  return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
}
}  // namespace

class TestController : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  QString fake_;

  LaunchConfig config(int world = 2) const {
    LaunchConfig c;
    c.strategy.world = world;
    c.strategy.ring_degree = world;
    c.modelDir = "/models/tiny";
    c.workerPath = "/bin/ditstudio-worker";
    c.mpirunPath = fake_;
    return c;
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    fake_ = dit::ui::testing::writeFakeMpirun(dir_.path());
    QVERIFY(!fake_.isEmpty());
  }

  void init() {
    qputenv("FAKE_MODE", "ok");
    QFile::remove(dir_.filePath("requests.txt"));
  }

  void generateOne() {
    WorkerController c;
    c.setOutputDir(dir_.filePath("images"));
    QSignalSpy ready(&c, &WorkerController::readyReceived);
    QSignalSpy ranks(&c, &WorkerController::ranksUpdated);
    QSignalSpy progress(&c, &WorkerController::progressReceived);
    QSignalSpy preview(&c, &WorkerController::previewReceived);
    QSignalSpy image(&c, &WorkerController::imageReceived);
    QSignalSpy done(&c, &WorkerController::requestDone);
    QSignalSpy stopped(&c, &WorkerController::groupStopped);
    QSignalSpy failed(&c, &WorkerController::groupFailed);
    QSignalSpy logs(&c, &WorkerController::logLine);
    // Submitted before the group is ready: held until `ready`.
    GenerationParams p;
    p.steps = 3;
    QVERIFY(c.start(config()));
    QVERIFY(!c.start(config()));  // already running
    QCOMPARE(c.state(), WorkerController::State::Starting);
    const QString id = c.submit(p);
    QCOMPARE(c.queue().size(), 1);
    QTRY_COMPARE_WITH_TIMEOUT(done.count(), 1, 10000);
    QCOMPARE(done.first().at(0).toString(), id);
    QCOMPARE(ready.count(), 1);
    QCOMPARE(progress.count(), 3);
    QCOMPARE(preview.count(), 3);
    // One `ranks` event per step and one after the request (every rank idle), as the worker sends.
    QTRY_COMPARE_WITH_TIMEOUT(ranks.count(), 4, 5000);
    QCOMPARE(image.count(), 1);
    QCOMPARE(image.first().at(0).value<ImageResult>().seed, std::uint64_t(4242));
    QCOMPARE(c.rankPids(), (QMap<int, qint64>{{0, 5000}, {1, 5001}}));
    QCOMPARE(c.state(), WorkerController::State::Ready);
    QVERIFY(c.queue().isEmpty());
    // The mpirun command line reached the launcher.
    QFile args(dir_.filePath("args.txt"));
    QVERIFY(args.open(QIODevice::ReadOnly));
    QCOMPARE(
        QString::fromLocal8Bit(args.readAll()).trimmed(),
        QString(
            "--allow-run-as-root --oversubscribe -np 2 --mca pml ob1 --mca btl "
            "^tcp,ofi,openib,usnic,uct " +
            QString::fromStdString(dit::launcher::shellQuoted(
                dit::launcher::threadPlacementArgs(2, 1, dit::launcher::availableCores()))) +
            " -x OMP_NUM_THREADS=1 "
            "/bin/ditstudio-worker "
            "--model /models/tiny --tp-degree 1 --ring-degree 2 --ulysses-degree 1 --cfg-degree 1 "
            "--dp-degree 1 --device cpu"));
    // The request line is the protocol's.
    QFile req(dir_.filePath("requests.txt"));
    QVERIFY(req.open(QIODevice::ReadOnly));
    const QJsonObject sent = QJsonDocument::fromJson(req.readLine()).object();
    QCOMPARE(sent.value("type").toString(), QString("generate"));
    QCOMPARE(sent.value("id").toString(), id);
    QCOMPARE(sent.value("steps").toInt(), 3);
    QCOMPARE(sent.value("seed").toInt(), 42);
    QCOMPARE(sent.value("output_dir").toString(), dir_.filePath("images"));
    QCOMPARE(sent.value("prompt").toString(), QString::fromStdString(p.prompt));
    // Noise and stderr reached the log; stderr attributed to rank 1 by its "[rank 1/2]" tag.
    bool noise = false, rank1 = false;
    for (const auto& l : logs) {
      noise |= l.at(2).toString() == "library noise: loading kernels";
      rank1 |= l.at(0).toInt() == 1 && l.at(1).toString() == "stderr";
    }
    QVERIFY(noise);
    QVERIFY(rank1);
    c.stop();
    QTRY_COMPARE_WITH_TIMEOUT(stopped.count(), 1, 10000);
    QCOMPARE(c.state(), WorkerController::State::Stopped);
    QCOMPARE(failed.count(), 0);
    req.close();
    QVERIFY(req.open(QIODevice::ReadOnly));
    QVERIFY(req.readAll().contains("{\"type\":\"shutdown\"}"));
  }

  void cancelQueuedAndSent() {
    WorkerController c;
    QSignalSpy cancelled(&c, &WorkerController::requestCancelled);
    QSignalSpy ready(&c, &WorkerController::readyReceived);
    QVERIFY(c.start(config()));
    GenerationParams p;
    p.steps = 1;
    const QString a = c.submit(p);
    QVERIFY(c.cancel(a));  // not yet sent: dropped locally
    QCOMPARE(cancelled.count(), 1);
    QVERIFY(c.queue().isEmpty());
    QVERIFY(!c.cancel("nope"));
    QTRY_COMPARE_WITH_TIMEOUT(ready.count(), 1, 10000);
    // Sent requests get {"type":"cancel","id":...} (what the worker does with it is
    // test_ui_integration's business; the fake finishes the request first).
    p.steps = 1;
    const QString b = c.submit(p);
    QVERIFY(c.queue().first().sent);
    QVERIFY(c.cancel(b));
    const QByteArray cancelLine = QString("{\"id\":\"%1\",\"type\":\"cancel\"}").arg(b).toUtf8();
    QTRY_VERIFY_WITH_TIMEOUT(fileBytes(dir_.filePath("requests.txt")).contains(cancelLine), 5000);
    QTRY_VERIFY_WITH_TIMEOUT(c.queue().isEmpty(), 5000);
    QCOMPARE(cancelled.count(), 1);  // the late `cancelled` for a finished request is ignored
    c.stop();
    QTRY_COMPARE_WITH_TIMEOUT(c.state(), WorkerController::State::Stopped, 10000);
  }

  void crashNamesRank() {
    qputenv("FAKE_MODE", "crash");
    WorkerController c;
    QSignalSpy failed(&c, &WorkerController::groupFailed);
    QSignalSpy reqFailed(&c, &WorkerController::requestFailed);
    QSignalSpy ranks(&c, &WorkerController::ranksUpdated);
    QVERIFY(c.start(config()));
    c.submit(GenerationParams{});
    c.submit(GenerationParams{});
    QTRY_COMPARE_WITH_TIMEOUT(failed.count(), 1, 10000);
    const WorkerFailure f = failed.first().at(0).value<WorkerFailure>();
    QCOMPARE(f.rank, 1);
    QCOMPARE(f.pid, 5001);
    QVERIFY(f.fatal);
    QVERIFY2(f.message.contains("rank 1") && f.message.contains("signal 9"), qPrintable(f.message));
    QCOMPARE(c.state(), WorkerController::State::Failed);
    QCOMPARE(reqFailed.count(), 2);
    QVERIFY(c.queue().isEmpty());
    // Recovers: start again.
    qputenv("FAKE_MODE", "ok");
    QSignalSpy done(&c, &WorkerController::requestDone);
    QVERIFY(c.start(config()));
    GenerationParams p;
    p.steps = 1;
    c.submit(p);
    QTRY_COMPARE_WITH_TIMEOUT(done.count(), 1, 10000);
    c.stop();
    QTRY_COMPARE_WITH_TIMEOUT(c.state(), WorkerController::State::Stopped, 10000);
  }

  void errorEventNamesRank() {
    qputenv("FAKE_MODE", "error");
    WorkerController c;
    QSignalSpy failed(&c, &WorkerController::groupFailed);
    QSignalSpy errors(&c, &WorkerController::errorReported);
    QVERIFY(c.start(config()));
    c.submit(GenerationParams{});
    QTRY_COMPARE_WITH_TIMEOUT(failed.count(), 1, 10000);
    QCOMPARE(errors.count(), 1);
    const WorkerFailure f = failed.first().at(0).value<WorkerFailure>();
    QCOMPARE(f.rank, 1);
    QVERIFY2(f.message.contains("out of memory in attention"), qPrintable(f.message));
    QVERIFY(f.detail.contains("rank 1"));
  }

  void fatalErrorCopiedToStderrIsReportedOnce() {
    // abortGroup writes the fatal event to stdout and stderr; OpenMPI 5 may lose the stdout copy.
    for (const char* mode : {"error_both", "error_stderr_only"}) {
      qputenv("FAKE_MODE", mode);
      WorkerController c;
      QSignalSpy failed(&c, &WorkerController::groupFailed);
      QSignalSpy errors(&c, &WorkerController::errorReported);
      QSignalSpy logs(&c, &WorkerController::logLine);
      QVERIFY(c.start(config()));
      c.submit(GenerationParams{});
      QTRY_COMPARE_WITH_TIMEOUT(failed.count(), 1, 10000);
      QCOMPARE(errors.count(), 1);
      const WorkerFailure f = failed.first().at(0).value<WorkerFailure>();
      QCOMPARE(f.rank, 1);
      QCOMPARE(f.message, QStringLiteral("rank 1: out of memory in attention"));
      QVERIFY2(!f.detail.contains("@@DIT"), qPrintable(f.detail));
      QVERIFY2(f.detail.contains("[rank 1] fatal: out of memory in attention"),
               qPrintable(f.detail));
      // The text before the event on that stderr line is still logged; no raw event is.
      bool before = false;
      for (const QList<QVariant>& l : logs) {
        const QString text = l.at(2).toString();
        QVERIFY2(!text.contains("@@DIT"), qPrintable(text));
        before |= l.at(1).toString() == "stderr" && text == "[12:00:01] [rank 0/2] da";
      }
      QVERIFY2(before, mode);
    }
  }

  void nonFatalErrorKeepsServing() {
    qputenv("FAKE_MODE", "badrequest");
    WorkerController c;
    QSignalSpy reqFailed(&c, &WorkerController::requestFailed);
    QSignalSpy failed(&c, &WorkerController::groupFailed);
    QVERIFY(c.start(config(1)));
    const QString id = c.submit(GenerationParams{});
    QTRY_COMPARE_WITH_TIMEOUT(reqFailed.count(), 1, 10000);
    QCOMPARE(reqFailed.first().at(0).toString(), id);
    QVERIFY(reqFailed.first().at(1).toString().contains("multiple of 4"));
    QCOMPARE(c.state(), WorkerController::State::Ready);
    QVERIFY(c.isRunning());
    c.stop();
    QTRY_COMPARE_WITH_TIMEOUT(c.state(), WorkerController::State::Stopped, 10000);
    QCOMPARE(failed.count(), 0);
  }

  void stopTerminatesAHungGroup() {
    qputenv("FAKE_MODE", "hang");
    WorkerController c;
    QSignalSpy ready(&c, &WorkerController::readyReceived);
    QSignalSpy stopped(&c, &WorkerController::groupStopped);
    QVERIFY(c.start(config()));
    QTRY_COMPARE_WITH_TIMEOUT(ready.count(), 1, 10000);
    QElapsedTimer t;
    t.start();
    c.stop(300);
    QCOMPARE(c.state(), WorkerController::State::Stopping);
    QTRY_COMPARE_WITH_TIMEOUT(stopped.count(), 1, 10000);
    QVERIFY(t.elapsed() < 5000);
    QCOMPARE(c.state(), WorkerController::State::Stopped);
  }

  void restartAppliesNewConfig() {
    WorkerController c;
    QSignalSpy hello(&c, &WorkerController::helloReceived);
    QSignalSpy ready(&c, &WorkerController::readyReceived);
    QVERIFY(c.start(config(2)));
    QTRY_COMPARE_WITH_TIMEOUT(ready.count(), 1, 10000);
    c.restart(config(4));
    QTRY_COMPARE_WITH_TIMEOUT(ready.count(), 2, 10000);
    QCOMPARE(c.world(), 4);
    QCOMPARE(c.config().strategy.world, 4);
    QCOMPARE(hello.count(), 6);
    c.stop();
    QTRY_COMPARE_WITH_TIMEOUT(c.state(), WorkerController::State::Stopped, 10000);
  }

  // A hostfile group of two hosts: rank 0 on this one, rank 1 on `other`; the model a folder
  // with one file (the pre-flight fingerprints it here first).
  LaunchConfig hostfileConfig(const QString& other) const {
    LaunchConfig c = config(2);
    QFile hf(dir_.filePath("hostfile"));
    if (hf.open(QIODevice::WriteOnly | QIODevice::Truncate))
      hf.write(QStringLiteral("localhost slots=1\n%1 slots=1\n").arg(other).toUtf8());
    QDir(dir_.path()).mkpath("model");
    QFile m(dir_.filePath("model/model_index.json"));
    if (m.open(QIODevice::WriteOnly | QIODevice::Truncate)) m.write("{}");
    c.hostfile = hf.fileName();
    c.modelDir = dir_.filePath("model");
    return c;
  }

  // Issue 36 in the GUI: a hostfile group's pre-flight runs off the UI thread (ssh takes 1 s
  // here: a stand-in on PATH that then refuses the login), names the host, the cause and the
  // fix, and starts no group; a request queued meanwhile stays queued. Stop abandons a check.
  void hostfilePreflightOffTheUiThreadNamesTheHost() {
    const QString bin = dir_.filePath("sshbin");
    QDir().mkpath(bin);
    QFile ssh(bin + "/ssh");
    QVERIFY(ssh.open(QIODevice::WriteOnly | QIODevice::Truncate));
    ssh.write(
        "#!/bin/sh\nsleep 1\necho 'ssh: connect to host fake-host-b port 22: Connection "
        "refused' >&2\nexit 255\n");
    ssh.close();
    ssh.setPermissions(QFile::ReadOwner | QFile::WriteOwner | QFile::ExeOwner);
    const QByteArray path = qgetenv("PATH");
    qputenv("PATH", bin.toLocal8Bit() + ":" + path);
    QFile::remove(dir_.filePath("args.txt"));
    WorkerController c;
    QSignalSpy checking(&c, &WorkerController::hostCheckChanged);
    QSignalSpy checkFailed(&c, &WorkerController::hostCheckFailed);
    QSignalSpy failed(&c, &WorkerController::groupFailed);
    const LaunchConfig cfg = hostfileConfig("fake-host-b");
    QElapsedTimer t;
    t.start();
    QVERIFY(c.start(cfg));
    QVERIFY2(t.elapsed() < 800, "start() waited for ssh");
    QVERIFY(c.checkingHosts());
    QCOMPARE(checking.count(), 1);
    QVERIFY(!c.start(cfg));  // one check at a time
    c.submit(GenerationParams{});
    QTRY_COMPARE_WITH_TIMEOUT(checkFailed.count(), 1, 30000);
    qputenv("PATH", path);
    QCOMPARE(checkFailed.first().at(0).toString(), QStringLiteral("fake-host-b"));
    const QString message = checkFailed.first().at(1).toString();
    QVERIFY2(message.startsWith("pre-flight failed:\n") && message.contains("fake-host-b") &&
                 message.contains("Fix: "),
             qPrintable(message));
    QVERIFY(!c.checkingHosts());
    QCOMPARE(checking.count(), 2);
    QVERIFY(!c.isRunning());
    QVERIFY(!QFile::exists(dir_.filePath("args.txt")));  // mpirun never ran
    QCOMPARE(failed.count(), 0);
    QCOMPARE(c.queue().size(), 1);  // never sent: kept for the next start
    // Stop during a check: abandoned, nothing starts, the unsent request is dropped.
    qputenv("PATH", bin.toLocal8Bit() + ":" + path);
    QSignalSpy cancelled(&c, &WorkerController::requestCancelled);
    QVERIFY(c.start(cfg));
    c.stop();
    QVERIFY(!c.checkingHosts());
    QCOMPARE(cancelled.count(), 1);
    QVERIFY(c.queue().isEmpty());
    QTest::qWait(1500);  // the abandoned check ends meanwhile: its result is ignored
    qputenv("PATH", path);
    QCOMPARE(checkFailed.count(), 1);
    QVERIFY(!c.isRunning());
    QVERIFY(!QFile::exists(dir_.filePath("args.txt")));
  }

  // Issue 36 in the GUI: rank 1 of a hostfile group stops on its host; while the group stalls the
  // controller asks that host (a fake state query here: stopped, and "exited" if asked again,
  // as the group's abort would leave it) off the UI thread, and the fatal "did not answer (is
  // the link to it up?)" error is shown in the CLI's words: stopped, not cut off.
  void hostfileStoppedRemoteRankNamedAsStopped() {
    qputenv("FAKE_MODE", "silent_remote");
    qputenv("FAKE_STALL", "4");
    qputenv("DITSTUDIO_COLLECTIVE_TIMEOUT_S", "4");  // a stall is asked about after 2 s
    WorkerController c;
    c.setPreflight(false);  // no ssh here; the pre-flight is the case above
    std::atomic<int> asked{0};
    std::atomic<bool> onUiThread{false};
    QThread* ui = QThread::currentThread();
    c.setRemoteStateQuery([&](const std::string& host, std::int64_t pid) -> std::string {
      onUiThread = onUiThread || QThread::currentThread() == ui;
      if (host != "fake-host-b" || pid != 5001) return "running (state R)";
      return asked++ == 0 ? "stopped (state T: SIGSTOP or a debugger)" : "exited";
    });
    QSignalSpy errors(&c, &WorkerController::errorReported);
    QSignalSpy failed(&c, &WorkerController::groupFailed);
    QSignalSpy logs(&c, &WorkerController::logLine);
    QSignalSpy passed(&c, &WorkerController::hostCheckPassed);
    QSignalSpy reqFailed(&c, &WorkerController::requestFailed);
    QVERIFY(c.start(hostfileConfig("fake-host-b")));
    QTRY_COMPARE_WITH_TIMEOUT(passed.count(), 1, 10000);
    QCOMPARE(passed.first().at(0).toString(),
             QStringLiteral("localhost: rank 0; fake-host-b: rank 1"));
    QCOMPARE(c.hostPlan(), QStringLiteral("localhost: rank 0; fake-host-b: rank 1"));
    GenerationParams p;
    p.steps = 10;
    c.submit(p);
    QTRY_COMPARE_WITH_TIMEOUT(failed.count(), 1, 30000);
    qunsetenv("DITSTUDIO_COLLECTIVE_TIMEOUT_S");
    qunsetenv("FAKE_STALL");
    const QString stopped =
        "rank 1 (pid 5001 on fake-host-b) is stopped (state T: SIGSTOP or a debugger) (asked over "
        "ssh): it is not cut off, it does not run";
    const WorkerFailure f = failed.first().at(0).value<WorkerFailure>();
    QVERIFY2(f.message.contains(stopped), qPrintable(f.message));
    QVERIFY2(!f.message.contains("is the link to it up?"), qPrintable(f.message));
    QCOMPARE(errors.count(), 1);
    QCOMPARE(errors.first().at(0).value<WorkerFailure>().message, f.message);
    QCOMPARE(c.lastFailure().message, f.message);
    // The request the group took down fails with the same words (held back with the error).
    QCOMPARE(reqFailed.count(), 1);
    QVERIFY2(reqFailed.first().at(1).toString().contains(stopped),
             qPrintable(reqFailed.first().at(1).toString()));
    // Asked once, during the stall, and never on the UI thread.
    QCOMPARE(asked.load(), 1);
    QVERIFY(!onUiThread);
    bool warned = false;
    for (const QList<QVariant>& l : logs)
      warned |= l.at(1).toString() == "warning" &&
                l.at(2).toString().contains("rank 1 (pid 5001 on fake-host-b) is stopped") &&
                l.at(2).toString().contains("asked over ssh while the group stalled");
    QVERIFY(warned);
  }

  // OpenMPI 5's peer-disconnect report (issue 36): the group's failure names rank 1 on the peer
  // host by its host's answer (off the UI thread); request failure and groupFailed carry the same
  // words, and no OpenMPI text reaches the log.
  void hostfilePeerLostNamedByTheHostsAnswer() {
    qputenv("FAKE_MODE", "peer_lost");
    WorkerController c;
    c.setPreflight(false);
    std::atomic<bool> onUiThread{false};
    QThread* ui = QThread::currentThread();
    c.setRemoteStateQuery([&](const std::string& host, std::int64_t pid) -> std::string {
      onUiThread = onUiThread || QThread::currentThread() == ui;
      return host == "fake-host-b" && pid == 5001 ? "exited" : "running (state R)";
    });
    QSignalSpy errors(&c, &WorkerController::errorReported);
    QSignalSpy failed(&c, &WorkerController::groupFailed);
    QSignalSpy logs(&c, &WorkerController::logLine);
    QSignalSpy reqFailed(&c, &WorkerController::requestFailed);
    QVERIFY(c.start(hostfileConfig("fake-host-b")));
    GenerationParams p;
    p.steps = 10;
    c.submit(p);
    QTRY_COMPARE_WITH_TIMEOUT(failed.count(), 1, 30000);
    const QString named =
        "rank 1 (pid 5001 on fake-host-b) has exited (asked over ssh): rank 0 (pid 5000 on "
        "fakehost) lost its connection to it mid-run";
    QCOMPARE(failed.first().at(0).value<WorkerFailure>().message, named);
    QCOMPARE(errors.count(), 0);
    QCOMPARE(reqFailed.count(), 1);
    QCOMPARE(reqFailed.first().at(1).toString(), named);
    QVERIFY(!onUiThread);
    int shown = 0;
    for (const QList<QVariant>& l : logs) {
      const QString level = l.at(1).toString(), text = l.at(2).toString();
      if (level == "debug") continue;
      QVERIFY2(!text.contains("An MPI communication peer") &&
                   !text.contains("MPI_ERRORS_ARE_FATAL") && !text.contains("failed to start") &&
                   !text.contains(") disconnected"),
               qPrintable(text));
      shown += level == "error" && text == named;
    }
    QCOMPARE(shown, 1);
  }

  // Restart of a running hostfile group: the old group stops (the unsent request kept), the new
  // one goes through its own hostfile check before mpirun starts, and runs the request.
  void restartOfAHostfileGroupChecksItsHostsAgain() {
    WorkerController c;
    c.setPreflight(false);  // the plan only: no ssh here
    QSignalSpy checking(&c, &WorkerController::hostCheckChanged);
    QSignalSpy ready(&c, &WorkerController::readyReceived);
    QSignalSpy done(&c, &WorkerController::requestDone);
    LaunchConfig cfg = hostfileConfig("fake-host-b");
    QVERIFY(c.start(cfg));
    QTRY_COMPARE_WITH_TIMEOUT(ready.count(), 1, 10000);
    QCOMPARE(checking.count(), 2);  // began, ended
    QCOMPARE(c.hostPlan(), QStringLiteral("localhost: rank 0; fake-host-b: rank 1"));
    cfg.strategy.ring_degree = 1;
    cfg.strategy.ulysses_degree = 2;
    c.restart(cfg);
    GenerationParams p;
    p.steps = 1;
    const QString id = c.submit(p);
    QTRY_COMPARE_WITH_TIMEOUT(ready.count(), 2, 10000);
    QCOMPARE(checking.count(), 4);  // checked again before the new group
    QCOMPARE(c.config().strategy.ulysses_degree, 2);
    QTRY_COMPARE_WITH_TIMEOUT(done.count(), 1, 10000);
    QCOMPARE(done.first().at(0).toString(), id);
    c.stop();
    QTRY_COMPARE_WITH_TIMEOUT(c.state(), WorkerController::State::Stopped, 10000);
  }

  void failedStart() {
    WorkerController c;
    QSignalSpy failed(&c, &WorkerController::groupFailed);
    LaunchConfig cfg = config();
    cfg.mpirunPath = dir_.filePath("no-such-mpirun");
    c.start(cfg);
    QTRY_COMPARE_WITH_TIMEOUT(failed.count(), 1, 10000);
    QVERIFY(failed.first().at(0).value<WorkerFailure>().message.contains("no-such-mpirun"));
    QCOMPARE(c.state(), WorkerController::State::Failed);
  }
};

QTEST_GUILESS_MAIN(TestController)
#include "test_ui_controller.moc"
