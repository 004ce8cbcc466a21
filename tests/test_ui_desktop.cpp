// The desktop app as a new user meets it (offscreen, a 1280x800 screen, the dark theme, the
// scripted mpirun stand-in of tests/test_ui_fake_worker.cpp): one test per defect of the
// usability issue (the viewer's menu after Open PNG, the LoRA row at 1024x700, the window fitting
// its screen and restoring its geometry, splitters and settings, "Use parameters" restoring the
// strategy, refusals at the field as typed, the quit confirmation, the surviving rank's state,
// the cancelled preview, errors scrolled into view, the last step time kept when idle, device
// memory in the chart, a hostfile host that cannot be reached named with the request kept, the
// truncation warning at the prompt, the mask overlay over red), and the features it asked for
// driven as a user would (compare swipe / blink / side by side, batch grid, gallery search, prompt
// history, repeat and queue reordering, progress in the title and on the taskbar over D-Bus, the
// menu bar's shortcuts, the mask editor's undo and soft brush, the LoRA browser). With
// DITSTUDIO_UI_SNAPSHOT_DIR set, screenshotsAt1280x800And1024x700 saves desktop-1280x800.png and
// desktop-1024x700.png there (docs/images).
#include <QtTest/qtestspontaneevent.h>

#include <QAbstractItemView>
#include <QAction>
#include <QApplication>
#include <QComboBox>
#include <QDir>
#include <QDoubleSpinBox>
#include <QFile>
#include <QFileDialog>
#include <QHeaderView>
#include <QImage>
#include <QLabel>
#include <QLineEdit>
#include <QListView>
#include <QListWidget>
#include <QMenu>
#include <QMenuBar>
#include <QMessageBox>
#include <QPainter>
#include <QPainterPath>
#include <QPlainTextEdit>
#include <QProcess>
#include <QPushButton>
#include <QScreen>
#include <QScrollArea>
#include <QScrollBar>
#include <QSignalSpy>
#include <QSlider>
#include <QSpinBox>
#include <QSplitter>
#include <QTabWidget>
#include <QTableView>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTimer>
#include <QToolButton>
#include <QtTest>
#ifdef DITSTUDIO_HAVE_DBUS
#include <QDBusConnection>
#endif
#include <cmath>
#include <filesystem>
#include <functional>

#include "app/protocol/protocol.h"
#include "strategy_util.h"
#include "ui/compare_view.h"
#include "ui/elided_label.h"
#include "ui/image_input_panel.h"
#include "ui/lora_browser.h"
#include "ui/main_window.h"
#include "ui/prompt_history.h"
#include "ui/seed_text.h"
#include "ui/strategy_json.h"
#include "ui/taskbar_progress.h"
#include "ui/theme.h"

using namespace dit::ui;

namespace dit::ui::testing {
QString writeFakeMpirun(const QString& dir);
}

namespace {
QString fixture() { return qEnvironmentVariable("DITSTUDIO_TEST_FIXTURE"); }
QString testData() { return qEnvironmentVariable("DITSTUDIO_TEST_DATA"); }

QByteArray fileBytes(const QString& path) {
  QFile f(path);
  return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
}

using dit::test::strat;

// A PNG of one colour (or a picture) with a parameters chunk, as the worker writes them.
QString writePng(const QString& path, const QColor& color, const QString& params, int side = 64) {
  QImage img(side, side, QImage::Format_RGB32);
  img.fill(color);
  if (!params.isEmpty()) img.setText("parameters", params);
  return img.save(path) ? path : QString();
}

// A picture for the screenshots: a yellow star on purple (the embedded model's kind of image).
QString writePicture(const QString& path) {
  QImage img(256, 256, QImage::Format_RGB32);
  img.fill(QColor(0x5b, 0x2a, 0x86));
  QPainter p(&img);
  p.setRenderHint(QPainter::Antialiasing);
  QPainterPath star;
  for (int i = 0; i < 10; ++i) {
    const double a = -M_PI / 2 + i * M_PI / 5, r = i % 2 ? 40 : 96;
    const QPointF pt(128 + r * std::cos(a), 132 + r * std::sin(a));
    if (i == 0)
      star.moveTo(pt);
    else
      star.lineTo(pt);
  }
  star.closeSubpath();
  p.fillPath(star, QColor(0xf5, 0xd0, 0x2a));
  p.end();
  img.setText("parameters",
              R"({"prompt":"a large yellow star on a purple background, centre","width":64,)"
              R"("height":64,"steps":28,"seed":4242})");
  return img.save(path) ? path : QString();
}

// Answers the next modal dialog the code under test opens (polling, as a user would after it
// appears): a QMessageBox with `button` (its text goes to *text), a QFileDialog with `file`.
class ModalAnswer : public QObject {
 public:
  explicit ModalAnswer(QMessageBox::StandardButton button, QString* text = nullptr)
      : button_(button), text_(text) {
    arm();
  }
  explicit ModalAnswer(const QString& file) : file_(file) { arm(); }
  bool answered() const { return answered_; }

 private:
  void arm() {
    timer_.setInterval(20);
    QObject::connect(&timer_, &QTimer::timeout, this, [this] { poll(); });
    timer_.start();
  }
  void poll() {
    // The dialog may be shown without being the active modal widget yet (the offscreen platform
    // activates windows late: the case then waited in the dialog's loop until ctest's timeout),
    // so a visible modal message box or file dialog among the top-level widgets counts too.
    QWidget* w = QApplication::activeModalWidget();
    for (QWidget* t : QApplication::topLevelWidgets()) {
      if (w) break;
      if (t->isVisible() && t->isModal() &&
          (qobject_cast<QMessageBox*>(t) || qobject_cast<QFileDialog*>(t)))
        w = t;
    }
    if (!w) return;
    if (auto* box = qobject_cast<QMessageBox*>(w); box && file_.isEmpty()) {
      if (text_) *text_ = box->text();
      timer_.stop();
      answered_ = true;
      box->button(button_)->click();
    } else if (auto* dlg = qobject_cast<QFileDialog*>(w); dlg && !file_.isEmpty()) {
      timer_.stop();
      answered_ = true;
      dlg->selectFile(file_);
      QMetaObject::invokeMethod(dlg, "accept");
    }
  }
  QTimer timer_;
  QMessageBox::StandardButton button_ = QMessageBox::NoButton;
  QString* text_ = nullptr;
  QString file_;
  bool answered_ = false;
};

QAction* actionNamed(const QList<QAction*>& actions, const QString& prefix) {
  for (QAction* a : actions)
    if (a->text().startsWith(prefix)) return a;
  return nullptr;
}

// The rectangle of `w` in `top`'s coordinates.
QRect rectIn(QWidget* w, QWidget* top) { return QRect(w->mapTo(top, QPoint(0, 0)), w->size()); }

QColor pixelAt(QWidget* w, QPointF p) {
  const QImage img = w->grab().toImage();
  const qreal dpr = img.devicePixelRatio();
  return img.pixelColor(QPoint(int(p.x() * dpr), int(p.y() * dpr)));
}
}  // namespace

class TestDesktop : public QObject {
  Q_OBJECT
  QTemporaryDir fakeDir_;
  QString fake_;

  std::unique_ptr<MainWindow> makeWindow(const QString& dataDir, const QString& model = {}) {
    MainWindowOptions o;
    o.dataDir = dataDir;
    o.modelDir = model.isEmpty() ? fixture() : model;
    o.mpirunPath = fake_;
    o.workerPath = "/opt/fake/ditstudio-worker";
    auto w = std::make_unique<MainWindow>(o);
    w->show();
    return w;
  }

  void stopAndWait(MainWindow* w) {
    w->stopGroup();
    QTRY_VERIFY_WITH_TIMEOUT(!w->controller()->isRunning(), 15000);
  }

  // A history entry whose PNG exists (for the gallery tests, no worker needed).
  HistoryEntry entry(const QString& dir, const QString& name, const QColor& color,
                     const QString& prompt, std::uint64_t seed, const QString& id = {},
                     const QDateTime& created = QDateTime::currentDateTime()) {
    HistoryEntry e;
    e.path =
        writePng(QDir(dir).filePath(name), color,
                 QStringLiteral(R"({"prompt":"%1","width":64,"height":64,"steps":4,"seed":%2})")
                     .arg(prompt, seedText(seed)));
    e.params = QJsonObject{{"prompt", prompt},
                           {"width", 64},
                           {"height", 64},
                           {"steps", 4},
                           {"seed", seedToQJson(seed)}};
    e.seed = seed;
    e.hasSeed = true;
    e.requestId = id.isEmpty() ? name : id;
    e.created = created;
    return e;
  }

 private Q_SLOTS:
  void initTestCase() {
    if (fixture().isEmpty() || !QFileInfo::exists(fixture() + "/model_index.json"))
      QFAIL("DITSTUDIO_TEST_FIXTURE does not point at tests/data/tiny-flux-A");
    fake_ = dit::ui::testing::writeFakeMpirun(fakeDir_.path());
    QVERIFY(!fake_.isEmpty());
    QCOMPARE(QGuiApplication::primaryScreen()->size(), QSize(1280, 800));
  }

