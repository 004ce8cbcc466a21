// The main window offscreen (QT_QPA_PLATFORM=offscreen): live validation with the worker's
// messages, presets, size stepping, mesh, advisor, gallery parameters; and a whole session
// against the scripted mpirun stand-in (image in the gallery, per-rank monitor, crash banner
// naming the rank, restart). The real worker: test_ui_integration.
#include <QAction>
#include <QComboBox>
#include <QDir>
#include <QDoubleSpinBox>
#include <QFile>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLineEdit>
#include <QListWidget>
#include <QPlainTextEdit>
#include <QSlider>
#include <QSpinBox>
#include <QTabWidget>
#include <QTemporaryDir>
#include <QtTest>
#include <filesystem>

#include "app/protocol/limits.h"
#include "strategy_util.h"
#include "ui/advisor_dialog.h"
#include "ui/generation_panel.h"
#include "ui/image_input_panel.h"
#include "ui/main_window.h"
#include "ui/preset_store.h"
#include "ui/rank_monitor_model.h"
#include "ui/strategy_editor.h"
#include "ui/theme.h"
#include "ui/worker_command.h"

using namespace dit::ui;

namespace dit::ui::testing {
QString writeFakeMpirun(const QString& dir);
}

namespace {
QString fixture() { return qEnvironmentVariable("DITSTUDIO_TEST_FIXTURE"); }

// With DITSTUDIO_UI_SNAPSHOT_DIR set, saves the window as <dir>/<name>.png (for docs and review).
void snapshot(QWidget* w, const QString& name) {
  const QString dir = qEnvironmentVariable("DITSTUDIO_UI_SNAPSHOT_DIR");
  if (!dir.isEmpty()) w->grab().save(QDir(dir).filePath(name + ".png"));
}

using dit::test::strat;
}  // namespace

class TestWidgets : public QObject {
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

 private Q_SLOTS:
  void initTestCase() {
    if (fixture().isEmpty() || !QFileInfo::exists(fixture() + "/model_index.json"))
      QSKIP("DITSTUDIO_TEST_FIXTURE does not point at tests/data/tiny-flux-A");
    fake_ = dit::ui::testing::writeFakeMpirun(fakeDir_.path());
    QVERIFY(!fake_.isEmpty());
  }

  void init() { qputenv("FAKE_MODE", "ok"); }

