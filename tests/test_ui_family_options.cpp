// Issue 31: the generation panel spells each family's guidance options as its diffusers pipeline
// reads them (PipelineConfig::options), on the four fixtures in tests/data: FLUX.1's guidance is
// the distilled guidance embedding and true_cfg_scale its true CFG; FLUX.2 [klein] (base) and
// Z-Image run CFG from guidance (above 1 and above 0) and read no true_cfg_scale; Qwen-Image reads
// true_cfg_scale and no guidance; only Z-Image shows cfg_truncation and cfg_normalization, and
// they reach the request. No worker runs.
#include <QDoubleSpinBox>
#include <QtTest>

#include "ui/generation_panel.h"
#include "ui/model_info.h"

using namespace dit::ui;

namespace {
QString data(const char* fixture) {
  return qEnvironmentVariable("DITSTUDIO_TEST_DATA") + QLatin1Char('/') + QLatin1String(fixture);
}
// Whether the loaded model's guider runs the CFG branch for a request with (true_cfg) or without
// a negative prompt at true_cfg_scale 4, and `guidance`.
bool runsCfg(const GenerationPanel& p, bool trueCfg, double guidance) {
  GenerationParams g;
  g.negative_prompt_given = trueCfg;
  g.options["true_cfg_scale"] = trueCfg ? 4.0 : 1.0;
  g.guidance = guidance;
  return p.modelInfo().resolve(g).cfg;
}
}  // namespace

