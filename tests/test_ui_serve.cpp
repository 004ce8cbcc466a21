// The GUI's "Serve API" switch (ui/api_serve.h, issue 45): ditstudio-server's HTTP front end in
// the window's process, serving through the WINDOW'S OWN group. With the window's 2-rank group
// running, switching the API on starts no second group (the ditstudio-worker processes under this
// test process are counted through /proc); an API request joins the window's queue (seen in the
// window's queue model), runs on that group, shows in the gallery and answers the HTTP client.
// Switched on with no group running, the window's group is started. Switched off, the port is
// gone and the window's group keeps running. Needs DITSTUDIO_TEST_WORKER and DITSTUDIO_TEST_MODEL
// (tests/ui_serve.cmake).
#include <httplib.h>
#include <unistd.h>

#include <QDir>
#include <QFileInfo>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QtTest>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "ui/main_window.h"
#include "ui/queue_model.h"
#include "ui/worker_controller.h"

using namespace dit::ui;

namespace {

// The parent pid of `pid` (/proc/PID/stat's fourth field), -1 when gone.
pid_t parentOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return -1;
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 2));
  std::string state;
  long ppid = -1;
  rest >> state >> ppid;
  return static_cast<pid_t>(ppid);
}

// The live ditstudio-worker processes descended from this test process (other sessions' workers
// on the machine are not counted): argv[0]'s file name, read from /proc/PID/cmdline.
std::set<pid_t> workersOfThisProcess() {
  std::set<pid_t> out;
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmd(e.path() / "cmdline");
    std::string argv0;
    if (!std::getline(cmd, argv0, '\0')) continue;
    if (fs::path(argv0).filename() != "ditstudio-worker") continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    for (pid_t p = parentOf(pid); p > 1; p = parentOf(p))
      if (p == ::getpid()) {
        out.insert(pid);
        break;
      }
  }
  return out;
}

}  // namespace

class TestServe : public QObject {
  Q_OBJECT

  static QString worker() { return qEnvironmentVariable("DITSTUDIO_TEST_WORKER"); }

  std::unique_ptr<MainWindow> makeWindow(QTemporaryDir& data) {
    MainWindowOptions o;
    o.dataDir = data.path();
    o.modelDir = qEnvironmentVariable("DITSTUDIO_TEST_MODEL");
    o.workerPath = worker();
    o.restoreSession = false;
    auto w = std::make_unique<MainWindow>(o);
    // The CPU demo: 2 ranks on the tiny model.
    if (const auto demo = w->presetStore()->find("CPU demo (2 ranks)")) w->applyPreset(*demo);
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
    qunsetenv("DITSTUDIO_MPIRUN");
    qputenv("DITSTUDIO_SERVE_PORT", "0");
  }

