#include "ui/gallery.h"

#include <QAction>
#include <QClipboard>
#include <QComboBox>
#include <QDesktopServices>
#include <QDir>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QFontMetrics>
#include <QGuiApplication>
#include <QHBoxLayout>
#include <QJsonDocument>
#include <QKeyEvent>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QMenu>
#include <QMessageBox>
#include <QMimeData>
#include <QMouseEvent>
#include <QPainter>
#include <QProgressBar>
#include <QPushButton>
#include <QScrollBar>
#include <QSignalBlocker>
#include <QStackedWidget>
#include <QStyle>
#include <QToolButton>
#include <QUrl>
#include <QVBoxLayout>
#include <QWheelEvent>
#include <algorithm>

#include "ui/compare_view.h"
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
  // The family's knobs as set (FLUX.1's true CFG scale, Z-Image's CFG truncation, ...).
  const QJsonObject options = p.value("options").toObject();
  for (auto it = options.begin(); it != options.end(); ++it)
    parts << QStringLiteral("%1 %2").arg(it.key()).arg(it.value().toDouble());
  if (seconds > 0) parts << QStringLiteral("%1 s").arg(seconds, 0, 'f', 1);
  QString s = parts.join(QStringLiteral(" · "));
  const QString prompt = p.value("prompt").toString();
  if (!prompt.isEmpty()) s += "\n" + prompt;
  return s;
}

}  // namespace

QString shortLabel(const HistoryEntry& e) {
  QStringList parts;
  parts << (e.hasSeed ? QStringLiteral("seed %1").arg(seedText(e.seed))
                      : QFileInfo(e.path).fileName());
  const QJsonObject& p = e.params;
  if (p.contains("width"))
    parts << QStringLiteral("%1×%2").arg(p.value("width").toInt()).arg(p.value("height").toInt());
  if (e.created.isValid()) parts << e.created.toString(QStringLiteral("HH:mm:ss"));
  return parts.join(QStringLiteral(" · "));
}

