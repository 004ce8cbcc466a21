// Gallery: the large current image (or the live preview while denoising) with its parameters,
// the progress bar with ETA, and thumbnails of the history (newest first) with a search over
// prompt, model, strategy, seed and date, "use parameters", "open PNG" (reads the PNG's
// parameters text chunk), "save as", remove and clear; two selected images compared (swipe,
// blink, side by side) and a batch shown as a grid. The viewer's menu and buttons act on the image
// it shows (an opened PNG included), the thumbnails' menu on the thumbnail.
#pragma once

#include <QImage>
#include <QWidget>

#include "ui/history_store.h"

class QAction;
class QComboBox;
class QDragEnterEvent;
class QDropEvent;
class QFontMetrics;
class QLabel;
class QLineEdit;
class QListWidget;
class QProgressBar;
class QPushButton;
class QStackedWidget;

namespace dit::ui {

class CompareView;

/// A thumbnail's label, three lines each elided to `width` pixels in `fm` (no eliding when
/// `width` <= 0): the prompt's start (the seed, else the file name, when there is no prompt);
/// size and time ("32×48 · 05:12:33"); the model's name ("transformer-Q4_K_S"), so that images
/// of one seed are told apart.
QString thumbnailLabel(const HistoryEntry& e, const QFontMetrics& fm, int width);
/// One line for the compare and grid captions: seed (else the file name), size and time
/// ("seed 42 · 64×64 · 05:12:33").
QString shortLabel(const HistoryEntry& e);

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
  /// Whether the viewer shows a live preview.
  bool showsPreview() const { return preview_; }
  /// Drops the preview (a cancelled or failed request): the selected image shows again.
  void clearPreview();
  /// The image the viewer shows (a history entry, or a PNG opened with "Open PNG..."); empty
  /// path while it shows a preview or nothing.
  const HistoryEntry& shownEntry() const { return shown_; }
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
  /// Use parameters, Save as…, Delete file…); the menu shows them on a right click on a
  /// thumbnail.
  QList<QAction*> imageActions(int row);
  /// The same actions for the image the viewer shows (what a right click on it offers): after
  /// "Open PNG..." they act on that file, not on the selected thumbnail. Empty while a preview
  /// or nothing is shown.
  QList<QAction*> viewActions();
  /// Deletes the entry's PNG from disk and the history (asking first when `confirm`). Returns
  /// false and emits errorMessage when the file cannot be removed.
  bool deleteFile(int row, bool confirm = true);
  /// Deletes `path` from disk (asking first, naming it, when `confirm`) and from the history
  /// when it is there.
  bool deletePath(const QString& path, bool confirm = true);
  /// Copies `source` byte for byte to `dest` (keeping its parameters chunk); "Save as…".
  bool saveImageAs(const QString& source, const QString& dest);

  // Search.
  QLineEdit* filterEdit() const { return filter_; }
  /// Shows only the thumbnails whose entries match `query` (historyMatches).
  void setFilter(const QString& query);
  /// Thumbnails shown by the search.
  int visibleCount() const;

  // Compare and grid.
  /// Shows history rows `a` and `b` in the compare view (current mode, Swipe at first).
  bool compare(int a, int b);
  /// Shows the images of the batch of request `id` (every history entry with that request id)
  /// as a grid; false when it has fewer than two.
  bool showBatch(const QString& requestId);
  /// Shows `rows` as a grid.
  bool showGrid(const QList<int>& rows);
  /// Back to the single image.
  void closeCompare();
  bool comparing() const;
  CompareView* compareView() const { return compareView_; }
  QComboBox* compareModeBox() const { return compareMode_; }
  QPushButton* compareButton() const { return compareBtn_; }
  QPushButton* gridButton() const { return gridBtn_; }
  /// Rows selected in the thumbnails, in order.
  QList<int> selectedRows() const;

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
  void showMenu(const QList<QAction*>& actions, const QPoint& globalPos);
  QList<QAction*> entryActions(const HistoryEntry& e);
  const HistoryEntry* selected() const;
  /// What the buttons act on: the shown image, else the selected thumbnail.
  const HistoryEntry* target() const;
  void updateButtons();
  HistoryStore* history_;
  QStackedWidget* stack_;
  ImageView* view_;
  CompareView* compareView_;
  QComboBox* compareMode_;
  QLabel* compareTitle_;
  QLineEdit* filter_;
  QPushButton* compareBtn_;
  QPushButton* gridBtn_;
  QLabel* caption_;
  QProgressBar* progress_;
  QLabel* progressText_;
  QListWidget* list_;
  QPushButton* use_;
  QPushButton* save_;
  QPushButton* remove_;
  QString currentPath_;
  HistoryEntry shown_;
  bool preview_ = false;
};

}  // namespace dit::ui
