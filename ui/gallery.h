// Gallery: the large current image (or the live preview while denoising) with its parameters,
// the progress bar with ETA, and thumbnails of the history (newest first) with "use parameters",
// "open PNG" (reads the PNG's parameters text chunk), "save as", remove and clear.
#pragma once

#include <QImage>
#include <QWidget>

#include "ui/history_store.h"

class QLabel;
class QListWidget;
class QProgressBar;
class QPushButton;

namespace dit::ui {

/// Paints an image scaled to fit, keeping its aspect ratio.
class ImageView : public QWidget {
  Q_OBJECT
 public:
  explicit ImageView(QWidget* parent = nullptr);
  void setImage(const QImage& image);
  const QImage& image() const { return image_; }
  void setPlaceholder(const QString& text);

 protected:
  void paintEvent(QPaintEvent*) override;

 private:
  QImage image_;
  QString placeholder_;
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
  /// Reads a PNG's parameters and emits useParameters (the "Open PNG" button after its dialog).
  bool openPng(const QString& path, QString* error = nullptr);

 Q_SIGNALS:
  /// Load these parameters into the generation panel.
  void useParameters(const dit::ui::HistoryEntry& entry);
  void errorMessage(const QString& message);

 private:
  void showEntry(const HistoryEntry& e);
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
