#include "ui/reference_strip.h"

#include <QApplication>
#include <QBuffer>
#include <QClipboard>
#include <QCryptographicHash>
#include <QDir>
#include <QDrag>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QImageReader>
#include <QLabel>
#include <QMimeData>
#include <QMouseEvent>
#include <QPushButton>
#include <QScrollArea>
#include <QScrollBar>
#include <QShortcut>
#include <QToolButton>
#include <QUrl>
#include <QVBoxLayout>
#include <algorithm>
#include <optional>

#include "app/protocol/protocol.h"
#include "ui/image_input_panel.h"
#include "ui/json_io.h"

namespace dit::ui {

namespace {
constexpr int kThumb = 96;  ///< thumbnail box, pixels

QString sizeText(QSize s) { return QStringLiteral("%1×%2").arg(s.width()).arg(s.height()); }

// The local image files among `mime`'s URLs.
QStringList localFiles(const QMimeData* mime) {
  QStringList out;
  if (!mime || !mime->hasUrls()) return out;
  for (const QUrl& u : mime->urls())
    if (u.isLocalFile()) out << u.toLocalFile();
  return out;
}
}  // namespace

/// One thumbnail: a drag handle for reordering (the strip does the rest).
class ReferenceTile : public QFrame {
 public:
  ReferenceTile(ReferenceStrip* strip, QWidget* parent, int index)
      : QFrame(parent), strip_(strip), index_(index) {}

 protected:
  void mousePressEvent(QMouseEvent* e) override {
    if (e->button() == Qt::LeftButton) press_ = e->position().toPoint();
    QFrame::mousePressEvent(e);
  }
  void mouseMoveEvent(QMouseEvent* e) override {
    if ((e->buttons() & Qt::LeftButton) && press_ &&
        (e->position().toPoint() - *press_).manhattanLength() >=
            QApplication::startDragDistance()) {
      press_.reset();
      strip_->startDrag(index_);
      return;
    }
    QFrame::mouseMoveEvent(e);
  }
  void mouseReleaseEvent(QMouseEvent* e) override {
    press_.reset();
    QFrame::mouseReleaseEvent(e);
  }

 private:
  ReferenceStrip* strip_;
  int index_;
  std::optional<QPoint> press_;
};

ReferenceStrip::ReferenceStrip(QWidget* parent)
    : QGroupBox(tr("Reference images"), parent),
      pasteDir_(QDir(appDataDir()).filePath(QStringLiteral("references"))) {
  setObjectName("referenceStrip");
  setFocusPolicy(Qt::ClickFocus);  // a click on the strip, then Ctrl+V, pastes here
  auto* outer = new QVBoxLayout(this);
  outer->setContentsMargins(6, 6, 6, 6);
  outer->setSpacing(4);
  hint_ = new QLabel(this);
  hint_->setObjectName("hint");
  hint_->setWordWrap(true);
  hint_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);  // wraps, never widens
  outer->addWidget(hint_);

  scroll_ = new QScrollArea(this);
  scroll_->setWidgetResizable(true);
  scroll_->setFrameShape(QFrame::NoFrame);
  scroll_->setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  scroll_->setHorizontalScrollBarPolicy(Qt::ScrollBarAsNeeded);
  holder_ = new QWidget(scroll_);
  row_ = new QHBoxLayout(holder_);
  row_->setContentsMargins(0, 0, 0, 0);
  row_->setSpacing(6);
  row_->addStretch(1);
  scroll_->setWidget(holder_);
  // The column never widens for the strip: it scrolls sideways inside its own area.
  scroll_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Fixed);
  outer->addWidget(scroll_);
  marker_ = new QWidget(holder_);
  marker_->setObjectName("referenceDropMarker");
  marker_->setFixedWidth(3);
  marker_->setAutoFillBackground(true);
  marker_->setStyleSheet(QStringLiteral("background: #4a90d9;"));
  marker_->hide();

  auto* buttons = new QHBoxLayout;
  browse_ = new QPushButton(tr("Browse…"), this);
  browse_->setToolTip(tr("Add image files as references (appended in the order chosen)"));
  paste_ = new QPushButton(tr("Paste"), this);
  paste_->setToolTip(
      tr("Add the clipboard's image (saved as a PNG in the data folder) or its copied image "
         "files (Ctrl+V over the strip)"));
  size_ = new QPushButton(tr("Size from 1st"), this);
  size_->setObjectName("referenceSize");
  buttons->addWidget(browse_);
  buttons->addWidget(paste_);
  buttons->addWidget(size_);
  buttons->addStretch(1);
  outer->addLayout(buttons);
  status_ = new QLabel(this);
  status_->setObjectName("issues");
  status_->setWordWrap(true);
  status_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);  // long paths wrap
  outer->addWidget(status_);

  connect(browse_, &QPushButton::clicked, this, [this] {
    const QString start = entries_.empty() ? QString() : QFileInfo(entries_.back().path).path();
    const QStringList files =
        QFileDialog::getOpenFileNames(this, tr("Add reference images"), start,
                                      tr("Images (*.png *.jpg *.jpeg *.webp *.bmp *.tga *.gif)"));
    for (const QString& f : files)
      if (!addReference(f)) break;  // the notice says why
  });
  connect(paste_, &QPushButton::clicked, this, [this] { paste(); });
  auto* pasteKey =
      new QShortcut(QKeySequence::Paste, this, nullptr, nullptr, Qt::WidgetWithChildrenShortcut);
  connect(pasteKey, &QShortcut::activated, this, [this] {
    if (paste_->isEnabled()) paste();
  });
  connect(size_, &QPushButton::clicked, this, [this] {
    const QSize s = fittedSize(0);
    if (s.isValid()) Q_EMIT sizeRequested(s.width(), s.height());
  });
  setModel(QString(), dit::RequestSpec{}, 16);
}