  void init() {
    qputenv("FAKE_MODE", "ok");
    qunsetenv("FAKE_STEP_SLEEP");
    qunsetenv("FAKE_SEED");
    qunsetenv("FAKE_STATUS");
    qunsetenv("FAKE_DEV");
    qunsetenv("FAKE_TRUNCATE");
    qputenv("FAKE_IMAGE", fakeDir_.filePath("out.png").toLocal8Bit());
    QFile::remove(fakeDir_.filePath("requests.txt"));
  }

  // ---- defects ----

  // After "Open PNG..." the viewer shows that file; its context menu (Use parameters, Save as...,
  // Delete file...) and the buttons act on it, not on the thumbnail still selected, and the
  // delete confirmation names it.
  void viewerActsOnTheShownImageAfterOpenPng() {
    QTemporaryDir data, elsewhere;
    auto w = makeWindow(data.path());
    Gallery* g = w->gallery();
    const HistoryEntry a = entry(data.path(), "a.png", Qt::red, "the selected thumbnail", 11);
    QVERIFY(w->historyStore()->add(a));
    g->reload();
    g->thumbnails()->setCurrentRow(0);
    QCOMPARE(g->shownEntry().path, a.path);
    const QString b = writePng(elsewhere.filePath("opened.png"), Qt::blue,
                               R"({"prompt":"the opened file","width":72,"height":64,)"
                               R"("steps":3,"seed":9223372036854775809})");
    QVERIFY(!b.isEmpty());
    QString err;
    QVERIFY2(g->openPng(b, &err), qPrintable(err));
    QCOMPARE(g->thumbnails()->currentRow(), 0);  // the thumbnail stays selected
    QCOMPARE(g->shownEntry().path, b);
    QCOMPARE(g->currentImage().pixelColor(0, 0), QColor(Qt::blue));
    // Use parameters (menu): the opened file's.
    w->generationPanel()->promptEdit()->setPlainText("something else");
    QList<QAction*> actions = g->viewActions();
    QVERIFY(actionNamed(actions, "Use parameters") && actionNamed(actions, "Save as") &&
            actionNamed(actions, "Delete file"));
    actionNamed(actions, "Use parameters")->trigger();
    QCOMPARE(w->generationPanel()->promptEdit()->toPlainText(), QString("the opened file"));
    QCOMPARE(w->generationPanel()->params().seed, std::uint64_t(9223372036854775809ULL));
    // Save as...: a copy of the opened file (its parameters chunk included).
    const QString dest = elsewhere.filePath("copy.png");
    {
      ModalAnswer answer(dest);
      actionNamed(actions, "Save as")->trigger();
      QVERIFY(answer.answered());
    }
    QCOMPARE(fileBytes(dest), fileBytes(b));
    // Delete file...: the confirmation names the opened file; No keeps it.
    QString asked;
    {
      ModalAnswer answer(QMessageBox::No, &asked);
      actionNamed(actions, "Delete file")->trigger();
      QVERIFY(answer.answered());
    }
    QVERIFY2(asked.contains(b) && !asked.contains(a.path), qPrintable(asked));
    QVERIFY(QFileInfo::exists(b));
    {
      ModalAnswer answer(QMessageBox::Yes, &asked);
      actionNamed(actions, "Delete file")->trigger();
      QVERIFY(answer.answered());
    }
    QVERIFY(!QFileInfo::exists(b));
    QVERIFY(QFileInfo::exists(a.path));  // the selected thumbnail's file is untouched
    QCOMPARE(w->historyStore()->entries().size(), 1);
    qDeleteAll(actions);
    // The thumbnail's own menu still acts on the thumbnail.
    actions = g->imageActions(0);
    QVERIFY(actionNamed(actions, "Save as"));
    actionNamed(actions, "Use parameters")->trigger();
    QCOMPARE(w->generationPanel()->promptEdit()->toPlainText(), QString("the selected thumbnail"));
    qDeleteAll(actions);
  }

  // At 1024x700 a LoRA row with a long name and description leaves the left column without a
  // sideways scroll: the texts are elided (whole in the tooltip), the strength has a spin box
  // and a slider of a usable width on which a small drag is a small change.
  void loraRowAt1024x700() {
    QTemporaryDir data;
    auto w = makeWindow(data.path());
    w->resize(1024, 700);
    const QString longName = data.filePath(
        "an-extremely-long-lora-file-name-for-watercolor-foxes-in-the-snow-v2-final-final."
        "safetensors");
    QVERIFY(QFile::copy(fixture() + "/lora/lora-diffusers-metaalpha.safetensors", longName));
    LoraList* list = w->generationPanel()->loraList();
    QVERIFY(list->addLora(longName, 0.8));
    w->generationPanel()->promptEdit()->setFocus();
    QApplication::processEvents();
    QTest::qWait(100);
    QScrollArea* scroll = w->generateScroll();
    QVERIFY(scroll->horizontalScrollBar()->maximum() == 0 ||
            !scroll->horizontalScrollBar()->isVisible());
    // The panel is as wide as the column shows: nothing cut off at its right edge.
    QWidget* panel = w->generationPanel();
    QVERIFY2(panel->width() <= scroll->viewport()->width(),
             qPrintable(QStringLiteral("panel %1 > viewport %2")
                            .arg(panel->width())
                            .arg(scroll->viewport()->width())));
    QVERIFY2(panel->minimumSizeHint().width() <= scroll->viewport()->width(),
             qPrintable(QStringLiteral("panel needs %1 > viewport %2")
                            .arg(panel->minimumSizeHint().width())
                            .arg(scroll->viewport()->width())));
    QVERIFY(list->strengthSlider(0)->width() >= 120);
    QDoubleSpinBox* spin = list->strengthSpin(0);
    QVERIFY(spin->isVisible());
    QVERIFY(spin->width() >= spin->minimumSizeHint().width());
    QCOMPARE(spin->value(), 0.8);
    auto* name = static_cast<ElidedLabel*>(list->nameLabel(0));
    QVERIFY(name->isElided());
    QVERIFY(name->shownText().endsWith(QStringLiteral("…")));
    QVERIFY2(name->toolTip().contains(longName), qPrintable(name->toolTip()));
    QVERIFY(rectIn(list->removeButton(0), panel).right() < scroll->viewport()->width());
    auto* info = static_cast<ElidedLabel*>(list->infoLabel(0));
    QVERIFY(info->text().startsWith("diffusers, rank 4"));
    QVERIFY(rectIn(info, panel).right() < scroll->viewport()->width());
    // A small drag (8 px) on the slider: a small change, never a jump to an end.
    QSlider* slider = list->strengthSlider(0);
    QStyleOptionSlider opt;
    opt.initFrom(slider);
    opt.minimum = slider->minimum();
    opt.maximum = slider->maximum();
    opt.sliderPosition = slider->value();
    opt.sliderValue = slider->value();
    opt.orientation = Qt::Horizontal;
    const QRect handle =
        slider->style()->subControlRect(QStyle::CC_Slider, &opt, QStyle::SC_SliderHandle, slider);
    QTest::mousePress(slider, Qt::LeftButton, {}, handle.center());
    QMouseEvent move(QEvent::MouseMove, QPointF(handle.center() + QPoint(8, 0)),
                     slider->mapToGlobal(QPointF(handle.center() + QPoint(8, 0))), Qt::NoButton,
                     Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(slider, &move);
    QTest::mouseRelease(slider, Qt::LeftButton, {}, handle.center() + QPoint(8, 0));
    const double after = list->loras().at(0).strength;
    QVERIFY2(after > 0.8 && after < 1.3, qPrintable(QString::number(after)));
    QCOMPARE(spin->value(), after);
    // The spin box takes the protocol's range beyond the slider's.
    spin->setValue(-3.5);
    QCOMPARE(list->loras().at(0).strength, -3.5);
    QCOMPARE(slider->value(), slider->minimum());
  }

  // Thumbnail labels are not cut off at 1024x700, and why Generate is disabled is elided with
  // "…" inside the window, the whole reason in its tooltip.
  void thumbnailsAndReasonAt1024x700() {
    QTemporaryDir data;
    HistoryStore h(data.path());
    QVERIFY(h.load());
    for (int i = 0; i < 14; ++i)
      QVERIFY(h.add(entry(data.path(), QStringLiteral("t%1.png").arg(i), QColor(20 * i, 90, 160),
                          "thumb", 18446744073709551615ULL - i)));
    auto w = makeWindow(data.path());
    w->resize(1024, 700);
    QTest::qWait(100);
    QListWidget* list = w->gallery()->thumbnails();
    QCOMPARE(list->count(), 14);
    const QRect vp = list->viewport()->rect();
    int checked = 0;
    for (int i = 0; i < list->count(); ++i) {
      const QRect r = list->visualItemRect(list->item(i));
      if (!r.intersects(vp)) continue;
      QVERIFY2(r.top() >= 0 && r.bottom() <= vp.bottom(),
               qPrintable(QStringLiteral("thumbnail %1: %2..%3 in a viewport of height %4")
                              .arg(i)
                              .arg(r.top())
                              .arg(r.bottom())
                              .arg(vp.height())));
      ++checked;
    }
    QVERIFY(checked >= 3);
    // A long reason (cfg_degree 2 without true CFG) is elided inside the window.
    w->strategyEditor()->setStrategy(strat(2, 1, 1, 1, 2));
    QVERIFY(!w->generateAction()->isEnabled());
    ElidedLabel* reason = w->generateReasonLabel();
    QVERIFY(reason->isVisible());
    QVERIFY(w->rect().contains(rectIn(reason, w.get())));
    const int textWidth = reason->fontMetrics().horizontalAdvance(reason->shownText());
    QVERIFY(textWidth <= reason->contentsRect().width());
    QVERIFY(reason->text().contains("cfg_degree 2 needs true CFG"));
    if (reason->fontMetrics().horizontalAdvance(reason->text()) > reason->contentsRect().width()) {
      QVERIFY(reason->shownText().endsWith(QStringLiteral("…")));
      QVERIFY(reason->toolTip().contains(reason->text()));
    }
    QVERIFY(reason->toolTip().contains(w->generateBlockedReason()));
  }

  // The window fits the screen it opens on (1280x800 here, not 1500x900), and a relaunch restores
  // its geometry, its splitters and the last settings (steps over the model's declared ones).
  void fitsTheScreenAndRestoresGeometry() {
    QTemporaryDir data, model;
    std::filesystem::copy(fixture().toStdString(), model.path().toStdString(),
                          std::filesystem::copy_options::recursive);
    {
      QFile f(model.filePath("model_index.json"));
      QVERIFY(f.open(QIODevice::ReadOnly));
      QJsonObject mi = QJsonDocument::fromJson(f.readAll()).object();
      f.close();
      mi["_dit_studio_default_settings"] = QJsonObject{{"steps", 21}};
      QVERIFY(f.open(QIODevice::WriteOnly | QIODevice::Truncate));
      f.write(QJsonDocument(mi).toJson());
    }
    QList<int> mainSizes, workSizes;
    {
      auto w = makeWindow(data.path(), model.path());
      QTest::qWait(50);
      const QRect avail = w->screen()->availableGeometry();
      QVERIFY2(avail.contains(w->frameGeometry()),
               qPrintable(QStringLiteral("window %1x%2 at %3,%4 on a %5x%6 screen")
                              .arg(w->frameGeometry().width())
                              .arg(w->frameGeometry().height())
                              .arg(w->frameGeometry().x())
                              .arg(w->frameGeometry().y())
                              .arg(avail.width())
                              .arg(avail.height())));
      QCOMPARE(w->generationPanel()->stepsSpin()->value(), 21);  // the model's declared steps
      w->generationPanel()->stepsSpin()->setValue(5);
      w->generationPanel()->repeatSpin()->setValue(2);
      w->resize(1100, 720);
      w->mainSplitter()->setSizes({300, 800});
      w->workSplitter()->setSizes({500, 170});
      QTest::qWait(50);
      mainSizes = w->mainSplitter()->sizes();
      workSizes = w->workSplitter()->sizes();
      w->close();
      QTRY_VERIFY(!w->isVisible());
    }
    auto w = makeWindow(data.path(), model.path());
    QTest::qWait(50);
    QCOMPARE(w->size(), QSize(1100, 720));
    QCOMPARE(w->mainSplitter()->sizes(), mainSizes);
    QCOMPARE(w->workSplitter()->sizes(), workSizes);
    QCOMPARE(w->generationPanel()->stepsSpin()->value(), 5);
    QCOMPARE(w->generationPanel()->repeatSpin()->value(), 2);
  }

  // "Use parameters" restores the strategy the image was made with (the history's, and a PNG's
  // text); the status bar offers Generate only when it is enabled.
  void useParametersRestoresTheStrategy() {
    QTemporaryDir data;
    auto w = makeWindow(data.path());
    GenerationParams p = w->generationPanel()->params();
    p.steps = 2;
    w->generationPanel()->setParams(p);
    const dit::Strategy made = w->strategyEditor()->strategy();
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, 15000);
    QTRY_VERIFY_WITH_TIMEOUT(w->statusText().contains("ready"), 5000);
    // The user tries another strategy, then recalls the image.
    w->strategyEditor()->setStrategy(strat(4, 1, 4));
    QVERIFY(!sameStrategy(w->strategyEditor()->strategy(), made));
    w->gallery()->thumbnails()->setCurrentRow(0);
    QPushButton* use = nullptr;
    for (QPushButton* b : w->gallery()->findChildren<QPushButton*>())
      if (b->text() == "Use parameters") use = b;
    QVERIFY(use);
    QTest::mouseClick(use, Qt::LeftButton);
    QVERIFY2(sameStrategy(w->strategyEditor()->strategy(), made),
             qPrintable(strategyText(w->strategyEditor()->strategy())));
    QVERIFY(!w->statusText().contains("strategy changed"));
    // A PNG written by the worker says it as text: "2 ranks: ulysses 2".
    const QString png = writePng(data.filePath("ulysses.png"), Qt::gray,
                                 R"({"prompt":"u","width":64,"height":64,"steps":2,"seed":5,)"
                                 R"("strategy":"2 ranks: ulysses 2","model":"/m"})");
    QVERIFY(w->gallery()->openPng(png));
    QCOMPARE(w->strategyEditor()->strategy().ulysses_degree, 2);
    QCOMPARE(w->strategyEditor()->strategy().ring_degree, 1);
    // A strategy whose requests are refused while the group runs another: the status bar does not
    // say Generate applies it.
    w->strategyEditor()->setStrategy(strat(2, 1, 1, 1, 2));
    QVERIFY(!w->generateAction()->isEnabled());
    QVERIFY2(!w->statusText().contains("Generate) applies"), qPrintable(w->statusText()));
    QVERIFY2(w->statusText().contains("Generate is disabled"), qPrintable(w->statusText()));
    stopAndWait(w.get());
  }