class TestUiFamilyOptions : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void initTestCase() {
    if (!QFileInfo::exists(data("tiny-zimage-A") + "/model_index.json"))
      QFAIL("DITSTUDIO_TEST_DATA does not hold tiny-zimage-A");
  }

  void flux1() {
    GenerationPanel p;
    p.setModelDir(data("tiny-flux-A"));
    QVERIFY2(p.modelInfo().ok, qPrintable(p.modelInfo().error));
    QCOMPARE(p.modelInfo().family, QStringLiteral("FLUX.1"));
    QVERIFY(p.guidanceSpin()->isEnabled());
    QCOMPARE(p.fieldLabel(p.guidanceSpin()), QStringLiteral("Guidance"));
    QVERIFY2(p.guidanceSpin()->toolTip().contains("distilled guidance embedding"),
             qPrintable(p.guidanceSpin()->toolTip()));
    QVERIFY(p.knobSpin("true_cfg_scale")->isEnabled());
    QVERIFY(p.knobSpin("true_cfg_scale")->toolTip().contains("true CFG with the negative prompt"));
    QVERIFY(!p.fieldShown(p.knobSpin("cfg_truncation")));
    QVERIFY(!p.fieldShown(p.knobSpin("cfg_normalization")));
    QVERIFY(!runsCfg(p, false, 4.0));  // guidance is an embedding, not CFG
    QVERIFY(runsCfg(p, true, 3.5));
  }

  void flux2Base() {
    GenerationPanel p;
    p.setModelDir(data("tiny-flux2-A"));
    QVERIFY2(p.modelInfo().ok, qPrintable(p.modelInfo().error));
    QVERIFY(p.guidanceSpin()->isEnabled());
    QCOMPARE(p.fieldLabel(p.guidanceSpin()), QStringLiteral("CFG scale"));
    QVERIFY(p.guidanceSpin()->toolTip().contains("on when > 1"));
    QVERIFY(!p.knobSpin("true_cfg_scale")->isEnabled());
    QVERIFY2(p.knobSpin("true_cfg_scale")->toolTip().contains("not read by FLUX.2 [klein]"),
             qPrintable(p.knobSpin("true_cfg_scale")->toolTip()));
    QVERIFY(!p.fieldShown(p.knobSpin("cfg_truncation")));
    QVERIFY(!runsCfg(p, true, 1.0));
    QVERIFY(runsCfg(p, false, 1.5));
  }

  void zimage() {
    GenerationPanel p;
    p.setModelDir(data("tiny-zimage-A"));
    QVERIFY2(p.modelInfo().ok, qPrintable(p.modelInfo().error));
    QCOMPARE(p.modelInfo().family, QStringLiteral("Z-Image"));
    QCOMPARE(p.fieldLabel(p.guidanceSpin()), QStringLiteral("CFG scale"));
    QVERIFY(p.guidanceSpin()->toolTip().contains("on when > 0"));
    QVERIFY(!p.knobSpin("true_cfg_scale")->isEnabled());
    QVERIFY(p.fieldShown(p.knobSpin("cfg_truncation")));
    QVERIFY(p.fieldShown(p.knobSpin("cfg_normalization")));
    // ZImagePipeline's do_classifier_free_guidance: guidance_scale > 0.
    QVERIFY(runsCfg(p, false, 0.5));
    QVERIFY(!runsCfg(p, true, 0.0));
    // The two fields reach the request and come back from it.
    p.knobSpin("cfg_truncation")->setValue(0.25);
    p.knobSpin("cfg_normalization")->setValue(1.5);
    GenerationParams g = p.params();
    QCOMPARE(g.options["cfg_truncation"], 0.25);
    QCOMPARE(g.options["cfg_normalization"], 1.5);
    g.options["cfg_truncation"] = 0.75;
    g.options["cfg_normalization"] = 0.0;
    p.setParams(g);
    QCOMPARE(p.knobSpin("cfg_truncation")->value(), 0.75);
    QCOMPARE(p.params().options.at("cfg_normalization"), 0.0);
  }

  void qwenImage() {
    GenerationPanel p;
    p.setModelDir(data("tiny-qwenimage-A"));
    QVERIFY2(p.modelInfo().ok, qPrintable(p.modelInfo().error));
    QCOMPARE(p.modelInfo().family, QStringLiteral("Qwen-Image"));
    QVERIFY(!p.guidanceSpin()->isEnabled());
    QVERIFY2(p.guidanceSpin()->toolTip().contains("not read by Qwen-Image"),
             qPrintable(p.guidanceSpin()->toolTip()));
    QVERIFY(p.knobSpin("true_cfg_scale")->isEnabled());
    QVERIFY(p.knobSpin("true_cfg_scale")->toolTip().contains("true CFG"));
    QVERIFY(!p.fieldShown(p.knobSpin("cfg_truncation")));
    QVERIFY(runsCfg(p, true, 0.0));
    QVERIFY(!runsCfg(p, false, 7.0));
    // The row starts at QwenImagePipeline's default (4), as diffusers' true_cfg_scale does.
    QCOMPARE(p.knobSpin("true_cfg_scale")->value(), 4.0);
  }

  void switchingBackShowsEverythingTheFamilyReads() {
    GenerationPanel p;
    p.setModelDir(data("tiny-qwenimage-A"));
    p.setModelDir(data("tiny-zimage-A"));
    QVERIFY(p.guidanceSpin()->isEnabled());
    QVERIFY(p.fieldShown(p.knobSpin("cfg_truncation")));
    // Z-Image's scheduler shift row: the folder's scheduler_config.json value (3.0).
    QVERIFY(p.fieldShown(p.knobSpin("shift")));
    QVERIFY(p.knobSpin("shift")->isEnabled());
    QCOMPARE(p.knobSpin("shift")->value(), 3.0);
    p.setModelDir(data("tiny-flux-A"));
    QVERIFY(p.knobSpin("true_cfg_scale")->isEnabled());
    QVERIFY(!p.fieldShown(p.knobSpin("shift")));
    // Z-Image did not read true_cfg_scale, so its row starts at FluxPipeline's default (1), not
    // at the 4 Qwen-Image left; a value set for a model that reads it is kept on the next one.
    QCOMPARE(p.knobSpin("true_cfg_scale")->value(), 1.0);
    p.knobSpin("true_cfg_scale")->setValue(6.0);
    p.setModelDir(data("tiny-qwenimage-A"));
    QCOMPARE(p.knobSpin("true_cfg_scale")->value(), 6.0);
    p.setModelDir(data("tiny-flux-A"));
    QVERIFY(!p.fieldShown(p.knobSpin("cfg_truncation")));
    QCOMPARE(p.fieldLabel(p.guidanceSpin()), QStringLiteral("Guidance"));
  }
};

QTEST_MAIN(TestUiFamilyOptions)
#include "test_ui_family_options.moc"