ReferenceStrip::Entry ReferenceStrip::readEntry(const QString& path) {
  Entry e;
  e.path = QFileInfo(path).absoluteFilePath();
  if (!QFileInfo::exists(e.path)) {
    e.problem = tr("missing here");
    return e;
  }
  QImageReader r(e.path);
  e.size = r.size();
  if (e.size.isValid()) {
    const QSize t = e.size.scaled(kThumb, kThumb, Qt::KeepAspectRatio);
    r.setScaledSize(t.expandedTo(QSize(1, 1)));
  }
  const QImage img = r.read();
  if (img.isNull()) {
    e.problem = tr("not a readable image: %1").arg(r.errorString());
    e.size = QSize();
    return e;
  }
  if (!e.size.isValid()) e.size = img.size();
  e.thumbnail = img.width() > kThumb || img.height() > kThumb
                    ? img.scaled(kThumb, kThumb, Qt::KeepAspectRatio, Qt::SmoothTransformation)
                    : img;
  e.sha256 = fileSha256(e.path);
  return e;
}

bool ReferenceStrip::addReference(const QString& path, int at, QString* error) {
  auto refuse = [&](const QString& why) {
    notices_ = QStringList{why};
    if (error) *error = why;
    updateState();
    return false;
  };
  if (!takesReferences()) return refuse(disabledReason_);
  if (count() >= dit::protocol::kMaxReferenceImages)
    return refuse(tr("cannot add %1: a request holds at most %2 reference images")
                      .arg(path)
                      .arg(dit::protocol::kMaxReferenceImages));
  Entry e = readEntry(path);
  if (!e.problem.isEmpty()) return refuse(tr("%1 is %2").arg(e.path, e.problem));
  const int i = at < 0 || at > count() ? count() : at;
  entries_.insert(entries_.begin() + i, std::move(e));
  notices_.clear();
  rebuildTiles();
  Q_EMIT changed();
  return true;
}

bool ReferenceStrip::addImage(const QImage& image, QString* error) {
  auto fail = [&](const QString& why) {
    notices_ = QStringList{why};
    if (error) *error = why;
    updateState();
    return false;
  };
  if (image.isNull()) return fail(tr("the clipboard holds no image"));
  if (!takesReferences()) return fail(disabledReason_);
  QByteArray png;
  {
    QBuffer buf(&png);
    buf.open(QIODevice::WriteOnly);
    if (!image.save(&buf, "PNG")) return fail(tr("cannot encode the pasted image as PNG"));
  }
  const QString hash =
      QString::fromLatin1(QCryptographicHash::hash(png, QCryptographicHash::Sha256).toHex());
  if (!QDir().mkpath(pasteDir_)) return fail(tr("cannot create the folder %1").arg(pasteDir_));
  // Content-named: pasting the same image twice finds the same file; a file of that name with
  // other bytes (edited by hand) is left alone and the new one takes the next free suffix.
  const QString stem = QStringLiteral("pasted-") + hash.left(16);
  for (int n = 1; n < 1000; ++n) {
    const QString file = QDir(pasteDir_).filePath(
        n == 1 ? stem + ".png" : QStringLiteral("%1-%2.png").arg(stem).arg(n));
    if (QFileInfo::exists(file)) {
      if (fileSha256(file) == hash) return addReference(file, -1, error);
      continue;
    }
    QFile f(file);
    if (!f.open(QIODevice::WriteOnly | QIODevice::NewOnly)) continue;  // taken meanwhile
    if (f.write(png) != png.size() || !f.flush()) {
      f.close();
      f.remove();
      return fail(tr("cannot write %1: %2").arg(file, f.errorString()));
    }
    f.close();
    return addReference(file, -1, error);
  }
  return fail(tr("no free file name for the pasted image in %1").arg(pasteDir_));
}

