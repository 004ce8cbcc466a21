// Issue 46 in the window: the reference strip of the generation panel (ui/reference_strip.h).
//
// Without the worker: a model that takes no references (tiny-flux-A, FluxPipeline) shows the strip
// disabled with the reason; on FLUX.2 [klein] (tiny-flux2-A, at most 6) seven references show the
// resolve's refusal and Generate is disabled; dropped files, the move buttons and a thumbnail
// dragged onto another place reorder; a pasted image is saved in the data folder and never
// written over another file; "Use parameters" and presets restore the references, naming a file
// missing here and refusing (in the worker's words) a file whose SHA-256 changed.
//
// With the real worker (DITSTUDIO_TEST_WORKER, 2 ranks, ring 2): edit_ref_1 and edit_ref_0 are
// dropped on the strip, reordered to edit_ref_0, edit_ref_1 by dragging, and generated with
// diffusers' edit run 1 (EDIT.md: the squirrel prompt, seed 7, 3 steps, guidance 1, 64 x 48);
// the PNG equals run.1.image of edit.safetensors within one 8-bit level (and ditstudio-cli's
// --image run of the same request pixel for pixel, when DITSTUDIO_TEST_CLI is given); the
// history and the PNG record both references with their SHA-256, and "Use parameters" puts
// them back in that order.
//
// FLUX.1 Kontext (tiny-flux-kontext-A): one reference, its fitted size following the auto_resize
// knob, a second refused; with the worker, the window's image equals ditstudio-cli --image
// --max-area --auto-resize off of the same request pixel for pixel.
#include <QApplication>
#include <QClipboard>
#include <QDir>
#include <QDoubleSpinBox>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFile>
#include <QFileInfo>
#include <QImage>
#include <QJsonArray>
#include <QLabel>
#include <QMimeData>
#include <QProcess>
#include <QPushButton>
#include <QScrollArea>
#include <QSpinBox>
#include <QTabWidget>
#include <QTemporaryDir>
#include <QToolButton>
#include <QUrl>
#include <QtTest>
#include <cmath>
#include <cstring>
#include <memory>

#include "backend/io/safetensors.h"
#include "ui/gallery.h"
#include "ui/generation_panel.h"
#include "ui/history_store.h"
#include "ui/image_input_panel.h"
#include "ui/main_window.h"
#include "ui/preset_store.h"
#include "ui/reference_strip.h"

using namespace dit::ui;

