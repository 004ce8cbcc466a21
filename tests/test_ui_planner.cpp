// The advisor dialog's "Plan for me" (ui/advisor_dialog.*): the placement planner on the dialog's
// inputs, its table and reasons shown, and Apply handing over the plan's strategy (disabled when
// nothing fits).
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QPushButton>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTextBrowser>
#include <QtTest>

#include "backend/models/memory_estimate.h"
#include "backend/models/placement_planner.h"
#include "ui/advisor_dialog.h"

using namespace dit::ui;

class UiPlannerTest : public QObject {
  Q_OBJECT
 private:
  // The dialog with FLUX.2 [dev] chosen, `devices` x `gib` GiB on NVLink.
  static void choose(AdvisorDialog& d, int devices, double gib) {
    auto* model = d.findChild<QComboBox*>();
    QVERIFY(model);
    const int idx = model->findText("FLUX.2 [dev]");
    QVERIFY(idx > 0);
    model->setCurrentIndex(idx);
    QSpinBox* dev = nullptr;
    for (QSpinBox* b : d.findChildren<QSpinBox*>())
      if (b->maximum() == 1024 && b->minimum() == 1 && !dev) dev = b;  // Devices comes first
    QVERIFY(dev);
    dev->setValue(devices);
    QDoubleSpinBox* mem = nullptr;
    for (QDoubleSpinBox* b : d.findChildren<QDoubleSpinBox*>())
      if (b->suffix() == " GiB") mem = b;
    QVERIFY(mem);
    mem->setValue(gib);
  }

 private Q_SLOTS:
  void planForFourEightyGigabyteGpus() {
    AdvisorDialog d;
    choose(d, 4, 80);
    QVERIFY(!d.hasPlan());
    d.planButton()->click();
    QVERIFY(d.hasPlan());
    const dit::Plan& p = d.plan();
    QVERIFY(p.fits);
    QCOMPARE(p.strategy.tp_degree, 2);
    QCOMPARE(p.strategy.ulysses_degree, 2);
    // The same figures as the memory model for that strategy.
    dit::RequestDims r;
    r.width = r.height = 1024;
    r.text_len = 512;
    const dit::MemoryEstimate e =
        dit::estimateKnownModelMemory(dit::findKnownModel("FLUX.2 [dev]"), p.strategy, r, 2, false);
    QCOMPARE(p.memory.peak(), e.peak());
    const QString html = d.findChild<QTextBrowser*>()->toPlainText();
    QVERIFY2(html.contains("sharded under the transformer's tp group"), qPrintable(html));
    QVERIFY(html.contains(QString::fromStdString(dit::formatBytes(e.peak()))));
    QVERIFY(html.contains("text encoder kept in host memory, streamed layer by layer"));
    // Apply hands over the plan's strategy.
    QSignalSpy spy(&d, &AdvisorDialog::applyRequested);
    QVERIFY(d.applyButton()->isEnabled());
    d.applyButton()->click();
    QCOMPARE(spy.count(), 1);
    const auto s = spy.at(0).at(0).value<dit::Strategy>();
    QCOMPARE(s.tp_degree, 2);
    QCOMPARE(s.ulysses_degree, 2);
    // An input change drops the plan (the advice is shown again).
    choose(d, 2, 80);
    QVERIFY(!d.hasPlan());
  }

  void nothingFitsDisablesApplyAndNamesTheMemoryNeeded() {
    AdvisorDialog d;
    choose(d, 1, 80);
    d.planButton()->click();
    QVERIFY(d.hasPlan());
    QVERIFY(!d.plan().fits);
    QVERIFY(!d.applyButton()->isEnabled());
    const QString text = d.findChild<QTextBrowser*>()->toPlainText();
    QVERIFY2(text.contains("Nothing fits"), qPrintable(text));
    QVERIFY(text.contains(
        QString::fromStdString("at least " + dit::formatBytes(d.plan().smallest_memory_per_rank))));
  }
};

QTEST_MAIN(UiPlannerTest)
#include "test_ui_planner.moc"