  void startsWithCpuDemo() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    QVERIFY(w->generationPanel()->modelInfo().ok);
    const dit::Strategy s = w->strategyEditor()->strategy();
    QCOMPARE(s.world, 2);
    QCOMPARE(s.device, std::string("cpu"));
    QVERIFY(w->validation().canGenerate());
    QVERIFY(w->startAction()->isEnabled());
    QVERIFY(w->generateAction()->isEnabled());
    QVERIFY(!w->stopAction()->isEnabled());
    QVERIFY(w->statusText().contains("stopped"));
    QCOMPARE(w->strategyEditor()->meshView()->layout().cells.size(), 2);
  }

  void invalidStrategyBlocksStart() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    const dit::Strategy bad = strat(2, 3);
    w->strategyEditor()->setStrategy(bad);
    const auto expected = dit::validateForModel(bad, w->generationPanel()->modelInfo().dims());
    QVERIFY(!expected.empty());
    QVERIFY(!w->startAction()->isEnabled());
    QVERIFY(!w->generateAction()->isEnabled());
    for (const auto& i : expected)
      QVERIFY2(w->strategyEditor()->issuesText().contains(QString::fromStdString(i.message)),
               qPrintable(w->strategyEditor()->issuesText()));
    QVERIFY(!w->strategyEditor()->meshView()->layout().valid);
    QVERIFY(!w->startGroup());
    snapshot(w.get(), "invalid-strategy");
    QVERIFY(w->generate().isEmpty());
    QVERIFY(!w->controller()->isRunning());
    QCOMPARE(w->controller()->state(), WorkerController::State::Stopped);
    QVERIFY(w->bannerVisible());
    QVERIFY(w->bannerText().contains(QString::fromStdString(expected.front().message)));
    // Fixing it enables Start again, live.
    w->strategyEditor()->tpSpin()->setValue(2);
    QVERIFY(w->startAction()->isEnabled());
  }

  void requestIssuesBlockGenerateOnly() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    w->strategyEditor()->setStrategy(strat(2, 1, 1, 1, 2));
    QVERIFY(w->startAction()->isEnabled());
    QVERIFY(!w->generateAction()->isEnabled());
    QVERIFY(w->strategyEditor()->issuesText().contains("cfg_degree 2 needs true CFG"));
    GenerationParams p = w->generationPanel()->params();
    p.negative_prompt = "blurry";
    p.options["true_cfg_scale"] = 3;
    w->generationPanel()->setParams(p);
    QVERIFY(w->generateAction()->isEnabled());
    QVERIFY(w->strategyEditor()->issuesText().isEmpty());
    // A CFG scale above 1 with an empty negative prompt box: true CFG against "" (the embedded
    // model's setting); at scale 1 an empty box is no negative prompt, and cfg 2 is refused.
    p.negative_prompt = "";
    p.options["true_cfg_scale"] = 5;
    w->generationPanel()->setParams(p);
    QVERIFY(w->generationPanel()->params().hasNegativePrompt());
    QVERIFY(w->generateAction()->isEnabled());
    p.options["true_cfg_scale"] = 1;
    w->generationPanel()->setParams(p);
    QVERIFY(!w->generationPanel()->params().hasNegativePrompt());
    QVERIFY(!w->generateAction()->isEnabled());
  }

  void missingModel() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    w->generationPanel()->setModelDir(data.filePath("nothing-here"));
    QVERIFY(!w->generationPanel()->modelInfo().ok);
    QVERIFY(!w->startAction()->isEnabled());
    QVERIFY(!w->startGroup());
    QVERIFY(w->bannerText().contains("does not exist"));
    QVERIFY(!w->controller()->isRunning());
  }

  // The spin boxes accept exactly what the worker accepts: their ranges come from the one limits
  // table (app/protocol/limits), not from constants of their own (issue 16).
  void spinBoxRangesAreTheLimitsTable() {
    using dit::protocol::requestLimit;
    QTemporaryDir data;
    auto w = makeWindow(data);
    GenerationPanel* g = w->generationPanel();
    QCOMPARE(g->widthSpin()->maximum(), static_cast<int>(requestLimit("width").hi));
    QCOMPARE(g->heightSpin()->maximum(), static_cast<int>(requestLimit("height").hi));
    QCOMPARE(g->stepsSpin()->minimum(), static_cast<int>(requestLimit("steps").lo));
    QCOMPARE(g->stepsSpin()->maximum(), static_cast<int>(requestLimit("steps").hi));
    QCOMPARE(g->guidanceSpin()->minimum(), requestLimit("guidance").lo);
    QCOMPARE(g->guidanceSpin()->maximum(), requestLimit("guidance").hi);
    // A family knob's row takes the knob's declared range (FLUX.1's true CFG scale: 0 .. 100).
    QVERIFY(g->modelInfo().request.field("true_cfg_scale"));
    QCOMPARE(g->knobSpin("true_cfg_scale")->maximum(),
             g->modelInfo().request.field("true_cfg_scale")->max);
    QCOMPARE(g->imagesSpin()->minimum(), static_cast<int>(requestLimit("num_images").lo));
    QCOMPARE(g->imagesSpin()->maximum(), static_cast<int>(requestLimit("num_images").hi));
    // strength (0, 1] in hundredths: 0 is excluded by the table's exclusive lower bound.
    const auto& st = requestLimit("strength");
    QVERIFY(st.lo_exclusive);
    QVERIFY(!st.accepts(0.0) && st.accepts(0.01) && st.accepts(1.0) && !st.accepts(1.01));
    QCOMPARE(g->imagePanel()->strengthSlider()->minimum(), 1);
    QCOMPARE(g->imagePanel()->strengthSlider()->maximum(), 100);
    // The largest value each box offers is accepted by the worker's check, one past is not.
    QVERIFY(requestLimit("steps").accepts(g->stepsSpin()->maximum()));
    QVERIFY(!requestLimit("steps").accepts(g->stepsSpin()->maximum() + 1));
    QVERIFY(requestLimit("num_images").accepts(g->imagesSpin()->maximum()));
    QVERIFY(!requestLimit("num_images").accepts(g->imagesSpin()->maximum() + 1));
  }

  // A model that declares default settings (model_index.json "_dit_studio_default_settings",
  // as the embedded model does) starts the panel with them when it is chosen; the prompt is
  // kept, and choosing a model without any keeps the current settings.
  void modelDefaultSettingsAppliedWhenChosen() {
    QTemporaryDir data, copy;
    std::filesystem::copy(fixture().toStdString(), copy.path().toStdString(),
                          std::filesystem::copy_options::recursive);
    {
      QFile f(copy.filePath("model_index.json"));
      QVERIFY(f.open(QIODevice::ReadOnly));
      QJsonObject mi = QJsonDocument::fromJson(f.readAll()).object();
      f.close();
      mi["_dit_studio_default_settings"] =
          QJsonObject{{"steps", 21}, {"negative_prompt", ""}, {"true_cfg_scale", 5.0}};
      QVERIFY(f.open(QIODevice::WriteOnly | QIODevice::Truncate));
      f.write(QJsonDocument(mi).toJson());
    }
    auto w = makeWindow(data);
    GenerationPanel* g = w->generationPanel();
    QCOMPARE(g->knobSpin("true_cfg_scale")->value(), 1.0);
    g->promptEdit()->setPlainText("a large red circle on a blue background, centre");
    g->setModelDir(copy.path());
    QVERIFY(g->modelInfo().ok);
    QCOMPARE(g->knobSpin("true_cfg_scale")->value(), 5.0);
    QCOMPARE(g->stepsSpin()->value(), 21);
    QVERIFY(g->modelInfo().resolve(g->params()).cfg);
    QCOMPARE(g->params().prompt, std::string("a large red circle on a blue background, centre"));
    QVERIFY(g->modelInfo().summary().contains("default settings"));
    g->setModelDir(fixture());
    QCOMPARE(g->knobSpin("true_cfg_scale")->value(), 5.0);
    QCOMPARE(g->stepsSpin()->value(), 21);
  }

  void sizeStepsByModelMultiple() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    QSpinBox* width = w->generationPanel()->widthSpin();
    QCOMPARE(width->singleStep(), 4);  // 2 x vae_scale_factor 2
    width->setValue(66);
    QMetaObject::invokeMethod(width, "editingFinished");
    QCOMPARE(width->value(), 68);
    width->stepBy(1);
    QCOMPARE(width->value(), 72);
  }

  void presets() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    PresetPanel* pp = w->presetPanel();
    QCOMPARE(pp->list()->count(), 6);
    pp->select("4 GPUs, Ulysses");
    w->applyPreset(*w->presetStore()->find(pp->selectedName()));
    QCOMPARE(w->strategyEditor()->strategy().ulysses_degree, 4);
    QCOMPARE(w->strategyEditor()->strategy().device, std::string("cuda"));
    // The strategy only: the panel's size stays (the preset's settings load only when asked).
    QCOMPARE(w->generationPanel()->params().width, 64);
    w->applyPreset(*w->presetStore()->find(pp->selectedName()), true);
    QCOMPARE(w->generationPanel()->params().width, 1024);
    QCOMPARE(w->strategyEditor()->meshView()->layout().cols, 4);
    w->applyPreset(*w->presetStore()->find("8 GPUs, unified (ring 2 x Ulysses 4)"));
    w->findChild<QTabWidget*>()->setCurrentIndex(1);
    snapshot(w.get(), "strategy-tab");
    w->findChild<QTabWidget*>()->setCurrentIndex(2);
    snapshot(w.get(), "presets-tab");
    w->applyPreset(*w->presetStore()->find("4 GPUs, Ulysses"));
    w->strategyEditor()->ringSpin()->setValue(2);
    w->strategyEditor()->worldSpin()->setValue(8);
    QVERIFY(pp->saveCurrentAs("my rig"));
    QCOMPARE(pp->list()->count(), 7);
    QCOMPARE(pp->selectedName(), QString("my rig"));
    QVERIFY(pp->renameSelected("my 8-GPU rig"));
    QVERIFY(!pp->renameSelected("1 GPU"));
    QVERIFY(!pp->lastError().isEmpty());
    QVERIFY(pp->exportSelected(data.filePath("rig.json")));
    QVERIFY(pp->deleteSelected());
    QCOMPARE(pp->list()->count(), 6);
    QVERIFY(pp->importFile(data.filePath("rig.json")));
    auto p = w->presetStore()->find("my 8-GPU rig");
    QVERIFY(p);
    QCOMPARE(p->strategy.world, 8);
    QCOMPARE(p->strategy.ring_degree, 2);
    pp->select("1 GPU");
    QVERIFY(!pp->deleteSelected());
  }

  // Issue 18: the multi-host fields are saved in a preset, restored from it, and reach mpirun's
  // command line (with a hostfile only).
  void multiHostFieldsInPresets() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    StrategyEditor* e = w->strategyEditor();
    e->hostfileEdit()->setText(data.filePath("hosts"));
    e->networkEdit()->setText(" 10.77.0.0/24 ");
    e->portRangeEdit()->setText("50000-50099");
    e->sshOptionsEdit()->setText("-i /k -p 2222");
    e->mpirunArgsEdit()->setText("--display-map");
    const QString args = buildLaunchCommand(w->launchConfig()).arguments.join(' ');
    QVERIFY2(args.contains("--mca btl_tcp_if_include 10.77.0.0/24"), qPrintable(args));
    QVERIFY2(args.contains("--mca oob_tcp_dynamic_ipv4_ports 50000-50024 --mca "
                           "btl_tcp_port_min_v4 50025 --mca btl_tcp_port_range_v4 75"),
             qPrintable(args));
    QVERIFY2(args.contains("-o BatchMode=yes -o ConnectTimeout=10 -i /k -p 2222"),
             qPrintable(args));
    QVERIFY2(args.contains("--display-map"), qPrintable(args));
    QVERIFY(w->presetPanel()->saveCurrentAs("two hosts"));
    e->setHostfile("");
    e->setHostSettings(HostSettings{});
    QVERIFY(!buildLaunchCommand(w->launchConfig()).arguments.join(' ').contains("BatchMode"));
    w->applyPreset(*w->presetStore()->find("two hosts"));
    QCOMPARE(e->hostfile(), data.filePath("hosts"));
    QCOMPARE(e->hostSettings().networkInterface, QString("10.77.0.0/24"));
    QCOMPARE(e->hostSettings().portRange, QString("50000-50099"));
    QCOMPARE(e->hostSettings().sshOptions, QString("-i /k -p 2222"));
    QCOMPARE(e->hostSettings().mpirunArgs, QString("--display-map"));
    // Written to the user's presets file.
    PresetStore again(data.path());
    QVERIFY(again.load());
    QVERIFY(again.find("two hosts"));
    QCOMPARE(again.find("two hosts")->hosts.networkInterface, QString("10.77.0.0/24"));
  }

  // Issue 47: the group's run options in the window (Strategy tab): the worker starts with them,
  // a preset keeps them, a change while the group runs means a restart, and a bad value in a
  // presets file is refused with the preset's name.
  void runOptionsInTheLaunchAndPresets() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    StrategyEditor* e = w->strategyEditor();
    // Defaults: no run-option flag on the worker's command line.
    QCOMPARE(e->vaeTilingSpin()->text(), QString("off"));
    QCOMPARE(e->promptCacheSpin()->text(), QString("off"));
    QString args = buildLaunchCommand(w->launchConfig()).arguments.join(' ');
    QVERIFY2(!args.contains("--text-encoder-placement") && !args.contains("--prompt-cache") &&
                 !args.contains("--vae-tiling"),
             qPrintable(args));
    e->textEncoderCombo()->setCurrentText("once");
    e->promptCacheSpin()->setValue(4);
    e->vaeTilingSpin()->setValue(256);
    args = buildLaunchCommand(w->launchConfig()).arguments.join(' ');
    QVERIFY2(args.contains("--vae-tiling 256 --text-encoder-placement once --prompt-cache 4"),
             qPrintable(args));
    QVERIFY(w->presetPanel()->saveCurrentAs("encoder once"));
    e->setRunOptions(dit::protocol::RunOptions{});
    QCOMPARE(e->textEncoderCombo()->currentText(), QString("sharded"));
    w->applyPreset(*w->presetStore()->find("encoder once"));
    QCOMPARE(e->runOptions().text_encoder_placement, std::string("once"));
    QCOMPARE(e->runOptions().prompt_cache, 4);
    QCOMPARE(e->runOptions().vae_tiling, 256);
    PresetStore again(data.path());
    QVERIFY(again.load());
    QVERIFY(again.find("encoder once"));
    QCOMPARE(again.find("encoder once")->run.text_encoder_placement, std::string("once"));
    QJsonObject j = again.find("encoder once")->toJson();
    QCOMPARE(j.value("run").toObject().value("prompt_cache").toInt(), 4);
    // A placement no worker takes (from a newer build, say) falls back to the default; the
    // preset and its other run options are kept (dropping it would lose it at the next save).
    QJsonObject run = j.value("run").toObject();
    run["text_encoder_placement"] = "everywhere";
    j["run"] = run;
    const auto kept = Preset::fromJson(j);
    QVERIFY(kept.has_value());
    QCOMPARE(kept->run.text_encoder_placement, std::string("sharded"));
    QCOMPARE(kept->run.prompt_cache, 4);
    QCOMPARE(kept->run.vae_tiling, 256);
  }

  void advisorApplies() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    Q_EMIT w->strategyEditor()->advisorRequested();
    auto* dlg = w->findChild<AdvisorDialog*>();
    QVERIFY(dlg);
    AdvisorInput in = dlg->input();
    QCOMPARE(in.transformer.num_attention_heads, 4);
    // The model's own declaration (the tiny fixture's table and plan), not a rebuilt config.
    QVERIFY(in.transformer.parameters && in.transformer.tensor_parallel_plan);
    QCOMPARE(in.transformer.parameters.get(),
             w->generationPanel()->modelInfo().dims().parameters.get());
    QCOMPARE(in.interconnect, Interconnect::CPU);
    in.num_devices = 4;
    dlg->setInput(in);
    QCOMPARE(dlg->advice().strategy.world, 4);
    Q_EMIT dlg->applyRequested(dlg->advice().strategy);
    QCOMPARE(w->strategyEditor()->strategy().world, 4);
    QCOMPARE(w->strategyEditor()->strategy().ring_degree, 4);
    QVERIFY(w->validation().canGenerate());
  }

  void sessionWithFakeWorker() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    GenerationParams p = w->generationPanel()->params();
    p.steps = 3;
    w->generationPanel()->setParams(p);
    const QString id = w->generate();
    QVERIFY(!id.isEmpty());
    QVERIFY(w->controller()->isRunning());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, 15000);
    QCOMPARE(w->historyStore()->entries().first().seed, std::uint64_t(4242));
    QCOMPARE(w->generationPanel()->lastSeed(), std::uint64_t(4242));
    QVERIFY(!w->gallery()->currentImage().isNull());
    // Per-rank monitor.
    RankMonitorModel* m = w->rankModel();
    QCOMPARE(m->world(), 2);
    QCOMPARE(m->pid(1), 5001);
    QVERIFY(m->samples(0).size() >= 3);
    // After the request every rank is idle (the worker's last `ranks` event); the step time of
    // the last step stays.
    QTRY_COMPARE_WITH_TIMEOUT(m->stats(1).stage, QString("idle"), 5000);
    QCOMPARE(m->stats(1).step_ms, 5.0);
    QVERIFY(m->stats(0).rss > 0);
    QVERIFY(w->rankMonitor()->seriesCount() >= 2);
    QVERIFY(w->logPanel()->text().contains("starting:"));
    QTRY_VERIFY_WITH_TIMEOUT(w->statusText().contains("ready"), 5000);
    QVERIFY(w->stopAction()->isEnabled());
    // History persisted.
    HistoryStore h(data.path());
    QVERIFY(h.load());
    QCOMPARE(h.entries().size(), 1);
    // Strategy changed while running: Generate restarts the group with it.
    w->strategyEditor()->setStrategy(strat(4, 1, 4));
    QVERIFY(w->statusText().contains("strategy changed"));
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 2, 15000);
    QCOMPARE(w->controller()->config().strategy.world, 4);
    QCOMPARE(w->rankModel()->world(), 4);
    // A run option changed while running (issue 47): also a restart, with the option.
    QTRY_VERIFY_WITH_TIMEOUT(w->statusText().contains("ready"), 5000);
    QVERIFY(!w->statusText().contains("strategy changed"));
    w->strategyEditor()->textEncoderCombo()->setCurrentText("once");
    QVERIFY2(w->statusText().contains("strategy changed"), qPrintable(w->statusText()));
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 3, 15000);
    QCOMPARE(w->controller()->config().run.text_encoder_placement, std::string("once"));
    QVERIFY(
        w->controller()->command().arguments.join(' ').contains("--text-encoder-placement once"));
    w->stopGroup();
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Stopped, 10000);
  }

  // Issue 36: each rank's BLAS core (from its hello event) in the monitor: in the Place tooltip,
  // and in the Place column itself where it differs from rank 0's.
  void rankMonitorShowsBlasCore() {
    RankMonitorModel m;
    m.reset(2);
    m.setPlace(0, "host-a", "cpu");
    m.setPlace(1, "host-b", "cpu");
    m.setBlas(0, "SkylakeX", "OpenBLAS 0.3.21, core SkylakeX (auto)");
    m.setBlas(1, "SkylakeX", "OpenBLAS 0.3.21, core SkylakeX (auto)");
    QCOMPARE(m.blasCore(1), QString("SkylakeX"));
    QCOMPARE(m.place(1), QString("host-b · cpu"));
    const QString tip = m.data(m.index(1, RankMonitorModel::Place), Qt::ToolTipRole).toString();
    QVERIFY2(tip.contains("BLAS: OpenBLAS 0.3.21, core SkylakeX (auto)"), qPrintable(tip));
    m.setBlas(1, "Prescott", "OpenBLAS 0.3.21, core Prescott (fallback)");
    QCOMPARE(m.place(1), QString("host-b · cpu · BLAS Prescott"));
    QCOMPARE(m.place(0), QString("host-a · cpu"));
  }

  void crashShowsRankAndRecovers() {
    qputenv("FAKE_MODE", "crash");
    QTemporaryDir data;
    auto w = makeWindow(data);
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Failed, 15000);
    QVERIFY(w->bannerVisible());
    QVERIFY2(w->bannerText().contains("Rank 1"), qPrintable(w->bannerText()));
    QVERIFY(w->bannerText().contains("signal 9"));
    QVERIFY(w->rankModel()->failed(1));
    snapshot(w.get(), "rank-failed");
    QVERIFY(w->restartAction()->isEnabled());
    QVERIFY(w->startAction()->isEnabled());
    qputenv("FAKE_MODE", "ok");
    QVERIFY(w->restartGroup());
    QVERIFY(!w->bannerVisible());
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Ready, 15000);
    QVERIFY(!w->rankModel()->failed(1));
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, 15000);
  }

  void openParametersFromPng() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    QString err;
    QVERIFY2(w->gallery()->openPng(fakeDir_.filePath("out.png"), &err), qPrintable(err));
    const GenerationParams p = w->generationPanel()->params();
    QCOMPARE(QString::fromStdString(p.prompt), QString("fake"));
    QCOMPARE(p.seed, std::uint64_t(4242));
    QCOMPARE(p.steps, 1);
    QVERIFY(!p.random_seed);
  }

  void closeStopsTheGroup() {
    QTemporaryDir data;
    auto w = makeWindow(data);
    QVERIFY(w->startGroup());
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Ready, 15000);
    w->close();
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Stopped, 10000);
    QTRY_VERIFY_WITH_TIMEOUT(!w->isVisible(), 5000);
    // The session was saved.
    QVERIFY(QFileInfo::exists(data.filePath("session.json")));
  }
};

QTEST_MAIN(TestWidgets)
#include "test_ui_widgets.moc"
