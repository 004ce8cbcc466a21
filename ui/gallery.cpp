#include "ui/gallery.h"

#include <QAction>
#include <QClipboard>
#include <QDesktopServices>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QGuiApplication>
#include <QHBoxLayout>
#include <QJsonDocument>
#include <QKeyEvent>
#include <QLabel>
#include <QListWidget>
#include <QMenu>
#include <QMessageBox>
#include <QMimeData>
#include <QMouseEvent>
#include <QPainter>
#include <QProgressBar>
#include <QPushButton>
#include <QUrl>
#include <QVBoxLayout>
#include <QWheelEvent>

#include "ui/seed_text.h"

namespace dit::ui {
namespace {

QString describe(const QJsonObject& p, const HistoryEntry& e, double seconds) {
  QStringList parts;
  if (e.hasSeed) parts << QStringLiteral("seed %1").arg(seedText(e.seed));
  if (p.contains("width"))
    parts << QStringLiteral("%1×%2").arg(p.value("width").toInt()).arg(p.value("height").toInt());
  if (p.contains("steps")) parts << QStringLiteral("%1 steps").arg(p.value("steps").toInt());
  if (p.contains("guidance"))
    parts << QStringLiteral("guidance %1").arg(p.value("guidance").toDouble());
  if (p.value("true_cfg_scale").toDouble(1) > 1)
    parts << QStringLiteral("true CFG %1").arg(p.value("true_cfg_scale").toDouble());
  if (seconds > 0) parts << QStringLiteral("%1 s").arg(seconds, 0, 'f', 1);
  QString s = parts.join(QStringLiteral(" · "));
  const QString prompt = p.value("prompt").toString();
  if (!prompt.isEmpty()) s += "\n" + prompt;
  return s;
}

}  // namespace

ImageView::ImageView(QWidget* parent) : QWidget(parent) {
  setMinimumSize(160, 140);
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Expanding);
  placeholder_ = tr("No image yet: press Generate");
  setFocusPolicy(Qt::ClickFocus);
  setToolTip(tr("Wheel: zoom · double-click or 1: 1:1 / fit · drag: pan · right click: menu"));
}

void ImageView::setImage(const QImage& image) {
  const bool sameSize = image.size() == image_.size();
  image_ = image;
  if (!sameSize) pan_ = {};  // a preview of the same image keeps the zoom and pan
  clampPan();
  update();
}

void ImageView::setZoom(double zoom) {
  zoom_ = zoom <= 0 ? 0 : std::clamp(zoom, 0.1, 32.0);
  if (zoom_ == 0) pan_ = {};
  clampPan();
  update();
}

QRectF ImageView::imageRect() const {
  if (image_.isNull()) return {};
  QSizeF target;
  if (zoom_ <= 0)
    target = QSizeF(image_.size().scaled(size() - QSize(16, 16), Qt::KeepAspectRatio));
  else
    target = QSizeF(image_.size()) * zoom_;
  const QPointF c = QPointF(width() / 2.0, height() / 2.0) + pan_;
  return QRectF(c - QPointF(target.width() / 2, target.height() / 2), target);
}

void ImageView::clampPan() {
  if (zoom_ <= 0 || image_.isNull()) {
    pan_ = {};
    return;
  }
  // The image may be dragged until its edge reaches the widget's centre, no further.
  const double mx = image_.width() * zoom_ / 2, my = image_.height() * zoom_ / 2;
  pan_.setX(std::clamp(pan_.x(), -mx, mx));
  pan_.setY(std::clamp(pan_.y(), -my, my));
}

void ImageView::wheelEvent(QWheelEvent* e) {
  if (image_.isNull()) return;
  const double current = zoom_ > 0 ? zoom_ : imageRect().width() / std::max(1, image_.width());
  setZoom(current * (e->angleDelta().y() > 0 ? 1.25 : 0.8));
  e->accept();
}

void ImageView::mousePressEvent(QMouseEvent* e) {
  if (e->button() == Qt::LeftButton && zoom_ > 0) {
    dragging_ = true;
    dragFrom_ = e->position().toPoint();
    setCursor(Qt::ClosedHandCursor);
  }
  QWidget::mousePressEvent(e);
}

void ImageView::mouseMoveEvent(QMouseEvent* e) {
  if (dragging_) {
    pan_ += e->position().toPoint() - dragFrom_;
    dragFrom_ = e->position().toPoint();
    clampPan();
    update();
  }
}

