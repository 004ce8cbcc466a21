// The model and its components are part of the request (issue 45): the window's fields for the
// CLI's --config, --vae, --text-encoder, --text-encoder-2, --tokenizer and --tokenizer-2, offered
// when the chosen file lacks a component; passed to the worker group; recorded in presets, the
// history and the PNG's metadata; restored by "Use parameters" and by loading a preset (or the
// paths missing on this machine named).
//
// With the real worker (DITSTUDIO_TEST_WORKER) and CLI (DITSTUDIO_TEST_CLI), ggufRoundTrip picks
// the GGUF transformer of tests/data/tiny-flux-gguf-A, gives its config folder, VAE and text
// encoders in the window's fields, generates on 2 ranks (ring 2), and checks that "Use
// parameters" with another model loaded, and a preset after a restart, restore the model, its
// components, the strategy and every field, and that the window's PNG equals the CLI's run of
// the same request pixel for pixel.
#include <QCheckBox>
#include <QDir>
#include <QFileInfo>
#include <QImage>
#include <QJsonArray>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QProcess>
#include <QPushButton>
#include <QTemporaryDir>
#include <QToolButton>
#include <QtTest>
#include <memory>

#include "ui/gallery.h"
#include "ui/generation_panel.h"
#include "ui/history_store.h"
#include "ui/main_window.h"
#include "ui/preset_panel.h"
#include "ui/preset_store.h"
#include "ui/strategy_editor.h"
#include "ui/strategy_json.h"
#include "ui/worker_command.h"

using namespace dit::ui;

namespace {

QString data() { return qEnvironmentVariable("DITSTUDIO_TEST_DATA"); }
QString ggufRoot() { return data() + "/tiny-flux-gguf-A"; }
QString ggufFile() { return ggufRoot() + "/gguf/transformer-Q4_K_S.gguf"; }
QString otherModel() { return data() + "/tiny-flux-A"; }
QString worker() { return qEnvironmentVariable("DITSTUDIO_TEST_WORKER"); }
QString cli() { return qEnvironmentVariable("DITSTUDIO_TEST_CLI"); }

/// The GGUF file's components, as a user gives them.
ModelSourcePaths ggufSources() {
  ModelSourcePaths s;
  s.model = ggufFile();
  s.components.config = ggufRoot();
  s.components.vae = ggufRoot() + "/vae";
  s.components.textEncoder = ggufRoot() + "/text_encoder";
  s.components.textEncoder2 = ggufRoot() + "/text_encoder_2";
  return s;
}

/// Types `text` into a field as a user does (the field reads it when editing finishes).
void typeInto(QLineEdit* e, const QString& text) {
  e->setFocus();
  e->selectAll();
  e->setText(text);
  Q_EMIT e->editingFinished();
}

dit::Strategy strat(int world, int ring = 1, int tp = 1) {
  dit::Strategy s;
  s.world = world;
  s.device = "cpu";
  s.ring_degree = ring;
  s.tp_degree = tp;
  return s;
}

/// The request the round trip makes: every field away from its default.
GenerationParams request(GenerationParams p) {
  p.prompt = "a photo of a cat";
  p.negative_prompt = "blurry";
  p.options["true_cfg_scale"] = 2.0;
  p.width = 32;
  p.height = 48;
  p.steps = 3;
  p.guidance = 2.5;
  p.seed = 1234;
  p.random_seed = false;
  p.num_images = 1;
  return p;
}

/// Every field of `want` is in `got` (what the panel shows after a restore).
QString differences(const GenerationParams& got, const GenerationParams& want) {
  QStringList d;
  if (got.prompt != want.prompt) d << "prompt";
  if (got.negative_prompt != want.negative_prompt) d << "negative_prompt";
  if (got.options != want.options) d << "options";
  if (got.width != want.width) d << "width";
  if (got.height != want.height) d << "height";
  if (got.steps != want.steps) d << "steps";
  if (got.guidance != want.guidance) d << "guidance";
  if (got.seed != want.seed) d << "seed";
  if (got.random_seed != want.random_seed) d << "random_seed";
  if (got.num_images != want.num_images) d << "num_images";
  return d.join(", ");
}

QPushButton* buttonNamed(QWidget* w, const QString& text) {
  for (QPushButton* b : w->findChildren<QPushButton*>())
    if (b->text() == text) return b;
  return nullptr;
}

}  // namespace

