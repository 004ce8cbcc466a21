// The panel a user scrolls (issue 45), offscreen on a 1280x800 screen with the dark theme: the
// wheel over an unfocused spin box, slider or combo box scrolls the panel and leaves the field's
// value (a focused one takes it); the Generate and Strategy tabs never scroll sideways at
// 1280x800, whatever the generated rows hold (each family's knobs, a step cache report, the
// component rows with long paths, long strategy issues); gallery labels tell apart two images
// of one seed.
#include <QApplication>
#include <QComboBox>
#include <QDir>
#include <QDoubleSpinBox>
#include <QFile>
#include <QImage>
#include <QJsonArray>
#include <QJsonObject>
#include <QLabel>
#include <QLayout>
#include <QLineEdit>
#include <QListWidget>
#include <QPlainTextEdit>
#include <QScrollArea>
#include <QScrollBar>
#include <QSlider>
#include <QSpinBox>
#include <QTabWidget>
#include <QTemporaryDir>
#include <QToolButton>
#include <QWheelEvent>
#include <QtTest>
#include <memory>

#include "ui/compare_view.h"
#include "ui/gallery.h"
#include "ui/generation_panel.h"
#include "ui/history_store.h"
#include "ui/image_input_panel.h"
#include "ui/main_window.h"
#include "ui/strategy_editor.h"
#include "ui/theme.h"
#include "ui/wheel_guard.h"

using namespace dit::ui;

namespace {

QString data() { return qEnvironmentVariable("DITSTUDIO_TEST_DATA"); }

std::unique_ptr<MainWindow> makeWindow(const QString& dataDir, const QString& model) {
  MainWindowOptions o;
  o.dataDir = dataDir;
  o.modelDir = model;
  o.restoreSession = false;
  o.mpirunPath = "/nonexistent/mpirun";  // nothing starts here
  auto w = std::make_unique<MainWindow>(o);
  w->resize(1280, 800);
  w->show();
  return w;
}

/// One wheel notch (up) over the centre of `w`.
void wheel(QWidget* w, int delta = 120) {
  const QPointF at = QRectF(w->rect()).center();
  QWheelEvent ev(at, w->mapToGlobal(at), QPoint(), QPoint(0, delta), Qt::NoButton, Qt::NoModifier,
                 Qt::NoScrollPhase, false);
  QApplication::sendEvent(w, &ev);
}

/// The widgets inside `scroll`'s panel whose right edge passes the viewport's (cut off).
QStringList cutOff(QScrollArea* scroll) {
  QStringList out;
  QWidget* vp = scroll->viewport();
  for (QWidget* c : scroll->widget()->findChildren<QWidget*>()) {
    if (!c->isVisibleTo(scroll->widget()) || c->width() == 0) continue;
    // Inside a scroll area of its own (the mesh drawing, a list): clipped and scrolled there.
    bool nested = false;
    for (QWidget* p = c->parentWidget(); p && p != scroll->widget(); p = p->parentWidget())
      if (qobject_cast<QAbstractScrollArea*>(p)) nested = true;
    if (nested) continue;
    const int right = c->mapTo(vp, QPoint(c->width(), 0)).x();
    if (right > vp->width() + 1)
      out << QStringLiteral("%1 %2 (right edge %3 > %4, min %5)")
                 .arg(QString::fromLatin1(c->metaObject()->className()), c->objectName())
                 .arg(right)
                 .arg(vp->width())
                 .arg(c->minimumSizeHint().width());
  }
  return out;
}

/// `scroll` shows its whole panel's width: no sideways scroll bar, nothing past the right edge.
QString sideways(QScrollArea* scroll) {
  QApplication::processEvents();
  QStringList why;
  if (scroll->horizontalScrollBar()->maximum() > 0 && scroll->horizontalScrollBar()->isVisible())
    why << QStringLiteral("a sideways scroll bar (%1 px)")
               .arg(scroll->horizontalScrollBar()->maximum());
  if (scroll->widget()->width() > scroll->viewport()->width())
    why << QStringLiteral("panel %1 px in a %2 px viewport (its minimum %3)")
               .arg(scroll->widget()->width())
               .arg(scroll->viewport()->width())
               .arg(scroll->widget()->minimumSizeHint().width());
  why << cutOff(scroll);
  if (!why.isEmpty()) {
    // The widest fields (leaves), to name what widens the panel.
    for (QWidget* c : scroll->widget()->findChildren<QWidget*>()) {
      if (!c->isVisibleTo(scroll->widget())) continue;
      if (!c->findChildren<QWidget*>().isEmpty() && !qobject_cast<QAbstractSpinBox*>(c)) continue;
      if (c->minimumSizeHint().width() > scroll->viewport()->width() / 3) {
        const auto* l = qobject_cast<QLabel*>(c);
        why << QStringLiteral("%1 '%2' min %3")
                   .arg(QString::fromLatin1(c->metaObject()->className()),
                        l ? l->text().left(60) : c->objectName())
                   .arg(c->minimumSizeHint().width());
      }
    }
  }
  if (!why.isEmpty()) {
    for (QLayout* l : scroll->widget()->findChildren<QLayout*>()) {
      if (l->minimumSize().width() <= scroll->viewport()->width() - 60) continue;
      QStringList items;
      for (int i = 0; i < l->count(); ++i) {
        QLayoutItem* it = l->itemAt(i);
        QString n = it->widget() ? QString::fromLatin1(it->widget()->metaObject()->className()) +
                                       ":" + it->widget()->objectName()
                                 : QStringLiteral("layout");
        if (auto* lab = qobject_cast<QLabel*>(it->widget())) n += "'" + lab->text().left(20) + "'";
        items << QStringLiteral("%1=%2").arg(n).arg(it->minimumSize().width());
      }
      why << QStringLiteral("layout %1 min %2 [%3]")
                 .arg(QString::fromLatin1(l->metaObject()->className()))
                 .arg(l->minimumSize().width())
                 .arg(items.join(", "));
    }
  }
  return why.join("; ");
}

QString writePng(const QString& path, const QColor& c) {
  QImage img(32, 32, QImage::Format_RGB888);
  img.fill(c);
  return img.save(path) ? path : QString();
}

}  // namespace