void ImageView::mouseReleaseEvent(QMouseEvent* e) {
  dragging_ = false;
  unsetCursor();
  QWidget::mouseReleaseEvent(e);
}

void ImageView::mouseDoubleClickEvent(QMouseEvent*) { setZoom(zoom_ == 1.0 ? 0 : 1.0); }

void ImageView::keyPressEvent(QKeyEvent* e) {
  if (e->key() == Qt::Key_1)
    setZoom(zoom_ == 1.0 ? 0 : 1.0);
  else if (e->key() == Qt::Key_0)
    setZoom(0);
  else if (e->key() == Qt::Key_Plus || e->key() == Qt::Key_Equal)
    setZoom((zoom_ > 0 ? zoom_ : 1.0) * 1.25);
  else if (e->key() == Qt::Key_Minus)
    setZoom((zoom_ > 0 ? zoom_ : 1.0) * 0.8);
  else
    QWidget::keyPressEvent(e);
}

void ImageView::setPlaceholder(const QString& text) {
  placeholder_ = text;
  update();
}

void ImageView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), QColor(0x13, 0x14, 0x17));
  if (image_.isNull()) {
    p.setPen(QColor(0x6a, 0x6f, 0x78));
    p.drawText(rect(), Qt::AlignCenter, placeholder_);
    return;
  }
  const QRectF r = imageRect();
  // 1:1 and magnified views show the pixels as they are.
  const bool smooth =
      zoom_ <= 0 ? (image_.width() >= 256 || r.width() < image_.width()) : zoom_ < 1.0;
  p.setRenderHint(QPainter::SmoothPixmapTransform, smooth);
  p.drawImage(r, image_);
  if (zoom_ > 0) {
    p.setPen(QColor(0xc8, 0xcc, 0xd2));
    p.drawText(
        rect().adjusted(6, 4, -6, -4), Qt::AlignTop | Qt::AlignRight,
        zoom_ == 1.0 ? QStringLiteral("1:1") : QStringLiteral("%1%").arg(qRound(zoom_ * 100)));
  }
}

