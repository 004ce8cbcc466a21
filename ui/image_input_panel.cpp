#include "ui/image_input_panel.h"

#include <QComboBox>
#include <QCryptographicHash>
#include <QDir>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QImageReader>
#include <QJsonArray>
#include <QLabel>
#include <QLineEdit>
#include <QMimeData>
#include <QMouseEvent>
#include <QPainter>
#include <QPushButton>
#include <QShortcut>
#include <QSlider>
#include <QSpinBox>
#include <QToolButton>
#include <QVBoxLayout>
#include <cmath>

#include "app/protocol/limits.h"
#include "app/protocol/protocol.h"
#include "backend/pipelines/pipeline_capabilities.h"
#include "ui/elided_label.h"

namespace dit::ui {

QString fileSha256(const QString& path) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return {};
  QCryptographicHash h(QCryptographicHash::Sha256);
  if (!h.addData(&f)) return {};
  return QString::fromLatin1(h.result().toHex());
}

// ---- MaskCanvas ----

MaskCanvas::MaskCanvas(QWidget* parent) : QWidget(parent) {
  setMinimumSize(128, 128);
  setMouseTracking(false);
  setCursor(Qt::CrossCursor);
  setFocusPolicy(Qt::ClickFocus);
}

void MaskCanvas::setImage(const QImage& image) {
  image_ = image.convertToFormat(QImage::Format_RGB32);
  mask_ = QImage(image_.size(), QImage::Format_Grayscale8);
  mask_.fill(0);
  undo_.clear();
  redo_.clear();
  update();
  Q_EMIT historyChanged();
}

void MaskCanvas::remember() {
  undo_.append(mask_.copy());
  if (undo_.size() > 50) undo_.removeFirst();
  redo_.clear();
  Q_EMIT historyChanged();
}

void MaskCanvas::undo() {
  if (undo_.isEmpty()) return;
  redo_.append(mask_);
  mask_ = undo_.takeLast();
  update();
  Q_EMIT historyChanged();
  Q_EMIT maskEdited();
}

void MaskCanvas::redo() {
  if (redo_.isEmpty()) return;
  undo_.append(mask_);
  mask_ = redo_.takeLast();
  update();
  Q_EMIT historyChanged();
  Q_EMIT maskEdited();
}

void MaskCanvas::setMask(const QImage& mask) {
  if (image_.isNull()) return;
  QImage m = mask.convertToFormat(QImage::Format_Grayscale8);
  if (m.size() != image_.size()) m = m.scaled(image_.size());
  remember();
  mask_ = m;
  update();
  Q_EMIT maskEdited();
}

void MaskCanvas::clearMask() {
  if (image_.isNull()) return;
  remember();
  mask_.fill(0);
  update();
  Q_EMIT maskEdited();
}

void MaskCanvas::invertMask() {
  if (image_.isNull()) return;
  remember();
  mask_.invertPixels();
  update();
  Q_EMIT maskEdited();
}

qint64 MaskCanvas::maskedPixels() const {
  qint64 n = 0;
  for (int y = 0; y < mask_.height(); ++y) {
    const uchar* row = mask_.constScanLine(y);
    for (int x = 0; x < mask_.width(); ++x) n += row[x] >= 128;
  }
  return n;
}

QRectF MaskCanvas::target() const {
  if (image_.isNull()) return {};
  QSizeF s = QSizeF(image_.size()).scaled(QSizeF(size()), Qt::KeepAspectRatio);
  return QRectF(QPointF((width() - s.width()) / 2, (height() - s.height()) / 2), s);
}

QPointF MaskCanvas::toWidget(QPointF p) const {
  const QRectF t = target();
  if (t.isEmpty()) return {};
  return {t.left() + (p.x() + 0.5) * t.width() / image_.width(),
          t.top() + (p.y() + 0.5) * t.height() / image_.height()};
}

