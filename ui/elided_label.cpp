#include "ui/elided_label.h"

#include <QFontMetrics>
#include <QPainter>
#include <QResizeEvent>
#include <QStyle>
#include <algorithm>

namespace dit::ui {

ElidedLabel::ElidedLabel(const QString& text, QWidget* parent) : QLabel(parent) {
  setWordWrap(false);
  setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  setText(text);
}

void ElidedLabel::setText(const QString& text) {
  QLabel::setText(text);
  updateGeometry();
  updateTip();
}

void ElidedLabel::setBaseToolTip(const QString& tip) {
  baseTip_ = tip;
  updateTip();
}

void ElidedLabel::setPreferredMaxWidth(int w) {
  maxHint_ = w;
  updateGeometry();
}

QString ElidedLabel::shownText() const {
  const QString line = text().section(QLatin1Char('\n'), 0, 0);
  const int room = contentsRect().width() - 2 * margin();
  return fontMetrics().elidedText(line, Qt::ElideRight, std::max(0, room));
}

QSize ElidedLabel::sizeHint() const {
  const QMargins m = contentsMargins();
  const QString line = text().section(QLatin1Char('\n'), 0, 0);
  int w = fontMetrics().horizontalAdvance(line) + m.left() + m.right() + 2 * margin() + 2;
  if (maxHint_ > 0) w = std::min(w, maxHint_);
  return {w, fontMetrics().height() + m.top() + m.bottom() + 2 * margin()};
}

QSize ElidedLabel::minimumSizeHint() const {
  const QMargins m = contentsMargins();
  // Room for a few characters and the ellipsis: a layout may shrink it that far, no further.
  const int w =
      fontMetrics().horizontalAdvance(QStringLiteral("Wm…")) + m.left() + m.right() + 2 * margin();
  return {w, fontMetrics().height() + m.top() + m.bottom() + 2 * margin()};
}

void ElidedLabel::paintEvent(QPaintEvent*) {
  QPainter p(this);
  const QRect r = contentsRect().adjusted(margin(), margin(), -margin(), -margin());
  style()->drawItemText(&p, r, static_cast<int>(alignment()) | Qt::TextSingleLine, palette(),
                        isEnabled(), shownText(), foregroundRole());
}

void ElidedLabel::resizeEvent(QResizeEvent* e) {
  QLabel::resizeEvent(e);
  updateTip();
}

void ElidedLabel::updateTip() {
  QString tip = baseTip_;
  if (isElided())
    tip = baseTip_.isEmpty() || baseTip_ == text() ? text() : text() + "\n" + baseTip_;
  if (tip != toolTip()) setToolTip(tip);
}

}  // namespace dit::ui