class TestUiPanel : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  // The wheel over an unfocused spin box (steps), slider (strength) or combo box (cache) scrolls
  // the panel and leaves the value; once the field has the focus, the wheel changes it.
  void wheelNeedsFocus() {
    QTemporaryDir dir;
    auto w = makeWindow(dir.path(), data() + "/tiny-flux-A");
    GenerationPanel* panel = w->generationPanel();
    QScrollArea* scroll = w->generateScroll();
    w->resize(1280, 500);  // the panel taller than its column: the column scrolls
    QApplication::processEvents();
    QVERIFY(scroll->verticalScrollBar()->maximum() > 0);
    QSpinBox* steps = panel->stepsSpin();
    QCOMPARE(steps->focusPolicy(), Qt::StrongFocus);
    panel->promptEdit()->setFocus();
    QApplication::processEvents();
    QVERIFY(!steps->hasFocus());
    scroll->verticalScrollBar()->setValue(scroll->verticalScrollBar()->maximum() / 2);
    scroll->ensureWidgetVisible(steps, 8, 80);
    QApplication::processEvents();
    QVERIFY(scroll->verticalScrollBar()->value() > 0);
    const int before = steps->value();
    const int at = scroll->verticalScrollBar()->value();
    wheel(steps);
    QCOMPARE(steps->value(), before);
    QVERIFY2(scroll->verticalScrollBar()->value() < at, "the wheel did not scroll the panel");
    QVERIFY(!steps->hasFocus());  // the wheel gave it no focus
    // Every guarded field of the panel and the strategy editor keeps its value.
    QDoubleSpinBox* guidance = panel->guidanceSpin();
    const double g = guidance->value();
    wheel(guidance);
    QCOMPARE(guidance->value(), g);
    QSlider* strength = panel->imagePanel()->strengthSlider();
    strength->setEnabled(true);
    const int sv = strength->value();
    wheel(strength);
    QCOMPARE(strength->value(), sv);
    QComboBox* cache = panel->imagePanel()->cacheCombo();
    const int ci = cache->currentIndex();
    wheel(cache);
    QCOMPARE(cache->currentIndex(), ci);
    for (QWidget* f : w->findChildren<QWidget*>())
      if (WheelGuard::guards(f) && f->isVisible())
        QVERIFY2(
            f->focusPolicy() != Qt::WheelFocus,
            qPrintable(QString::fromLatin1(f->metaObject()->className()) + " " + f->objectName()));
    // Focused (a click or Tab): the wheel is the field's.
    steps->setFocus();
    QApplication::processEvents();
    QVERIFY(steps->hasFocus());
    wheel(steps);
    QCOMPARE(steps->value(), before + steps->singleStep());
  }

  // At 1280x800 neither the Generate tab nor the Strategy tab scrolls sideways or cuts off a
  // row, for every family's generated rows, with a step cache report, the component rows open
  // with long paths, and long strategy issues.
  void noSidewaysScrollAt1280x800() {
    QTemporaryDir dir;
    auto w = makeWindow(dir.path(), data() + "/tiny-flux-A");
    QCOMPARE(w->size(), QSize(1280, 800));
    QScrollArea* gen = w->generateScroll();
    auto* tabs = gen->parentWidget()->parentWidget();  // the stacked widget's tab widget
    Q_UNUSED(tabs);
    GenerationPanel* panel = w->generationPanel();
    for (const char* model : {"tiny-flux-A", "tiny-flux2-A", "tiny-zimage-A", "tiny-qwenimage-A"}) {
      panel->setModelDir(data() + "/" + model);
      QVERIFY2(panel->modelInfo().ok, qPrintable(panel->modelInfo().error));
      QString why = sideways(gen);
      QVERIFY2(why.isEmpty(), qPrintable(QString::fromLatin1(model) + ": " + why));
    }
    // A step cache report (the PNG's cache_report) under the cache control.
    panel->setModelDir(data() + "/tiny-flux-A");
    panel->imagePanel()->showCacheReport(
        QJsonObject{{"mode", "taylorseer:interval=3,warmup=2,order=2,cutoff=0.9"},
                    {"steps", 28},
                    {"computed_steps", QJsonArray{0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27}},
                    {"step_ms_computed", 812.5},
                    {"saved_ms", 13000.0}});
    QString why = sideways(gen);
    QVERIFY2(why.isEmpty(), qPrintable("cache report: " + why));
    // The component rows open, with long paths.
    panel->componentsToggle()->setChecked(true);
    const QString deep =
        "/home/someone/models/a-very-long-folder-name-for-flux-checkpoints/FLUX.1-dev-gguf-"
        "collection/flux1-dev-Q4_K_S-with-an-even-longer-file-name.gguf";
    panel->setSources(ModelSourcePaths{deep, {deep, deep, deep, deep, deep, deep}});
    why = sideways(gen);
    QVERIFY2(why.isEmpty(), qPrintable("components: " + why));
    // The Strategy tab, with a long issue list.
    QScrollArea* strat = nullptr;
    for (QScrollArea* s : w->findChildren<QScrollArea*>())
      if (s->objectName() == "strategyScroll") strat = s;
    QVERIFY(strat);
    if (auto* t = qobject_cast<QTabWidget*>(strat->parentWidget()->parentWidget()))
      t->setCurrentWidget(strat);
    w->strategyEditor()->setIssues(
        {"tp_degree 3 does not divide num_attention_heads 4 "
         "(FluxTransformer2DModel.transformer_blocks.0.attn)"},
        {"request field 'width': 1000 is not a multiple of 16 (2 x vae_scale_factor) for this "
         "model's pipeline; use 992 or 1008"});
    why = sideways(strat);
    QVERIFY2(why.isEmpty(), qPrintable("strategy: " + why));
    dit::Strategy big;
    big.world = 8;
    big.device = "cpu";
    big.ring_degree = 2;
    big.ulysses_degree = 2;
    big.tp_degree = 2;
    w->strategyEditor()->setStrategy(big);
    why = sideways(strat);
    QVERIFY2(why.isEmpty(), qPrintable("strategy 8 ranks: " + why));
  }

  // Two images of one seed (another prompt, size, model or time) get different labels, each
  // within the thumbnail's width.
  void galleryLabelsTellImagesApart() {
    QTemporaryDir dir;
    auto w = makeWindow(dir.path(), data() + "/tiny-flux-A");
    HistoryEntry a;
    a.path = writePng(dir.filePath("a.png"), Qt::red);
    a.seed = 42;
    a.hasSeed = true;
    a.created = QDateTime(QDate(2026, 12, 7), QTime(5, 12, 33));
    a.params = QJsonObject{{"prompt", "a photo of a cat on a red sofa in the evening sun"},
                           {"width", 64},
                           {"height", 64},
                           {"seed", 42},
                           {"model", "/models/tiny-flux"}};
    HistoryEntry b = a;
    b.path = writePng(dir.filePath("b.png"), Qt::blue);
    b.params["prompt"] = "a photo of a dog";
    HistoryEntry c = a;  // same prompt and seed, another size and model, a minute later
    c.path = writePng(dir.filePath("c.png"), Qt::green);
    c.params["width"] = 32;
    c.params["model"] = "/models/flux1-dev-Q4_K_S.gguf";
    c.created = a.created.addSecs(60);
    for (const HistoryEntry& e : {a, b, c}) QVERIFY(w->historyStore()->add(e));
    w->gallery()->reload();
    QListWidget* list = w->gallery()->thumbnails();
    QCOMPARE(list->count(), 3);
    QStringList labels;
    for (int i = 0; i < list->count(); ++i) labels << list->item(i)->text();
    QCOMPARE(QSet<QString>(labels.begin(), labels.end()).size(), 3);
    const QString la = thumbnailLabel(a, list->fontMetrics(), 0);
    QVERIFY2(la.contains("a photo of a cat") && la.contains("64×64") && la.contains("tiny-flux") &&
                 la.contains("05:12:33"),
             qPrintable(la));
    const int room = list->gridSize().width();
    for (const QString& l : labels)
      for (const QString& line : l.split('\n'))
        QVERIFY2(list->fontMetrics().horizontalAdvance(line) <= room, qPrintable(line));
    QVERIFY(labels.join(' ').contains("flux1-dev-Q4_K_S") ||
            labels.join(' ').contains("flux1-dev"));
    // Compared, a and c (one seed and prompt) are captioned apart too.
    int ra = -1, rc = -1;
    for (int i = 0; i < list->count(); ++i) {
      if (list->item(i)->data(Qt::UserRole).toString() == a.path) ra = i;
      if (list->item(i)->data(Qt::UserRole).toString() == c.path) rc = i;
    }
    QVERIFY(w->gallery()->compare(ra, rc));
    const QStringList caps = w->gallery()->compareView()->captions();
    QCOMPARE(caps.size(), 2);
    QVERIFY2(caps[0] != caps[1], qPrintable(caps.join(" | ")));
    QVERIFY2(caps[0].contains("seed 42"), qPrintable(caps[0]));
  }
};

// A 1280x800 offscreen screen (the issue's laptop) and the application's dark theme.
int main(int argc, char** argv) {
  QTemporaryDir config;
  const QString file = config.filePath("screens.json");
  {
    QFile f(file);
    if (!f.open(QIODevice::WriteOnly)) return 2;
    f.write(R"({"screens":[{"name":"laptop","x":0,"y":0,"width":1280,"height":800,)"
            R"("logicalDpi":96,"logicalBaseDpi":96,"dpr":1}]})");
  }
  qputenv("QT_QPA_PLATFORM", ("offscreen:configfile=" + file).toLocal8Bit());
  QApplication app(argc, argv);
  applyDarkTheme(app);
  TestUiPanel t;
  QTEST_SET_MAIN_SOURCE_PATH
  return QTest::qExec(&t, argc, argv);
}

#include "test_ui_panel.moc"
