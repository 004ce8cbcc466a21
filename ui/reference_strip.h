// Reference images of an editing request (issue 46: Flux2KleinPipeline(image=[...]),
// FluxKontextPipeline(image=...)): a strip of thumbnails in the generation panel, in the order the
// model sees them. Added by dropping files on the strip, by pasting (an image on the clipboard is
// saved as a PNG in the app's data folder, content-named, never over another file; copied files
// are added as they are) or with Browse; each thumbnail shows the file's pixel size and, when the
// model fits it to another size, what it becomes (dit::fitReference); it can be moved by dragging
// it (or with its arrows) and removed (x). Enabled for a model whose declared request takes
// references (dit::RequestSpec::references.max_count > 0), otherwise disabled with the reason as
// its tooltip. How many a model takes is the resolve's check (ModelInfo::resolve), not the
// strip's: more than max_count stay listed and the live validation shows the refusal. No Torch.
#pragma once

#include <QGroupBox>
#include <QImage>
#include <QSize>
#include <QString>
#include <QStringList>
#include <vector>

#include "backend/models/request_spec.h"
#include "ui/generation_params.h"

class QHBoxLayout;
class QLabel;
class QDropEvent;
class QMimeData;
class QPushButton;
class QScrollArea;
class QToolButton;

namespace dit::ui {

class ReferenceStrip : public QGroupBox {
  Q_OBJECT
 public:
  /// The MIME type of a thumbnail being dragged inside the strip (its index as decimal text).
  static constexpr const char* kDragMime = "application/x-ditstudio-reference-index";

  explicit ReferenceStrip(QWidget* parent = nullptr);

  /// One reference as listed.
  struct Entry {
    QString path;      ///< absolute path
    QString sha256;    ///< of the file as it is now (64 lowercase hex digits; "" when unreadable)
    QString recorded;  ///< the SHA-256 a recalled request carried ("" for a file added here)
    QSize size;        ///< the file's pixel size (invalid when unreadable)
    QImage thumbnail;  ///< at most 96 x 96, aspect kept (null when unreadable)
    QString problem;   ///< why it cannot be used as listed (missing here, unreadable); "" = fine
  };

  /// Inserts the image file `path` at `at` (-1: at the end). Refused (false, `error` naming the
  /// file) when it is not a readable image, when the model takes no references, or when the
  /// strip already holds the protocol's most (dit::protocol::kMaxReferenceImages). Emits
  /// changed().
  bool addReference(const QString& path, int at = -1, QString* error = nullptr);
  /// Saves `image` as a PNG in pasteDir() (named by its content's SHA-256; a file of that name
  /// with other bytes is never overwritten, the name gets a suffix) and adds it like
  /// addReference. Returns false with `error` set when it cannot be written or added.
  bool addImage(const QImage& image, QString* error = nullptr);
  /// What Paste (Ctrl+V) does: the clipboard's image (addImage) or its copied image files
  /// (addReference each). False with `error` set when it holds neither or adding failed.
  bool paste(QString* error = nullptr);
  void removeReference(int index);
  /// Moves reference `from` so that it becomes reference `to` (both 0-based, in range).
  void moveReference(int from, int to);
  void clear();
  int count() const { return static_cast<int>(entries_.size()); }
  const Entry& entry(int index) const { return entries_.at(static_cast<size_t>(index)); }
  /// The references' paths in order.
  QStringList paths() const;

  /// Writes reference_images: absolute paths in order, each recalled one with the SHA-256 it
  /// was recorded with (the worker refuses a file changed since); one added here without (the
  /// worker records the hash of the file it read in the image's parameters).
  void apply(GenerationParams& p) const;
  /// Replaces the list with the recalled references (a history entry's, a preset's, a PNG's).
  /// A file that is missing here or unreadable stays listed, marked; a file whose SHA-256
  /// differs from the recorded one stays listed and is named by issues(). notice() names each.
  void restore(const GenerationParams& p);

