// A one-line label that paints its text elided with "…" to the width it is given, never asks a
// layout for more than a few characters (so it cannot push a panel into sideways scrolling), and
// shows the whole text in its tooltip when it had to cut it. text() stays the whole text.
#pragma once

#include <QLabel>

namespace dit::ui {

class ElidedLabel : public QLabel {
  Q_OBJECT
 public:
  explicit ElidedLabel(const QString& text = QString(), QWidget* parent = nullptr);
  /// Sets the whole text (shadows QLabel::setText: call it through an ElidedLabel pointer).
  void setText(const QString& text);
  /// Tooltip when the text fits; appended to the whole text when it is cut.
  void setBaseToolTip(const QString& tip);
  /// The text as painted (elided to the current width; the first line only).
  QString shownText() const;
  /// Whether the painted text is cut.
  bool isElided() const { return shownText() != text(); }
  /// Upper bound of sizeHint().width() (0: the whole text's width).
  void setPreferredMaxWidth(int w);

  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 protected:
  void paintEvent(QPaintEvent* e) override;
  void resizeEvent(QResizeEvent* e) override;

 private:
  void updateTip();
  QString baseTip_;
  int maxHint_ = 0;
};

}  // namespace dit::ui