void MaskCanvas::paintEvent(QPaintEvent*) {
  QPainter g(this);
  g.fillRect(rect(), palette().window());
  if (image_.isNull()) {
    g.drawText(rect(), Qt::AlignCenter, tr("Open or drop an init image"));
    return;
  }
  const QRectF t = target();
  g.drawImage(t, image_);
  // The repaint area at screen resolution: black and white stripes (one of the two stands out
  // on any colour, red included), fainter where a soft brush left less than full value, and the
  // 50% line (where the worker cuts) outlined in black and white dashes.
  const QRect tr_ = t.toAlignedRect();
  if (tr_.isEmpty()) return;
  const QImage m = mask_.scaled(tr_.size(), Qt::IgnoreAspectRatio, Qt::FastTransformation);
  QImage overlay(m.size(), QImage::Format_ARGB32_Premultiplied);
  overlay.fill(Qt::transparent);
  const int w = m.width(), h = m.height();
  for (int y = 0; y < h; ++y) {
    const uchar* row = m.constScanLine(y);
    const uchar* below = y + 1 < h ? m.constScanLine(y + 1) : row;
    const uchar* above = y > 0 ? m.constScanLine(y - 1) : row;
    auto* o = reinterpret_cast<QRgb*>(overlay.scanLine(y));
    for (int x = 0; x < w; ++x) {
      const bool in = row[x] >= 128;
      const bool edge = in != (row[x > 0 ? x - 1 : x] >= 128) ||
                        in != (row[x + 1 < w ? x + 1 : x] >= 128) || in != (above[x] >= 128) ||
                        in != (below[x] >= 128);
      if (edge) {
        const int v = ((x + y) / 3) % 2 ? 255 : 0;
        o[x] = qRgba(v, v, v, 255);
      } else if (row[x] > 0) {
        const int a = 40 + row[x] * 140 / 255;
        const int v = ((x + y) / 4) % 2 ? a : 0;  // premultiplied white or black
        o[x] = qRgba(v, v, v, a);
      }
    }
  }
  g.drawImage(tr_.topLeft(), overlay);
}

void MaskCanvas::dab(QPointF w) {
  const QRectF t = target();
  if (t.isEmpty()) return;
  const double sx = image_.width() / t.width(), sy = image_.height() / t.height();
  const QPointF c((w.x() - t.left()) * sx, (w.y() - t.top()) * sy);
  // A disk of radius_ image pixels: full value inside the hard core, then (soft brush) fading
  // linearly to 0 at the rim. Painting keeps the larger value, erasing the smaller remainder.
  const double r = std::max(0.5, static_cast<double>(radius_));
  const double core = r * (1.0 - softness_ / 100.0);
  const int x0 = std::max(0, static_cast<int>(std::floor(c.x() - r)));
  const int x1 = std::min(mask_.width() - 1, static_cast<int>(std::ceil(c.x() + r)));
  const int y0 = std::max(0, static_cast<int>(std::floor(c.y() - r)));
  const int y1 = std::min(mask_.height() - 1, static_cast<int>(std::ceil(c.y() + r)));
  for (int y = y0; y <= y1; ++y) {
    uchar* row = mask_.scanLine(y);
    for (int x = x0; x <= x1; ++x) {
      const double d = std::hypot(x + 0.5 - c.x(), y + 0.5 - c.y());
      if (d > r) continue;
      const double f = d <= core ? 1.0 : (r - d) / std::max(1e-9, r - core);
      const int v = static_cast<int>(std::lround(255.0 * std::clamp(f, 0.0, 1.0)));
      row[x] = erasing_ ? static_cast<uchar>(std::min<int>(row[x], 255 - v))
                        : static_cast<uchar>(std::max<int>(row[x], v));
    }
  }
  update();
}

void MaskCanvas::mousePressEvent(QMouseEvent* e) {
  if (image_.isNull() || e->button() != Qt::LeftButton) return;
  remember();  // one undo step per stroke
  drawing_ = true;
  dab(e->position());
}

void MaskCanvas::mouseMoveEvent(QMouseEvent* e) {
  if (drawing_) dab(e->position());
}

void MaskCanvas::mouseReleaseEvent(QMouseEvent* e) {
  if (!drawing_) return;
  dab(e->position());
  drawing_ = false;
  Q_EMIT maskEdited();
}

// ---- ImageInputPanel ----

