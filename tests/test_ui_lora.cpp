// The GUI's LoRA list (issue 13), offscreen: adding the fixture's kohya LoRA shows its detected
// format, rank and modules; a missing file is named. Then the main window driving the REAL worker
// (mpirun -np 2, the tiny-flux-A fixture the LoRA was made for): add a LoRA at 0.8, generate, the
// PNG's parameters carry its file, SHA-256 and strength, "use parameters" restores it (and names
// a LoRA file that has disappeared since).
#include <QLabel>
#include <QPushButton>
#include <QSignalSpy>
#include <QSlider>
#include <QTemporaryDir>
#include <QtTest>

#include "backend/io/sha256.h"
#include "ui/history_store.h"
#include "ui/lora_list.h"
#include "ui/main_window.h"

using namespace dit::ui;

namespace {
constexpr int kImageMs = 400000;
QString fixture() { return qEnvironmentVariable("DITSTUDIO_TEST_FIXTURE"); }
QString kohya() { return fixture() + "/lora/lora-kohya.safetensors"; }
QString worker() { return qEnvironmentVariable("DITSTUDIO_TEST_WORKER"); }
}  // namespace

class TestUiLora : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void listShowsDetectedFormatAndNamesMissingFiles() {
    LoraList list;
    QSignalSpy changed(&list, &LoraList::changed);
    QVERIFY(list.addLora(kohya(), 0.75));
    QCOMPARE(list.count(), 1);
    QCOMPARE(list.infoLabel(0)->text(),
             QString("kohya, rank 4, 26 modules, alpha from kohya .alpha"));
    QCOMPARE(list.loras().at(0).strength, 0.75);
    list.strengthSlider(0)->setValue(-50);
    QCOMPARE(list.loras().at(0).strength, -0.5);
    QVERIFY(changed.count() >= 2);
    QVERIFY(list.addLora(fixture() + "/lora/lora-diffusers-metaalpha.safetensors"));
    QVERIFY(
        list.infoLabel(1)->text().startsWith("diffusers, rank 4, 40 modules, alpha from "
                                             "lora_adapter_metadata"));
    QVERIFY(!list.addLora("/nonexistent/gone.safetensors", 1.0));
    QCOMPARE(list.problems(), QStringList{"LoRA file not found: /nonexistent/gone.safetensors"});
    QVERIFY(list.warningLabel()->text().contains("/nonexistent/gone.safetensors"));
    list.removeButton(2)->click();
    QCOMPARE(list.count(), 2);
    QVERIFY(list.problems().isEmpty());
    // A file that is not a LoRA: named with the cause.
    QVERIFY(!list.addLora(fixture() + "/golden/golden.safetensors"));
    QVERIFY2(list.problems().at(0).contains("unknown LoRA format"),
             qPrintable(list.problems().join("; ")));
  }

  void generateCarriesTheLoraAndRecallRestoresIt() {
    if (worker().isEmpty() || !QFileInfo(worker()).isExecutable())
      QFAIL("DITSTUDIO_TEST_WORKER is not an executable ditstudio-worker");
    qunsetenv("DITSTUDIO_MPIRUN");
    QTemporaryDir data;
    MainWindowOptions o;
    o.dataDir = data.path();
    o.modelDir = fixture();
    o.workerPath = worker();
    o.restoreSession = false;
    MainWindow w(o);
    w.show();
    const auto demo = w.presetStore()->find("CPU demo (2 ranks)");
    QVERIFY(demo.has_value());
    w.applyPreset(*demo);
    // A copy of the LoRA, so that it can disappear before the recall.
    const QString copy = data.filePath("my-style.safetensors");
    QVERIFY(QFile::copy(kohya(), copy));
    GenerationParams p = w.generationPanel()->params();
    p.width = p.height = 32;
    p.steps = 2;
    p.max_sequence_length = 48;
    p.seed = 7;
    p.random_seed = false;
    p.num_images = 1;
    w.generationPanel()->setParams(p);
    QVERIFY(w.generationPanel()->loraList()->addLora(copy, 0.8));
    QVERIFY2(w.validation().canGenerate(), qPrintable(w.validation().all().join("; ")));
    QVERIFY(!w.generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w.gallery()->count(), 1, kImageMs);
    QVERIFY2(w.controller()->lastFailure().message.isEmpty(),
             qPrintable(w.controller()->lastFailure().message));
    const HistoryEntry e = w.historyStore()->entries().first();
    QString err;
    const QJsonObject png = readPngParameters(e.path, &err);
    QVERIFY2(!png.isEmpty(), qPrintable(err));
    const QJsonArray loras = png.value("loras").toArray();
    QCOMPARE(loras.size(), 1);
    QCOMPARE(loras.at(0).toObject().value("file").toString(), copy);
    QCOMPARE(loras.at(0).toObject().value("strength").toDouble(), 0.8);
    QCOMPARE(loras.at(0).toObject().value("sha256").toString(),
             QString::fromStdString(dit::sha256File(copy.toStdString())));
    // Recall: the panel's LoRA list comes back from the image.
    w.generationPanel()->loraList()->clear();
    QCOMPARE(w.generationPanel()->loraList()->count(), 0);
    Q_EMIT w.gallery()->useParameters(e);
    QCOMPARE(w.generationPanel()->loraList()->count(), 1);
    QCOMPARE(w.generationPanel()->params().loras.at(0).file, copy.toStdString());
    QCOMPARE(w.generationPanel()->params().loras.at(0).strength, 0.8);
    QVERIFY(w.generationPanel()->loraList()->problems().isEmpty());
    // The file disappears: recall names it.
    QVERIFY(QFile::remove(copy));
    w.generationPanel()->loraList()->clear();
    Q_EMIT w.gallery()->useParameters(e);
    QCOMPARE(w.generationPanel()->loraList()->problems(),
             QStringList{"LoRA file not found: " + copy});
    w.stopGroup();
    QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), 30000);
  }
};

QTEST_MAIN(TestUiLora)
#include "test_ui_lora.moc"