bool ReferenceStrip::paste(QString* error) {
  const QMimeData* mime = QGuiApplication::clipboard()->mimeData();
  const QStringList files = localFiles(mime);
  if (!files.isEmpty()) {
    for (const QString& f : files)
      if (!addReference(f, -1, error)) return false;
    return true;
  }
  if (mime && mime->hasImage()) return addImage(qvariant_cast<QImage>(mime->imageData()), error);
  notices_ = QStringList{tr("the clipboard holds no image and no image file")};
  if (error) *error = notices_.first();
  updateState();
  return false;
}

void ReferenceStrip::removeReference(int index) {
  if (index < 0 || index >= count()) return;
  entries_.erase(entries_.begin() + index);
  notices_.clear();
  rebuildTiles();
  Q_EMIT changed();
}

void ReferenceStrip::moveReference(int from, int to) {
  if (from < 0 || from >= count() || to < 0 || to >= count() || from == to) return;
  Entry e = std::move(entries_[static_cast<size_t>(from)]);
  entries_.erase(entries_.begin() + from);
  entries_.insert(entries_.begin() + to, std::move(e));
  rebuildTiles();
  Q_EMIT changed();
}

void ReferenceStrip::clear() {
  if (entries_.empty() && notices_.isEmpty()) return;
  entries_.clear();
  notices_.clear();
  rebuildTiles();
  Q_EMIT changed();
}

QStringList ReferenceStrip::paths() const {
  QStringList out;
  for (const Entry& e : entries_) out << e.path;
  return out;
}

void ReferenceStrip::apply(GenerationParams& p) const {
  p.reference_images.clear();
  // A file added here goes without a hash: the worker reads it as it is when the request runs
  // and records that file's SHA-256 in the image's parameters. A recalled one keeps its
  // recorded hash, so that a changed file is refused rather than silently used.
  for (const Entry& e : entries_)
    p.reference_images.push_back({e.path.toStdString(), e.recorded.toStdString()});
}

void ReferenceStrip::restore(const GenerationParams& p) {
  GenerationParams now;
  apply(now);
  if (now.reference_images == p.reference_images) return;  // the same list: nothing to read
  entries_.clear();
  notices_.clear();
  for (size_t i = 0; i < p.reference_images.size(); ++i) {
    const auto& ref = p.reference_images[i];
    Entry e = readEntry(QString::fromStdString(ref.file));
    e.recorded = QString::fromStdString(ref.sha256).toLower();
    if (!e.problem.isEmpty())
      notices_ << tr("reference %1 %2: %3").arg(i + 1).arg(e.problem, e.path);
    else if (!e.recorded.isEmpty() && e.recorded != e.sha256)
      notices_ << tr("reference %1 changed since it was recorded (its SHA-256 differs): %2")
                      .arg(i + 1)
                      .arg(e.path);
    entries_.push_back(std::move(e));
  }
  rebuildTiles();
  Q_EMIT changed();
}

void ReferenceStrip::setModel(const QString& family, const dit::RequestSpec& spec,
                              int sizeMultiple) {
  rule_ = spec.references;
  family_ = family.isEmpty() ? QString::fromStdString(spec.family) : family;
  pipeline_ = QString::fromStdString(spec.pipeline);
  multiple_ = std::max(1, sizeMultiple);
  if (!rule_.auto_resize_field.empty()) {
    const dit::FieldSpec* k = spec.field(rule_.auto_resize_field);
    autoResize_ = !k || k->default_value != 0;
  }
  if (takesReferences()) {
    disabledReason_.clear();
  } else {
    const QString who = family_.isEmpty() ? tr("this model") : family_;
    disabledReason_ =
        pipeline_.isEmpty()
            ? tr("Reference images are not supported for %1: its request declares no "
                 "reference images (an editing model's does)")
                  .arg(who)
            : tr("Reference images are not supported for %1 (%2): its request declares no "
                 "reference images (an editing model's does)")
                  .arg(who, pipeline_);
  }
  rebuildTiles();
}

