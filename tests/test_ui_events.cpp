// Event stream parsing (ui/event_parser.h): `@@DIT ` lines among library noise, partial chunks,
// `ranks` events, mpirun's failure reports; and WorkerController's handling of a fed stream.
#include <QBuffer>
#include <QImage>
#include <QSignalSpy>
#include <QtTest>

#include "ui/event_parser.h"
#include "ui/worker_controller.h"

using namespace dit::ui;

class TestEvents : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void parsesEvents() {
    // The worker names the event in "event"; "type" is accepted too.
    auto ev =
        parseEventLine(R"(@@DIT {"event":"hello","host":"vm","pid":4242,"rank":1,"world":2})");
    QVERIFY(ev);
    QCOMPARE(ev->type, QString("hello"));
    QCOMPARE(ev->data.value("host").toString(), QString("vm"));
    ev = parseEventLine(R"(@@DIT {"type":"hello","rank":1,"world":2,"pid":4242})");
    QVERIFY(ev);
    QCOMPARE(ev->type, QString("hello"));
    QCOMPARE(ev->data.value("rank").toInt(), 1);
    QCOMPARE(ev->data.value("pid").toInteger(), 4242);
    // Trailing CR/LF, leading blanks.
    ev = parseEventLine("  @@DIT {\"type\":\"bye\"}\r\n");
    QVERIFY(ev);
    QCOMPARE(ev->type, QString("bye"));
    // OpenMPI --tag-output prefix.
    ev = parseEventLine(R"([1,0]<stdout>:@@DIT {"type":"status","stage":"loading","message":"x"})");
    QVERIFY(ev);
    QCOMPARE(ev->data.value("stage").toString(), QString("loading"));
    // An event after other text on the line (mpirun's pieces of several streams): the offset
    // of its marker.
    auto found = findEventInLine(
        R"([rank 0/2] da@@DIT {"event":"error","rank":1,"message":"m","fatal":true})");
    QVERIFY(found);
    QCOMPARE(found->offset, qsizetype(13));
    QCOMPARE(found->event.type, QString("error"));
    QCOMPARE(found->event.data.value("rank").toInt(), 1);
    QVERIFY(!findEventInLine("[rank 0/2] loading"));
    // Unicode survives.
    ev = parseEventLine(
        QString(R"(@@DIT {"type":"log","rank":0,"level":"info","message":"café 日本"})").toUtf8());
    QVERIFY(ev);
    QCOMPARE(ev->data.value("message").toString(), QString("café 日本"));
  }

  void ignoresNoise() {
    const QByteArray noise[] = {
        "",
        "Loading weights...",
        "[W OperatorEntry.cpp:150] Warning: overriding a previously registered kernel",
        "@@DIT",
        "@@DIT ",
        "@@DIT not json",
        "@@DIT {\"type\":\"hello\"",          // truncated
        "@@DIT [1,2,3]",                      // not an object
        "@@DIT {\"rank\":0}",                 // no type
        "@@DIT {\"type\":42}",                // type not a string
        "@@DIT {\"event\":null}",             // event not a string
        "@@DIT {\"event\":\"\"}",             // empty name
        "@@DITX {\"type\":\"hello\"}",        // wrong prefix
        "@@dit {\"type\":\"hello\"}",         // case matters
        "prefix @@DIT {\"type\":\"hello\"}",  // prefix must start the line
        "{\"type\":\"hello\"}",               // JSON without prefix is noise too
    };
    for (const QByteArray& n : noise) QVERIFY2(!parseEventLine(n), n.constData());
  }

  void splitsChunks() {
    LineSplitter s;
    QCOMPARE(s.feed("@@DIT {\"type\":").size(), 0);
    QList<QByteArray> lines = s.feed("\"ready\"}\nnoise line\r\n@@DIT {\"ty");
    QCOMPARE(lines.size(), 2);
    QCOMPARE(lines[0], QByteArray("@@DIT {\"type\":\"ready\"}"));
    QCOMPARE(lines[1], QByteArray("noise line"));
    lines = s.feed("pe\":\"bye\"}\n\n");
    QCOMPARE(lines.size(), 2);
    QVERIFY(parseEventLine(lines[0]));
    QCOMPARE(lines[1], QByteArray());
    s.feed("tail without newline");
    QCOMPARE(s.flush(), QByteArray("tail without newline"));
    QCOMPARE(s.flush(), QByteArray());
    // One byte at a time.
    LineSplitter t;
    const QByteArray text = "@@DIT {\"type\":\"bye\"}\nabc\n";
    int n = 0;
    for (char c : text) n += t.feed(QByteArray(1, c)).size();
    QCOMPARE(n, 2);
  }

  void parsesRanks() {
    auto ev = parseEventLine(
        R"(@@DIT {"type":"ranks","ranks":[{"rank":0,"stage":"denoising","step":3,"steps":8,"rss":104857600,"rss_peak":209715200,"dev":0,"dev_peak":0,"bytes_sent":5000,"step_ms":12.5},{"rank":1,"stage":"denoising","step":3,"steps":8,"rss":1048576},{"stage":"bad"}]})");
    QVERIFY(ev);
    const QList<RankStats> r = parseRanks(ev->data);
    QCOMPARE(r.size(), 2);
    QCOMPARE(r[0].rank, 0);
    QCOMPARE(r[0].stage, QString("denoising"));
    QCOMPARE(r[0].step, 3);
    QCOMPARE(r[0].steps, 8);
    QCOMPARE(r[0].rss, 104857600);
    QCOMPARE(r[0].rss_peak, 209715200);
    QCOMPARE(r[0].bytes_sent, 5000);
    QCOMPARE(r[0].step_ms, 12.5);
    QCOMPARE(r[1].rss, 1048576);
    QCOMPARE(r[1].dev, -1);  // missing
    QCOMPARE(r[1].step_ms, -1.0);
  }

  void mpirunSignal() {
    const QString err =
        "--------------------------------------------------------------------------\n"
        "Primary job  terminated normally, but 1 process returned\n"
        "a non-zero exit code. Per user-direction, the job has been aborted.\n"
        "--------------------------------------------------------------------------\n"
        "--------------------------------------------------------------------------\n"
        "mpirun noticed that process rank 1 with PID 31337 on node worker-a exited on signal 9 "
        "(Killed).\n"
        "--------------------------------------------------------------------------\n";
    const auto f = parseMpirunFailure(err);
    QVERIFY(f);
    QCOMPARE(f->rank, 1);
    QCOMPARE(f->pid, 31337);
    QCOMPARE(f->signal, 9);
    QCOMPARE(f->node, QString("worker-a"));
    QVERIFY(f->reason.contains("rank 1"));
    QVERIFY(f->reason.contains("signal 9"));
    QVERIFY(f->reason.contains("Killed"));
  }

  void mpirunExitCode() {
    const QString err =
        "-------------------------------------------------------\n"
        "Primary job  terminated normally, but 1 process returned\n"
        "a non-zero exit code. Per user-direction, the job has been aborted.\n"
        "-------------------------------------------------------\n"
        "--------------------------------------------------------------------------\n"
        "mpirun detected that one or more processes exited with non-zero status, thus causing\n"
        "the job to be terminated. The first process to do so was:\n"
        "\n"
        "  Process name: [[6180,1],1]\n"
        "  Exit code:    3\n"
        "--------------------------------------------------------------------------\n";
    const auto f = parseMpirunFailure(err);
    QVERIFY(f);
    QCOMPARE(f->rank, 1);
    QCOMPARE(f->exit_code, 3);
    QVERIFY(f->reason.contains("rank 1"));
  }

  void mpirunExitCodeOpenMpi5() {
    // OpenMPI 5 (prterun, Debian 13) names the process "[prterun-<host>-<pid>@<job>,<rank>]".
    const QString err =
        "--------------------------------------------------------------------------\n"
        "prterun detected that one or more processes exited with non-zero status,\n"
        "thus causing the job to be terminated. The first process to do so was:\n"
        "\n"
        "   Process name: [prterun-vm-2690@1,2]\n"
        "   Exit code:    3\n"
        "--------------------------------------------------------------------------\n";
    const auto f = parseMpirunFailure(err);
    QVERIFY(f);
    QCOMPARE(f->rank, 2);
    QCOMPARE(f->exit_code, 3);
    QVERIFY(f->reason.contains("rank 2"));
  }

  void mpirunAbort() {
    const QString err =
        "--------------------------------------------------------------------------\n"
        "MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD\n"
        "with errorcode 1.\n\n"
        "NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.\n";
    const auto f = parseMpirunFailure(err);
    QVERIFY(f);
    QCOMPARE(f->rank, 2);
    QCOMPARE(f->exit_code, 1);
    QVERIFY(f->reason.contains("rank 2"));
  }

  void mpirunPrimaryOnly() {
    const auto f = parseMpirunFailure(
        "Primary job  terminated normally, but 1 process returned\na non-zero exit code.");
    QVERIFY(f);
    QCOMPARE(f->rank, -1);
    QVERIFY(!parseMpirunFailure("all fine\nnothing to see"));
  }

  void rankOfLines() {
    QCOMPARE(rankOfLogLine("[12:00:01] [rank 3/4] [pipeline] loading"), 3);
    QCOMPARE(rankOfLogLine("[1,2]<stderr>:something"), 2);
    QCOMPARE(rankOfLogLine("plain line"), -1);
  }

  void controllerHandlesStream() {
    WorkerController c;
    QSignalSpy hello(&c, &WorkerController::helloReceived);
    QSignalSpy ready(&c, &WorkerController::readyReceived);
    QSignalSpy ranks(&c, &WorkerController::ranksUpdated);
    QSignalSpy progress(&c, &WorkerController::progressReceived);
    QSignalSpy preview(&c, &WorkerController::previewReceived);
    QSignalSpy image(&c, &WorkerController::imageReceived);
    QSignalSpy errors(&c, &WorkerController::errorReported);
    QSignalSpy logs(&c, &WorkerController::logLine);
    // A 1x1 PNG, base64.
    QByteArray png;
    {
      QImage img(1, 1, QImage::Format_RGB32);
      img.fill(Qt::red);
      QBuffer buf(&png);
      buf.open(QIODevice::WriteOnly);
      img.save(&buf, "PNG");
    }
    const QByteArray stream =
        "noise before\n"
        "@@DIT {\"event\":\"hello\",\"rank\":0,\"world\":2,\"pid\":100}\n"
        "@@DIT {\"event\":\"hello\",\"rank\":1,\"world\":2,\"pid\":101}\n"
        "@@DIT "
        "{\"event\":\"ready\",\"world\":2,\"strategy\":{\"ring_degree\":2},\"model\":{\"heads\":4},"
        "\"load_seconds\":0.5}\n"
        "@@DIT {\"event\":\"ranks\",\"ranks\":[{\"rank\":0,\"rss\":1},{\"rank\":1,\"rss\":2}]}\n"
        "@@DIT "
        "{\"event\":\"progress\",\"id\":\"r1\",\"step\":1,\"steps\":4,\"step_ms\":10,\"eta_s\":0."
        "03,\"image_index\":0}\n"
        "@@DIT {\"event\":\"preview\",\"id\":\"r1\",\"step\":1,\"image_index\":0,\"png\":\"" +
        png.toBase64() +
        "\"}\n"
        "@@DIT "
        "{\"event\":\"image\",\"id\":\"r1\",\"image_index\":0,\"path\":\"/tmp/"
        "x.png\",\"seed\":77,\"params\":{\"prompt\":\"p\"},\"seconds\":1.5}\n"
        "@@DIT {\"event\":\"error\",\"id\":\"r9\",\"rank\":1,\"message\":\"bad "
        "request\",\"fatal\":false}\n"
        "@@DIT {\"type\":\"log\",\"rank\":1,\"level\":\"warn\",\"message\":\"hi\"}\n";
    // Feed in awkward chunks.
    for (int i = 0; i < stream.size(); i += 7) c.feedStdoutForTest(stream.mid(i, 7));
    QCOMPARE(hello.count(), 2);
    QCOMPARE(c.rankPids().value(1), 101);
    QCOMPARE(ready.count(), 1);
    QCOMPARE(c.readyInfo().value("load_seconds").toDouble(), 0.5);
    QCOMPARE(ranks.count(), 1);
    QCOMPARE(progress.count(), 1);
    QCOMPARE(progress.first().at(2).toInt(), 4);
    QCOMPARE(preview.count(), 1);
    QCOMPARE(preview.first().at(3).value<QImage>().size(), QSize(1, 1));
    QCOMPARE(image.count(), 1);
    const ImageResult r = image.first().at(0).value<ImageResult>();
    QCOMPARE(r.seed, std::uint64_t(77));
    QCOMPARE(r.path, QString("/tmp/x.png"));
    QCOMPARE(r.params.value("prompt").toString(), QString("p"));
    QCOMPARE(errors.count(), 1);
    const WorkerFailure f = errors.first().at(0).value<WorkerFailure>();
    QCOMPARE(f.rank, 1);
    QCOMPARE(f.pid, 101);
    QVERIFY(f.message.contains("rank 1"));
    QVERIFY(f.message.contains("bad request"));
    QVERIFY(!f.fatal);
    bool sawNoise = false, sawLog = false;
    for (const auto& l : logs) {
      if (l.at(2).toString() == "noise before") sawNoise = l.at(1).toString() == "stdout";
      if (l.at(2).toString() == "hi") sawLog = l.at(0).toInt() == 1 && l.at(1).toString() == "warn";
    }
    QVERIFY(sawNoise);
    QVERIFY(sawLog);
  }
};

QTEST_GUILESS_MAIN(TestEvents)
#include "test_ui_events.moc"
