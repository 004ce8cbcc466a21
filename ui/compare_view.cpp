#include "ui/compare_view.h"

#include <QKeyEvent>
#include <QMouseEvent>
#include <QPainter>
#include <algorithm>
#include <cmath>

namespace dit::ui {

namespace {
constexpr int kCaption = 18;  // caption strip under each grid / side-by-side cell
}

CompareView::CompareView(QWidget* parent) : QWidget(parent) {
  setMinimumSize(160, 140);
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Expanding);
  setFocusPolicy(Qt::ClickFocus);
  setMouseTracking(false);
  timer_.setInterval(600);
  connect(&timer_, &QTimer::timeout, this, &CompareView::step);
}

void CompareView::setImages(const QList<QImage>& images, const QStringList& captions) {
  images_ = images;
  captions_ = captions;
  shown_ = 0;
  split_ = 0.5;
  syncTimer();
  update();
}

void CompareView::setMode(Mode m) {
  mode_ = m;
  shown_ = 0;
  syncTimer();
  update();
}

void CompareView::setSplit(double fraction) {
  split_ = std::clamp(fraction, 0.0, 1.0);
  update();
}

void CompareView::step() {
  if (images_.size() < 2) return;
  shown_ = 1 - std::min(shown_, 1);
  update();
}

void CompareView::setBlinkInterval(int ms) {
  timer_.setInterval(std::max(50, ms));
  syncTimer();
}

void CompareView::syncTimer() {
  const bool on = mode_ == Mode::Blink && images_.size() >= 2 && isVisible();
  if (on && !timer_.isActive()) timer_.start();
  if (!on) timer_.stop();
}

void CompareView::showEvent(QShowEvent* e) {
  QWidget::showEvent(e);
  syncTimer();
}

void CompareView::hideEvent(QHideEvent* e) {
  QWidget::hideEvent(e);
  timer_.stop();
}

QRectF CompareView::fit(const QSize& image, const QRectF& cell) const {
  if (image.isEmpty() || cell.isEmpty()) return {};
  const QSizeF s = QSizeF(image).scaled(cell.size(), Qt::KeepAspectRatio);
  return QRectF(cell.center() - QPointF(s.width() / 2, s.height() / 2), s);
}

QList<QRectF> CompareView::cells() const {
  QList<QRectF> out;
  const int n = static_cast<int>(images_.size());
  if (n == 0) return out;
  const QRectF area = QRectF(rect()).adjusted(6, 6, -6, -6);
  int cols = 1;
  if (mode_ == Mode::SideBySide)
    cols = std::min(n, 2);
  else
    cols = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n))));
  const int rows = (n + cols - 1) / cols;
  const double w = area.width() / cols, h = area.height() / rows;
  for (int i = 0; i < n; ++i) {
    const QRectF cell(area.left() + (i % cols) * w, area.top() + (i / cols) * h, w, h);
    out << cell.adjusted(3, 3, -3, -3 - kCaption);
  }
  return out;
}

QRectF CompareView::imageRect(int i) const {
  if (i < 0 || i >= images_.size()) return {};
  if (mode_ == Mode::Swipe || mode_ == Mode::Blink)
    return fit(images_.first().size(), QRectF(rect()).adjusted(8, 8, -8, -8));
  const QList<QRectF> c = cells();
  return i < c.size() ? fit(images_[i].size(), c[i]) : QRectF();
}

int CompareView::imageAt(const QPointF& pos) const {
  if (mode_ != Mode::Grid && mode_ != Mode::SideBySide) return -1;
  for (int i = 0; i < images_.size(); ++i)
    if (imageRect(i).contains(pos)) return i;
  return -1;
}

void CompareView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), QColor(0x13, 0x14, 0x17));
  p.setRenderHint(QPainter::SmoothPixmapTransform, true);
  if (images_.isEmpty()) {
    p.setPen(QColor(0x6a, 0x6f, 0x78));
    p.drawText(rect(), Qt::AlignCenter, tr("Select two images to compare"));
    return;
  }
  const QColor text(0xc8, 0xcc, 0xd2);
  if (mode_ == Mode::Swipe && images_.size() >= 2) {
    const QRectF r = imageRect(0);
    const double x = r.left() + split_ * r.width();
    p.save();
    p.setClipRect(QRectF(r.left(), r.top(), x - r.left(), r.height()));
    p.drawImage(r, images_[0]);
    p.setClipRect(QRectF(x, r.top(), r.right() - x, r.height()));
    p.drawImage(r, images_[1]);
    p.restore();
    p.setPen(QPen(QColor(0xff, 0xff, 0xff, 200), 2));
    p.drawLine(QPointF(x, r.top()), QPointF(x, r.bottom()));
    p.setPen(text);
    p.drawText(QRectF(r.left() + 4, r.top() + 2, r.width() / 2 - 8, 18), Qt::AlignLeft,
               captions_.value(0, QStringLiteral("A")));
    p.drawText(QRectF(r.center().x() + 4, r.top() + 2, r.width() / 2 - 8, 18), Qt::AlignRight,
               captions_.value(1, QStringLiteral("B")));
    return;
  }
  if (mode_ == Mode::Blink || images_.size() == 1) {
    const int i = std::min<int>(shown_, images_.size() - 1);
    const QRectF r = imageRect(0);
    p.drawImage(r, images_[i]);
    p.setPen(text);
    p.drawText(QRectF(r.left() + 4, r.top() + 2, r.width() - 8, 18), Qt::AlignLeft,
               captions_.value(i, i == 0 ? QStringLiteral("A") : QStringLiteral("B")));
    return;
  }
  const QList<QRectF> c = cells();
  p.setPen(text);
  for (int i = 0; i < images_.size() && i < c.size(); ++i) {
    const QRectF r = fit(images_[i].size(), c[i]);
    p.drawImage(r, images_[i]);
    const QRectF cap(c[i].left(), c[i].bottom() + 2, c[i].width(), kCaption - 2);
    p.drawText(cap, Qt::AlignHCenter | Qt::AlignTop,
               fontMetrics().elidedText(captions_.value(i), Qt::ElideRight,
                                        static_cast<int>(cap.width())));
  }
}

void CompareView::mousePressEvent(QMouseEvent* e) {
  if (mode_ == Mode::Swipe && e->button() == Qt::LeftButton) {
    const QRectF r = imageRect(0);
    if (r.width() > 0) setSplit((e->position().x() - r.left()) / r.width());
  } else if (mode_ == Mode::Blink && e->button() == Qt::LeftButton) {
    step();
  }
  QWidget::mousePressEvent(e);
}

void CompareView::mouseMoveEvent(QMouseEvent* e) {
  if (mode_ == Mode::Swipe && (e->buttons() & Qt::LeftButton)) {
    const QRectF r = imageRect(0);
    if (r.width() > 0) setSplit((e->position().x() - r.left()) / r.width());
  }
}

void CompareView::mouseDoubleClickEvent(QMouseEvent* e) {
  const int i = imageAt(e->position());
  if (i >= 0) Q_EMIT imageActivated(i);
}

void CompareView::keyPressEvent(QKeyEvent* e) {
  if (mode_ == Mode::Swipe && e->key() == Qt::Key_Left)
    setSplit(split_ - 0.05);
  else if (mode_ == Mode::Swipe && e->key() == Qt::Key_Right)
    setSplit(split_ + 0.05);
  else if (mode_ == Mode::Blink && e->key() == Qt::Key_Space)
    step();
  else
    QWidget::keyPressEvent(e);
}

}  // namespace dit::ui
