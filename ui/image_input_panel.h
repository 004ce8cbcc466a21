// Image-to-image, inpainting and step caching controls (issue 14): open (or drop) an init image,
// paint a mask over it (paint, erase, clear, invert; white = repaint), a strength slider, the
// step-cache mode, and the measured speed-up of the last cached image. The mask is saved as an
// 8-bit grayscale PNG the size of the init image (content-named, so a recalled request finds
// it); the worker resizes it like diffusers' mask_processor. No Torch.
#pragma once

#include <QGroupBox>
#include <QImage>
#include <QJsonObject>
#include <QList>
#include <QString>
#include <algorithm>

#include "backend/models/family.h"
#include "ui/generation_params.h"

class QComboBox;
class QLabel;
class QLineEdit;
class QPushButton;
class QSlider;
class QSpinBox;
class QToolButton;

namespace dit::ui {

/// The init image with the mask drawn over it: the repaint area striped black and white and
/// outlined (visible over any colour, red included; soft values fainter). The left mouse button
/// paints (or erases) a disk of brushRadius() image pixels, hard or soft-edged (softness()); each
/// stroke, Clear and Invert can be undone and redone (the panel's buttons, Ctrl+Z and
/// Ctrl+Shift+Z).
class MaskCanvas : public QWidget {
  Q_OBJECT
 public:
  explicit MaskCanvas(QWidget* parent = nullptr);
  /// Shows `image` and resets the mask to its size (all keep) and the undo history.
  void setImage(const QImage& image);
  const QImage& image() const { return image_; }
  /// Grayscale8, the image's size: 255 = repaint, 0 = keep (soft edges in between; the worker
  /// binarises at 50% as diffusers' mask processor does).
  const QImage& mask() const { return mask_; }
  /// Replaces the mask (scaled to the image's size when it differs).
  void setMask(const QImage& mask);
  void clearMask();
  void invertMask();
  /// Pixels marked for repainting (at least 50%).
  qint64 maskedPixels() const;
  void setErasing(bool erase) { erasing_ = erase; }
  bool erasing() const { return erasing_; }
  void setBrushRadius(int r) { radius_ = r; }
  int brushRadius() const { return radius_; }
  /// 0 = a hard disk; 100 = full value only at the centre, fading linearly to the rim.
  void setSoftness(int percent) { softness_ = std::clamp(percent, 0, 100); }
  int softness() const { return softness_; }
  /// Undo / redo of strokes, Clear and Invert (up to 50 steps).
  bool canUndo() const { return !undo_.isEmpty(); }
  bool canRedo() const { return !redo_.isEmpty(); }
  void undo();
  void redo();
  /// Where image pixel (x, y) is drawn in widget coordinates (for tests and the brush).
  QPointF toWidget(QPointF imagePoint) const;

 Q_SIGNALS:
  void maskEdited();
  /// canUndo() or canRedo() may have changed.
  void historyChanged();

 protected:
  void paintEvent(QPaintEvent*) override;
  void mousePressEvent(QMouseEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;
  void mouseReleaseEvent(QMouseEvent* e) override;
  QSize sizeHint() const override { return {256, 256}; }

 private:
  QRectF target() const;
  void dab(QPointF widgetPoint);
  /// Saves the mask before an edit (clears the redo steps).
  void remember();
  QImage image_, mask_;
  QList<QImage> undo_, redo_;
  bool erasing_ = false, drawing_ = false;
  int radius_ = 4;
  int softness_ = 0;
};

class ImageInputPanel : public QGroupBox {
  Q_OBJECT
 public:
  explicit ImageInputPanel(QWidget* parent = nullptr);

  /// Loads the init image (empty path: text-to-image). Returns false and sets `error` naming the
  /// file when it is not a readable image. The mask is cleared.
  bool loadInitImage(const QString& path, QString* error = nullptr);
  QString initImagePath() const { return path_; }
  /// Folder where painted masks are saved (created on demand).
  void setMaskDir(const QString& dir) { maskDir_ = dir; }
  /// Writes init_image, init_image_sha256, mask_image (the painted mask saved as a PNG; none
  /// when nothing is painted), strength and cache into `p`.
  void apply(GenerationParams& p) const;
  /// Restores the controls from recalled parameters: loads the init image and the mask by path
  /// (a changed init image, by SHA-256, is reported in the status line), strength and cache.
  void restore(const GenerationParams& p);
  /// Shows the measured effect of caching from an image's "cache_report" (PNG metadata); an
  /// empty object clears it.
  void showCacheReport(const QJsonObject& report);
  /// Enables the controls the model's family supports (dit::FamilyCapabilities: img2img the
  /// init image and strength, inpaint the mask brush, step_cache the cache mode); an unsupported
  /// init image is removed and an unsupported cache mode set to Off, so apply() never asks for
  /// what the worker would refuse. The disabled controls' tooltips name the family.
  void setCapabilities(const QString& family, const dit::FamilyCapabilities& caps);
  const dit::FamilyCapabilities& capabilities() const { return caps_; }
  /// The family named in the refusal tooltips (FamilySpec::display_name).
  const QString& family() const { return family_; }
  /// What the worker would refuse in these controls, in its words, as they stand (a recalled
  /// init image, mask or cache mode the family cannot run: dit::checkRequestSupported; cache
  /// settings it cannot read: the protocol's "request field 'cache': ..."). Shown under the
  /// controls and at the cache field; the window disables Generate while it is not empty.
  QStringList issues() const;

  // Widgets exposed for tests.
  MaskCanvas* canvas() const { return canvas_; }
  QPushButton* openButton() const { return open_; }
  QSlider* strengthSlider() const { return strength_; }
  QComboBox* cacheCombo() const { return cacheMode_; }
  QLineEdit* cacheArgs() const { return cacheArgs_; }
  QLabel* speedupLabel() const { return speedup_; }
  QLabel* statusLabel() const { return status_; }
  QToolButton* eraseButton() const { return erase_; }
  QSpinBox* brushSpin() const { return brush_; }
  QSpinBox* softnessSpin() const { return softness_; }
  QPushButton* undoButton() const { return undo_; }
  QPushButton* redoButton() const { return redo_; }
  QPushButton* clearMaskButton() const { return clearMask_; }
  QPushButton* invertMaskButton() const { return invertMask_; }

 Q_SIGNALS:
  void changed();

 protected:
  void dragEnterEvent(QDragEnterEvent* e) override;
  void dropEvent(QDropEvent* e) override;

 private:
  QString saveMask() const;
  void updateState();
  /// The cache field as the request spells it ("" when off).
  QString cacheText() const;
  void showIssues();

  QString path_, sha256_, maskDir_;
  dit::FamilyCapabilities caps_{true, true, true, true, {}};
  QString family_;  ///< the family named in the tooltips
  MaskCanvas* canvas_;
  QLabel* pathLabel_;
  QString notice_;  ///< what restore() could not do (missing init image, changed file)
  QLabel* status_;
  QPushButton* open_;
  QPushButton* remove_;
  QToolButton* erase_;
  QSpinBox* brush_;
  QSpinBox* softness_;
  QPushButton* undo_;
  QPushButton* redo_;
  QPushButton* clearMask_;
  QPushButton* invertMask_;
  QSlider* strength_;
  QLabel* strengthValue_;
  QComboBox* cacheMode_;
  QLineEdit* cacheArgs_;
  QLabel* speedup_;
};

/// SHA-256 of a file as 64 lowercase hex digits ("" when unreadable).
QString fileSha256(const QString& path);

}  // namespace dit::ui
