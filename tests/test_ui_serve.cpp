// The GUI's "Serve API" switch (ui/api_serve.h): ditstudio-server's code in the window's process
// over a group of its own on the embedded model. Switched on, it answers the OpenAI Images API
// and the page on 127.0.0.1; switched off, its group and port are gone. Needs
// DITSTUDIO_TEST_WORKER and DITSTUDIO_TEST_MODEL (tests/ui_serve.cmake).
#include <httplib.h>

#include <QFileInfo>
#include <QTemporaryDir>
#include <QtTest>
#include <memory>
#include <nlohmann/json.hpp>

#include "ui/main_window.h"

using namespace dit::ui;

class TestServe : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void initTestCase() {
    const QString worker = qEnvironmentVariable("DITSTUDIO_TEST_WORKER");
    if (worker.isEmpty() || !QFileInfo(worker).isExecutable())
      QSKIP("DITSTUDIO_TEST_WORKER is not an executable ditstudio-worker");
    qunsetenv("DITSTUDIO_MPIRUN");
    qputenv("DITSTUDIO_SERVE_PORT", "0");
  }

  void serveSwitch() {
    QTemporaryDir data;
    MainWindowOptions o;
    o.dataDir = data.path();
    o.modelDir = qEnvironmentVariable("DITSTUDIO_TEST_MODEL");
    o.workerPath = qEnvironmentVariable("DITSTUDIO_TEST_WORKER");
    o.restoreSession = false;
    MainWindow w(o);
    QVERIFY(w.serveAction() && w.serveAction()->isCheckable());
    QVERIFY(!w.apiServe());
    w.serveAction()->setChecked(true);
    QVERIFY2(w.apiServe(), "the switch did not start the server (see the log panel)");
    const int port = w.apiServe()->port();
    QVERIFY(port > 0);

    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(600, 0);
    const nlohmann::json body{{"prompt", "a large yellow star on a purple background, centre"},
                              {"size", "64x64"},
                              {"seed", 7},
                              {"steps", 4}};
    auto res = cli.Post("/v1/images/generations", body.dump(), "application/json");
    QVERIFY(res);
    QCOMPARE(res->status, 200);
    const auto j = nlohmann::json::parse(res->body);
    QCOMPARE(j["data"].size(), size_t(1));
    QVERIFY(j["data"][0]["b64_json"].get<std::string>().size() > 100);
    QCOMPARE(j["seed"].get<int>(), 7);
    auto page = cli.Get("/");
    QVERIFY(page);
    QCOMPARE(page->status, 200);
    QVERIFY(page->body.find("DiT Studio") != std::string::npos);
    auto groups = cli.Get("/v1/groups");
    QVERIFY(groups);
    const auto g = nlohmann::json::parse(groups->body)["data"];
    QCOMPARE(g.size(), size_t(1));
    QCOMPARE(g[0]["name"].get<std::string>(), std::string("gui"));
    QCOMPARE(g[0]["jobs_done"].get<int>(), 1);
    // The window's own group was never started: the served group is the server's.
    QVERIFY(!w.controller()->isRunning());

    w.serveAction()->setChecked(false);
    QVERIFY(!w.apiServe());
    httplib::Client after("127.0.0.1", port);
    after.set_connection_timeout(2, 0);
    QVERIFY(!after.Get("/v1/health"));
  }
};

QTEST_MAIN(TestServe)
#include "test_ui_serve.moc"