  // What the worker would refuse is refused at the field as it is typed, with the worker's words,
  // before any group starts: unreadable cache settings, an init image on a family without
  // image-to-image, a LoRA for another model.
  void refusedAtTheFieldAsTyped() {
    QTemporaryDir data;
    auto w = makeWindow(data.path());
    ImageInputPanel* ip = w->generationPanel()->imagePanel();
    ip->cacheCombo()->setCurrentIndex(ip->cacheCombo()->findData("first-block"));
    QVERIFY(w->generateAction()->isEnabled());
    ip->cacheArgs()->clear();
    QTest::keyClicks(ip->cacheArgs(), "0.x8");
    dit::protocol::GenerationParams q;
    q.cache = "first-block:0.x8";
    QString words;
    try {
      dit::protocol::checkParams(q);
    } catch (const std::exception& e) {
      words = QString::fromStdString(e.what());
    }
    QVERIFY(words.startsWith("request field 'cache'"));
    QVERIFY(!w->generateAction()->isEnabled());
    QVERIFY2(w->generateBlockedReason().contains(words), qPrintable(w->generateBlockedReason()));
    QCOMPARE(ip->cacheArgs()->toolTip(), words);
    QVERIFY(ip->statusLabel()->text().contains(words));
    QVERIFY(w->generate().isEmpty());
    QVERIFY(!w->controller()->isRunning());  // refused without starting a group
    ip->cacheArgs()->setText("0.08");
    QVERIFY(w->generateAction()->isEnabled());

    // Qwen-Image: no image-to-image, diffusers LoRAs only.
    const QString qwen = testData() + "/tiny-qwenimage-A";
    if (testData().isEmpty() || !QFileInfo::exists(qwen + "/model_index.json"))
      QFAIL("DITSTUDIO_TEST_DATA does not hold tiny-qwenimage-A");
    w->generationPanel()->setModelDir(qwen);
    QVERIFY(w->generationPanel()->modelInfo().ok);
    const QString family = w->generationPanel()->modelInfo().family;
    GenerationParams recalled = w->generationPanel()->params();
    recalled.init_image = writePng(data.filePath("init.png"), Qt::white, {}).toStdString();
    recalled.cache.clear();
    w->generationPanel()->setParams(recalled);  // as "Use parameters" does
    QCOMPARE(ip->initImagePath(), QString::fromStdString(recalled.init_image));
    const QString i2i =
        QStringLiteral("image-to-image is not supported for %1; remove init_image").arg(family);
    QVERIFY2(ip->statusLabel()->text().contains(i2i), qPrintable(ip->statusLabel()->text()));
    QVERIFY(w->validation().requestIssues.contains(i2i));
    QVERIFY(!w->generateAction()->isEnabled());
    ip->loadInitImage(QString());
    QVERIFY(!w->validation().requestIssues.contains(i2i));

    LoraList* loras = w->generationPanel()->loraList();
    const QString kohya = fixture() + "/lora/lora-kohya.safetensors";
    const QString diffusers = fixture() + "/lora/lora-diffusers.safetensors";
    QVERIFY(!loras->addLora(kohya, 1.0));
    QVERIFY(!loras->addLora(diffusers, 1.0));
    const QStringList problems = loras->problems();
    QCOMPARE(problems.size(), 2);
    QCOMPARE(problems[0],
             "LoRA refused: " + kohya + ": this model family takes no kohya LoRA files");
    QVERIFY2(problems[1].startsWith("LoRA refused: " + diffusers + ": module '") &&
                 problems[1].endsWith("a LoRA for another model?)"),
             qPrintable(problems[1]));
    for (const QString& pr : problems) QVERIFY(w->validation().requestIssues.contains(pr));
    QVERIFY(loras->infoLabel(0)->toolTip().contains(problems[0]));
    // The model they were made for takes them.
    w->generationPanel()->setModelDir(fixture());
    QVERIFY2(loras->problems().isEmpty(), qPrintable(loras->problems().join("; ")));
    QVERIFY2(w->validation().canGenerate(), qPrintable(w->validation().all().join("; ")));
  }