void ReferenceStrip::setAutoResize(bool on) {
  if (on == autoResize_) return;
  autoResize_ = on;
  rebuildTiles();
}

QStringList ReferenceStrip::issues() const {
  QStringList out;
  for (int i = 0; i < count(); ++i) {
    const Entry& e = entries_[static_cast<size_t>(i)];
    // app/common/generation.cpp checkInputImages, word for word.
    if (e.problem.isEmpty() && !e.recorded.isEmpty() && e.recorded != e.sha256)
      out << QStringLiteral(
                 "reference image %1 %2 has SHA-256 %3, not the recorded %4 (the file changed "
                 "since the image was made)")
                 .arg(i + 1)
                 .arg(e.path, e.sha256, e.recorded);
  }
  return out;
}

QSize ReferenceStrip::fittedSize(int index) const {
  if (!takesReferences() || index < 0 || index >= count()) return {};
  const Entry& e = entries_[static_cast<size_t>(index)];
  if (!e.size.isValid()) return {};
  const dit::ReferenceFit f =
      dit::fitReference(rule_, multiple_, e.size.width(), e.size.height(), autoResize_);
  if (!f.problem.empty() || f.width <= 0 || f.height <= 0) return {};
  return {f.width, f.height};
}

QString ReferenceStrip::ruleText() const {
  if (!takesReferences()) return disabledReason_;
  QStringList lines;
  lines << tr("Reference images for %1 (%2), at most %3, in order: reference 1 is the first "
              "the model sees (position %4).")
               .arg(family_, QString::fromStdString(rule_.source))
               .arg(rule_.max_count)
               .arg(QString::fromStdString(rule_.ids));
  if (rule_.output_size_from_first)
    lines << tr(
        "Reference 1 sets the size: without a width and height the output takes its "
        "fitted size (\"Size from 1st\" sets the size fields to it).");
  if (rule_.min_side > 0 || rule_.max_aspect > 0)
    lines << tr("Each needs both sides of at least %1 px and an aspect of at most %2.")
                 .arg(rule_.min_side)
                 .arg(rule_.max_aspect);
  lines << (rule_.fit == dit::ReferenceRule::Fit::CenterCrop
                ? tr("Each is centre-cropped to a multiple of %1 px (no resampling)%2.")
                      .arg(multiple_)
                      .arg(rule_.max_area > 0 ? tr(" after scaling down to %1 pixels when larger")
                                                    .arg(rule_.max_area)
                                              : QString())
                : tr("Each is resized to a multiple of %1 px%2.")
                      .arg(multiple_)
                      .arg(rule_.auto_resize_field.empty()
                               ? QString()
                               : tr(" (with %1 on: the nearest preferred size)")
                                     .arg(QString::fromStdString(rule_.auto_resize_field))));
  lines << tr(
      "Drop image files here, paste (Ctrl+V) or Browse; drag a thumbnail (or use its "
      "arrows) to reorder, x removes it.");
  return lines.join(QLatin1Char('\n'));
}