Gallery::Gallery(HistoryStore* history, QWidget* parent) : QWidget(parent), history_(history) {
  setAcceptDrops(true);  // a PNG dropped here recalls its parameters
  auto* lay = new QVBoxLayout(this);
  lay->setContentsMargins(0, 0, 0, 0);
  view_ = new ImageView(this);
  lay->addWidget(view_, 1);
  caption_ = new QLabel(this);
  caption_->setWordWrap(true);
  caption_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  lay->addWidget(caption_);
  auto* prow = new QHBoxLayout;
  progress_ = new QProgressBar(this);
  progress_->setRange(0, 1000);
  progress_->setTextVisible(false);
  progress_->setMaximumHeight(10);
  progressText_ = new QLabel(this);
  progressText_->setObjectName("hint");
  prow->addWidget(progress_, 1);
  prow->addWidget(progressText_);
  lay->addLayout(prow);
  setProgress(-1, {});

  list_ = new QListWidget(this);
  list_->setObjectName("gallery");
  list_->setViewMode(QListView::IconMode);
  list_->setFlow(QListView::LeftToRight);
  list_->setWrapping(false);
  list_->setIconSize(QSize(72, 72));
  list_->setFixedHeight(104);
  list_->setMovement(QListView::Static);
  list_->setSpacing(4);
  lay->addWidget(list_);

  auto* brow = new QHBoxLayout;
  use_ = new QPushButton(tr("Use parameters"), this);
  use_->setToolTip(tr("Load this image's prompt, size, steps, guidance and seed into the panel"));
  auto* open = new QPushButton(tr("Open PNG…"), this);
  open->setToolTip(tr("Read the parameters stored in any DiT Studio PNG"));
  save_ = new QPushButton(tr("Save as…"), this);
  remove_ = new QPushButton(tr("Remove"), this);
  auto* clear = new QPushButton(tr("Clear history"), this);
  // Two rows, so that the buttons fit a narrow gallery (1024 px wide window) unclipped.
  brow->addWidget(use_);
  brow->addWidget(open);
  brow->addWidget(save_);
  brow->addStretch(1);
  auto* brow2 = new QHBoxLayout;
  brow2->addStretch(1);
  brow2->addWidget(remove_);
  brow2->addWidget(clear);
  lay->addLayout(brow);
  lay->addLayout(brow2);

  list_->setContextMenuPolicy(Qt::CustomContextMenu);
  connect(list_, &QListWidget::customContextMenuRequested, this, [this](const QPoint& pos) {
    const QModelIndex i = list_->indexAt(pos);
    if (i.isValid()) showContextMenu(i.row(), list_->viewport()->mapToGlobal(pos));
  });
  view_->setContextMenuPolicy(Qt::CustomContextMenu);
  connect(view_, &QWidget::customContextMenuRequested, this, [this](const QPoint& pos) {
    if (!currentPath_.isEmpty() && list_->currentRow() >= 0)
      showContextMenu(list_->currentRow(), view_->mapToGlobal(pos));
  });
  connect(list_, &QListWidget::currentRowChanged, this, [this] {
    if (const HistoryEntry* e = selected()) showEntry(*e);
    const bool has = selected() != nullptr;
    use_->setEnabled(has);
    save_->setEnabled(has);
    remove_->setEnabled(has);
  });
  connect(use_, &QPushButton::clicked, this, [this] {
    if (const HistoryEntry* e = selected()) Q_EMIT useParameters(*e);
  });
  connect(open, &QPushButton::clicked, this, [this] {
    const QString f = QFileDialog::getOpenFileName(this, tr("Open a generated PNG"), QString(),
                                                   tr("PNG images (*.png)"));
    QString err;
    if (!f.isEmpty() && !openPng(f, &err)) Q_EMIT errorMessage(err);
  });
  connect(save_, &QPushButton::clicked, this, [this] {
    const HistoryEntry* e = selected();
    if (!e) return;
    const QString dest = QFileDialog::getSaveFileName(
        this, tr("Save image"), QFileInfo(e->path).fileName(), tr("PNG images (*.png)"));
    if (dest.isEmpty()) return;
    if (QFile::exists(dest)) QFile::remove(dest);
    // A byte copy keeps the parameters text chunk.
    if (!QFile::copy(e->path, dest)) Q_EMIT errorMessage(tr("cannot save %1").arg(dest));
  });
  connect(remove_, &QPushButton::clicked, this, [this] {
    const HistoryEntry* e = selected();
    if (!e) return;
    QString err;
    if (!history_->remove(e->path, &err)) Q_EMIT errorMessage(err);
    reload();
  });
  connect(clear, &QPushButton::clicked, this, [this] {
    if (QMessageBox::question(this, tr("Clear history"),
                              tr("Forget all images? The PNG files stay on disk.")) !=
        QMessageBox::Yes)
      return;
    QString err;
    if (!history_->clear(&err)) Q_EMIT errorMessage(err);
    reload();
  });
  reload();
}

void Gallery::reload() {
  list_->clear();
  for (const HistoryEntry& e : history_->entries()) {
    auto* item = new QListWidgetItem(list_);
    QImage thumb(e.path);
    item->setIcon(QPixmap::fromImage(
        thumb.isNull() ? QImage()
                       : thumb.scaled(72, 72, Qt::KeepAspectRatio, Qt::SmoothTransformation)));
    item->setText(e.hasSeed ? seedText(e.seed) : QString());
    item->setToolTip(describe(e.params, e, e.seconds) + "\n" + e.path);
    item->setData(Qt::UserRole, e.path);
  }
  if (list_->count() > 0)
    list_->setCurrentRow(0);
  else {
    view_->setImage({});
    caption_->clear();
    currentPath_.clear();
  }
  use_->setEnabled(list_->count() > 0);
  save_->setEnabled(list_->count() > 0);
  remove_->setEnabled(list_->count() > 0);
}

void Gallery::addImage(const HistoryEntry&) { reload(); }

const HistoryEntry* Gallery::selected() const {
  const int row = list_->currentRow();
  const auto& es = history_->entries();
  return row >= 0 && row < es.size() ? &es[row] : nullptr;
}

void Gallery::showEntry(const HistoryEntry& e) {
  currentPath_ = e.path;
  QImage img(e.path);
  if (img.isNull()) view_->setPlaceholder(tr("%1 is missing").arg(e.path));
  view_->setImage(img);
  caption_->setText(describe(e.params, e, e.seconds));
}

void Gallery::showPreview(const QImage& image, const QString& caption) {
  view_->setImage(image);
  caption_->setText(caption);
}