QString thumbnailLabel(const HistoryEntry& e, const QFontMetrics& fm, int width) {
  const QJsonObject& p = e.params;
  QString prompt = p.value("prompt").toString().simplified();
  if (prompt.isEmpty())
    prompt = e.hasSeed ? QStringLiteral("seed %1").arg(seedText(e.seed))
                       : QFileInfo(e.path).completeBaseName();
  QStringList sizeTime;
  if (p.contains("width"))
    sizeTime
        << QStringLiteral("%1×%2").arg(p.value("width").toInt()).arg(p.value("height").toInt());
  if (e.created.isValid()) sizeTime << e.created.toString(QStringLiteral("HH:mm:ss"));
  const QString model = p.value("model").toString();
  const QStringList lines{
      prompt, sizeTime.join(QStringLiteral(" · ")),
      model.isEmpty() ? QString() : QFileInfo(QDir::cleanPath(model)).completeBaseName()};
  if (width <= 0) return lines.join('\n');
  return fm.elidedText(lines[0], Qt::ElideRight, width) + '\n' +
         fm.elidedText(lines[1], Qt::ElideRight, width) + '\n' +
         fm.elidedText(lines[2], Qt::ElideMiddle, width);
}

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
  stack_ = new QStackedWidget(this);
  view_ = new ImageView(stack_);
  stack_->addWidget(view_);
  // The compare page: mode, title and Close over the compare view.
  auto* cmpPage = new QWidget(stack_);
  auto* cl = new QVBoxLayout(cmpPage);
  cl->setContentsMargins(0, 0, 0, 0);
  cl->setSpacing(2);
  auto* cbar = new QHBoxLayout;
  compareMode_ = new QComboBox(cmpPage);
  compareMode_->setObjectName("compareMode");
  compareMode_->addItem(tr("Swipe"), int(CompareView::Mode::Swipe));
  compareMode_->addItem(tr("Blink"), int(CompareView::Mode::Blink));
  compareMode_->addItem(tr("Side by side"), int(CompareView::Mode::SideBySide));
  compareMode_->addItem(tr("Grid"), int(CompareView::Mode::Grid));
  compareMode_->setToolTip(
      tr("Swipe: drag the divider (or Left / Right); Blink: the two "
         "alternate (click or Space); Grid: every image"));
  compareTitle_ = new QLabel(cmpPage);
  compareTitle_->setObjectName("hint");
  compareTitle_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  auto* closeCmp = new QToolButton(cmpPage);
  closeCmp->setText(tr("Close"));
  closeCmp->setObjectName("closeCompare");
  closeCmp->setToolTip(tr("Back to the single image (Esc)"));
  cbar->addWidget(compareMode_);
  cbar->addWidget(compareTitle_, 1);
  cbar->addWidget(closeCmp);
  cl->addLayout(cbar);
  compareView_ = new CompareView(cmpPage);
  cl->addWidget(compareView_, 1);
  stack_->addWidget(cmpPage);
  lay->addWidget(stack_, 1);
  caption_ = new QLabel(this);
  caption_->setWordWrap(true);
  caption_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  caption_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  caption_->setMaximumHeight(caption_->fontMetrics().lineSpacing() * 3 + 4);
  lay->addWidget(caption_);
  auto* prow = new QHBoxLayout;
  progress_ = new QProgressBar(this);
  progress_->setRange(0, 1000);
  progress_->setTextVisible(false);
  progress_->setMaximumHeight(10);
  progressText_ = new QLabel(this);
  progressText_->setObjectName("hint");
  progressText_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  prow->addWidget(progress_, 1);
  prow->addWidget(progressText_, 2);
  lay->addLayout(prow);
  setProgress(-1, {});

  // Search, compare and grid above the thumbnails.
  auto* frow = new QHBoxLayout;
  filter_ = new QLineEdit(this);
  filter_->setObjectName("galleryFilter");
  filter_->setClearButtonEnabled(true);
  filter_->setPlaceholderText(tr("Search: prompt, model, strategy, seed, date"));
  filter_->setToolTip(
      tr("Words that must all match (prompt, model, strategy, seed, date, id); field:value looks "
         "in one field, e.g. seed:42 date:2025-01 strategy:ring \"red fox\""));
  compareBtn_ = new QPushButton(tr("Compare"), this);
  compareBtn_->setToolTip(tr("Compare the two selected images (Ctrl+click selects a second)"));
  gridBtn_ = new QPushButton(tr("Grid"), this);
  gridBtn_->setToolTip(tr("The selected images, or the batch of the current one, as a grid"));
  frow->addWidget(filter_, 1);
  frow->addWidget(compareBtn_);
  frow->addWidget(gridBtn_);
  lay->addLayout(frow);

  list_ = new QListWidget(this);
  list_->setObjectName("gallery");
  list_->setViewMode(QListView::IconMode);
  list_->setFlow(QListView::LeftToRight);
  list_->setWrapping(false);
  list_->setIconSize(QSize(72, 72));
  list_->setMovement(QListView::Static);
  list_->setSpacing(4);
  list_->setSelectionMode(QAbstractItemView::ExtendedSelection);
  list_->setTextElideMode(Qt::ElideMiddle);
  list_->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOn);
  // Room for the icon, its three-line label (thumbnailLabel: the prompt's start; size and time;
  // the model) and the scroll bar: no label is cut off at the bottom.
  const int textH = list_->fontMetrics().height();
  list_->setGridSize(QSize(132, 72 + 3 * textH + 8));
  const int scroll = list_->style()->pixelMetric(QStyle::PM_ScrollBarExtent, nullptr, list_);
  list_->setFixedHeight(list_->gridSize().height() + 4 * list_->spacing() +
                        2 * list_->frameWidth() + scroll + 6);
  lay->addWidget(list_);

  auto* brow = new QHBoxLayout;
  use_ = new QPushButton(tr("Use parameters"), this);
  use_->setToolTip(
      tr("Load the shown image's prompt, size, steps, guidance, seed and strategy into the panel"));
  auto* open = new QPushButton(tr("Open PNG…"), this);
  open->setObjectName("openPng");
  open->setToolTip(tr("Read the parameters stored in any DiT Studio PNG (Ctrl+O)"));
  save_ = new QPushButton(tr("Save as…"), this);
  save_->setToolTip(tr("Save a copy of the shown image (its parameters included)"));
  remove_ = new QPushButton(tr("Remove"), this);
  remove_->setToolTip(tr("Forget the selected thumbnail (the PNG stays on disk)"));
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
    if (i.isValid()) showMenu(imageActions(i.row()), list_->viewport()->mapToGlobal(pos));
  });
  view_->setContextMenuPolicy(Qt::CustomContextMenu);
  connect(view_, &QWidget::customContextMenuRequested, this,
          [this](const QPoint& pos) { showMenu(viewActions(), view_->mapToGlobal(pos)); });
  connect(list_, &QListWidget::currentRowChanged, this, [this] {
    if (const HistoryEntry* e = selected()) showEntry(*e);
    updateButtons();
  });
  connect(list_, &QListWidget::itemSelectionChanged, this, &Gallery::updateButtons);
  connect(filter_, &QLineEdit::textChanged, this, &Gallery::setFilter);
  connect(compareBtn_, &QPushButton::clicked, this, [this] {
    const QList<int> rows = selectedRows();
    if (rows.size() >= 2) compare(rows[0], rows[1]);
  });
  connect(gridBtn_, &QPushButton::clicked, this, [this] {
    const QList<int> rows = selectedRows();
    if (rows.size() >= 2)
      showGrid(rows);
    else if (const HistoryEntry* e = selected())
      showBatch(e->requestId);
  });
  connect(closeCmp, &QToolButton::clicked, this, &Gallery::closeCompare);
  connect(compareMode_, &QComboBox::currentIndexChanged, this, [this] {
    compareView_->setMode(static_cast<CompareView::Mode>(compareMode_->currentData().toInt()));
  });
  connect(compareView_, &CompareView::imageActivated, this, [this](int i) {
    // A grid cell double-clicked: that image, large.
    const QStringList paths = compareView_->property("paths").toStringList();
    closeCompare();
    if (i < 0 || i >= paths.size()) return;
    const auto& es = history_->entries();
    for (int r = 0; r < es.size(); ++r)
      if (es[r].path == paths[i]) list_->setCurrentRow(r);
  });
  connect(use_, &QPushButton::clicked, this, [this] {
    if (const HistoryEntry* e = target()) Q_EMIT useParameters(*e);
  });
  connect(open, &QPushButton::clicked, this, [this] {
    const QString f = QFileDialog::getOpenFileName(this, tr("Open a generated PNG"), QString(),
                                                   tr("PNG images (*.png)"));
    QString err;
    if (!f.isEmpty() && !openPng(f, &err)) Q_EMIT errorMessage(err);
  });
  connect(save_, &QPushButton::clicked, this, [this] {
    const HistoryEntry* e = target();
    if (!e) return;
    const QString src = e->path;
    const QString dest = QFileDialog::getSaveFileName(
        this, tr("Save image"), QFileInfo(src).fileName(), tr("PNG images (*.png)"));
    if (!dest.isEmpty()) saveImageAs(src, dest);
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
  const QSignalBlocker block(list_);
  list_->clear();
  for (const HistoryEntry& e : history_->entries()) {
    auto* item = new QListWidgetItem(list_);
    QImage thumb(e.path);
    item->setIcon(QPixmap::fromImage(
        thumb.isNull() ? QImage()
                       : thumb.scaled(72, 72, Qt::KeepAspectRatio, Qt::SmoothTransformation)));
    item->setText(thumbnailLabel(e, list_->fontMetrics(), list_->gridSize().width() - 8));
    item->setToolTip(describe(e.params, e, e.seconds) + "\n" + e.path);
    item->setData(Qt::UserRole, e.path);
  }
  setFilter(filter_->text());
  if (list_->count() > 0) {
    list_->setCurrentRow(0);
    if (const HistoryEntry* e = selected()) showEntry(*e);
  } else {
    view_->setImage({});
    caption_->clear();
    currentPath_.clear();
    shown_ = HistoryEntry{};
    preview_ = false;
  }
  updateButtons();
}

void Gallery::updateButtons() {
  const bool has = target() != nullptr;
  use_->setEnabled(has);
  save_->setEnabled(has);
  remove_->setEnabled(selected() != nullptr);
  const QList<int> rows = selectedRows();
  compareBtn_->setEnabled(rows.size() >= 2);
  int batch = 0;
  if (const HistoryEntry* e = selected(); e && !e->requestId.isEmpty())
    for (const HistoryEntry& o : history_->entries()) batch += o.requestId == e->requestId;
  gridBtn_->setEnabled(rows.size() >= 2 || batch >= 2);
}

void Gallery::addImage(const HistoryEntry&) { reload(); }

const HistoryEntry* Gallery::selected() const {
  const int row = list_->currentRow();
  const auto& es = history_->entries();
  return row >= 0 && row < es.size() ? &es[row] : nullptr;
}

const HistoryEntry* Gallery::target() const {
  if (!shown_.path.isEmpty()) return &shown_;
  return selected();
}

QList<int> Gallery::selectedRows() const {
  QList<int> rows;
  for (const QModelIndex& i : list_->selectionModel()->selectedIndexes())
    if (!list_->isRowHidden(i.row())) rows << i.row();
  std::sort(rows.begin(), rows.end());
  return rows;
}

void Gallery::showEntry(const HistoryEntry& e) {
  closeCompare();
  currentPath_ = e.path;
  shown_ = e;
  preview_ = false;
  QImage img(e.path);
  if (img.isNull()) view_->setPlaceholder(tr("%1 is missing").arg(e.path));
  view_->setImage(img);
  caption_->setText(describe(e.params, e, e.seconds));
  updateButtons();
}

void Gallery::showPreview(const QImage& image, const QString& caption) {
  closeCompare();
  preview_ = true;
  shown_ = HistoryEntry{};
  currentPath_.clear();
  view_->setImage(image);
  caption_->setText(caption);
  updateButtons();
}

void Gallery::clearPreview() {
  if (!preview_) return;
  preview_ = false;
  if (const HistoryEntry* e = selected()) {
    showEntry(*e);
  } else {
    view_->setImage({});
    caption_->clear();
    updateButtons();
  }
}

void Gallery::setProgress(int perMille, const QString& text) {
  progress_->setVisible(perMille >= 0);
  progressText_->setVisible(perMille >= 0);
  if (perMille >= 0) progress_->setValue(std::min(1000, perMille));
  progressText_->setText(text);
  progressText_->setToolTip(text);
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
  closeCompare();
  // The viewer now shows this file: its menu and the buttons act on it.
  shown_ = e;
  preview_ = false;
  currentPath_ = path;
  view_->setImage(QImage(path));
  caption_->setText(describe(params, e, 0));
  updateButtons();
  Q_EMIT useParameters(e);
  return true;
}

QList<QAction*> Gallery::imageActions(int row) {
  const auto& es = history_->entries();
  if (row < 0 || row >= es.size()) return {};
  return entryActions(es[row]);
}

QList<QAction*> Gallery::viewActions() {
  if (preview_ || shown_.path.isEmpty()) return {};
  return entryActions(shown_);
}

QList<QAction*> Gallery::entryActions(const HistoryEntry& e) {
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
  auto* save = new QAction(tr("Save as…"), this);
  connect(save, &QAction::triggered, this, [this, path = e.path] {
    const QString dest = QFileDialog::getSaveFileName(
        this, tr("Save image"), QFileInfo(path).fileName(), tr("PNG images (*.png)"));
    if (!dest.isEmpty()) saveImageAs(path, dest);
  });
  auto* del = new QAction(tr("Delete file…"), this);
  connect(del, &QAction::triggered, this, [this, path = e.path] { deletePath(path, true); });
  out << copy << folder << seed << use << save << del;
  for (QAction* a : out) a->setObjectName(a->text());
  return out;
}

void Gallery::showMenu(const QList<QAction*>& actions, const QPoint& globalPos) {
  if (actions.isEmpty()) return;
  QMenu menu(this);
  for (QAction* a : actions) {
    if (a->text().startsWith(tr("Delete"))) menu.addSeparator();
    menu.addAction(a);
  }
  menu.exec(globalPos);
  qDeleteAll(actions);
}

bool Gallery::saveImageAs(const QString& source, const QString& dest) {
  if (QFileInfo(source).absoluteFilePath() == QFileInfo(dest).absoluteFilePath()) return true;
  if (QFile::exists(dest)) QFile::remove(dest);
  // A byte copy keeps the parameters text chunk.
  if (!QFile::copy(source, dest)) {
    Q_EMIT errorMessage(tr("cannot save %1 as %2").arg(source, dest));
    return false;
  }
  return true;
}

bool Gallery::deleteFile(int row, bool confirm) {
  const auto& es = history_->entries();
  if (row < 0 || row >= es.size()) return false;
  return deletePath(es[row].path, confirm);
}

bool Gallery::deletePath(const QString& path, bool confirm) {
  if (path.isEmpty()) return false;
  if (confirm &&
      QMessageBox::question(this, tr("Delete file"), tr("Delete %1 from the disk?").arg(path)) !=
          QMessageBox::Yes)
    return false;
  if (QFileInfo::exists(path) && !QFile::remove(path)) {
    Q_EMIT errorMessage(tr("cannot delete %1").arg(path));
    return false;
  }
  bool inHistory = false;
  for (const HistoryEntry& e : history_->entries()) inHistory |= e.path == path;
  if (inHistory) {
    QString err;
    if (!history_->remove(path, &err)) Q_EMIT errorMessage(err);
  }
  if (shown_.path == path) shown_ = HistoryEntry{};
  reload();
  return true;
}

void Gallery::setFilter(const QString& query) {
  if (filter_->text() != query) {
    filter_->setText(query);  // textChanged comes back here
    return;
  }
  const auto& es = history_->entries();
  for (int i = 0; i < list_->count() && i < es.size(); ++i)
    list_->setRowHidden(i, !historyMatches(es[i], query));
  updateButtons();
}

int Gallery::visibleCount() const {
  int n = 0;
  for (int i = 0; i < list_->count(); ++i) n += !list_->isRowHidden(i);
  return n;
}

bool Gallery::compare(int a, int b) {
  const auto& es = history_->entries();
  if (a < 0 || b < 0 || a >= es.size() || b >= es.size() || a == b) return false;
  const HistoryEntry ea = es[a], eb = es[b];
  auto label = [](const HistoryEntry& e) { return shortLabel(e); };
  compareView_->setImages({QImage(ea.path), QImage(eb.path)}, {label(ea), label(eb)});
  compareView_->setProperty("paths", QStringList{ea.path, eb.path});
  if (compareMode_->currentData().toInt() == int(CompareView::Mode::Grid))
    compareMode_->setCurrentIndex(0);
  compareView_->setMode(static_cast<CompareView::Mode>(compareMode_->currentData().toInt()));
  compareTitle_->setText(tr("%1  |  %2").arg(label(ea), label(eb)));
  stack_->setCurrentIndex(1);
  return true;
}

bool Gallery::showGrid(const QList<int>& rows) {
  const auto& es = history_->entries();
  QList<QImage> images;
  QStringList captions, paths;
  for (int r : rows) {
    if (r < 0 || r >= es.size()) continue;
    images << QImage(es[r].path);
    captions << shortLabel(es[r]);
    paths << es[r].path;
  }
  if (images.size() < 2) return false;
  compareView_->setImages(images, captions);
  compareView_->setProperty("paths", paths);
  compareMode_->setCurrentIndex(compareMode_->findData(int(CompareView::Mode::Grid)));
  compareView_->setMode(CompareView::Mode::Grid);
  compareTitle_->setText(tr("%n image(s)", nullptr, static_cast<int>(images.size())));
  stack_->setCurrentIndex(1);
  return true;
}

bool Gallery::showBatch(const QString& requestId) {
  if (requestId.isEmpty()) return false;
  QList<int> rows;
  const auto& es = history_->entries();
  // The batch in image order (the history is newest first).
  for (int r = static_cast<int>(es.size()) - 1; r >= 0; --r)
    if (es[r].requestId == requestId) rows << r;
  if (!showGrid(rows)) return false;
  compareTitle_->setText(
      tr("batch %1: %n image(s)", nullptr, static_cast<int>(rows.size())).arg(requestId));
  return true;
}

void Gallery::closeCompare() { stack_->setCurrentIndex(0); }

bool Gallery::comparing() const { return stack_->currentIndex() == 1; }

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