void ReferenceStrip::rebuildTiles() {
  // Later: this runs from a tile's own button (move, remove).
  for (Tile& t : tiles_) {
    row_->removeWidget(t.frame);
    t.frame->hide();
    t.frame->deleteLater();
  }
  tiles_.clear();
  for (int i = 0; i < count(); ++i) {
    const Entry& e = entries_[static_cast<size_t>(i)];
    auto* frame = new ReferenceTile(this, holder_, i);
    frame->setObjectName(QStringLiteral("referenceTile"));
    frame->setFrameShape(QFrame::StyledPanel);
    auto* v = new QVBoxLayout(frame);
    v->setContentsMargins(3, 3, 3, 3);
    v->setSpacing(2);
    auto* top = new QHBoxLayout;
    top->setContentsMargins(0, 0, 0, 0);
    auto* number = new QLabel(QString::number(i + 1), frame);
    number->setToolTip(i == 0 && rule_.output_size_from_first
                           ? tr("reference 1: the first the model sees; it sets the size when "
                                "none is given")
                           : tr("reference %1 (the order the model sees them)").arg(i + 1));
    Tile t;
    t.frame = frame;
    t.left = new QToolButton(frame);
    t.left->setArrowType(Qt::LeftArrow);
    t.left->setAutoRaise(true);
    t.left->setToolTip(tr("Move earlier"));
    t.left->setEnabled(i > 0);
    t.right = new QToolButton(frame);
    t.right->setArrowType(Qt::RightArrow);
    t.right->setAutoRaise(true);
    t.right->setToolTip(tr("Move later"));
    t.right->setEnabled(i + 1 < count());
    t.remove = new QToolButton(frame);
    t.remove->setText(QStringLiteral("✕"));
    t.remove->setAutoRaise(true);
    t.remove->setToolTip(tr("Remove this reference"));
    top->addWidget(number);
    top->addStretch(1);
    top->addWidget(t.left);
    top->addWidget(t.right);
    top->addWidget(t.remove);
    v->addLayout(top);
    auto* thumb = new QLabel(frame);
    thumb->setFixedSize(kThumb, kThumb);
    thumb->setAlignment(Qt::AlignCenter);
    if (!e.thumbnail.isNull())
      thumb->setPixmap(QPixmap::fromImage(e.thumbnail));
    else
      thumb->setText(tr("(missing)"));
    v->addWidget(thumb);
    t.size = new QLabel(frame);
    t.size->setAlignment(Qt::AlignCenter);
    QString sizeLine, tip = e.path;
    if (e.size.isValid()) {
      sizeLine = sizeText(e.size);
      tip += QStringLiteral("\n") + tr("%1 px").arg(sizeText(e.size));
      const QSize fit = fittedSize(i);
      if (fit.isValid() && fit != e.size) {
        sizeLine += QStringLiteral(" → ") + sizeText(fit);
        tip += QStringLiteral("\n") + tr("encoded at %1 px").arg(sizeText(fit));
      } else if (takesReferences() && !fit.isValid()) {
        const dit::ReferenceFit f =
            dit::fitReference(rule_, multiple_, e.size.width(), e.size.height(), autoResize_);
        if (!f.problem.empty()) {
          tip += QStringLiteral("\n") + QString::fromStdString(f.problem);
          t.size->setProperty("invalid", true);
          t.size->setStyleSheet(QStringLiteral("color: #ff6b6b;"));
        }
      }
    } else {
      sizeLine = e.problem;
      t.size->setStyleSheet(QStringLiteral("color: #ff6b6b;"));
    }
    if (!e.sha256.isEmpty()) tip += QStringLiteral("\nSHA-256 ") + e.sha256;
    if (!e.problem.isEmpty()) tip += QStringLiteral("\n") + e.problem;
    t.size->setText(sizeLine);
    frame->setToolTip(tip);
    v->addWidget(t.size);
    row_->insertWidget(i, frame);
    frame->show();  // now, not when the layout's queued show runs
    connect(t.left, &QToolButton::clicked, this, [this, i] { moveReference(i, i - 1); });
    connect(t.right, &QToolButton::clicked, this, [this, i] { moveReference(i, i + 1); });
    connect(t.remove, &QToolButton::clicked, this, [this, i] { removeReference(i); });
    tiles_.push_back(t);
  }
  marker_->raise();
  updateState();
}

void ReferenceStrip::updateState() {
  const bool takes = takesReferences();
  const bool room = count() < dit::protocol::kMaxReferenceImages;
  // Disabled with the reason when the model takes none; references recalled for such a model
  // stay removable (the resolve refuses the request until they are gone).
  setEnabled(takes || count() > 0);
  browse_->setEnabled(takes && room);
  paste_->setEnabled(takes && room);
  // A model that takes none: the title and the reason only (no buttons to look for).
  browse_->setVisible(takes || count() > 0);
  paste_->setVisible(takes || count() > 0);
  size_->setEnabled(fittedSize(0).isValid());
  size_->setVisible(rule_.output_size_from_first && (takes || count() > 0));
  size_->setToolTip(fittedSize(0).isValid()
                        ? tr("Set the output size to reference 1's fitted size (%1 px), the size "
                             "%2 makes when none is given")
                              .arg(sizeText(fittedSize(0)), QString::fromStdString(rule_.source))
                        : tr("Add a reference first"));
  setAcceptDrops(takes || count() > 0);
  scroll_->setVisible(count() > 0);
  if (count() > 0) {
    int h = 0;
    for (const Tile& t : tiles_) h = std::max(h, t.frame->sizeHint().height());
    scroll_->setFixedHeight(h + scroll_->horizontalScrollBar()->sizeHint().height() + 4);
  }
  setTitle(takes ? tr("Reference images (%1 of at most %2)").arg(count()).arg(rule_.max_count)
                 : tr("Reference images"));
  if (!takes)
    hint_->setText(disabledReason_);
  else if (count() == 0)
    hint_->setText(tr("Drop images here, paste (Ctrl+V) or Browse…"));
  else
    hint_->setText(rule_.output_size_from_first
                       ? tr("In order; reference 1 sets the size when none is given. Drag to "
                            "reorder.")
                       : tr("In order. Drag to reorder."));
  setToolTip(ruleText());
  QStringList lines = notices_;
  for (const QString& i : issues())
    if (!lines.contains(i)) lines << i;
  status_->setText(lines.join(QLatin1Char('\n')));
  status_->setVisible(!lines.isEmpty());
}

