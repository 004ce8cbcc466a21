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
#include <QSlider>
#include <QSpinBox>
#include <QToolButton>
#include <QVBoxLayout>
#include <cmath>

#include "app/protocol/limits.h"

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
}

void MaskCanvas::setImage(const QImage& image) {
  image_ = image.convertToFormat(QImage::Format_RGB32);
  mask_ = QImage(image_.size(), QImage::Format_Grayscale8);
  mask_.fill(0);
  update();
}

void MaskCanvas::setMask(const QImage& mask) {
  if (image_.isNull()) return;
  QImage m = mask.convertToFormat(QImage::Format_Grayscale8);
  if (m.size() != image_.size()) m = m.scaled(image_.size());
  mask_ = m;
  update();
  Q_EMIT maskEdited();
}

void MaskCanvas::clearMask() {
  mask_.fill(0);
  update();
  Q_EMIT maskEdited();
}

void MaskCanvas::invertMask() {
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
  // The repaint area in translucent red.
  QImage overlay(mask_.size(), QImage::Format_ARGB32);
  overlay.fill(Qt::transparent);
  for (int y = 0; y < mask_.height(); ++y) {
    const uchar* m = mask_.constScanLine(y);
    auto* o = reinterpret_cast<QRgb*>(overlay.scanLine(y));
    for (int x = 0; x < mask_.width(); ++x)
      if (m[x] >= 128) o[x] = qRgba(230, 40, 40, 140);
  }
  g.drawImage(t, overlay);
}

void MaskCanvas::dab(QPointF w) {
  const QRectF t = target();
  if (t.isEmpty()) return;
  const double sx = image_.width() / t.width(), sy = image_.height() / t.height();
  const QPointF c((w.x() - t.left()) * sx, (w.y() - t.top()) * sy);
  QPainter g(&mask_);
  g.setPen(Qt::NoPen);
  g.setBrush(QColor(erasing_ ? 0 : 255, erasing_ ? 0 : 255, erasing_ ? 0 : 255));
  g.drawEllipse(c, radius_, radius_);
  g.end();
  update();
}

void MaskCanvas::mousePressEvent(QMouseEvent* e) {
  if (image_.isNull() || e->button() != Qt::LeftButton) return;
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
  pathLabel_ = new QLabel(tr("none: text-to-image"), this);
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
  clearMask_ = new QPushButton(tr("Clear"), this);
  invertMask_ = new QPushButton(tr("Invert"), this);
  brushRow->addWidget(new QLabel(tr("Mask brush"), this));
  brushRow->addWidget(brush_);
  brushRow->addWidget(erase_);
  brushRow->addWidget(clearMask_);
  brushRow->addWidget(invertMask_);
  brushRow->addStretch(1);
  outer->addLayout(brushRow);

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
  status_ = new QLabel(this);
  status_->setObjectName("issues");
  status_->setWordWrap(true);
  outer->addWidget(speedup_);
  outer->addWidget(status_);

  connect(open_, &QPushButton::clicked, this, [this] {
    const QString f = QFileDialog::getOpenFileName(
        this, tr("Open an init image"), QFileInfo(path_).absolutePath(),
        tr("Images (*.png *.jpg *.jpeg *.bmp *.tga *.gif)"));
    if (f.isEmpty()) return;
    QString err;
    if (!loadInitImage(f, &err)) status_->setText(err);
  });
  connect(remove_, &QPushButton::clicked, this, [this] { loadInitImage(QString()); });
  connect(erase_, &QToolButton::toggled, this, [this](bool on) { canvas_->setErasing(on); });
  connect(brush_, &QSpinBox::valueChanged, this, [this](int r) { canvas_->setBrushRadius(r); });
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
    Q_EMIT changed();
  });
  connect(cacheArgs_, &QLineEdit::textChanged, this, [this] { Q_EMIT changed(); });
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
  cacheMode_->setEnabled(caps_.step_cache);
  updateState();
}

void ImageInputPanel::updateState() {
  const bool has = !path_.isEmpty() && caps_.img2img;
  const bool mask = has && caps_.inpaint;
  open_->setEnabled(caps_.img2img);
  setAcceptDrops(caps_.img2img);
  remove_->setEnabled(!path_.isEmpty());
  strength_->setEnabled(has);
  canvas_->setEnabled(mask || !has);
  for (QWidget* w : {static_cast<QWidget*>(erase_), static_cast<QWidget*>(brush_),
                     static_cast<QWidget*>(clearMask_), static_cast<QWidget*>(invertMask_)})
    w->setEnabled(mask);
  if (has)
    pathLabel_->setText(tr("%1 (%2 x %3), mask: %4 px")
                            .arg(QFileInfo(path_).fileName())
                            .arg(canvas_->image().width())
                            .arg(canvas_->image().height())
                            .arg(canvas_->maskedPixels()));
  else
    pathLabel_->setText(tr("none: text-to-image"));
}

bool ImageInputPanel::loadInitImage(const QString& path, QString* error) {
  if (path.isEmpty()) {
    path_.clear();
    sha256_.clear();
    canvas_->setImage(QImage());
    status_->clear();
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
  status_->clear();
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
  const QString m = cacheMode_->currentData().toString();
  const QString a = cacheArgs_->text().trimmed();
  if (m == "first-block")
    p.cache = ("first-block:" + a).toStdString();
  else if (m == "taylorseer")
    p.cache = ("taylorseer:" + a).toStdString();
  else if (m == "taylorseer-lite")
    p.cache = ("taylorseer:" + a + ",lite").toStdString();
  else
    p.cache.clear();
}

void ImageInputPanel::restore(const GenerationParams& p) {
  const QString init = QString::fromStdString(p.init_image);
  QString err;
  if (init != path_ && !loadInitImage(init, &err)) {
    loadInitImage(QString());
    status_->setText(tr("cannot restore the init image: %1").arg(err));
  }
  if (!path_.isEmpty() && !p.init_image_sha256.empty() &&
      QString::fromStdString(p.init_image_sha256).toLower() != sha256_)
    status_->setText(tr("%1 changed since the image was made (its SHA-256 differs); the worker "
                        "refuses the recalled request until the original is back")
                         .arg(path_));
  if (!path_.isEmpty()) {
    if (!p.mask_image.empty()) {
      const QImage m(QString::fromStdString(p.mask_image));
      if (m.isNull())
        status_->setText(tr("cannot read the mask %1").arg(QString::fromStdString(p.mask_image)));
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
  if (!loadInitImage(urls.first().toLocalFile(), &err)) status_->setText(err);
}

}  // namespace dit::ui