class TestUiModelSources : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void initTestCase() {
    QVERIFY2(QFileInfo::exists(ggufFile()), qPrintable(ggufFile() + " is missing"));
    QVERIFY2(QFileInfo::exists(otherModel() + "/model_index.json"), qPrintable(otherModel()));
    qunsetenv("DITSTUDIO_MPIRUN");
  }

  // The record: "model" and "components" (only those given), read back as written; a component
  // missing on this machine is named with its flag.
  void recordsTheModelAndComponents() {
    const ModelSourcePaths s = ggufSources();
    QJsonObject j{{"prompt", "x"}};
    s.writeTo(j);
    QCOMPARE(j.value("model").toString(), ggufFile());
    const QJsonObject c = j.value("components").toObject();
    QCOMPARE(c.keys(), (QStringList{"config", "text_encoder", "text_encoder_2", "vae"}));
    QCOMPARE(ModelSourcePaths::readFrom(j), s);
    QVERIFY(s.missingHere().isEmpty());
    ModelSourcePaths gone = s;
    gone.components.vae = "/nonexistent/ae.safetensors";
    QCOMPARE(gone.missingHere(), QStringList{"VAE (--vae): /nonexistent/ae.safetensors"});
    // No components: no key (a folder model's record stays as it was).
    QJsonObject f{{"components", QJsonObject{{"vae", "/old"}}}};
    ModelSourcePaths{otherModel(), {}}.writeTo(f);
    QVERIFY(!f.contains("components"));
    // A preset keeps them through its JSON; one without a model (the built-ins) has none.
    Preset p;
    p.name = "gguf";
    p.strategy = strat(2, 2);
    p.model = s;
    const auto back = Preset::fromJson(p.toJson());
    QVERIFY(back);
    QCOMPARE(back->model, s);
    Preset none;
    none.name = "none";
    none.strategy = strat(1);
    QVERIFY(!none.toJson().contains("model"));
    QVERIFY(Preset::fromJson(none.toJson())->model.model.isEmpty());
    // The reader's errors name the flag to give.
    QCOMPARE(flagAskedFor("x.gguf: has no vae (give one with --vae), no text_encoder (give one "
                          "with --text-encoder)"),
             QStringLiteral("--vae"));
    QCOMPARE(flagAskedFor("x: give a diffusers config folder with --config"),
             QStringLiteral("--config"));
    QCOMPARE(flagAskedFor("/a/b: no such file or folder (--text-encoder-2)"),
             QStringLiteral("--text-encoder-2"));
    QCOMPARE(flagAskedFor("model folder does not exist"), QString());
  }

  // The worker group gets the components as the CLI passes them on.
  void workerArgsCarryTheComponents() {
    LaunchConfig c;
    c.strategy = strat(2, 2);
    c.modelDir = ggufFile();
    c.components = ggufSources().components;
    c.workerPath = "/opt/ditstudio-worker";
    c.extraWorkerArgs = {"--dtype", "float32"};
    const QStringList a = buildLaunchCommand(c).arguments;
    const int at = static_cast<int>(a.indexOf("--config"));
    QVERIFY2(at > a.indexOf("--model"), qPrintable(a.join(' ')));
    QCOMPARE(a.mid(at, 8), (QStringList{"--config", ggufRoot(), "--vae", ggufRoot() + "/vae",
                                        "--text-encoder", ggufRoot() + "/text_encoder",
                                        "--text-encoder-2", ggufRoot() + "/text_encoder_2"}));
    QCOMPARE(a.mid(at + 8, 2), (QStringList{"--dtype", "float32"}));
  }

  // Choosing a GGUF file opens the component rows and marks the one the reader asks for; the
  // model reads once they are given.
  void offersTheComponentsTheFileLacks() {
    GenerationPanel panel;
    panel.resize(420, 900);
    panel.show();
    panel.setSources(ModelSourcePaths{otherModel(), {}});
    QVERIFY(panel.modelInfo().ok);
    QVERIFY(!panel.componentsToggle()->isVisible());  // a diffusers folder needs none
    QVERIFY(!panel.componentsBox()->isVisible());
    panel.setModelDir(ggufFile());
    QVERIFY(!panel.modelInfo().ok);
    QVERIFY(panel.componentsToggle()->isChecked());
    QVERIFY(panel.componentsBox()->isVisible());
    const QString asked = panel.askedComponent();
    QVERIFY2(asked == "--vae" || asked == "--text-encoder" || asked == "--config",
             qPrintable(asked + " from " + panel.modelInfo().error));
    const ModelComponents::Field* f = ModelComponents::fieldForFlag(asked);
    QVERIFY(f);
    QLineEdit* field = panel.componentEdit(QLatin1String(f->key));
    QVERIFY(field->property("invalid").toBool());
    QCOMPARE(field->toolTip(), panel.modelInfo().error);
    const ModelSourcePaths s = ggufSources();
    typeInto(panel.componentEdit("config"), s.components.config);
    typeInto(panel.componentEdit("vae"), s.components.vae);
    typeInto(panel.componentEdit("text_encoder"), s.components.textEncoder);
    QVERIFY(!panel.modelInfo().ok);
    QCOMPARE(panel.askedComponent(), QStringLiteral("--text-encoder-2"));
    QVERIFY(panel.componentEdit("text_encoder_2")->property("invalid").toBool());
    QVERIFY(!panel.componentEdit("vae")->property("invalid").toBool());
    typeInto(panel.componentEdit("text_encoder_2"), s.components.textEncoder2);
    QVERIFY2(panel.modelInfo().ok, qPrintable(panel.modelInfo().error));
    QVERIFY(panel.askedComponent().isEmpty());
    QCOMPARE(panel.sources(), s);
    QCOMPARE(panel.modelInfo().num_attention_heads, 4);
    QCOMPARE(panel.modelInfo().attention_head_dim, 64);
    QVERIFY2(panel.modelInfo().component("transformer")->storage.contains("Q4_K"),
             qPrintable(panel.modelInfo().component("transformer")->storage));
    // "Default" returns to the embedded model without another model's components.
    QPushButton* deflt = buttonNamed(&panel, "Default");
    QVERIFY(deflt);
    deflt->click();
    QVERIFY(panel.components().isEmpty());
  }

  // Loading a preset whose files are not on this machine names them and keeps the model.
  void missingFilesNamedOnLoad() {
    QTemporaryDir dir;
    MainWindowOptions o;
    o.dataDir = dir.path();
    o.modelDir = otherModel();
    o.restoreSession = false;
    o.mpirunPath = "/nonexistent/mpirun";
    MainWindow w(o);
    Preset p;
    p.name = "elsewhere";
    p.strategy = strat(1);
    p.model = ggufSources();
    p.model.components.vae = "/nonexistent/ae.safetensors";
    p.hasGeneration = true;
    p.generation = request(w.generationPanel()->params());
    w.applyPreset(p, true);
    QVERIFY(w.bannerVisible());
    QVERIFY2(w.bannerText().contains("VAE (--vae): /nonexistent/ae.safetensors"),
             qPrintable(w.bannerText()));
    QVERIFY2(w.bannerText().contains("preset \"elsewhere\""), qPrintable(w.bannerText()));
    QCOMPARE(w.generationPanel()->sources(), (ModelSourcePaths{otherModel(), {}}));
    // The generation settings still load.
    QCOMPARE(differences(w.generationPanel()->params(), p.generation), QString());
  }

  // The program's own flags (ditstudio --model FILE --config DIR --vae P ...) reach the panel.
  void programFlagsGiveTheComponents() {
    QTemporaryDir dir;
    MainWindowOptions o;
    o.dataDir = dir.path();
    o.modelDir = ggufFile();
    o.components = ggufSources().components;
    o.restoreSession = false;
    o.mpirunPath = "/nonexistent/mpirun";
    MainWindow w(o);
    QCOMPARE(w.generationPanel()->sources(), ggufSources());
    QVERIFY2(w.generationPanel()->modelInfo().ok,
             qPrintable(w.generationPanel()->modelInfo().error));
    QCOMPARE(w.launchConfig().components, ggufSources().components);
  }

  // `ditstudio --headless` with a GGUF file and its components runs ditstudio-cli with them.
  void headlessRunTakesTheComponents() {
    const QString gui = qEnvironmentVariable("DITSTUDIO_TEST_GUI");
    if (gui.isEmpty() || !QFileInfo(gui).isExecutable())
      QSKIP("DITSTUDIO_TEST_GUI is not an executable ditstudio");
    if (worker().isEmpty() || cli().isEmpty()) QSKIP("needs the worker and ditstudio-cli");
    QTemporaryDir dir;
    const ModelSourcePaths s = ggufSources();
    QProcess proc;
    proc.setWorkingDirectory(dir.path());
    proc.setProcessChannelMode(QProcess::MergedChannels);
    proc.start(gui, {"--headless", "--model", s.model, "--config", s.components.config, "--vae",
                     s.components.vae, "--text-encoder", s.components.textEncoder,
                     "--text-encoder-2=" + s.components.textEncoder2});
    QVERIFY(proc.waitForFinished(300000));
    const QByteArray log = proc.readAll();
    QVERIFY2(proc.exitCode() == 0, log.constData());
    QVERIFY2(log.contains("--vae " + s.components.vae.toUtf8()), log.constData());
    const QImage img(dir.filePath("ditstudio-output.png"));
    QVERIFY2(!img.isNull(), log.constData());
  }

  // The round trip with the real worker and CLI (see the file comment).
  void ggufRoundTrip() {
    if (worker().isEmpty() || !QFileInfo(worker()).isExecutable())
      QSKIP("DITSTUDIO_TEST_WORKER is not an executable ditstudio-worker");
    if (cli().isEmpty() || !QFileInfo(cli()).isExecutable())
      QSKIP("DITSTUDIO_TEST_CLI is not an executable ditstudio-cli");
    QTemporaryDir dir;
    MainWindowOptions o;
    o.dataDir = dir.path();
    o.modelDir = ggufFile();
    o.workerPath = worker();
    o.restoreSession = false;
    const ModelSourcePaths made = ggufSources();
    const dit::Strategy ring2 = strat(2, 2);
    GenerationParams want;
    QString guiPng;
    {
      MainWindow w(o);
      w.show();
      GenerationPanel* panel = w.generationPanel();
      QVERIFY(!panel->modelInfo().ok);  // the GGUF file alone lacks its components
      QVERIFY(!w.validation().canStart() || !w.validation().canGenerate());
      typeInto(panel->componentEdit("config"), made.components.config);
      typeInto(panel->componentEdit("vae"), made.components.vae);
      typeInto(panel->componentEdit("text_encoder"), made.components.textEncoder);
      typeInto(panel->componentEdit("text_encoder_2"), made.components.textEncoder2);
      QVERIFY2(panel->modelInfo().ok, qPrintable(panel->modelInfo().error));
      w.strategyEditor()->setStrategy(ring2);
      want = request(panel->params());
      panel->setParams(want);
      QVERIFY2(w.validation().canGenerate(), qPrintable(w.validation().all().join("; ")));
      QCOMPARE(w.launchConfig().components, made.components);
      QVERIFY(!w.generate().isEmpty());
      QTRY_COMPARE_WITH_TIMEOUT(w.gallery()->count(), 1, 300000);
      QVERIFY2(w.controller()->lastFailure().message.isEmpty(),
               qPrintable(w.controller()->lastFailure().message));
      const HistoryEntry e = w.historyStore()->entries().first();
      guiPng = e.path;
      // The history and the PNG record the model and its components.
      QCOMPARE(ModelSourcePaths::readFrom(e.params), made);
      const QJsonObject png = readPngParameters(e.path);
      QCOMPARE(png.value("model").toString(), made.model);
      QCOMPARE(ModelComponents::fromJson(png.value("components").toObject()), made.components);

      // Another model, strategy and settings; "Use parameters" brings the image's back.
      panel->setSources(ModelSourcePaths{otherModel(), {}});
      QVERIFY(panel->modelInfo().ok);
      w.strategyEditor()->setStrategy(strat(1));
      GenerationParams other = panel->params();
      other.prompt = "something else";
      other.negative_prompt.clear();
      other.options["true_cfg_scale"] = 1.0;
      other.width = other.height = 64;
      other.steps = 8;
      other.guidance = 3.5;
      other.seed = 7;
      panel->setParams(other);
      w.gallery()->thumbnails()->setCurrentRow(0);
      QPushButton* use = buttonNamed(w.gallery(), "Use parameters");
      QVERIFY(use);
      QTest::mouseClick(use, Qt::LeftButton);
      QCOMPARE(panel->sources(), made);
      QVERIFY2(panel->modelInfo().ok, qPrintable(panel->modelInfo().error));
      QVERIFY2(sameStrategy(w.strategyEditor()->strategy(), ring2),
               qPrintable(strategyText(w.strategyEditor()->strategy())));
      QCOMPARE(differences(panel->params(), want), QString());
      // Saved as a preset ("Save current…" stores currentPreset under the name typed).
      Preset p = w.currentPreset();
      p.name = "gguf round trip";
      QString err;
      QVERIFY2(w.presetStore()->save(p, &err), qPrintable(err));
      w.stopGroup();
      QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), 30000);
    }

    // The CLI's run of the same request: the same pixels.
    const QString cliPng = dir.filePath("cli.png");
    QProcess proc;
    proc.setProcessChannelMode(QProcess::MergedChannels);
    proc.start(cli(), {"--np",
                       "2",
                       "--ring-degree",
                       "2",
                       "--model",
                       made.model,
                       "--config",
                       made.components.config,
                       "--vae",
                       made.components.vae,
                       "--text-encoder",
                       made.components.textEncoder,
                       "--text-encoder-2",
                       made.components.textEncoder2,
                       "--prompt",
                       QString::fromStdString(want.prompt),
                       "--negative-prompt",
                       QString::fromStdString(want.negative_prompt),
                       "--true-cfg-scale",
                       QString::number(want.options.at("true_cfg_scale")),
                       "--width",
                       QString::number(want.width),
                       "--height",
                       QString::number(want.height),
                       "--steps",
                       QString::number(want.steps),
                       "--guidance",
                       QString::number(want.guidance),
                       "--seed",
                       QString::number(want.seed),
                       "--output",
                       cliPng});
    QVERIFY(proc.waitForFinished(300000));
    QVERIFY2(proc.exitCode() == 0, proc.readAll().constData());
    const QImage gui = QImage(guiPng).convertToFormat(QImage::Format_RGB888);
    const QImage ref = QImage(cliPng).convertToFormat(QImage::Format_RGB888);
    QCOMPARE(gui.size(), QSize(want.width, want.height));
    QCOMPARE(ref.size(), gui.size());
    QVERIFY2(gui == ref, "the window's image differs from the CLI's");

    // A restart: a new window over the same data folder, another model loaded; the preset
    // brings the model, its components, the strategy and every field back.
    o.modelDir = otherModel();
    MainWindow w2(o);
    w2.show();
    QCOMPARE(w2.generationPanel()->sources(), (ModelSourcePaths{otherModel(), {}}));
    w2.strategyEditor()->setStrategy(strat(1));
    PresetPanel* pp = w2.presetPanel();
    pp->refresh();
    pp->select("gguf round trip");
    QCOMPARE(pp->selectedName(), QStringLiteral("gguf round trip"));
    auto* also = pp->findChild<QCheckBox*>("applyGeneration");
    QVERIFY(also);
    also->setChecked(true);
    QPushButton* load = buttonNamed(pp, "Load");
    QVERIFY(load);
    load->click();
    QCOMPARE(w2.generationPanel()->sources(), made);
    QVERIFY2(w2.generationPanel()->modelInfo().ok,
             qPrintable(w2.generationPanel()->modelInfo().error));
    QVERIFY(sameStrategy(w2.strategyEditor()->strategy(), ring2));
    QCOMPARE(differences(w2.generationPanel()->params(), want), QString());
    // ... and makes the same image again.
    QVERIFY2(w2.validation().canGenerate(), qPrintable(w2.validation().all().join("; ")));
    QVERIFY(!w2.generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w2.gallery()->count(), 2, 300000);
    const QImage again =
        QImage(w2.historyStore()->entries().first().path).convertToFormat(QImage::Format_RGB888);
    QVERIFY2(again == gui, "the preset's request made another image");
    w2.stopGroup();
    QTRY_VERIFY_WITH_TIMEOUT(!w2.controller()->isRunning(), 30000);
  }
};

QTEST_MAIN(TestUiModelSources)
#include "test_ui_model_sources.moc"
