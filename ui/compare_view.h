// Compare view of the gallery: two images side by side, as a swipe (one image left of a movable
// divider, the other right of it; drag or the arrow keys move it) or a blink (the two alternate,
// every blinkInterval() ms or on Space), and a grid of every image of a batch. Images of other
// sizes are drawn in the same rectangle (scaled to fit the first), so a swipe compares the same
// pixels.
#pragma once

#include <QImage>
#include <QList>
#include <QStringList>
#include <QTimer>
#include <QWidget>

namespace dit::ui {

class CompareView : public QWidget {
  Q_OBJECT
 public:
  enum class Mode { Swipe, Blink, SideBySide, Grid };
  Q_ENUM(Mode)

  explicit CompareView(QWidget* parent = nullptr);
  /// Images to show with their captions (two for Swipe / Blink / SideBySide, any number for
  /// Grid).
  void setImages(const QList<QImage>& images, const QStringList& captions = {});
  const QStringList& captions() const { return captions_; }
  int imageCount() const { return static_cast<int>(images_.size()); }
  void setMode(Mode m);
  Mode mode() const { return mode_; }
  /// Swipe: where the divider is, 0 .. 1 of the image's width (0.5 at first).
  void setSplit(double fraction);
  double split() const { return split_; }
  /// Blink: which image shows (0 or 1); step() shows the other one.
  int shownIndex() const { return shown_; }
  void step();
  void setBlinkInterval(int ms);
  int blinkInterval() const { return timer_.interval(); }
  bool blinking() const { return timer_.isActive(); }
  /// Where image `i` is drawn (Grid and SideBySide: its cell; Swipe and Blink: the common
  /// rectangle), in widget coordinates.
  QRectF imageRect(int i) const;
  /// Grid: the image under `pos`, -1 when none.
  int imageAt(const QPointF& pos) const;

 Q_SIGNALS:
  /// Grid: an image was double-clicked.
  void imageActivated(int index);

 protected:
  void paintEvent(QPaintEvent*) override;
  void mousePressEvent(QMouseEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;
  void mouseDoubleClickEvent(QMouseEvent* e) override;
  void keyPressEvent(QKeyEvent* e) override;
  void showEvent(QShowEvent* e) override;
  void hideEvent(QHideEvent* e) override;

 private:
  QRectF fit(const QSize& image, const QRectF& cell) const;
  QList<QRectF> cells() const;
  void syncTimer();
  QList<QImage> images_;
  QStringList captions_;
  Mode mode_ = Mode::Swipe;
  double split_ = 0.5;
  int shown_ = 0;
  QTimer timer_;
};

}  // namespace dit::ui