  // Closing the window while a generation runs asks first; "Keep running" keeps it, Quit stops.
  void quitConfirmationWhileRunning() {
    qputenv("FAKE_STEP_SLEEP", "0.1");
    QTemporaryDir data;
    auto w = makeWindow(data.path());
    GenerationParams p = w->generationPanel()->params();
    p.steps = 300;
    w->generationPanel()->setParams(p);
    QVERIFY(!w->generate().isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(
        !w->controller()->queue().isEmpty() && w->controller()->queue().first().step >= 1, 15000);
    // The window's close button (a spontaneous close event, as the window system sends it).
    QString asked;
    {
      ModalAnswer answer(QMessageBox::No, &asked);
      QCloseEvent close;
      QSpontaneKeyEvent::setSpontaneous(&close);
      qApp->notify(w.get(), &close);  // as the window system delivers it (sendEvent would clear
                                      // the spontaneous flag)
      QVERIFY(answer.answered());
      QVERIFY(!close.isAccepted());
    }
    QVERIFY2(asked.contains("generation is running"), qPrintable(asked));
    QVERIFY(w->isVisible());
    QVERIFY(w->controller()->isRunning());
    QVERIFY(!w->controller()->queue().isEmpty());
    // File > Quit, answered Quit: the group stops and the window closes.
    {
      ModalAnswer answer(QMessageBox::Yes, &asked);
      w->quitAction()->trigger();
      QVERIFY(answer.answered());
    }
    QTRY_VERIFY_WITH_TIMEOUT(!w->controller()->isRunning(), 15000);
    QTRY_VERIFY_WITH_TIMEOUT(!w->isVisible(), 5000);
  }

  // A rank killed mid-denoising: the surviving rank's row no longer says "denoising" and keeps
  // the last step time it measured; the preview goes and the title drops its progress.
  void survivingRankAfterAKill() {
    qputenv("FAKE_MODE", "crash_mid");
    qputenv("FAKE_STEP_SLEEP", "0.05");
    QTemporaryDir data;
    auto w = makeWindow(data.path());
    GenerationParams p = w->generationPanel()->params();
    p.steps = 10;
    w->generationPanel()->setParams(p);
    QVERIFY(!w->generate().isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(w->rankModel()->stats(0).stage == "denoising", 15000);
    QTRY_VERIFY_WITH_TIMEOUT(w->gallery()->showsPreview(), 15000);
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Failed, 15000);
    QVERIFY(w->rankModel()->failed(1));
    QVERIFY(!w->rankModel()->failed(0));
    const QString stage = w->rankModel()->stats(0).stage;
    QVERIFY2(stage == "exited" || stage == "unknown" || stage == "stopped", qPrintable(stage));
    const QModelIndex ms = w->rankModel()->index(0, RankMonitorModel::StepMs);
    QCOMPARE(ms.data().toString(), QString("5.0"));  // the fake's step_ms, not 0.0
    QVERIFY(ms.data(Qt::ToolTipRole).toString().contains("last measured"));
    QVERIFY(!w->gallery()->showsPreview());
    QCOMPARE(w->windowTitle(), QString("DiT Studio"));
    QVERIFY(w->bannerText().contains("Rank 1"));
  }

  // Between requests ms/step keeps the last measured step's time (the worker's idle `ranks`
  // event says 0), with a tooltip saying so; the stage reads idle.
  void idleRanksKeepTheLastStepTime() {
    QTemporaryDir data;
    auto w = makeWindow(data.path());
    GenerationParams p = w->generationPanel()->params();
    p.steps = 2;
    w->generationPanel()->setParams(p);
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, 15000);
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Ready, 5000);
    QTRY_COMPARE_WITH_TIMEOUT(w->rankModel()->stats(0).stage, QString("idle"), 5000);
    for (int r = 0; r < 2; ++r) {
      const QModelIndex ms = w->rankModel()->index(r, RankMonitorModel::StepMs);
      QCOMPARE(ms.data().toString(), QString("5.0"));
      QVERIFY(ms.data(Qt::ToolTipRole).toString().contains("last measured"));
      QCOMPARE(w->rankModel()->stats(r).stage, QString("idle"));
    }
    stopAndWait(w.get());
    // Stopped: still the last figure, not 0.0.
    QCOMPARE(w->rankModel()->index(0, RankMonitorModel::StepMs).data().toString(), QString("5.0"));
  }

  // The memory chart: host RSS for CPU ranks (their events report no device memory), device
  // memory for ranks whose events carry it (as the worker's do on a GPU).
  void memoryChartShowsDeviceMemoryWhereThereIsADevice() {
    for (const bool device : {false, true}) {
      if (device)
        qputenv("FAKE_DEV", "3000000000");
      else
        qunsetenv("FAKE_DEV");
      QTemporaryDir data;
      auto w = makeWindow(data.path());
      GenerationParams p = w->generationPanel()->params();
      p.steps = 3;
      w->generationPanel()->setParams(p);
      QVERIFY(!w->generate().isEmpty());
      QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, 15000);
      QTRY_COMPARE_WITH_TIMEOUT(w->rankModel()->stats(0).stage, QString("idle"), 5000);
      RankMonitor* mon = w->rankMonitor();
      QCOMPARE(mon->seriesCount(), 2);  // one line per rank
      for (int r = 0; r < 2; ++r) {
        QCOMPARE(w->rankModel()->hasDevice(r), device);
        QCOMPARE(mon->plotsDevice(r), device);
        QCOMPARE(mon->seriesName(r), device ? QStringLiteral("rank %1 device").arg(r)
                                            : QStringLiteral("rank %1 RSS").arg(r));
      }
      const QList<QPointF> pts = mon->seriesPoints(0);
      QVERIFY(pts.size() >= 3);
      for (int i = 1; i < pts.size(); ++i) QVERIFY(pts[i].x() > pts[i - 1].x());  // once each
      // Step 2's sample: device 3e9 + 2 MiB, host RSS 1e8 + 2 bytes (the fake's figures).
      const double expected =
          device ? (3000000000.0 + 2 * 1048576.0) / 1048576.0 : (100000000.0 + 2) / 1048576.0;
      QVERIFY2(std::abs(pts[1].y() - expected) < 1e-6,
               qPrintable(QStringLiteral("%1 vs %2").arg(pts[1].y()).arg(expected)));
      QCOMPARE(mon->chartTitle(),
               device ? QString("Device memory per rank") : QString("Host memory (RSS) per rank"));
      stopAndWait(w.get());
    }
    qunsetenv("FAKE_DEV");
  }

  // A hostfile naming a host ssh cannot resolve: the banner names the host and ssh's cause (not
  // only OpenMPI's generic text), and the request stays queued; once the hostfile is fixed,
  // Start runs it.
  void hostfileFailureNamesTheHostAndKeepsTheRequest() {
    qputenv("FAKE_MODE", "unknown_host");
    QTemporaryDir data;
    const QString hostfile = data.filePath("hosts");
    {
      QFile f(hostfile);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write("localhost slots=1\nnode-b.invalid slots=1\n");
    }
    auto w = makeWindow(data.path());
    w->strategyEditor()->setHostfile(hostfile);
    GenerationParams p = w->generationPanel()->params();
    p.steps = 2;
    w->generationPanel()->setParams(p);
    // First the pre-flight (issue 36; a stand-in ssh that cannot resolve the name, as ssh says
    // it): the host is named before mpirun starts, nothing starts, the request stays queued.
    const QString bin = data.filePath("bin");
    QVERIFY(QDir().mkpath(bin));
    {
      QFile ssh(bin + "/ssh");
      QVERIFY(ssh.open(QIODevice::WriteOnly));
      ssh.write(
          "#!/bin/sh\necho 'ssh: Could not resolve hostname node-b.invalid: Name or service "
          "not known' >&2\nexit 255\n");
      ssh.setPermissions(QFile::ReadOwner | QFile::WriteOwner | QFile::ExeOwner);
    }
    const QByteArray path = qgetenv("PATH");
    qputenv("PATH", bin.toLocal8Bit() + ":" + path);
    const QString id = w->generate();
    QVERIFY2(!id.isEmpty(), qPrintable(w->bannerText()));
    QTRY_VERIFY_WITH_TIMEOUT(w->bannerText().startsWith("Pre-flight failed on host node-b.invalid"),
                             15000);
    qputenv("PATH", path);
    QVERIFY(w->bannerVisible());
    QVERIFY2(w->bannerText().contains("node-b.invalid") && w->bannerText().contains("Fix: ") &&
                 w->bannerText().contains("1 request(s) stay queued"),
             qPrintable(w->bannerText()));
    QVERIFY(!w->controller()->isRunning());
    QVERIFY(!w->controller()->checkingHosts());
    QVERIFY(w->startAction()->isEnabled());
    QCOMPARE(w->controller()->queue().size(), 1);
    // Without the pre-flight, mpirun's own report of the host it could not reach is named.
    w->controller()->setPreflight(false);
    QVERIFY(w->startGroup());
    QTRY_COMPARE_WITH_TIMEOUT(w->controller()->state(), WorkerController::State::Failed, 15000);
    QVERIFY(w->bannerVisible());
    const QString banner = w->bannerText();
    QVERIFY2(banner.startsWith("Host node-b.invalid could not be reached: ssh could not resolve "
                               "the host name (Name or service not known)"),
             qPrintable(banner));
    QVERIFY2(banner.contains("1 request(s) stay queued"), qPrintable(banner));
    QCOMPARE(w->controller()->lastFailure().host, QString("node-b.invalid"));
    // The request is still queued, with its id, and shown in the queue.
    QCOMPARE(w->controller()->queue().size(), 1);
    QCOMPARE(w->controller()->queue().first().id, id);
    QCOMPARE(w->queueView()->model()->rowCount(), 1);
    QCOMPARE(w->gallery()->count(), 0);
    // The hostfile fixed (here: the group on this machine), Start runs the kept request.
    qputenv("FAKE_MODE", "ok");
    w->strategyEditor()->setHostfile(QString());
    QVERIFY(w->startGroup());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, 15000);
    QVERIFY(w->gallery()->shownEntry().requestId == id);
    QVERIFY(w->controller()->queue().isEmpty());
    stopAndWait(w.get());
  }

  // The worker's truncation warning shows at the prompt (not only in the log) and goes once the
  // prompt is edited.
  void truncationWarningAtThePrompt() {
    qputenv("FAKE_TRUNCATE", "1");
    QTemporaryDir data;
    auto w = makeWindow(data.path());
    GenerationParams p = w->generationPanel()->params();
    p.steps = 2;
    p.prompt = "a very long prompt";
    w->generationPanel()->setParams(p);
    QLabel* warn = w->generationPanel()->promptWarningLabel();
    QVERIFY(!warn->isVisible());
    QVERIFY(!w->generate().isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(warn->isVisible(), 15000);
    QVERIFY2(warn->text().contains("the prompt was truncated: CLIP can only handle sequences up "
                                   "to 77 tokens; 25 of its 100 tokens were dropped"),
             qPrintable(warn->text()));
    // Under the prompt, inside the left column.
    QWidget* prompt = w->generationPanel()->promptEdit();
    QVERIFY(warn->mapTo(w.get(), QPoint(0, 0)).y() > prompt->mapTo(w.get(), QPoint(0, 0)).y());
    QVERIFY(w->generateScroll()->viewport()->rect().contains(QRect(
        warn->mapTo(w->generateScroll()->viewport(), QPoint(0, 0)), QSize(warn->width(), 1))));
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, 15000);
    // Editing the prompt removes it.
    QTest::keyClicks(w->generationPanel()->promptEdit(), " shorter");
    QVERIFY(!warn->isVisible());
    QVERIFY(w->generationPanel()->promptWarnings().isEmpty());
    qunsetenv("FAKE_TRUNCATE");
    stopAndWait(w.get());
  }

  // A cancelled request's preview does not stay in the viewer.
  void cancelledPreviewIsCleared() {
    qputenv("FAKE_STEP_SLEEP", "0.05");
    QTemporaryDir data;
    HistoryStore h(data.path());
    QVERIFY(h.load());
    const HistoryEntry before = entry(data.path(), "before.png", Qt::red, "earlier", 1);
    QVERIFY(h.add(before));
    auto w = makeWindow(data.path());
    GenerationParams p = w->generationPanel()->params();
    p.steps = 200;
    w->generationPanel()->setParams(p);
    QVERIFY(!w->generate().isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(w->gallery()->showsPreview(), 15000);
    QTRY_VERIFY(w->windowTitle().contains("%"));
    w->cancelCurrent();
    QTRY_VERIFY_WITH_TIMEOUT(!w->gallery()->showsPreview(), 10000);
    QCOMPARE(w->gallery()->shownEntry().path, before.path);
    QCOMPARE(w->gallery()->currentImage().pixelColor(0, 0), QColor(Qt::red));
    QTRY_COMPARE_WITH_TIMEOUT(w->windowTitle(), QString("DiT Studio"), 5000);
    stopAndWait(w.get());
  }

  // Errors are scrolled into view: a refused Generate shows the field behind the refusal, and an
  // error line in the log is scrolled to even when the reader had scrolled up.
  void errorsScrolledIntoView() {
    QTemporaryDir data;
    auto w = makeWindow(data.path());
    w->resize(1024, 700);
    QTest::qWait(50);
    w->leftTabs()->setCurrentIndex(2);
    QScrollArea* scroll = w->generateScroll();
    scroll->verticalScrollBar()->setValue(0);
    LoraList* loras = w->generationPanel()->loraList();
    loras->addLora(data.filePath("gone.safetensors"));
    QVERIFY(w->generate().isEmpty());
    QVERIFY(w->bannerVisible());
    QCOMPARE(w->leftTabs()->currentIndex(), 0);
    const QRect inView(loras->mapTo(scroll->viewport(), QPoint(0, 0)), loras->size());
    QVERIFY2(scroll->viewport()->rect().intersects(inView),
             qPrintable(QStringLiteral("LoRA list at y %1 in a %2 px viewport")
                            .arg(inView.y())
                            .arg(scroll->viewport()->height())));
    LogPanel* log = w->logPanel();
    for (int i = 0; i < 400; ++i) log->append(-1, "info", QStringLiteral("line %1").arg(i));
    log->view()->verticalScrollBar()->setValue(0);
    log->append(-1, "error", "something failed");
    QCOMPARE(log->view()->verticalScrollBar()->value(),
             log->view()->verticalScrollBar()->maximum());
  }

  // ---- features ----

  // Two selected images compared: swipe (a drag moves the divider), blink (they alternate), side
  // by side; the batch of a request as a grid.
  void compareSwipeBlinkAndBatchGrid() {
    QTemporaryDir data;
    HistoryStore h(data.path());
    QVERIFY(h.load());
    // Newest first: c, b, a (b and c one batch).
    QVERIFY(h.add(entry(data.path(), "a.png", Qt::red, "a", 1, "r1-x")));
    QVERIFY(h.add(entry(data.path(), "b.png", Qt::blue, "b", 2, "r2-x")));
    QVERIFY(h.add(entry(data.path(), "c.png", Qt::green, "c", 3, "r2-x")));
    auto w = makeWindow(data.path());
    Gallery* g = w->gallery();
    QListWidget* list = g->thumbnails();
    QVERIFY(!g->compareButton()->isEnabled());
    // Click the newest, Ctrl+click the oldest.
    QTest::mouseClick(list->viewport(), Qt::LeftButton, {},
                      list->visualItemRect(list->item(0)).center());
    QTest::mouseClick(list->viewport(), Qt::LeftButton, Qt::ControlModifier,
                      list->visualItemRect(list->item(2)).center());
    QCOMPARE(g->selectedRows(), (QList<int>{0, 2}));
    QVERIFY(g->compareButton()->isEnabled());
    QTest::mouseClick(g->compareButton(), Qt::LeftButton);
    QVERIFY(g->comparing());
    CompareView* cv = g->compareView();
    QCOMPARE(cv->mode(), CompareView::Mode::Swipe);
    QTest::qWait(50);
    const QRectF r = cv->imageRect(0);
    QVERIFY(r.width() > 20);
    // Left of the divider the first image (green c), right of it the second (red a).
    QCOMPARE(pixelAt(cv, QPointF(r.left() + r.width() * 0.25, r.center().y())), QColor(Qt::green));
    QCOMPARE(pixelAt(cv, QPointF(r.left() + r.width() * 0.75, r.center().y())), QColor(Qt::red));
    // Drag the divider to 10%.
    QTest::mousePress(cv, Qt::LeftButton, {}, r.center().toPoint());
    const QPointF to(r.left() + r.width() * 0.1, r.center().y());
    QMouseEvent move(QEvent::MouseMove, to, cv->mapToGlobal(to), Qt::NoButton, Qt::LeftButton,
                     Qt::NoModifier);
    QApplication::sendEvent(cv, &move);
    QTest::mouseRelease(cv, Qt::LeftButton, {}, to.toPoint());
    QVERIFY(std::abs(cv->split() - 0.1) < 0.02);
    QCOMPARE(pixelAt(cv, QPointF(r.left() + r.width() * 0.25, r.center().y())), QColor(Qt::red));
    // Blink: the two alternate by themselves.
    g->compareModeBox()->setCurrentIndex(g->compareModeBox()->findText("Blink"));
    QCOMPARE(cv->mode(), CompareView::Mode::Blink);
    QVERIFY(cv->blinking());
    cv->setBlinkInterval(60);
    const QColor first = pixelAt(cv, cv->imageRect(0).center());
    QTRY_VERIFY_WITH_TIMEOUT(pixelAt(cv, cv->imageRect(0).center()) != first, 2000);
    // Side by side: both at once.
    g->compareModeBox()->setCurrentIndex(g->compareModeBox()->findText("Side by side"));
    QVERIFY(!cv->blinking());
    QCOMPARE(pixelAt(cv, cv->imageRect(0).center()), QColor(Qt::green));
    QCOMPARE(pixelAt(cv, cv->imageRect(1).center()), QColor(Qt::red));
    QVERIFY(!cv->imageRect(0).intersects(cv->imageRect(1)));
    g->closeCompare();
    QVERIFY(!g->comparing());
    // The batch of the newest image (b and c) as a grid, in image order.
    list->setCurrentRow(0);
    QVERIFY(g->gridButton()->isEnabled());
    QTest::mouseClick(g->gridButton(), Qt::LeftButton);
    QVERIFY(g->comparing());
    QCOMPARE(cv->mode(), CompareView::Mode::Grid);
    QCOMPARE(cv->imageCount(), 2);
    QTest::qWait(50);
    QCOMPARE(pixelAt(cv, cv->imageRect(0).center()), QColor(Qt::blue));
    QCOMPARE(pixelAt(cv, cv->imageRect(1).center()), QColor(Qt::green));
    // A double click on a cell shows that image.
    QTest::mouseDClick(cv, Qt::LeftButton, {}, cv->imageRect(0).center().toPoint());
    QVERIFY(!g->comparing());
    QCOMPARE(g->shownEntry().path, data.filePath("b.png"));
  }

  // The gallery's search over prompt, model, strategy, seed and date, typed into its field.
  void galleryFilter() {
    QTemporaryDir data;
    HistoryStore h(data.path());
    QVERIFY(h.load());
    HistoryEntry fox = entry(data.path(), "fox.png", Qt::red, "a red fox in the snow", 42, "r1",
                             QDateTime(QDate(2025, 1, 5), QTime(10, 0)));
    fox.params.insert("model", "/models/tiny-flux");
    fox.params.insert("strategy", strategyToJson(strat(2, 1, 2)));
    HistoryEntry bird = entry(data.path(), "bird.png", Qt::blue, "a blue bird", 7, "r2",
                              QDateTime(QDate(2025, 2, 9), QTime(11, 30)));
    bird.params.insert("model", "/models/flux-dev");
    bird.params.insert("strategy", "4 ranks: tp 2 x ulysses 2 on cuda");
    HistoryEntry fox2 = entry(data.path(), "fox2.png", Qt::green, "an orange fox", 4242, "r3",
                              QDateTime(QDate(2025, 2, 10), QTime(9, 0)));
    fox2.params.insert("model", "/models/flux-dev");
    QVERIFY(h.add(fox) && h.add(bird) && h.add(fox2));
    auto w = makeWindow(data.path());
    Gallery* g = w->gallery();
    QCOMPARE(g->visibleCount(), 3);
    QLineEdit* f = g->filterEdit();
    auto typed = [&](const QString& query) {
      f->clear();
      QTest::keyClicks(f, query);
      return g->visibleCount();
    };
    QCOMPARE(typed("fox"), 2);
    QCOMPARE(typed("FOX snow"), 1);
    QCOMPARE(typed("prompt:bird"), 1);
    QCOMPARE(typed("model:flux-dev"), 2);
    QCOMPARE(typed("strategy:ring"), 1);
    QCOMPARE(typed("strategy:ulysses"), 1);
    QCOMPARE(typed("seed:4242"), 1);
    QCOMPARE(typed("seed:42"), 2);  // 42 and 4242
    QCOMPARE(typed("date:2025-02"), 2);
    QCOMPARE(typed("date:2025-01-05"), 1);
    QCOMPARE(typed("\"orange fox\""), 1);
    QCOMPARE(typed("nothing-like-this"), 0);
    f->clear();
    QCOMPARE(g->visibleCount(), 3);
    // The filter follows new images.
    QTest::keyClicks(f, "bird");
    QVERIFY(!g->thumbnails()->isRowHidden(1));
    QVERIFY(g->thumbnails()->isRowHidden(0));
  }

  // The prompts generated with come back from the "History" menu, newest first, after a relaunch
  // too.
  void promptHistory() {
    QTemporaryDir data;
    {
      auto w = makeWindow(data.path());
      GenerationParams p = w->generationPanel()->params();
      p.steps = 1;
      for (const char* prompt : {"a red fox", "a blue bird", "a red fox"}) {
        p.prompt = prompt;
        w->generationPanel()->setParams(p);
        QVERIFY(!w->generate().isEmpty());
      }
      QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 3, 15000);
      QCOMPARE(w->promptHistory()->prompts(), (QStringList{"a red fox", "a blue bird"}));
      stopAndWait(w.get());
    }
    auto w = makeWindow(data.path());
    QToolButton* b = w->generationPanel()->promptHistoryButton();
    QVERIFY(b->isEnabled());
    const QList<QAction*> items = w->generationPanel()->promptHistoryMenu()->actions();
    QCOMPARE(items.size(), 2);
    QCOMPARE(items[0]->text(), QString("a red fox"));
    QCOMPARE(items[1]->text(), QString("a blue bird"));
    w->generationPanel()->promptEdit()->setPlainText("typed");
    items[1]->trigger();
    QCOMPARE(w->generationPanel()->promptEdit()->toPlainText(), QString("a blue bird"));
    PromptHistory again(data.path(), 2);
    QVERIFY(again.load());
    QVERIFY(again.add("third"));
    QCOMPARE(again.prompts(), (QStringList{"third", "a red fox"}));
  }

  // "Repeat" queues several requests (a fixed seed advancing), and a waiting request moves up in
  // the queue: it runs before the one it passed.
  void repeatAndQueueReorder() {
    qputenv("FAKE_STEP_SLEEP", "0.05");
    QTemporaryDir data;
    auto w = makeWindow(data.path());
    GenerationParams p = w->generationPanel()->params();
    p.steps = 200;
    p.seed = 100;
    p.random_seed = false;
    p.num_images = 1;
    w->generationPanel()->setParams(p);
    w->generationPanel()->repeatSpin()->setValue(3);
    QVERIFY(!w->generate().isEmpty());
    const QStringList ids = w->lastGenerated();
    QCOMPARE(ids.size(), 3);
    QTRY_VERIFY_WITH_TIMEOUT(
        !w->controller()->queue().isEmpty() && w->controller()->queue().first().step >= 1, 15000);
    const auto q = w->controller()->queue();
    QCOMPARE(q.size(), 3);
    QCOMPARE(q[0].params.seed, std::uint64_t(100));
    QCOMPARE(q[1].params.seed, std::uint64_t(101));
    QCOMPARE(q[2].params.seed, std::uint64_t(102));
    // Select the last one and move it up (the button, as a user).
    QListView* view = w->queueView();
    QCOMPARE(view->model()->rowCount(), 3);
    view->setCurrentIndex(view->model()->index(2, 0));
    QPushButton* up = w->findChild<QPushButton*>("moveUp");
    QVERIFY(up && up->isEnabled());
    QTest::mouseClick(up, Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(view->model()->rowCount(), 3, 5000);
    QCOMPARE(view->currentIndex().row(), 1);
    const QString moved = view->currentIndex().data(Qt::UserRole).toString();
    QVERIFY(moved != ids[2]);
    QCOMPARE(view->model()->index(0, 0).data(Qt::UserRole).toString(), ids[0]);  // running one
    // The running request cannot move.
    view->setCurrentIndex(view->model()->index(0, 0));
    QVERIFY(!up->isEnabled());
    // Cancel the running one: the moved request (seed 102) runs next, then seed 101.
    w->cancelCurrent();
    QTRY_VERIFY_WITH_TIMEOUT(
        w->controller()->activeId() == moved && w->controller()->queue().first().step >= 1, 15000);
    QCOMPARE(w->controller()->queue().first().params.seed, std::uint64_t(102));
    QCOMPARE(w->controller()->queue().size(), 2);
    QCOMPARE(w->controller()->queue().at(1).params.seed, std::uint64_t(101));
    QVERIFY(w->windowTitle().contains("queued"));
    stopAndWait(w.get());
  }

  // The menu bar lists every action with its shortcut; the title shows the progress.
  void menuBarAndTitleProgress() {
    qputenv("FAKE_STEP_SLEEP", "0.05");
    QTemporaryDir data;
    auto w = makeWindow(data.path());
    QStringList menus;
    for (QAction* a : w->menuBar()->actions()) menus << a->text().remove('&');
    QCOMPARE(menus, (QStringList{"File", "Group", "Generate", "View", "Help"}));
    const QString keys = w->shortcutList().join('\n');
    for (const char* k : {"Ctrl+Return", "Esc", "Ctrl+Q", "Ctrl+O", "F5", "Ctrl+F", "Ctrl+K",
                          "Ctrl+G", "Ctrl+H", "Alt+1", "F1"})
      QVERIFY2(keys.contains(QString::fromLatin1(k)), qPrintable(k + QString(" in\n") + keys));
    QVERIFY(keys.contains("Generate > ✦ Generate: Ctrl+Return"));
    // The shortcut in the menu works: Ctrl+F goes to the gallery's search.
    w->activateWindow();
    QVERIFY(QTest::qWaitForWindowActive(w.get()));
    QTest::keyClick(w.get(), Qt::Key_F, Qt::ControlModifier);
    QTRY_VERIFY(w->gallery()->filterEdit()->hasFocus());
    // Progress in the title.
    GenerationParams p = w->generationPanel()->params();
    p.steps = 40;
    w->generationPanel()->setParams(p);
    QVERIFY(!w->generate().isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(
        QRegularExpression("^\\d+% · DiT Studio$").match(w->windowTitle()).hasMatch(), 15000);
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, 30000);
    QTRY_COMPARE_WITH_TIMEOUT(w->windowTitle(), QString("DiT Studio"), 5000);
    stopAndWait(w.get());
  }

  // The mask overlay shows over any colour, red included: over each init image the repaint area
  // has pixels far from the image's colour (the old red tint vanished on red), its outline has
  // both a light and a dark pixel, and the kept area is the image untouched.
  void maskOverlayShowsOnAnyColour() {
    QTemporaryDir data;
    ImageInputPanel panel;
    panel.resize(360, 620);
    panel.show();
    QVERIFY(QTest::qWaitForWindowExposed(&panel));
    MaskCanvas* cv = panel.canvas();
    for (const QColor& c : {QColor(Qt::red), QColor(230, 40, 40), QColor(Qt::white),
                            QColor(Qt::black), QColor(0x5b, 0x2a, 0x86)}) {
      const QString path = writePng(data.filePath(c.name().mid(1) + ".png"), c, {}, 64);
      QVERIFY(panel.loadInitImage(path));
      QImage m(64, 64, QImage::Format_Grayscale8);
      m.fill(0);
      for (int y = 0; y < 64; ++y) std::fill_n(m.scanLine(y), 32, uchar(255));  // left half
      cv->setMask(m);
      QCOMPARE(cv->maskedPixels(), qint64(32 * 64));
      const QImage shot = cv->grab().toImage();
      const qreal dpr = shot.devicePixelRatio();
      auto far = [&](QPoint wp) {
        const QColor px = shot.pixelColor(QPoint(int(wp.x() * dpr), int(wp.y() * dpr)));
        return std::max({std::abs(px.red() - c.red()), std::abs(px.green() - c.green()),
                         std::abs(px.blue() - c.blue())});
      };
      auto count = [&](QPointF from, QPointF to, int* farOnes) {
        const QRect r(cv->toWidget(from).toPoint(), cv->toWidget(to).toPoint());
        int n = 0;
        *farOnes = 0;
        for (int y = r.top(); y <= r.bottom(); ++y)
          for (int x = r.left(); x <= r.right(); ++x, ++n) *farOnes += far(QPoint(x, y)) > 60;
        return n;
      };
      int inFar = 0, outFar = 0;
      const int inN = count({3, 3}, {28, 60}, &inFar);
      const int outN = count({35, 3}, {60, 60}, &outFar);
      QVERIFY(inN > 500 && outN > 500);
      // At least the stripes of one of black and white stand out, whatever the colour.
      QVERIFY2(
          inFar >= inN * 2 / 5,
          qPrintable(
              QStringLiteral("%1: %2 of %3 pixels visible").arg(c.name()).arg(inFar).arg(inN)));
      QCOMPARE(outFar, 0);
      // The outline (image column 32's left edge): black and white dashes.
      int light = 0, dark = 0;
      const int ex = int(cv->toWidget(QPointF(31.5, 0)).x());
      for (int y = int(cv->toWidget({0, 3}).y()); y < int(cv->toWidget({0, 60}).y()); ++y)
        for (int x = ex - 2; x <= ex + 1; ++x) {
          const QColor px = shot.pixelColor(QPoint(int(x * dpr), int(y * dpr)));
          light += px.lightness() > 230;
          dark += px.lightness() < 25;
        }
      QVERIFY2(light > 5 && dark > 5, qPrintable(c.name()));
    }
  }

  // The mask editor: a soft brush (values fading to the rim, the hard one a full disk), undo and
  // redo of strokes, Clear and Invert by the buttons and Ctrl+Z / Ctrl+Shift+Z on the mask, and
  // the soft values in the mask sent to the worker.
  void maskEditorUndoAndSoftBrush() {
    QTemporaryDir data;
    ImageInputPanel panel;
    panel.setMaskDir(data.filePath("masks"));
    panel.resize(360, 620);
    panel.show();
    QVERIFY(QTest::qWaitForWindowExposed(&panel));
    QVERIFY(panel.loadInitImage(writePng(data.filePath("red.png"), Qt::red, {}, 64)));
    MaskCanvas* cv = panel.canvas();
    auto at = [&](int x, int y) { return int(cv->mask().constScanLine(y)[x]); };
    QVERIFY(!panel.undoButton()->isEnabled() && !panel.redoButton()->isEnabled());
    panel.brushSpin()->setValue(8);
    QCOMPARE(cv->brushRadius(), 8);
    // Hard brush: a full disk.
    QTest::mouseClick(cv, Qt::LeftButton, {}, cv->toWidget(QPointF(16, 16)).toPoint());
    QCOMPARE(at(16, 16), 255);
    QCOMPARE(at(21, 16), 255);
    QCOMPARE(at(27, 16), 0);
    const QImage first = cv->mask().copy();
    QVERIFY(panel.undoButton()->isEnabled());
    // Soft brush: full at the centre, fading to 0 at the rim.
    panel.softnessSpin()->setValue(100);
    QCOMPARE(cv->softness(), 100);
    QTest::mouseClick(cv, Qt::LeftButton, {}, cv->toWidget(QPointF(44, 44)).toPoint());
    QVERIFY2(at(44, 44) >= 200, qPrintable(QString::number(at(44, 44))));
    QVERIFY2(at(48, 44) > 40 && at(48, 44) < 215, qPrintable(QString::number(at(48, 44))));
    QVERIFY(at(50, 44) < at(48, 44));
    QCOMPARE(at(54, 44), 0);
    const QImage both = cv->mask().copy();
    // What the worker gets carries the soft values.
    GenerationParams p;
    panel.apply(p);
    QVERIFY(!p.mask_image.empty());
    QCOMPARE(
        QImage(QString::fromStdString(p.mask_image)).convertToFormat(QImage::Format_Grayscale8),
        both);
    // Undo (button): the soft stroke goes; Ctrl+Z on the mask: the hard one too.
    QTest::mouseClick(panel.undoButton(), Qt::LeftButton);
    QCOMPARE(cv->mask(), first);
    panel.activateWindow();
    QVERIFY(QTest::qWaitForWindowActive(&panel));
    cv->setFocus();
    QTest::keyClick(cv, Qt::Key_Z, Qt::ControlModifier);
    QCOMPARE(cv->maskedPixels(), qint64(0));
    QVERIFY(!cv->canUndo());
    QVERIFY(!panel.undoButton()->isEnabled());
    QVERIFY(panel.redoButton()->isEnabled());
    // Redo twice (button, then Ctrl+Shift+Z with the button focused): both strokes are back.
    QTest::mouseClick(panel.redoButton(), Qt::LeftButton);
    QCOMPARE(cv->mask(), first);
    QTest::keyClick(cv, Qt::Key_Z, Qt::ControlModifier | Qt::ShiftModifier);
    QCOMPARE(cv->mask(), both);
    // Invert and Clear are steps too.
    QTest::mouseClick(panel.invertMaskButton(), Qt::LeftButton);
    QCOMPARE(at(0, 0), 255);
    QTest::mouseClick(panel.clearMaskButton(), Qt::LeftButton);
    QCOMPARE(cv->maskedPixels(), qint64(0));
    QTest::mouseClick(panel.undoButton(), Qt::LeftButton);
    QCOMPARE(at(0, 0), 255);
    QTest::mouseClick(panel.undoButton(), Qt::LeftButton);
    QCOMPARE(cv->mask(), both);
    // A new image starts a new history.
    QVERIFY(panel.loadInitImage(writePng(data.filePath("blue.png"), Qt::blue, {}, 64)));
    QVERIFY(!cv->canUndo() && !panel.undoButton()->isEnabled());
  }

  // The LoRA browser over a chosen folder (subfolders too): each file with its own header
  // (format, rank) and its own __metadata__, whether the model takes it, a filter over names and
  // metadata, and Add; the folder is remembered across launches.
  void loraBrowserShowsEachFilesMetadata() {
    QTemporaryDir data, folder;
    const QString lora = fixture() + "/lora/";
    QVERIFY(QFile::copy(lora + "lora-kohya.safetensors", folder.filePath("kohya.safetensors")));
    QVERIFY(QDir(folder.path()).mkpath("sub"));
    QVERIFY(QFile::copy(lora + "lora-diffusers-metaalpha.safetensors",
                        folder.filePath("sub/peft.safetensors")));
    // A file with a trainer's metadata in its header.
    {
      const QByteArray in = fileBytes(lora + "lora-diffusers-alphas.safetensors");
      quint64 n = 0;
      memcpy(&n, in.constData(), 8);
      QJsonObject h = QJsonDocument::fromJson(in.mid(8, int(n))).object();
      h["__metadata__"] = QJsonObject{{"format", "pt"},
                                      {"modelspec.title", "Watercolor fox"},
                                      {"ss_output_name", "watercolor-fox-v2"}};
      QByteArray hj = QJsonDocument(h).toJson(QJsonDocument::Compact);
      while (hj.size() % 8) hj.append(' ');
      QFile f(folder.filePath("watercolor.safetensors"));
      QVERIFY(f.open(QIODevice::WriteOnly));
      const quint64 m = quint64(hj.size());
      f.write(reinterpret_cast<const char*>(&m), 8);
      f.write(hj);
      f.write(in.mid(8 + int(n)));
    }
    {
      QFile f(folder.filePath("broken.safetensors"));
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write("not a safetensors file");
    }
    {
      auto w = makeWindow(data.path());
      LoraList* list = w->generationPanel()->loraList();
      list->setBrowseFolder(folder.path());
      QTest::mouseClick(list->browseButton(), Qt::LeftButton);
      LoraBrowser* b = list->browser();
      QVERIFY(b && b->isVisible());
      QCOMPARE(b->files().size(), 4);
      QStringList names;
      for (int i = 0; i < b->fileList()->count(); ++i) names << b->fileList()->item(i)->text();
      QCOMPARE(names, (QStringList{"broken.safetensors", "kohya.safetensors",
                                   "sub/peft.safetensors", "watercolor.safetensors"}));
      auto metadata = [&] {
        QMap<QString, QString> m;
        for (int r = 0; r < b->metadataTable()->rowCount(); ++r)
          m[b->metadataTable()->item(r, 0)->text()] = b->metadataTable()->item(r, 1)->text();
        return m;
      };
      // Each file's own metadata, as the user clicks through them.
      QTest::mouseClick(b->fileList()->viewport(), Qt::LeftButton, {},
                        b->fileList()->visualItemRect(b->fileList()->item(1)).center());
      QCOMPARE(b->selectedFile(), folder.filePath("kohya.safetensors"));
      QVERIFY2(b->summaryLabel()->text().contains("kohya, rank 4"),
               qPrintable(b->summaryLabel()->text()));
      QVERIFY(b->summaryLabel()->text().contains("the loaded model takes it"));
      QMap<QString, QString> m = metadata();
      QCOMPARE(m.value("ss_network_dim"), QString("4"));
      QCOMPARE(m.value("ss_network_module"), QString("networks.lora_flux"));
      QVERIFY(!m.contains("modelspec.title"));
      QTest::mouseClick(b->fileList()->viewport(), Qt::LeftButton, {},
                        b->fileList()->visualItemRect(b->fileList()->item(3)).center());
      m = metadata();
      QCOMPARE(m.value("modelspec.title"), QString("Watercolor fox"));
      QCOMPARE(m.value("ss_output_name"), QString("watercolor-fox-v2"));
      QVERIFY(!m.contains("ss_network_dim"));
      QVERIFY(b->summaryLabel()->text().contains("diffusers, rank 4"));
      b->select(2);  // the PEFT file: its lora_adapter_metadata
      QVERIFY(metadata().value("lora_adapter_metadata").contains("\"transformer.lora_alpha\":6"));
      b->select(0);
      QVERIFY2(b->summaryLabel()->text().contains("not usable"),
               qPrintable(b->summaryLabel()->text()));
      QVERIFY(b->metadataTable()->rowCount() == 0);
      // The filter: over names and metadata.
      auto visible = [&] {
        QStringList v;
        for (int i = 0; i < b->fileList()->count(); ++i)
          if (!b->fileList()->item(i)->isHidden()) v << b->fileList()->item(i)->text();
        return v;
      };
      QTest::keyClicks(b->filterEdit(), "watercolor");
      QCOMPARE(visible(), QStringList{"watercolor.safetensors"});
      b->filterEdit()->clear();
      QTest::keyClicks(b->filterEdit(), "networks.lora_flux");
      QCOMPARE(visible(), QStringList{"kohya.safetensors"});
      b->filterEdit()->clear();
      QCOMPARE(visible().size(), 4);
      // Add: the shown file goes into the LoRA list.
      b->select(3);
      QTest::mouseClick(b->addButton(), Qt::LeftButton);
      QCOMPARE(list->count(), 1);
      QCOMPARE(QString::fromStdString(list->loras().at(0).file),
               folder.filePath("watercolor.safetensors"));
      w->close();
    }
    auto w = makeWindow(data.path());
    QCOMPARE(w->generationPanel()->loraList()->browseFolder(), folder.path());
  }

#ifdef DITSTUDIO_HAVE_DBUS
 public Q_SLOTS:
  void launcherUpdate(const QString& uri, const QVariantMap& props) {
    launcherUpdates_.append({uri, props});
  }

 private:
  QList<QPair<QString, QVariantMap>> launcherUpdates_;

 private Q_SLOTS:
#endif
  // Progress on the taskbar: the Unity LauncherEntry signal that docks and task managers read,
  // on a private D-Bus session bus: the bar while a request runs, gone when it is done.
  void taskbarProgressOverDBus() {
#ifndef DITSTUDIO_HAVE_DBUS
    QSKIP("built without QtDBus: no taskbar progress on this build (the title shows it)");
#else
    QVERIFY(TaskbarProgress::supported());
    QProcess bus;
    bus.start("dbus-daemon", {"--session", "--nofork", "--print-address=1"});
    QVERIFY2(bus.waitForStarted(5000), "dbus-daemon (Debian package dbus-daemon) is needed");
    QTRY_VERIFY_WITH_TIMEOUT(bus.canReadLine(), 5000);
    const QString address = QString::fromLocal8Bit(bus.readLine()).trimmed();
    QVERIFY(address.startsWith("unix:"));
    {
      QDBusConnection watch = QDBusConnection::connectToBus(address, "launcher-watch");
      QVERIFY(watch.isConnected());
      QVERIFY(watch.connect(QString(), TaskbarProgress::objectPath(),
                            "com.canonical.Unity.LauncherEntry", "Update", this,
                            SLOT(launcherUpdate(QString, QVariantMap))));
      launcherUpdates_.clear();
      qputenv("FAKE_STEP_SLEEP", "0.05");
      QTemporaryDir data;
      auto w = makeWindow(data.path());
      QVERIFY(w->taskbar()->setBusAddress(address));
      QVERIFY(w->taskbar()->connected());
      GenerationParams p = w->generationPanel()->params();
      p.steps = 30;
      w->generationPanel()->setParams(p);
      w->generationPanel()->repeatSpin()->setValue(2);
      QVERIFY(!w->generate().isEmpty());
      auto midway = [&] {
        for (const auto& [uri, props] : launcherUpdates_)
          if (uri == "application://ditstudio.desktop" &&
              props.value("progress-visible").toBool() && props.value("progress").toDouble() > 0 &&
              props.value("progress").toDouble() < 1 && props.value("count").toLongLong() == 1 &&
              props.value("count-visible").toBool())
            return true;
        return false;
      };
      QTRY_VERIFY_WITH_TIMEOUT(midway(), 15000);
      QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 2, 30000);
      QTRY_VERIFY_WITH_TIMEOUT(
          !launcherUpdates_.isEmpty() &&
              !launcherUpdates_.last().second.value("progress-visible").toBool() &&
              !launcherUpdates_.last().second.value("count-visible").toBool(),
          5000);
      stopAndWait(w.get());
    }
    QDBusConnection::disconnectFromBus("launcher-watch");
    bus.terminate();
    bus.waitForFinished(3000);
#endif
  }

  // ---- the window at 1280x800 and 1024x700: nothing cut off, no sideways scroll ----
  void screenshotsAt1280x800And1024x700() {
    QTemporaryDir data;
    const QString picture = writePicture(data.filePath("picture.png"));
    QVERIFY(!picture.isEmpty());
    qputenv("FAKE_IMAGE", picture.toLocal8Bit());
    qputenv("FAKE_STATUS", "1");
    auto w = makeWindow(data.path());
    GenerationParams p = w->generationPanel()->params();
    p.prompt = "a large yellow star on a purple background, centre";
    p.steps = 4;
    w->generationPanel()->setParams(p);
    QVERIFY(w->generationPanel()->loraList()->addLora(
        fixture() + "/lora/lora-diffusers-metaalpha.safetensors", 0.8));
    w->generationPanel()->repeatSpin()->setValue(2);
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 2, 20000);
    QTRY_VERIFY_WITH_TIMEOUT(w->statusText().contains("ready"), 5000);
    const QString dir = qEnvironmentVariable("DITSTUDIO_UI_SNAPSHOT_DIR");
    for (const QSize size : {QSize(1280, 800), QSize(1024, 700)}) {
      w->resize(size);
      QTest::qWait(200);
      QCOMPARE(w->size(), size);
      // No sideways scroll in the left column, every column of the monitor on screen.
      QScrollArea* scroll = w->generateScroll();
      QVERIFY(w->generationPanel()->minimumSizeHint().width() <= scroll->viewport()->width());
      QTableView* table = w->rankMonitor()->table();
      QCOMPARE(table->horizontalScrollBar()->maximum(), 0);
      // Every gallery button and the toolbar's actions inside the window.
      for (QPushButton* b : w->gallery()->findChildren<QPushButton*>()) {
        if (!b->isVisible()) continue;
        QVERIFY2(w->rect().contains(rectIn(b, w.get())), qPrintable(b->text()));
        QVERIFY2(b->width() >= b->minimumSizeHint().width(), qPrintable(b->text()));
      }
      QVERIFY(w->rect().contains(rectIn(w->gallery()->filterEdit(), w.get())));
      QVERIFY(w->menuBar()->isVisible());
      // The LoRA row and Repeat in view (what the issue's LoRA defect was about).
      scroll->ensureWidgetVisible(w->generationPanel()->loraList(), 8, 120);
      QApplication::processEvents();
      const QRect lora(w->generationPanel()->loraList()->mapTo(scroll->viewport(), QPoint(0, 0)),
                       w->generationPanel()->loraList()->size());
      QVERIFY(scroll->viewport()->rect().intersects(lora));
      if (!dir.isEmpty())
        QVERIFY(w->grab().save(QDir(dir).filePath(
            QStringLiteral("desktop-%1x%2.png").arg(size.width()).arg(size.height()))));
    }
    stopAndWait(w.get());
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
  TestDesktop t;
  QTEST_SET_MAIN_SOURCE_PATH
  return QTest::qExec(&t, argc, argv);
}

#include "test_ui_desktop.moc"