ImageInputPanel::ImageInputPanel(QWidget* parent)
    : QGroupBox(tr("Init image, mask and caching"), parent) {
  setAcceptDrops(true);
  auto* outer = new QVBoxLayout(this);
  auto* fileRow = new QHBoxLayout;
  open_ = new QPushButton(tr("Open image..."), this);
  remove_ = new QPushButton(tr("Remove"), this);
  pathLabel_ = new ElidedLabel(tr("none: text-to-image"), this);
  pathLabel_->setObjectName("hint");
  pathLabel_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  fileRow->addWidget(open_);
  fileRow->addWidget(remove_);
  fileRow->addWidget(pathLabel_, 1);
  outer->addLayout(fileRow);
  canvas_ = new MaskCanvas(this);
  outer->addWidget(canvas_, 1);

  auto* brushRow = new QHBoxLayout;
  erase_ = new QToolButton(this);
  erase_->setText(tr("Erase"));
  erase_->setCheckable(true);
  erase_->setToolTip(
      tr("Checked: the brush erases the mask; unchecked: it paints (white = repaint)"));
  brush_ = new QSpinBox(this);
  brush_->setRange(1, 256);
  brush_->setValue(4);
  brush_->setSuffix(tr(" px"));
  brush_->setToolTip(tr("Brush radius in image pixels"));
  softness_ = new QSpinBox(this);
  softness_->setRange(0, 100);
  softness_->setValue(0);
  softness_->setSuffix(tr("% soft"));
  softness_->setToolTip(
      tr("Brush softness: 0% a hard disk, 100% full value only at its centre, fading to the rim. "
         "The worker repaints where the mask is at least 50% (as diffusers binarises it)."));
  clearMask_ = new QPushButton(tr("Clear"), this);
  invertMask_ = new QPushButton(tr("Invert"), this);
  undo_ = new QPushButton(tr("Undo"), this);
  undo_->setToolTip(tr("Undo the last stroke, Clear or Invert (Ctrl+Z)"));
  redo_ = new QPushButton(tr("Redo"), this);
  redo_->setToolTip(tr("Redo (Ctrl+Shift+Z)"));
  brushRow->addWidget(new QLabel(tr("Mask brush"), this));
  brushRow->addWidget(brush_);
  brushRow->addWidget(softness_);
  brushRow->addStretch(1);
  outer->addLayout(brushRow);
  // Two short lines, so that the panel fits a narrow column (a 1024 px window).
  auto* editRow = new QHBoxLayout;
  editRow->addWidget(erase_);
  editRow->addWidget(undo_);
  editRow->addWidget(redo_);
  editRow->addStretch(1);
  outer->addLayout(editRow);
  auto* maskRow = new QHBoxLayout;
  maskRow->addWidget(clearMask_);
  maskRow->addWidget(invertMask_);
  maskRow->addStretch(1);
  outer->addLayout(maskRow);
  // Ctrl+Z / Ctrl+Shift+Z anywhere in the panel but its text field (which keeps its own undo).
  auto* undoKey =
      new QShortcut(QKeySequence::Undo, this, nullptr, nullptr, Qt::WidgetWithChildrenShortcut);
  connect(undoKey, &QShortcut::activated, this, [this] {
    if (undo_->isEnabled()) canvas_->undo();
  });
  auto* redoKey =
      new QShortcut(QKeySequence::Redo, this, nullptr, nullptr, Qt::WidgetWithChildrenShortcut);
  connect(redoKey, &QShortcut::activated, this, [this] {
    if (redo_->isEnabled()) canvas_->redo();
  });

  auto* form = new QFormLayout;
  auto* strengthRow = new QHBoxLayout;
  strength_ = new QSlider(Qt::Horizontal, this);
  // Hundredths of the limits table's strength range (app/protocol/limits): (0, 1] -> 1 .. 100.
  {
    const auto& l = dit::protocol::requestLimit("strength");
    strength_->setRange(static_cast<int>(std::lround(l.lo * 100)) + (l.lo_exclusive ? 1 : 0),
                        static_cast<int>(std::lround(l.hi * 100)));
  }
  strength_->setValue(60);
  strength_->setToolTip(
      tr("How much of the schedule runs: 1.0 = all steps (the image only "
         "seeds the noise), lower keeps more of the image"));
  strengthValue_ = new QLabel("0.60", this);
  strengthRow->addWidget(strength_, 1);
  strengthRow->addWidget(strengthValue_);
  form->addRow(tr("Strength"), strengthRow);
  auto* cacheRow = new QHBoxLayout;
  cacheMode_ = new QComboBox(this);
  cacheMode_->addItem(tr("Off"), "none");
  cacheMode_->addItem(tr("First Block Cache"), "first-block");
  cacheMode_->addItem(tr("TaylorSeer"), "taylorseer");
  cacheMode_->addItem(tr("TaylorSeer lite"), "taylorseer-lite");
  cacheArgs_ = new QLineEdit(this);
  cacheArgs_->setToolTip(
      tr("First Block Cache: the threshold (e.g. 0.08); TaylorSeer: ORDER[,INTERVAL,WARMUP]"));
  cacheRow->addWidget(cacheMode_);
  cacheRow->addWidget(cacheArgs_, 1);
  form->addRow(tr("Step cache"), cacheRow);
  outer->addLayout(form);
  speedup_ = new QLabel(this);
  speedup_->setObjectName("hint");
  // The step cache report wraps in the column's width (a long mode string never widens it).
  speedup_->setWordWrap(true);
  speedup_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  status_ = new QLabel(this);
  status_->setObjectName("issues");
  status_->setWordWrap(true);
  status_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);  // long paths wrap
  outer->addWidget(speedup_);
  outer->addWidget(status_);

  connect(open_, &QPushButton::clicked, this, [this] {
    const QString f = QFileDialog::getOpenFileName(
        this, tr("Open an init image"), QFileInfo(path_).absolutePath(),
        tr("Images (*.png *.jpg *.jpeg *.bmp *.tga *.gif)"));
    if (f.isEmpty()) return;
    QString err;
    if (!loadInitImage(f, &err)) {
      notice_ = err;
      showIssues();
    }
  });
  connect(remove_, &QPushButton::clicked, this, [this] { loadInitImage(QString()); });
  connect(erase_, &QToolButton::toggled, this, [this](bool on) { canvas_->setErasing(on); });
  connect(brush_, &QSpinBox::valueChanged, this, [this](int r) { canvas_->setBrushRadius(r); });
  connect(softness_, &QSpinBox::valueChanged, this, [this](int v) { canvas_->setSoftness(v); });
  connect(undo_, &QPushButton::clicked, canvas_, &MaskCanvas::undo);
  connect(redo_, &QPushButton::clicked, canvas_, &MaskCanvas::redo);
  connect(canvas_, &MaskCanvas::historyChanged, this, [this] { updateState(); });
  connect(clearMask_, &QPushButton::clicked, canvas_, &MaskCanvas::clearMask);
  connect(invertMask_, &QPushButton::clicked, canvas_, &MaskCanvas::invertMask);
  connect(canvas_, &MaskCanvas::maskEdited, this, [this] {
    updateState();
    Q_EMIT changed();
  });
  connect(strength_, &QSlider::valueChanged, this, [this](int v) {
    strengthValue_->setText(QString::number(v / 100.0, 'f', 2));
    Q_EMIT changed();
  });
  connect(cacheMode_, &QComboBox::currentIndexChanged, this, [this] {
    const QString m = cacheMode_->currentData().toString();
    cacheArgs_->setEnabled(m != "none");
    if (m == "first-block" && !cacheArgs_->text().contains('.')) cacheArgs_->setText("0.08");
    if (m.startsWith("taylorseer") && !cacheArgs_->text().contains(','))
      cacheArgs_->setText("1,5,3");
    updateState();
    Q_EMIT changed();
  });
  connect(cacheArgs_, &QLineEdit::textChanged, this, [this] {
    showIssues();
    Q_EMIT changed();
  });
  cacheArgs_->setEnabled(false);
  updateState();
}