  /// The loaded model's declared request (its references rule, family and pipeline) and the
  /// size multiple the fitted sizes are floored to (2 * vae_scale_factor). Enables or disables
  /// the strip; references already listed stay (the resolve refuses them for a model that takes
  /// none) and can be removed.
  void setModel(const QString& family, const dit::RequestSpec& spec, int sizeMultiple);
  /// The value of the rule's auto-resize knob (FluxKontextPipeline's _auto_resize) the fitted
  /// sizes are shown for.
  void setAutoResize(bool on);
  /// Whether the loaded model takes references at all.
  bool takesReferences() const { return rule_.max_count > 0; }
  /// Why the strip is disabled ("" when the model takes references).
  QString disabledReason() const { return disabledReason_; }

  /// Folder where pasted images are saved (created on demand); default <appDataDir>/references.
  void setPasteDir(const QString& dir) { pasteDir_ = dir; }
  QString pasteDir() const { return pasteDir_; }

  /// What the worker would refuse that the resolve cannot see, in the worker's words: a recalled
  /// reference whose file changed ("reference image 2 /a/b.png has SHA-256 ..., not the
  /// recorded ... (the file changed since the image was made)"). The window disables Generate
  /// while it is not empty.
  QStringList issues() const;
  /// What restore() or the last add could not do (a file missing here, unreadable, refused),
  /// one line each; shown under the thumbnails. Cleared by the next successful edit.
  QStringList notices() const { return notices_; }

  /// Where a drop at `pos` (strip coordinates) inserts: 0 .. count().
  int dropIndexAt(const QPoint& pos) const;
  /// The fitted size of reference `index` as the model encodes it (dit::fitReference), or an
  /// invalid size when the model takes none or refuses it.
  QSize fittedSize(int index) const;

  // Widgets exposed for tests.
  QPushButton* browseButton() const { return browse_; }
  QPushButton* pasteButton() const { return paste_; }
  QPushButton* sizeButton() const { return size_; }
  QLabel* hintLabel() const { return hint_; }
  QLabel* statusLabel() const { return status_; }
  QWidget* tile(int index) const { return tiles_.at(static_cast<size_t>(index)).frame; }
  QLabel* sizeLabel(int index) const { return tiles_.at(static_cast<size_t>(index)).size; }
  QToolButton* removeButton(int index) const {
    return tiles_.at(static_cast<size_t>(index)).remove;
  }
  QToolButton* moveLeftButton(int index) const {
    return tiles_.at(static_cast<size_t>(index)).left;
  }
  QToolButton* moveRightButton(int index) const {
    return tiles_.at(static_cast<size_t>(index)).right;
  }

 Q_SIGNALS:
  /// The list, its order or a file's state changed.
  void changed();
  /// "Size from reference 1": the first reference's fitted size, in pixels.
  void sizeRequested(int width, int height);

 protected:
  void dragEnterEvent(QDragEnterEvent* e) override;
  void dragMoveEvent(QDragMoveEvent* e) override;
  void dragLeaveEvent(QDragLeaveEvent* e) override;
  void dropEvent(QDropEvent* e) override;

 private:
  friend class ReferenceTile;
  struct Tile {
    QWidget* frame = nullptr;
    QLabel* size = nullptr;
    QToolButton* remove = nullptr;
    QToolButton* left = nullptr;
    QToolButton* right = nullptr;
  };
  /// Reads `path` into an Entry (problem set when unreadable).
  static Entry readEntry(const QString& path);
  /// Starts dragging tile `index` (a QDrag of kDragMime).
  void startDrag(int index);
  /// Whether the strip takes what `e` carries: one of its own thumbnails (a drag whose source
  /// is this strip, or a synthesized one without a source), or files while the model takes
  /// references.
  bool accepts(const QDropEvent* e) const;
  void rebuildTiles();
  void updateState();
  void showDropMarker(int index);
  /// The tooltip of the whole strip: the model's rule in words.
  QString ruleText() const;

  std::vector<Entry> entries_;
  std::vector<Tile> tiles_;
  dit::ReferenceRule rule_;
  QString family_, pipeline_, disabledReason_, pasteDir_;
  int multiple_ = 16;
  bool autoResize_ = true;
  QStringList notices_;
  QScrollArea* scroll_;
  QWidget* holder_;
  QHBoxLayout* row_;
  QWidget* marker_;
  QLabel* hint_;
  QLabel* status_;
  QPushButton* browse_;
  QPushButton* paste_;
  QPushButton* size_;
};

}  // namespace dit::ui