void Gallery::setProgress(int perMille, const QString& text) {
  progress_->setVisible(perMille >= 0);
  progressText_->setVisible(perMille >= 0);
  if (perMille >= 0) progress_->setValue(std::min(1000, perMille));
  progressText_->setText(text);
}

int Gallery::count() const { return list_->count(); }

const QImage& Gallery::currentImage() const { return view_->image(); }

QString Gallery::caption() const { return caption_->text(); }

bool Gallery::openPng(const QString& path, QString* error) {
  QString err;
  const QJsonObject params = readPngParameters(path, &err);
  if (params.isEmpty()) {
    if (error) *error = err;
    return false;
  }
  HistoryEntry e;
  e.path = path;
  e.params = params;
  if (const auto seed = seedFromQJson(params.value("seed"))) {
    e.seed = *seed;
    e.hasSeed = true;
  }
  view_->setImage(QImage(path));
  caption_->setText(describe(params, e, 0));
  Q_EMIT useParameters(e);
  return true;
}

QList<QAction*> Gallery::imageActions(int row) {
  const auto& es = history_->entries();
  if (row < 0 || row >= es.size()) return {};
  const HistoryEntry e = es[row];
  QList<QAction*> out;
  auto* copy = new QAction(tr("Copy image"), this);
  connect(copy, &QAction::triggered, this, [this, e] {
    const QImage img(e.path);
    if (img.isNull())
      Q_EMIT errorMessage(tr("cannot read %1").arg(e.path));
    else
      QGuiApplication::clipboard()->setImage(img);
  });
  auto* folder = new QAction(tr("Open containing folder"), this);
  connect(folder, &QAction::triggered, this, [e] {
    QDesktopServices::openUrl(QUrl::fromLocalFile(QFileInfo(e.path).absolutePath()));
  });
  auto* seed =
      new QAction(e.hasSeed ? tr("Use seed %1").arg(seedText(e.seed)) : tr("Use seed"), this);
  seed->setEnabled(e.hasSeed);
  connect(seed, &QAction::triggered, this, [this, e] {
    if (e.hasSeed) Q_EMIT useSeed(e.seed);
  });
  auto* use = new QAction(tr("Use parameters"), this);
  connect(use, &QAction::triggered, this, [this, e] { Q_EMIT useParameters(e); });
  auto* del = new QAction(tr("Delete file…"), this);
  connect(del, &QAction::triggered, this, [this, row] { deleteFile(row, true); });
  out << copy << folder << seed << use << del;
  for (QAction* a : out) a->setObjectName(a->text());
  return out;
}

void Gallery::showContextMenu(int row, const QPoint& globalPos) {
  QMenu menu(this);
  const QList<QAction*> actions = imageActions(row);
  for (QAction* a : actions) {
    if (a->text().startsWith(tr("Delete"))) menu.addSeparator();
    menu.addAction(a);
  }
  menu.exec(globalPos);
  qDeleteAll(actions);
}

bool Gallery::deleteFile(int row, bool confirm) {
  const auto& es = history_->entries();
  if (row < 0 || row >= es.size()) return false;
  const QString path = es[row].path;
  if (confirm &&
      QMessageBox::question(this, tr("Delete file"), tr("Delete %1 from the disk?").arg(path)) !=
          QMessageBox::Yes)
    return false;
  if (QFileInfo::exists(path) && !QFile::remove(path)) {
    Q_EMIT errorMessage(tr("cannot delete %1").arg(path));
    return false;
  }
  QString err;
  if (!history_->remove(path, &err)) Q_EMIT errorMessage(err);
  reload();
  return true;
}

void Gallery::dragEnterEvent(QDragEnterEvent* e) {
  for (const QUrl& u : e->mimeData()->urls()) {
    if (u.isLocalFile() && u.toLocalFile().endsWith(QStringLiteral(".png"), Qt::CaseInsensitive)) {
      e->acceptProposedAction();
      return;
    }
  }
}

void Gallery::dropEvent(QDropEvent* e) {
  for (const QUrl& u : e->mimeData()->urls()) {
    if (!u.isLocalFile()) continue;
    QString err;
    if (!openPng(u.toLocalFile(), &err)) Q_EMIT errorMessage(err);
    e->acceptProposedAction();
    return;
  }
}

}  // namespace dit::ui
