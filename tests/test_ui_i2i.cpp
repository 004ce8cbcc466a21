// Issue 14 in the GUI with the REAL worker (mpirun -np 2 ditstudio-worker, the embedded tiny
// model; DITSTUDIO_TEST_WORKER / DITSTUDIO_TEST_MODEL / DITSTUDIO_TEST_FIXTURE from
// tests/ui.cmake): load an init image, paint a mask with the mouse (plus erase, invert, clear), set
// strength and TaylorSeer caching, generate, see the measured speed-up, then recall everything from
// the PNG.
#include <QComboBox>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSignalSpy>
#include <QSlider>
#include <QTemporaryDir>
#include <QToolButton>
#include <QtTest>

#include "ui/gallery.h"
#include "ui/generation_panel.h"
#include "ui/history_store.h"
#include "ui/image_input_panel.h"
#include "ui/main_window.h"

using namespace dit::ui;

namespace {
constexpr int kImageMs = 300000;
QString worker() { return qEnvironmentVariable("DITSTUDIO_TEST_WORKER"); }
QString model() { return qEnvironmentVariable("DITSTUDIO_TEST_MODEL"); }
QString initImage() {
  return qEnvironmentVariable("DITSTUDIO_TEST_FIXTURE") + "/pipelines/input_32x24.png";
}

// A mouse stroke over image pixels (x0, y) .. (x1, y).
void stroke(MaskCanvas* c, int x0, int x1, int y) {
  const QPoint a = c->toWidget(QPointF(x0, y)).toPoint(), b = c->toWidget(QPointF(x1, y)).toPoint();
  QTest::mousePress(c, Qt::LeftButton, {}, a);
  for (int i = 1; i <= 8; ++i) {
    QMouseEvent move(QEvent::MouseMove, a + (b - a) * i / 8, c->mapToGlobal(a + (b - a) * i / 8),
                     Qt::NoButton, Qt::LeftButton, {});
    QApplication::sendEvent(c, &move);
  }
  QTest::mouseRelease(c, Qt::LeftButton, {}, b);
}
}  // namespace

