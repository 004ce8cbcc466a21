// Gallery: the large current image (or the live preview while denoising) with its parameters,
// the progress bar with ETA, and thumbnails of the history (newest first) with "use parameters",
// "open PNG" (reads the PNG's parameters text chunk), "save as", remove and clear.
#pragma once

#include <QImage>
#include <QWidget>

#include "ui/history_store.h"

class QAction;
class QDragEnterEvent;
class QDropEvent;
class QLabel;
class QListWidget;
class QProgressBar;
class QPushButton;

namespace dit::ui {

/// Paints an image scaled to fit (keeping its aspect ratio), or at a zoom factor (1 = 1:1, one
/// image pixel per screen pixel) panned by dragging. Wheel: zoom in/out; double-click or "1":
/// toggle fit / 1:1; "0": fit.
class ImageView : public QWidget {
  Q_OBJECT
 public:
  explicit ImageView(QWidget* parent = nullptr);
  void setImage(const QImage& image);
  const QImage& image() const { return image_; }
  void setPlaceholder(const QString& text);
  /// 0 = fit to the widget; otherwise screen pixels per image pixel (0.1 .. 32). Resets the pan
  /// when it changes to fit.
  void setZoom(double zoom);
  double zoom() const { return zoom_; }
  /// Offset of the image centre from the widget centre, in screen pixels (dragging moves it).
  QPointF pan() const { return pan_; }
  /// Where the image is drawn, in widget coordinates.
  QRectF imageRect() const;

 protected:
  void paintEvent(QPaintEvent*) override;
  void wheelEvent(QWheelEvent* e) override;
  void mousePressEvent(QMouseEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;
  void mouseReleaseEvent(QMouseEvent* e) override;
  void mouseDoubleClickEvent(QMouseEvent* e) override;
  void keyPressEvent(QKeyEvent* e) override;

 private:
  void clampPan();
  QImage image_;
  QString placeholder_;
  double zoom_ = 0;
  QPointF pan_;
  QPoint dragFrom_;
  bool dragging_ = false;
};

/// Gallery over a HistoryStore (which the window owns and appends to).
class Gallery : public QWidget {
  Q_OBJECT
 public:
  explicit Gallery(HistoryStore* history, QWidget* parent = nullptr);

  /// Rebuilds the thumbnails from the store.
  void reload();
  /// Adds a thumbnail for an image that was just added to the store and shows it large.
  void addImage(const HistoryEntry& e);
  /// Shows a live preview (not stored).
  void showPreview(const QImage& image, const QString& caption);
  /// Progress 0..1000 per mille with text ("step 3/8, image 1/1, ETA 2 s"); < 0 hides the bar.
  void setProgress(int perMille, const QString& text);
  int count() const;
  QString currentPath() const { return currentPath_; }
  const QImage& currentImage() const;
  QString caption() const;
  QListWidget* thumbnails() const { return list_; }
  QProgressBar* progressBar() const { return progress_; }
  /// Reads a PNG's parameters and emits useParameters (the "Open PNG" button after its dialog,
  /// and a PNG dropped on the gallery).
  bool openPng(const QString& path, QString* error = nullptr);
  ImageView* view() const { return view_; }
  /// The context menu's actions for history entry `row` (Copy image, Open folder, Use seed,
  /// Delete file…); the menu shows them on a right click on a thumbnail or the large image.
  QList<QAction*> imageActions(int row);
  /// Deletes the entry's PNG from disk and the history (asking first when `confirm`). Returns
  /// false and emits errorMessage when the file cannot be removed.
  bool deleteFile(int row, bool confirm = true);

 Q_SIGNALS:
  /// Load these parameters into the generation panel.
  void useParameters(const dit::ui::HistoryEntry& entry);
  /// Put this seed (exact) into the generation panel ("Use seed").
  void useSeed(std::uint64_t seed);
  void errorMessage(const QString& message);

 protected:
  void dragEnterEvent(QDragEnterEvent* e) override;
  void dropEvent(QDropEvent* e) override;

 private:
  void showEntry(const HistoryEntry& e);
  void showContextMenu(int row, const QPoint& globalPos);
  const HistoryEntry* selected() const;
  HistoryStore* history_;
  ImageView* view_;
  QLabel* caption_;
  QProgressBar* progress_;
  QLabel* progressText_;
  QListWidget* list_;
  QPushButton* use_;
  QPushButton* save_;
  QPushButton* remove_;
  QString currentPath_;
};

}  // namespace dit::ui