void ImageInputPanel::setCapabilities(const QString& family, const dit::FamilyCapabilities& caps) {
  caps_ = caps;
  family_ = family;
  if (!caps_.img2img && !path_.isEmpty()) loadInitImage(QString());
  if (!caps_.step_cache && cacheMode_->currentIndex() != 0) cacheMode_->setCurrentIndex(0);
  auto unsupported = [&](const QString& what) {
    return tr("%1 is not supported for %2").arg(what, family_);
  };
  open_->setToolTip(caps_.img2img ? QString() : unsupported(tr("Image-to-image")));
  canvas_->setToolTip(caps_.inpaint ? QString() : unsupported(tr("Inpainting")));
  cacheMode_->setToolTip(caps_.step_cache ? QString() : unsupported(tr("Step caching")));
  updateState();
}

void ImageInputPanel::updateState() {
  const bool has = !path_.isEmpty() && caps_.img2img;
  const bool mask = has && caps_.inpaint;
  // A recalled cache mode the family cannot run stays editable, so that it can be turned off.
  cacheMode_->setEnabled(caps_.step_cache || cacheMode_->currentIndex() != 0);
  open_->setEnabled(caps_.img2img);
  setAcceptDrops(caps_.img2img);
  remove_->setEnabled(!path_.isEmpty());
  strength_->setEnabled(has);
  canvas_->setEnabled(mask || !has);
  for (QWidget* w : {static_cast<QWidget*>(erase_), static_cast<QWidget*>(brush_),
                     static_cast<QWidget*>(softness_), static_cast<QWidget*>(clearMask_),
                     static_cast<QWidget*>(invertMask_)})
    w->setEnabled(mask);
  undo_->setEnabled(mask && canvas_->canUndo());
  redo_->setEnabled(mask && canvas_->canRedo());
  auto* path = static_cast<ElidedLabel*>(pathLabel_);
  if (!path_.isEmpty())
    path->setText(tr("%1 (%2 x %3), mask: %4 px")
                      .arg(QFileInfo(path_).fileName())
                      .arg(canvas_->image().width())
                      .arg(canvas_->image().height())
                      .arg(canvas_->maskedPixels()));
  else
    path->setText(tr("none: text-to-image"));
  path->setBaseToolTip(path_);
  showIssues();
}