void ReferenceStrip::startDrag(int index) {
  if (index < 0 || index >= count()) return;
  auto* mime = new QMimeData;
  mime->setData(QString::fromLatin1(kDragMime), QByteArray::number(index));
  auto* drag = new QDrag(this);
  drag->setMimeData(mime);
  const Entry& e = entries_[static_cast<size_t>(index)];
  if (!e.thumbnail.isNull())
    drag->setPixmap(QPixmap::fromImage(
        e.thumbnail.scaled(48, 48, Qt::KeepAspectRatio, Qt::SmoothTransformation)));
  drag->exec(Qt::MoveAction);
}

bool ReferenceStrip::accepts(const QDropEvent* e) const {
  const QMimeData* mime = e->mimeData();
  if (!mime) return false;
  // A thumbnail of this strip (another window's strip numbers its own references).
  if (mime->hasFormat(QString::fromLatin1(kDragMime)))
    return e->source() == nullptr || e->source() == this;
  return takesReferences() && !localFiles(mime).isEmpty();
}

int ReferenceStrip::dropIndexAt(const QPoint& pos) const {
  const QPoint p = holder_->mapFrom(this, pos);
  int i = 0;
  for (const Tile& t : tiles_) {
    if (p.x() < t.frame->geometry().center().x()) break;
    ++i;
  }
  return i;
}

void ReferenceStrip::showDropMarker(int index) {
  if (index < 0 || tiles_.empty()) {
    marker_->hide();
    return;
  }
  const int spacing = row_->spacing();
  const QRect g = index < count() ? tiles_[static_cast<size_t>(index)].frame->geometry()
                                  : tiles_.back().frame->geometry();
  const int x = index < count() ? g.left() - spacing / 2 - 1 : g.right() + spacing / 2;
  marker_->setGeometry(std::max(0, x), g.top(), 3, g.height());
  marker_->show();
  marker_->raise();
}

void ReferenceStrip::dragEnterEvent(QDragEnterEvent* e) {
  if (!accepts(e)) return;
  e->acceptProposedAction();
  showDropMarker(dropIndexAt(e->position().toPoint()));
}

void ReferenceStrip::dragMoveEvent(QDragMoveEvent* e) {
  if (!accepts(e)) {
    e->ignore();
    return;
  }
  e->acceptProposedAction();
  showDropMarker(dropIndexAt(e->position().toPoint()));
}

void ReferenceStrip::dragLeaveEvent(QDragLeaveEvent*) { showDropMarker(-1); }

void ReferenceStrip::dropEvent(QDropEvent* e) {
  showDropMarker(-1);
  const QMimeData* mime = e->mimeData();
  if (!accepts(e)) return;
  const int at = dropIndexAt(e->position().toPoint());
  if (mime->hasFormat(QString::fromLatin1(kDragMime))) {
    bool ok = false;
    const int from = mime->data(QString::fromLatin1(kDragMime)).toInt(&ok);
    if (!ok || from < 0 || from >= count()) return;
    // `at` is an insertion point among the current tiles; the moved one leaves its place first.
    const int to = at > from ? at - 1 : at;
    e->setDropAction(Qt::MoveAction);
    e->accept();
    moveReference(from, std::clamp(to, 0, count() - 1));
    return;
  }
  e->acceptProposedAction();
  int pos = at;
  for (const QString& f : localFiles(mime)) {
    if (!addReference(f, pos)) break;  // the notice names the file
    ++pos;
  }
}

}  // namespace dit::ui