  void servesThroughTheWindowsRunningGroup() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    QVERIFY(w->serveAction() && w->serveAction()->isCheckable());
    QVERIFY(!w->apiServe());
    QVERIFY(w->startGroup());
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Ready, 120000);
    QCOMPARE(w->controller()->world(), 2);
    const std::set<pid_t> before = workersOfThisProcess();
    QCOMPARE(before.size(), size_t(2));

    // The API's requests as the window's queue shows them.
    std::set<QString> queued;
    const auto watching = connect(w->controller(), &WorkerController::queueChanged, this, [&] {
      for (int r = 0; r < w->queueModel()->rowCount(); ++r)
        if (w->queueModel()->idAt(r).startsWith("img-")) queued.insert(w->queueModel()->idAt(r));
    });
    QSignalSpy done(w->controller(), &WorkerController::requestDone);
    const int galleryBefore = w->gallery()->count();

    w->serveAction()->setChecked(true);
    QVERIFY2(w->apiServe(), "the switch did not start the server (see the log panel)");
    const int port = w->apiServe()->port();
    QVERIFY(port > 0);
    QTest::qWait(1500);  // a second group would have started its ranks by now
    QCOMPARE(workersOfThisProcess(), before);

    // One request over HTTP, on a thread of its own (the window's event loop runs meanwhile).
    std::atomic<bool> answered{false};
    int status = 0;
    std::string body;
    std::thread client([&] {
      httplib::Client cli("127.0.0.1", port);
      cli.set_read_timeout(600, 0);
      const nlohmann::json req{{"prompt", "a large yellow star on a purple background, centre"},
                               {"size", "64x64"},
                               {"seed", 7},
                               {"steps", 6}};
      if (auto res = cli.Post("/v1/images/generations", req.dump(), "application/json")) {
        status = res->status;
        body = res->body;
      }
      answered = true;
    });
    QTRY_VERIFY_WITH_TIMEOUT(answered.load(), 300000);
    client.join();
    disconnect(watching);
    QCOMPARE(status, 200);
    const auto j = nlohmann::json::parse(body);
    QCOMPARE(j["data"].size(), size_t(1));
    QVERIFY(j["data"][0]["b64_json"].get<std::string>().size() > 100);
    QCOMPARE(j["seed"].get<int>(), 7);
    // It was in the window's queue, finished there, and its image is in the window's gallery.
    QCOMPARE(queued.size(), size_t(1));
    const QString id = *queued.begin();
    bool finished = false;
    for (const auto& a : done) finished = finished || a.at(0).toString() == id;
    QVERIFY2(finished, qPrintable(id));
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), galleryBefore + 1, 10000);
    QCOMPARE(w->queueModel()->rowOf(id), -1);
    // Still the one group: the same two ranks, nothing else started.
    QCOMPARE(workersOfThisProcess(), before);
    QCOMPARE(w->controller()->rankPids().size(), 2);
    for (qint64 p : w->controller()->rankPids()) QVERIFY(before.count(static_cast<pid_t>(p)));
    qInfo("ditstudio-worker processes: %zu before Serve API, %zu after one API request",
          before.size(), workersOfThisProcess().size());

    httplib::Client cli("127.0.0.1", port);
    auto groups = cli.Get("/v1/groups");
    QVERIFY(groups);
    const auto g = nlohmann::json::parse(groups->body)["data"];
    QCOMPARE(g.size(), size_t(1));
    QCOMPARE(g[0]["name"].get<std::string>(), std::string("gui"));
    QCOMPARE(g[0]["jobs_done"].get<int>(), 1);
    QCOMPARE(g[0]["world"].get<int>(), 2);
    auto page = cli.Get("/");
    QVERIFY(page);
    QCOMPARE(page->status, 200);

    w->serveAction()->setChecked(false);
    QVERIFY(!w->apiServe());
    httplib::Client after("127.0.0.1", port);
    after.set_connection_timeout(2, 0);
    QVERIFY(!after.Get("/v1/health"));
    QVERIFY(w->controller()->isRunning());  // the window's group is the window's
    QCOMPARE(workersOfThisProcess(), before);
    shutdown(w.get());
  }

  void startsTheWindowsGroupWhenNoneRuns() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    QVERIFY(!w->controller()->isRunning());
    w->serveAction()->setChecked(true);
    QVERIFY2(w->apiServe(), "the switch did not start the server (see the log panel)");
    QVERIFY(w->controller()->isRunning());
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Ready, 120000);
    QCOMPARE(workersOfThisProcess().size(), size_t(w->controller()->world()));
    httplib::Client cli("127.0.0.1", w->apiServe()->port());
    std::string models;
    std::atomic<bool> got{false};
    std::thread t([&] {
      if (auto r = cli.Get("/v1/models")) models = r->body;
      got = true;
    });
    QTRY_VERIFY_WITH_TIMEOUT(got.load(), 10000);
    t.join();
    QVERIFY2(models.find("\"tiny-flux\"") != std::string::npos, models.c_str());
    w->serveAction()->setChecked(false);
    shutdown(w.get());
  }
};

QTEST_MAIN(TestServe)
#include "test_ui_serve.moc"