QString ImageInputPanel::cacheText() const {
  const QString m = cacheMode_->currentData().toString();
  const QString a = cacheArgs_->text().trimmed();
  if (m == "first-block") return "first-block:" + a;
  if (m == "taylorseer") return "taylorseer:" + a;
  if (m == "taylorseer-lite") return "taylorseer:" + a + ",lite";
  return {};
}

QStringList ImageInputPanel::issues() const {
  QStringList out;
  // The protocol's check at the worker's door, on the cache field alone (its exact sentence).
  dit::protocol::GenerationParams q;
  q.cache = cacheText().toStdString();
  try {
    dit::protocol::checkParams(q);
  } catch (const std::exception& e) {
    out << QString::fromStdString(e.what());
  }
  // Then the family's refusal of a feature it cannot run (the pipeline's, before any step).
  try {
    dit::checkRequestSupported(family_.toStdString(), caps_,
                               {!path_.isEmpty(), !path_.isEmpty() && canvas_->maskedPixels() > 0,
                                !cacheText().isEmpty()});
  } catch (const std::exception& e) {
    out << QString::fromStdString(e.what());
  }
  return out;
}

void ImageInputPanel::showIssues() {
  const QStringList is = issues();
  QStringList lines = is;
  if (!notice_.isEmpty()) lines.prepend(notice_);
  status_->setText(lines.join(QLatin1Char('\n')));
  QString cacheIssue;
  for (const QString& i : is)
    if (i.contains(QLatin1String("'cache'")) || i.contains(QLatin1String("remove cache")))
      cacheIssue = i;
  for (QWidget* w : {static_cast<QWidget*>(cacheArgs_), static_cast<QWidget*>(cacheMode_)}) {
    w->setProperty("invalid", !cacheIssue.isEmpty());
    w->setStyleSheet(cacheIssue.isEmpty() ? QString()
                                          : QStringLiteral("border: 1px solid #ff6b6b;"));
  }
  cacheArgs_->setToolTip(
      cacheIssue.isEmpty()
          ? tr("First Block Cache: the threshold (e.g. 0.08); TaylorSeer: ORDER[,INTERVAL,WARMUP]")
          : cacheIssue);
}

bool ImageInputPanel::loadInitImage(const QString& path, QString* error) {
  if (path.isEmpty()) {
    path_.clear();
    sha256_.clear();
    canvas_->setImage(QImage());
    notice_.clear();
    updateState();
    Q_EMIT changed();
    return true;
  }
  QImageReader r(path);
  const QImage img = r.read();
  if (img.isNull()) {
    if (error) *error = tr("%1 is not a readable image: %2").arg(path, r.errorString());
    return false;
  }
  path_ = QFileInfo(path).absoluteFilePath();
  sha256_ = fileSha256(path_);
  canvas_->setImage(img);
  notice_.clear();
  updateState();
  Q_EMIT changed();
  return true;
}