class TestUiI2I : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void initTestCase() {
    if (worker().isEmpty() || !QFileInfo(worker()).isExecutable())
      QFAIL("DITSTUDIO_TEST_WORKER is not an executable ditstudio-worker");
    if (!QFileInfo::exists(model() + "/model_index.json"))
      QFAIL("DITSTUDIO_TEST_MODEL is not the embedded tiny model");
    QVERIFY2(QFileInfo::exists(initImage()), qPrintable(initImage()));
    qunsetenv("DITSTUDIO_MPIRUN");
  }

  void maskBrushEditsTheMask() {
    ImageInputPanel panel;
    panel.resize(300, 400);
    panel.show();
    QVERIFY(QTest::qWaitForWindowExposed(&panel));
    QString err;
    QVERIFY(!panel.loadInitImage(
        qEnvironmentVariable("DITSTUDIO_TEST_FIXTURE") + "/pipelines/golden.json", &err));
    QVERIFY2(err.contains("golden.json"), qPrintable(err));
    QVERIFY2(panel.loadInitImage(initImage(), &err), qPrintable(err));
    MaskCanvas* c = panel.canvas();
    QCOMPARE(c->mask().size(), QSize(24, 32));
    QCOMPARE(c->maskedPixels(), 0);
    c->setBrushRadius(2);
    stroke(c, 4, 18, 16);
    const qint64 painted = c->maskedPixels();
    QVERIFY2(painted > 20, qPrintable(QString::number(painted)));
    panel.eraseButton()->setChecked(true);
    stroke(c, 4, 10, 16);
    const qint64 afterErase = c->maskedPixels();
    QVERIFY(afterErase < painted && afterErase > 0);
    panel.invertMaskButton()->click();
    QCOMPARE(c->maskedPixels(), 24 * 32 - afterErase);
    panel.clearMaskButton()->click();
    QCOMPARE(c->maskedPixels(), 0);
  }

  void generateAndRecallFromPng() {
    QTemporaryDir data;
    MainWindowOptions o;
    o.dataDir = data.path();
    o.modelDir = model();
    o.workerPath = worker();
    o.restoreSession = false;
    auto w = std::make_unique<MainWindow>(o);
    w->resize(1400, 1000);
    w->show();
    QVERIFY(QTest::qWaitForWindowExposed(w.get()));
    const auto demo = w->presetStore()->find("CPU demo (2 ranks)");
    QVERIFY(demo);
    w->applyPreset(*demo);
    ImageInputPanel* ip = w->generationPanel()->imagePanel();
    QString err;
    QVERIFY2(ip->loadInitImage(initImage(), &err), qPrintable(err));
    // Paint a mask over the lower half with the brush.
    ip->canvas()->setBrushRadius(3);
    for (int y = 17; y < 31; y += 3) stroke(ip->canvas(), 1, 22, y);
    const qint64 masked = ip->canvas()->maskedPixels();
    QVERIFY(masked > 100);
    ip->strengthSlider()->setValue(90);
    ip->cacheCombo()->setCurrentIndex(ip->cacheCombo()->findData("taylorseer"));
    ip->cacheArgs()->setText("1,2,2");
    GenerationParams p = w->generationPanel()->params();
    p.steps = 8;
    p.seed = 7;
    p.random_seed = false;
    w->generationPanel()->setParams(p);
    QCOMPARE(w->generationPanel()->params().cache, std::string("taylorseer:1,2,2"));
    QVERIFY(!w->generationPanel()->params().mask_image.empty());
    QVERIFY2(w->validation().canGenerate(), qPrintable(w->validation().all().join("; ")));
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, kImageMs);
    QVERIFY2(w->controller()->lastFailure().message.isEmpty(),
             qPrintable(w->controller()->lastFailure().message));
    const HistoryEntry e = w->historyStore()->entries().first();
    const QJsonObject png = readPngParameters(e.path, &err);
    QVERIFY2(!png.isEmpty(), qPrintable(err));
    QCOMPARE(png.value("init_image").toString(), QFileInfo(initImage()).absoluteFilePath());
    QCOMPARE(png.value("init_image_sha256").toString(), fileSha256(initImage()));
    QVERIFY(QFileInfo::exists(png.value("mask_image").toString()));
    QCOMPARE(png.value("strength").toDouble(), 0.9);
    QCOMPARE(png.value("cache").toString(), QString("taylorseer:1,2,2"));
    // 8 steps at strength 0.9: t_start 0 (int(8 - 7.2)), TaylorSeer K=2 W=2 computes 0,1,3,5,7.
    QCOMPARE(png.value("cache_report").toObject().value("computed_steps").toArray(),
             QJsonArray({0, 1, 3, 5, 7}));
    QVERIFY2(ip->speedupLabel()->text().contains("5 of 8 steps computed"),
             qPrintable(ip->speedupLabel()->text()));
    // Recall: reset the controls, then "use parameters" of the gallery's image.
    ip->loadInitImage(QString());
    ip->strengthSlider()->setValue(30);
    ip->cacheCombo()->setCurrentIndex(0);
    QCOMPARE(w->generationPanel()->params().init_image, std::string());
    Q_EMIT w->gallery()->useParameters(e);
    QCOMPARE(ip->initImagePath(), QFileInfo(initImage()).absoluteFilePath());
    QCOMPARE(ip->canvas()->maskedPixels(), masked);
    QCOMPARE(ip->strengthSlider()->value(), 90);
    QCOMPARE(ip->cacheCombo()->currentData().toString(), QString("taylorseer"));
    QCOMPARE(ip->cacheArgs()->text(), QString("1,2,2"));
    QVERIFY2(ip->statusLabel()->text().isEmpty(), qPrintable(ip->statusLabel()->text()));
    const GenerationParams back = w->generationPanel()->params();
    QCOMPARE(back.mask_image, png.value("mask_image").toString().toStdString());
    QCOMPARE(back.seed, 7u);
    w->stopGroup();
    QTRY_VERIFY_WITH_TIMEOUT(!w->controller()->isRunning(), 30000);
  }
};

QTEST_MAIN(TestUiI2I)
#include "test_ui_i2i.moc"