namespace {
constexpr int kImageMs = 300000;
QString data() { return qEnvironmentVariable("DITSTUDIO_TEST_DATA"); }
QString klein() { return data() + "/tiny-flux2-A"; }
QString flux1() { return data() + "/tiny-flux-A"; }
QString ref(int i) { return klein() + QStringLiteral("/golden/edit_ref_%1.png").arg(i); }
QString worker() { return qEnvironmentVariable("DITSTUDIO_TEST_WORKER"); }
QString cli() { return qEnvironmentVariable("DITSTUDIO_TEST_CLI"); }
// EDIT.md run 1.
const char* kPrompt =
    "A Painting of a Squirrel eating a BURGER!! It's 3:45pm, isn't it? They'll say I'd've known.";

std::unique_ptr<MainWindow> window(const QString& dataDir, const QString& model) {
  MainWindowOptions o;
  o.dataDir = dataDir;
  o.modelDir = model;
  o.workerPath = worker();
  o.restoreSession = false;
  auto w = std::make_unique<MainWindow>(o);
  w->resize(1400, 1000);
  w->show();
  return w;
}

/// Drops `files` on the strip at `pos` (strip coordinates), as a file manager does.
void dropFiles(ReferenceStrip* s, const QStringList& files, QPoint pos) {
  QMimeData mime;
  QList<QUrl> urls;
  for (const QString& f : files) urls << QUrl::fromLocalFile(f);
  mime.setUrls(urls);
  QDragEnterEvent enter(pos, Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(s, &enter);
  QVERIFY(enter.isAccepted());
  QDropEvent drop(QPointF(pos), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(s, &drop);
}

/// Drags thumbnail `from` and drops it at `pos` (strip coordinates): the MIME data its QDrag
/// carries, through the strip's enter / move / drop handlers.
void dragTile(ReferenceStrip* s, int from, QPoint pos) {
  QMimeData mime;
  mime.setData(QString::fromLatin1(ReferenceStrip::kDragMime), QByteArray::number(from));
  QDragEnterEvent enter(pos, Qt::MoveAction, &mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(s, &enter);
  QVERIFY(enter.isAccepted());
  QDragMoveEvent move(pos, Qt::MoveAction, &mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(s, &move);
  QVERIFY(move.isAccepted());
  QDropEvent drop(QPointF(pos), Qt::MoveAction, &mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(s, &drop);
  QVERIFY(drop.isAccepted());
}

/// The left edge of thumbnail `i` in strip coordinates (a drop there inserts before it).
QPoint leftOf(ReferenceStrip* s, int i) {
  QWidget* t = s->tile(i);
  return t->mapTo(s, QPoint(4, t->height() / 2));
}

QStringList names(const ReferenceStrip* s) {
  QStringList out;
  for (const QString& p : s->paths()) out << QFileInfo(p).fileName();
  return out;
}

QStringList files(const dit::protocol::GenerationParams& p) {
  QStringList out;
  for (const auto& r : p.reference_images) out << QString::fromStdString(r.file);
  return out;
}
}  // namespace

class TestUiEdit : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void initTestCase() {
    for (const QString& f :
         {klein() + "/model_index.json", flux1() + "/model_index.json", ref(0), ref(1)})
      QVERIFY2(QFileInfo::exists(f), qPrintable(f + " is missing (DITSTUDIO_TEST_DATA)"));
    qunsetenv("DITSTUDIO_MPIRUN");
  }

  // FLUX.1 (FluxPipeline) takes none: the strip is disabled with the resolve's reason as its
  // tooltip and hint, Browse / Paste are off and a drop is refused. A recalled reference stays
  // removable and the validation shows the resolve's refusal.
  void modelWithoutReferencesDisablesTheStrip() {
    QTemporaryDir dir;
    auto w = window(dir.path(), flux1());
    GenerationPanel* panel = w->generationPanel();
    QVERIFY2(panel->modelInfo().ok, qPrintable(panel->modelInfo().error));
    QCOMPARE(panel->modelInfo().request.references.max_count, 0);
    ReferenceStrip* s = panel->referenceStrip();
    QVERIFY(!s->takesReferences());
    QVERIFY(!s->isEnabled());
    QVERIFY2(
        s->toolTip().contains("not supported for FLUX.1") && s->toolTip().contains("FluxPipeline"),
        qPrintable(s->toolTip()));
    QCOMPARE(s->hintLabel()->text(), s->disabledReason());
    QVERIFY(!s->browseButton()->isEnabled());
    QVERIFY(!s->pasteButton()->isEnabled());
    QVERIFY(s->browseButton()->isHidden());  // just the title and the reason
    QString err;
    QVERIFY(!s->addReference(ref(0), -1, &err));
    QCOMPARE(err, s->disabledReason());
    QCOMPARE(s->count(), 0);
    QMimeData mime;
    mime.setUrls({QUrl::fromLocalFile(ref(0))});
    QDragEnterEvent enter(QPoint(5, 5), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(s, &enter);
    QVERIFY(!enter.isAccepted());
    // A request recalled with a reference (made with another model): listed, removable, refused.
    GenerationParams p = panel->params();
    p.reference_images = {{ref(0).toStdString(), ""}};
    panel->setParams(p);
    QCOMPARE(s->count(), 1);
    QVERIFY(s->isEnabled());
    QVERIFY(s->removeButton(0)->isEnabled());
    QVERIFY(!s->browseButton()->isEnabled());
    QVERIFY(!w->generateAction()->isEnabled());
    QVERIFY2(w->validation().requestIssues.join('\n').contains(
                 "reference images are not supported for FLUX.1"),
             qPrintable(w->validation().all().join('\n')));
    s->removeButton(0)->click();
    QCOMPARE(s->count(), 0);
    QVERIFY(!s->isEnabled());
    QVERIFY2(w->validation().canGenerate(), qPrintable(w->validation().all().join('\n')));
  }

  // FLUX.2 [klein] takes at most 6: the strip says so, and a seventh is the resolve's refusal
  // ("7 reference images given; Flux2KleinPipeline takes at most 6") with Generate disabled.
  void sevenReferencesAreRefused() {
    QTemporaryDir dir;
    auto w = window(dir.path(), klein());
    GenerationPanel* panel = w->generationPanel();
    QVERIFY2(panel->modelInfo().ok, qPrintable(panel->modelInfo().error));
    ReferenceStrip* s = panel->referenceStrip();
    QVERIFY(s->isEnabled());
    QVERIFY(s->browseButton()->isEnabled());
    QCOMPARE(panel->modelInfo().request.references.max_count, 6);
    QVERIFY2(s->toolTip().contains("Reference 1 sets the size"), qPrintable(s->toolTip()));
    QVERIFY2(s->title().contains("0 of at most 6"), qPrintable(s->title()));
    for (int i = 0; i < 6; ++i) {
      QString err;
      QVERIFY2(s->addReference(ref(i % 2), -1, &err), qPrintable(err));
    }
    QVERIFY2(w->validation().canGenerate(), qPrintable(w->validation().all().join('\n')));
    QVERIFY(w->generateAction()->isEnabled());
    QVERIFY(s->addReference(ref(0)));
    QCOMPARE(s->count(), 7);
    QCOMPARE(panel->params().reference_images.size(), size_t(7));
    const QString issues = w->validation().requestIssues.join('\n');
    QVERIFY2(issues.contains("7 reference images given; Flux2KleinPipeline takes at most 6"),
             qPrintable(issues));
    QVERIFY(!w->generateAction()->isEnabled());
    QVERIFY2(w->generateBlockedReason().contains("takes at most 6"),
             qPrintable(w->generateBlockedReason()));
    // Generate refused: the banner says why and the strip is shown (its tab, scrolled to it).
    w->leftTabs()->setCurrentIndex(1);
    QVERIFY(w->generate().isEmpty());
    QVERIFY(w->bannerVisible());
    QCOMPARE(w->leftTabs()->currentIndex(), 0);
    QTest::qWait(50);
    QScrollArea* scroll = w->generateScroll();
    const QRect inView(s->mapTo(scroll->viewport(), QPoint(0, 0)), s->size());
    QVERIFY2(scroll->viewport()->rect().intersects(inView),
             qPrintable(QStringLiteral("strip at y %1 in a %2 px viewport")
                            .arg(inView.y())
                            .arg(scroll->viewport()->height())));
    s->removeButton(6)->click();
    QVERIFY2(w->validation().canGenerate(), qPrintable(w->validation().all().join('\n')));
    // References and an init image together are the resolve's conflict.
    QString err;
    QVERIFY2(panel->imagePanel()->loadInitImage(ref(0), &err), qPrintable(err));
    QVERIFY2(w->validation().requestIssues.join('\n').contains("cannot be combined"),
             qPrintable(w->validation().all().join('\n')));
    panel->imagePanel()->loadInitImage(QString());
    // Too small for Flux2ImageProcessor (both sides >= 64 px): the resolve names the file.
    const QString tiny = dir.filePath("tiny.png");
    {
      QImage small(40, 64, QImage::Format_RGB32);
      small.fill(Qt::gray);
      QVERIFY(small.save(tiny));
    }
    s->clear();
    QVERIFY(s->addReference(tiny));
    QVERIFY(s->sizeLabel(0)->text().startsWith(QStringLiteral("40×64")));
    const QString small = w->validation().requestIssues.join('\n');
    QVERIFY2(small.contains("reference image 1 (" + QFileInfo(tiny).absoluteFilePath() + ")"),
             qPrintable(small));
    QVERIFY(!w->generateAction()->isEnabled());
  }

  // Drop, the move buttons, a dragged thumbnail, the sizes under the thumbnails, and the order
  // the request sends.
  void dropReorderAndSizes() {
    QTemporaryDir dir;
    auto w = window(dir.path(), klein());
    QVERIFY(QTest::qWaitForWindowExposed(w.get()));
    ReferenceStrip* s = w->generationPanel()->referenceStrip();
    dropFiles(s, {ref(1), ref(0)}, QPoint(10, 10));
    QCOMPARE(names(s), QStringList({"edit_ref_1.png", "edit_ref_0.png"}));
    QCOMPARE(s->sizeLabel(0)->text(), QStringLiteral("80×64"));
    QCOMPARE(s->sizeLabel(1)->text(), QStringLiteral("64×64"));
    // A third dropped before the first; edit_ref_2 (72 x 90) is centre-cropped to 72 x 88.
    QTest::qWait(50);  // the tiles are laid out
    dropFiles(s, {ref(2)}, leftOf(s, 0));
    QCOMPARE(names(s), QStringList({"edit_ref_2.png", "edit_ref_1.png", "edit_ref_0.png"}));
    QCOMPARE(s->sizeLabel(0)->text(), QStringLiteral("72×90 → 72×88"));
    QCOMPARE(s->fittedSize(0), QSize(72, 88));
    // "Size from 1st": the first reference's fitted size into the size fields.
    QVERIFY(s->sizeButton()->isVisible());
    s->sizeButton()->click();
    QCOMPARE(w->generationPanel()->widthSpin()->value(), 72);
    QCOMPARE(w->generationPanel()->heightSpin()->value(), 88);
    s->removeButton(0)->click();
    QCOMPARE(names(s), QStringList({"edit_ref_1.png", "edit_ref_0.png"}));
    // Buttons: later, earlier.
    QVERIFY(!s->moveLeftButton(0)->isEnabled());
    QVERIFY(!s->moveRightButton(1)->isEnabled());
    s->moveRightButton(0)->click();
    QCOMPARE(names(s), QStringList({"edit_ref_0.png", "edit_ref_1.png"}));
    s->moveLeftButton(1)->click();
    QCOMPARE(names(s), QStringList({"edit_ref_1.png", "edit_ref_0.png"}));
    // Drag: the second thumbnail onto the first one's left edge.
    QTest::qWait(50);
    QCOMPARE(s->dropIndexAt(leftOf(s, 0)), 0);
    dragTile(s, 1, leftOf(s, 0));
    QCOMPARE(names(s), QStringList({"edit_ref_0.png", "edit_ref_1.png"}));
    // ... and the first dragged past the end.
    QTest::qWait(50);
    const QPoint end = s->tile(1)->mapTo(s, QPoint(s->tile(1)->width() - 2, 10));
    QCOMPARE(s->dropIndexAt(end), 2);
    dragTile(s, 0, end);
    QCOMPARE(names(s), QStringList({"edit_ref_1.png", "edit_ref_0.png"}));
    // A file that is not an image is refused, named, and nothing is added.
    const QString notImage = klein() + "/golden/edit_info.json";
    dropFiles(s, {notImage}, QPoint(10, 10));
    QCOMPARE(s->count(), 2);
    QVERIFY2(s->statusLabel()->text().contains(notImage + " is not a readable image"),
             qPrintable(s->statusLabel()->text()));
    const GenerationParams p = w->generationPanel()->params();
    QCOMPARE(files(p), QStringList({QFileInfo(ref(1)).absoluteFilePath(),
                                    QFileInfo(ref(0)).absoluteFilePath()}));
    // Added here: no hash sent (the worker records the one of the file it reads).
    QVERIFY(p.reference_images[0].sha256.empty());
    const dit::ResolvedRequest r = w->generationPanel()->modelInfo().resolve(p);
    QVERIFY2(r.ok(), r.message().c_str());
    QCOMPARE(r.reference_tokens, 80 + 64);  // 10 x 8 and 8 x 8 tokens of 8 x 8 px
  }

  // Paste: the clipboard's image saved as a PNG under <data>/references, named by its content;
  // the same image again finds the same file; a file of that name with other bytes stays.
  void pasteSavesInTheDataFolder() {
    QTemporaryDir dir;
    auto w = window(dir.path(), klein());
    ReferenceStrip* s = w->generationPanel()->referenceStrip();
    QCOMPARE(s->pasteDir(), QDir(dir.path()).filePath("references"));
    QImage img(96, 72, QImage::Format_RGB32);
    img.fill(QColor(20, 120, 200));
    QGuiApplication::clipboard()->setImage(img);
    QString err;
    QVERIFY2(s->paste(&err), qPrintable(err));
    QCOMPARE(s->count(), 1);
    const QString saved = s->paths().first();
    QCOMPARE(QFileInfo(saved).absolutePath(), QDir(dir.path()).filePath("references"));
    QVERIFY(QFileInfo(saved).fileName().startsWith("pasted-"));
    QCOMPARE(QImage(saved).convertToFormat(QImage::Format_RGB32), img);
    QCOMPARE(s->sizeLabel(0)->text(), QStringLiteral("96×72"));
    s->pasteButton()->click();
    QCOMPARE(s->count(), 2);
    QCOMPARE(s->paths().at(1), saved);
    // Someone writes other bytes under that name: the next paste keeps them and takes "-2".
    {
      QFile f(saved);
      QVERIFY(f.open(QIODevice::WriteOnly | QIODevice::Truncate));
      f.write("not the image");
    }
    QVERIFY2(s->paste(&err), qPrintable(err));
    const QString third = s->paths().at(2);
    QVERIFY2(third.endsWith("-2.png"), qPrintable(third));
    QFile f(saved);
    QVERIFY(f.open(QIODevice::ReadOnly));
    QCOMPARE(f.readAll(), QByteArray("not the image"));
    // Copied files are added as they are.
    auto* mime = new QMimeData;
    mime->setUrls({QUrl::fromLocalFile(ref(0))});
    QGuiApplication::clipboard()->setMimeData(mime);
    QVERIFY2(s->paste(&err), qPrintable(err));
    QCOMPARE(s->paths().at(3), QFileInfo(ref(0)).absoluteFilePath());
    QGuiApplication::clipboard()->clear();
    QVERIFY(!s->paste(&err));
    QVERIFY2(err.contains("no image"), qPrintable(err));
  }

  // Recall without the worker: a history entry (as the worker records it: each reference with
  // its SHA-256) and a preset put the references back in order; a file missing here is named and
  // refused by the resolve; a changed file is refused in the worker's words.
  void recallNamesMissingAndChangedFiles() {
    QTemporaryDir dir;
    const QString a = dir.filePath("a.png"), b = dir.filePath("b.png");
    QVERIFY(QFile::copy(ref(0), a));
    QVERIFY(QFile::copy(ref(1), b));
    auto w = window(dir.filePath("data"), klein());
    GenerationPanel* panel = w->generationPanel();
    ReferenceStrip* s = panel->referenceStrip();
    QVERIFY(s->addReference(b));
    QVERIFY(s->addReference(a));
    // A preset made now, applied after the strip was emptied.
    const Preset preset = w->currentPreset();
    QCOMPARE(QString::fromStdString(preset.generation.reference_images.at(0).sha256),
             fileSha256(b));
    s->clear();
    w->applyPreset(preset, true);
    QCOMPARE(s->paths(), QStringList({b, a}));
    // The worker's record: each with its hash.
    GenerationParams made = panel->params();
    for (auto& r : made.reference_images)
      r.sha256 = fileSha256(QString::fromStdString(r.file)).toStdString();
    HistoryEntry e;
    e.path = dir.filePath("image.png");
    e.params = paramsToQJson(made);
    QCOMPARE(e.params.value("reference_images").toArray().size(), 2);
    s->clear();
    Q_EMIT w->gallery()->useParameters(e);
    QCOMPARE(s->paths(), QStringList({b, a}));
    QVERIFY2(s->statusLabel()->text().isEmpty(), qPrintable(s->statusLabel()->text()));
    QVERIFY2(w->validation().canGenerate(), qPrintable(w->validation().all().join('\n')));
    QCOMPARE(panel->params().reference_images, made.reference_images);
    // An entry made without references recalls to none.
    HistoryEntry plain = e;
    plain.params.remove("reference_images");
    Q_EMIT w->gallery()->useParameters(plain);
    QCOMPARE(s->count(), 0);
    // b changed, a gone.
    {
      QImage changed = QImage(b).convertToFormat(QImage::Format_RGB32);
      changed.setPixel(0, 0, changed.pixel(0, 0) ^ 0x00010203u);
      QVERIFY(changed.save(b));
    }
    QVERIFY(QFile::remove(a));
    Q_EMIT w->gallery()->useParameters(e);
    QCOMPARE(s->paths(), QStringList({b, a}));
    const QString status = s->statusLabel()->text();
    QVERIFY2(status.contains("reference 2 missing here: " + a), qPrintable(status));
    QVERIFY2(status.contains("reference 1 changed since it was recorded"), qPrintable(status));
    QCOMPARE(s->sizeLabel(1)->text(), QStringLiteral("missing here"));
    // Named in the banner and the log, as a recalled model's missing components are.
    QVERIFY(w->bannerVisible());
    QVERIFY2(w->bannerText().contains("Reference images of the image are missing here or changed"),
             qPrintable(w->bannerText()));
    const QString issues = w->validation().requestIssues.join('\n');
    QVERIFY2(issues.contains("reference image 1 " + b + " has SHA-256 " + fileSha256(b) +
                             ", not the recorded " +
                             QString::fromStdString(made.reference_images[0].sha256) +
                             " (the file changed since the image was made)"),
             qPrintable(issues));
    QVERIFY2(issues.contains("reference image 2: "), qPrintable(issues));
    QVERIFY(!w->generateAction()->isEnabled());
    // A preset holding them says so too (it recorded each file's SHA-256 when it was made).
    s->clear();
    w->applyPreset(preset, true);
    QCOMPARE(s->paths(), QStringList({b, a}));
    QVERIFY(w->bannerVisible());
    QVERIFY2(w->bannerText().contains("Reference images of preset"), qPrintable(w->bannerText()));
    QVERIFY2(s->statusLabel()->text().contains("reference 2 missing here: " + a),
             qPrintable(s->statusLabel()->text()));
    QVERIFY2(s->statusLabel()->text().contains("reference 1 changed since it was recorded"),
             qPrintable(s->statusLabel()->text()));
    // Removing both lets the request go.
    s->removeButton(1)->click();
    s->removeButton(0)->click();
    QVERIFY2(w->validation().canGenerate(), qPrintable(w->validation().all().join('\n')));
  }

  // FLUX.1 Kontext (tiny-flux-kontext-A: FluxKontextPipeline) takes one reference, resized (not
  // cropped) to the preferred Kontext size nearest in aspect while the auto_resize knob is on, to
  // its own size floored to the multiple when off; a second is the resolve's refusal. With the
  // real worker, KONTEXT.md run 0's call (auto_resize off, max_area = height x width) through the
  // window equals ditstudio-cli's run of it pixel for pixel (not the golden itself: that was made
  // with 48 T5 rows, and the window has no max_sequence_length field; test_edit covers it).
  void kontextThroughTheWindow() {
    const QString kontext = data() + "/tiny-flux-kontext-A";
    const QString kref = flux1() + "/golden/kontext_ref_0.png";
    if (!QFileInfo::exists(kontext + "/model_index.json")) QSKIP("no tiny-flux-kontext-A here");
    QTemporaryDir dir;
    auto w = window(dir.path(), kontext);
    GenerationPanel* panel = w->generationPanel();
    QVERIFY2(panel->modelInfo().ok, qPrintable(panel->modelInfo().error));
    const dit::ReferenceRule& rule = panel->modelInfo().request.references;
    QCOMPARE(rule.max_count, 1);
    ReferenceStrip* s = panel->referenceStrip();
    QVERIFY(s->isEnabled());
    QVERIFY2(s->title().contains("0 of at most 1"), qPrintable(s->title()));
    QVERIFY(!s->sizeButton()->isVisible());  // the output size never follows the reference
    QDoubleSpinBox* autoResize = panel->knobSpin(QString::fromStdString(rule.auto_resize_field));
    QDoubleSpinBox* maxArea = panel->knobSpin("max_area");
    QVERIFY(autoResize && maxArea);
    QVERIFY(panel->fieldShown(autoResize));
    autoResize->setValue(1);
    QString err;
    QVERIFY2(s->addReference(kref, -1, &err), qPrintable(err));
    const QSize preferred = s->fittedSize(0);
    bool listed = false;
    for (const auto& [pw, ph] : rule.preferred_sizes) listed = listed || QSize(pw, ph) == preferred;
    QVERIFY2(listed,
             qPrintable(QStringLiteral("%1x%2").arg(preferred.width()).arg(preferred.height())));
    QCOMPARE(s->sizeLabel(0)->text(),
             QStringLiteral("40×32 → %1×%2").arg(preferred.width()).arg(preferred.height()));
    autoResize->setValue(0);
    QCOMPARE(s->fittedSize(0), QSize(40, 32));
    QCOMPARE(s->sizeLabel(0)->text(), QStringLiteral("40×32"));
    QVERIFY(s->addReference(kref));
    QVERIFY2(w->validation().requestIssues.join('\n').contains("takes at most 1"),
             qPrintable(w->validation().all().join('\n')));
    s->removeReference(1);
    if (worker().isEmpty() || !QFileInfo(worker()).isExecutable())
      QSKIP("DITSTUDIO_TEST_WORKER is not an executable ditstudio-worker");
    const auto demo = w->presetStore()->find("CPU demo (2 ranks)");
    QVERIFY(demo);
    w->applyPreset(*demo);
    GenerationParams p = panel->params();
    p.prompt = "a photo of a cat";
    p.negative_prompt.clear();
    p.options["true_cfg_scale"] = 1.0;
    p.width = 40;
    p.height = 32;
    p.steps = 4;
    p.guidance = 3.5;
    p.seed = 42;
    p.random_seed = false;
    p.num_images = 1;
    p.options["max_area"] = 40 * 32;
    p.options[rule.auto_resize_field] = 0;
    panel->setParams(p);
    QCOMPARE(s->paths(), QStringList({QFileInfo(kref).absoluteFilePath()}));
    QVERIFY2(w->validation().canGenerate(), qPrintable(w->validation().all().join("; ")));
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, kImageMs);
    QVERIFY2(w->controller()->lastFailure().message.isEmpty(),
             qPrintable(w->controller()->lastFailure().message));
    const QString made = w->historyStore()->entries().first().path;
    const QImage img(made);
    QCOMPARE(img.size(), QSize(40, 32));
    QString perr;
    const QJsonObject rec = readPngParameters(made, &perr);
    QCOMPARE(rec.value("options").toObject().value("max_area").toDouble(), 1280.0);
    QCOMPARE(rec.value("options").toObject().value("auto_resize").toDouble(), 0.0);
    QCOMPARE(rec.value("reference_images").toArray().at(0).toObject().value("sha256").toString(),
             fileSha256(kref));
    // ditstudio-cli --image with --max-area / --auto-resize, the same request on the same
    // strategy: the same pixels.
    if (!cli().isEmpty() && QFileInfo(cli()).isExecutable()) {
      const QString out = dir.filePath("kontext-cli.png");
      QProcess run;
      run.setProcessChannelMode(QProcess::MergedChannels);
      run.start(cli(), {"--np",          "2",     "--ring-degree", "2",
                        "--model",       kontext, "--prompt",      "a photo of a cat",
                        "--image",       kref,    "--max-area",    "1280",
                        "--auto-resize", "off",   "--width",       "40",
                        "--height",      "32",    "--steps",       "4",
                        "--guidance",    "3.5",   "--seed",        "42",
                        "--output",      out});
      QVERIFY(run.waitForFinished(kImageMs));
      QVERIFY2(run.exitCode() == 0, run.readAll().constData());
      QCOMPARE(QImage(out).convertToFormat(QImage::Format_RGB32),
               img.convertToFormat(QImage::Format_RGB32));
    }
    w->stopGroup();
    QTRY_VERIFY_WITH_TIMEOUT(!w->controller()->isRunning(), 30000);
  }

  void dropReorderGenerateRecall() {
    if (worker().isEmpty() || !QFileInfo(worker()).isExecutable())
      QSKIP("DITSTUDIO_TEST_WORKER is not an executable ditstudio-worker");
    QTemporaryDir dir;
    auto w = window(dir.path(), klein());
    QVERIFY(QTest::qWaitForWindowExposed(w.get()));
    const auto demo = w->presetStore()->find("CPU demo (2 ranks)");
    QVERIFY(demo);
    w->applyPreset(*demo);
    GenerationPanel* panel = w->generationPanel();
    ReferenceStrip* s = panel->referenceStrip();
    // Dropped in the wrong order, then the second dragged in front.
    dropFiles(s, {ref(1), ref(0)}, QPoint(10, 10));
    QTest::qWait(50);
    dragTile(s, 1, leftOf(s, 0));
    QCOMPARE(names(s), QStringList({"edit_ref_0.png", "edit_ref_1.png"}));
    GenerationParams p = panel->params();
    p.prompt = kPrompt;
    p.negative_prompt.clear();
    p.options["true_cfg_scale"] = 1.0;
    p.width = 64;
    p.height = 48;
    p.steps = 3;
    p.guidance = 1.0;
    p.seed = 7;
    p.random_seed = false;
    p.num_images = 1;
    panel->setParams(p);
    QCOMPARE(names(s), QStringList({"edit_ref_0.png", "edit_ref_1.png"}));
    QVERIFY2(w->validation().canGenerate(), qPrintable(w->validation().all().join("; ")));
    QVERIFY(!w->generate().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(w->gallery()->count(), 1, kImageMs);
    QVERIFY2(w->controller()->lastFailure().message.isEmpty(),
             qPrintable(w->controller()->lastFailure().message));
    const HistoryEntry e = w->historyStore()->entries().first();
    const QImage img(e.path);
    QCOMPARE(img.size(), QSize(64, 48));
    // EDIT.md run 1: run.1.image, float32 (3, 48, 64) in [0, 1]; the PNG holds round(x * 255).
    dit::SafetensorsReader g((klein() + "/golden/edit.safetensors").toStdString());
    const auto& t = g.info("run.1.image");
    std::vector<float> want(3 * 48 * 64);
    std::memcpy(want.data(), g.data(t), want.size() * sizeof(float));
    int worst = 0;
    for (int y = 0; y < 48; ++y)
      for (int x = 0; x < 64; ++x) {
        const QRgb px = img.pixel(x, y);
        const int got[3] = {qRed(px), qGreen(px), qBlue(px)};
        for (int c = 0; c < 3; ++c) {
          const int v = static_cast<int>(std::lround(want[size_t(c * 48 * 64 + y * 64 + x)] * 255));
          worst = std::max(worst, std::abs(got[c] - v));
        }
      }
    QVERIFY2(worst <= 1, qPrintable(QString("max 8-bit difference %1").arg(worst)));
    qInfo("window vs diffusers run.1.image: max %d 8-bit level(s)", worst);
    // The references' effect is far above that (EDIT.md: 3.3e-2 of the image, ~8 levels): the
    // image without references differs.
    {
      const auto& nt = g.info("run.1.noref_image");
      std::vector<float> noref(3 * 48 * 64);
      std::memcpy(noref.data(), g.data(nt), noref.size() * sizeof(float));
      int far = 0;
      for (size_t i = 0; i < noref.size(); ++i)
        far = std::max(far, std::abs(static_cast<int>(std::lround(noref[i] * 255)) -
                                     static_cast<int>(std::lround(want[i] * 255))));
      QVERIFY2(far > 2, qPrintable(QString::number(far)));
      qInfo("run.1.image vs run.1.noref_image: %d 8-bit levels apart", far);
    }
    // The PNG and the history record both, in order, with their SHA-256.
    QString err;
    const QJsonObject png = readPngParameters(e.path, &err);
    QVERIFY2(!png.isEmpty(), qPrintable(err));
    for (const QJsonObject& rec : {png, e.params}) {
      const QJsonArray refs = rec.value("reference_images").toArray();
      QCOMPARE(refs.size(), 2);
      for (int i = 0; i < 2; ++i) {
        const QJsonObject r = refs.at(i).toObject();
        QCOMPARE(r.value("file").toString(), QFileInfo(ref(i)).absoluteFilePath());
        QCOMPARE(r.value("sha256").toString(), fileSha256(ref(i)));
      }
    }
    // The CLI's run of the same request: the same pixels.
    if (!cli().isEmpty() && QFileInfo(cli()).isExecutable()) {
      const QString out = dir.filePath("cli.png");
      QProcess cliRun;
      cliRun.setProcessChannelMode(QProcess::MergedChannels);
      cliRun.start(cli(), {"--np",    "2",     "--ring-degree", "2",
                           "--model", klein(), "--prompt",      QString::fromUtf8(kPrompt),
                           "--image", ref(0),  "--image",       ref(1),
                           "--width", "64",    "--height",      "48",
                           "--steps", "3",     "--guidance",    "1",
                           "--seed",  "7",     "--output",      out});
      QVERIFY(cliRun.waitForFinished(kImageMs));
      QVERIFY2(cliRun.exitCode() == 0, cliRun.readAll().constData());
      QCOMPARE(QImage(out).convertToFormat(QImage::Format_RGB32),
               img.convertToFormat(QImage::Format_RGB32));
    }
    // Recall: another list in the strip, then "Use parameters" of the gallery's image.
    s->clear();
    QVERIFY(s->addReference(ref(2)));
    Q_EMIT w->gallery()->useParameters(e);
    QCOMPARE(names(s), QStringList({"edit_ref_0.png", "edit_ref_1.png"}));
    QVERIFY2(s->statusLabel()->text().isEmpty(), qPrintable(s->statusLabel()->text()));
    const GenerationParams back = panel->params();
    QCOMPARE(back.reference_images.size(), size_t(2));
    QCOMPARE(QString::fromStdString(back.reference_images[0].sha256), fileSha256(ref(0)));
    QCOMPARE(QString::fromStdString(back.reference_images[1].sha256), fileSha256(ref(1)));
    QVERIFY2(w->validation().canGenerate(), qPrintable(w->validation().all().join("; ")));
    // Screenshot of the strip with its two references (DITSTUDIO_UI_SNAPSHOT_DIR).
    const QString shots = qEnvironmentVariable("DITSTUDIO_UI_SNAPSHOT_DIR");
    if (!shots.isEmpty()) {
      QDir().mkpath(shots);
      w->leftTabs()->setCurrentIndex(0);
      w->generateScroll()->ensureWidgetVisible(s, 0, 0);
      QTest::qWait(200);
      s->grab().save(QDir(shots).filePath("reference-strip.png"));
      w->grab().save(QDir(shots).filePath("reference-window.png"));
    }
    w->stopGroup();
    QTRY_VERIFY_WITH_TIMEOUT(!w->controller()->isRunning(), 30000);
  }
};

QTEST_MAIN(TestUiEdit)
#include "test_ui_edit.moc"