QString ImageInputPanel::saveMask() const {
  if (path_.isEmpty() || canvas_->maskedPixels() == 0) return {};
  const QImage& m = canvas_->mask();
  QCryptographicHash h(QCryptographicHash::Sha1);
  h.addData(QByteArrayView(reinterpret_cast<const char*>(m.constBits()), m.sizeInBytes()));
  const QString dir = maskDir_.isEmpty() ? QDir::tempPath() + "/ditstudio-masks" : maskDir_;
  QDir().mkpath(dir);
  const QString file =
      QDir(dir).filePath("mask-" + QString::fromLatin1(h.result().toHex()) + ".png");
  if (!QFileInfo::exists(file) && !m.save(file, "PNG")) return {};
  return file;
}

void ImageInputPanel::apply(GenerationParams& p) const {
  p.init_image = path_.toStdString();
  p.init_image_sha256 = path_.isEmpty() ? std::string() : sha256_.toStdString();
  p.mask_image = caps_.inpaint ? saveMask().toStdString() : std::string();
  p.strength = strength_->value() / 100.0;
  p.cache = cacheText().toStdString();
}

void ImageInputPanel::restore(const GenerationParams& p) {
  const QString init = QString::fromStdString(p.init_image);
  QString err;
  QString notice;
  if (init != path_ && !loadInitImage(init, &err)) {
    loadInitImage(QString());
    notice = tr("cannot restore the init image: %1").arg(err);
  }
  if (!path_.isEmpty() && !p.init_image_sha256.empty() &&
      QString::fromStdString(p.init_image_sha256).toLower() != sha256_)
    notice = tr("%1 changed since the image was made (its SHA-256 differs); the worker "
                "refuses the recalled request until the original is back")
                 .arg(path_);
  if (!path_.isEmpty()) {
    if (!p.mask_image.empty()) {
      const QImage m(QString::fromStdString(p.mask_image));
      if (m.isNull())
        notice = tr("cannot read the mask %1").arg(QString::fromStdString(p.mask_image));
      else
        canvas_->setMask(m);
    } else {
      canvas_->clearMask();
    }
  }
  strength_->setValue(static_cast<int>(std::lround(p.strength * 100)));
  const QString c = QString::fromStdString(p.cache);
  const QString mode = c.section(':', 0, 0), args = c.section(':', 1);
  if (mode == "first-block") {
    cacheMode_->setCurrentIndex(cacheMode_->findData("first-block"));
    cacheArgs_->setText(args);
  } else if (mode == "taylorseer") {
    const bool lite = args.endsWith(",lite");
    cacheMode_->setCurrentIndex(cacheMode_->findData(lite ? "taylorseer-lite" : "taylorseer"));
    cacheArgs_->setText(lite ? args.chopped(5) : args);
  } else {
    cacheMode_->setCurrentIndex(0);
  }
  notice_ = notice;
  updateState();
}

void ImageInputPanel::showCacheReport(const QJsonObject& r) {
  if (r.isEmpty()) {
    speedup_->clear();
    return;
  }
  const int steps = r.value("steps").toInt();
  const int computed = r.value("computed_steps").toArray().size();
  const double mean = r.value("step_ms_computed").toDouble();
  const double saved = r.value("saved_ms").toDouble();
  const double full = steps * mean;
  const double ratio = full - saved > 0 ? full / (full - saved) : 1.0;
  speedup_->setText(tr("%1: %2 of %3 steps computed, denoising about %4x faster (%5 ms saved)")
                        .arg(r.value("mode").toString())
                        .arg(computed)
                        .arg(steps)
                        .arg(ratio, 0, 'f', 2)
                        .arg(saved, 0, 'f', 0));
}

void ImageInputPanel::dragEnterEvent(QDragEnterEvent* e) {
  if (e->mimeData()->hasUrls()) e->acceptProposedAction();
}

void ImageInputPanel::dropEvent(QDropEvent* e) {
  const auto urls = e->mimeData()->urls();
  if (urls.isEmpty()) return;
  QString err;
  if (!loadInitImage(urls.first().toLocalFile(), &err)) {
    notice_ = err;
    showIssues();
  }
}

}  // namespace dit::ui
