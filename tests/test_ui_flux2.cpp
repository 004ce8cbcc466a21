// The GUI with a FLUX.2 [klein] model from a clean start: the window opens
// tests/data/tiny-flux2-A (family shown), the CPU demo strategy (2 ranks, ring 2) runs the real
// worker, and the image in the gallery is diffusers' run 0 ("a photo of a cat", seed 42, 32x32,
// 4 steps, guidance 4 = CFG) pixel for pixel within one 8-bit level (the golden image read from
// golden.safetensors).
#include <QComboBox>
#include <QImage>
#include <QPushButton>
#include <QSlider>
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>
#include <cstring>

#include "backend/io/safetensors.h"
#include "ui/generation_panel.h"
#include "ui/image_input_panel.h"
#include "ui/main_window.h"
#include "ui/model_info.h"
#include "ui/validation.h"

using namespace dit::ui;

namespace {
QString worker() { return qEnvironmentVariable("DITSTUDIO_TEST_WORKER"); }
QString model() { return qEnvironmentVariable("DITSTUDIO_TEST_FLUX2_MODEL"); }
}  // namespace

class TestUiFlux2 : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void initTestCase() {
    if (worker().isEmpty() || !QFileInfo(worker()).isExecutable())
      QFAIL("DITSTUDIO_TEST_WORKER is not an executable ditstudio-worker");
    if (!QFileInfo::exists(model() + "/model_index.json"))
      QFAIL("DITSTUDIO_TEST_FLUX2_MODEL is not the tiny-flux2-A folder");
    qunsetenv("DITSTUDIO_MPIRUN");
  }

  void generatesDiffusersImage() {
    QTemporaryDir data;
    MainWindowOptions o;
    o.dataDir = data.path();
    o.modelDir = model();
    o.workerPath = worker();
    o.restoreSession = false;
    MainWindow w(o);
    w.show();
    const ModelInfo& info = w.generationPanel()->modelInfo();
    QVERIFY2(info.ok, qPrintable(info.error));
    QCOMPARE(info.detected, QStringLiteral("FLUX.2 [klein]"));
    QCOMPARE(info.num_attention_heads, 2);
    const auto demo = w.presetStore()->find("CPU demo (2 ranks)");
    QVERIFY(demo);
    w.applyPreset(*demo);
    GenerationParams p = w.generationPanel()->params();
    p.prompt = "a photo of a cat";
    p.width = p.height = 32;
    p.steps = 4;
    p.guidance = 4.0;
    p.seed = 42;
    p.random_seed = false;
    w.generationPanel()->setParams(p);
    QVERIFY2(w.validation().canGenerate(), qPrintable(w.validation().all().join("; ")));
    QVERIFY(!w.generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w.gallery()->count(), 1, 300000);
    QVERIFY2(w.controller()->lastFailure().message.isEmpty(),
             qPrintable(w.controller()->lastFailure().message));
    const QImage img(w.historyStore()->entries().first().path);
    QCOMPARE(img.size(), QSize(32, 32));
    // run.0.image: float32 [3, 32, 32] in [0, 1]; the PNG holds round(x * 255).
    dit::SafetensorsReader g((model() + "/golden/golden.safetensors").toStdString());
    const auto& t = g.info("run.0.image");
    std::vector<float> ref(3 * 32 * 32);
    std::memcpy(ref.data(), g.data(t), ref.size() * sizeof(float));
    int worst = 0;
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x) {
        const QRgb px = img.pixel(x, y);
        const int got[3] = {qRed(px), qGreen(px), qBlue(px)};
        for (int c = 0; c < 3; ++c) {
          const int want = static_cast<int>(std::lround(ref[size_t(c * 1024 + y * 32 + x)] * 255));
          worst = std::max(worst, std::abs(got[c] - want));
        }
      }
    QVERIFY2(worst <= 1, qPrintable(QString("max 8-bit difference %1").arg(worst)));
    w.stopGroup();
    QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), 30000);
  }

  // The image panel follows the family's capabilities (dit::FamilyCapabilities): FLUX.2
  // [klein] runs image-to-image and inpainting through the shared loop and step caching through
  // the DiT driver, so the init image, strength, mask brush and cache mode are enabled. A family
  // without them drops the init image and the cache mode and never sends them.
  void imagePanelFollowsCapabilities() {
    QTemporaryDir data;
    MainWindowOptions o;
    o.dataDir = data.path();
    o.modelDir = model();
    o.workerPath = worker();
    o.restoreSession = false;
    MainWindow w(o);
    const ModelInfo& info = w.generationPanel()->modelInfo();
    QVERIFY2(info.ok, qPrintable(info.error));
    ImageInputPanel* panel = w.generationPanel()->imagePanel();
    QCOMPARE(panel->family(), QStringLiteral("FLUX.2 [klein]"));
    QVERIFY(panel->openButton()->isEnabled());
    QVERIFY(panel->cacheCombo()->isEnabled());
    QCOMPARE(panel->cacheCombo()->currentIndex(), 0);
    const QString png = model() + "/golden/inpaint_image.png";
    QString err;
    QVERIFY2(panel->loadInitImage(png, &err), qPrintable(err));
    QVERIFY(panel->strengthSlider()->isEnabled());
    QVERIFY(panel->clearMaskButton()->isEnabled());
    GenerationParams p;
    panel->apply(p);
    QCOMPARE(QString::fromStdString(p.init_image), QFileInfo(png).absoluteFilePath());
    QVERIFY(p.cache.empty());
    panel->cacheCombo()->setCurrentIndex(1);
    panel->setCapabilities(QStringLiteral("no-images"), dit::FamilyCapabilities{});
    QCOMPARE(panel->cacheCombo()->currentIndex(), 0);
    QVERIFY(!panel->cacheCombo()->isEnabled());
    QVERIFY(panel->initImagePath().isEmpty());
    QVERIFY(!panel->openButton()->isEnabled());
    QVERIFY(!panel->strengthSlider()->isEnabled());
    panel->apply(p);
    QVERIFY(p.init_image.empty());
    QVERIFY(p.mask_image.empty());
  }

  // FLUX.2 [klein] base runs CFG whenever guidance > 1 (no negative prompt or true_cfg_scale
  // needed), so cfg_degree 2 is offered then and refused at guidance 1, as the worker does.
  void cfgParallelFollowsGuidance() {
    const ModelInfo info = readModelInfo(model());
    QVERIFY2(info.ok, qPrintable(info.error));
    QVERIFY(info.request.guider.kind == dit::GuiderSpec::Kind::ClassicCfg);
    dit::Strategy s;
    s.world = 2;
    s.cfg_degree = 2;
    GenerationParams p;
    p.width = p.height = 32;
    p.guidance = 4.0;
    QVERIFY(!p.hasNegativePrompt());  // no negative prompt: klein's CFG is guidance alone
    Validation v = validate(s, info, p, info.max_sequence_length);
    QVERIFY2(v.canGenerate(), qPrintable(v.all().join("; ")));
    p.guidance = 1.0;
    v = validate(s, info, p, info.max_sequence_length);
    QVERIFY(v.canStart());
    QVERIFY(!v.canGenerate());
    QVERIFY(v.requestIssues.join(' ').contains("needs true CFG"));
  }
};

QTEST_MAIN(TestUiFlux2)
#include "test_ui_flux2.moc"
