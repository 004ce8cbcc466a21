#include "ui/lora_browser.h"

#include <QDir>
#include <QDirIterator>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QJsonDocument>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QPushButton>
#include <QSplitter>
#include <QTableWidget>
#include <QVBoxLayout>
#include <algorithm>

#include "ui/lora_list.h"
#include "ui/model_info.h"

namespace dit::ui {

namespace {
constexpr int kMaxFiles = 2000;

// A metadata value as shown: JSON (lora_adapter_metadata, ss_tag_frequency, ...) compacted.
QString shownValue(const std::string& v) {
  const QString s = QString::fromStdString(v);
  const QJsonDocument d = QJsonDocument::fromJson(s.toUtf8());
  if (!d.isNull()) return QString::fromUtf8(d.toJson(QJsonDocument::Compact));
  return s;
}
}  // namespace

LoraBrowser::LoraBrowser(LoraList* list, QWidget* parent) : QDialog(parent), loras_(list) {
  setWindowTitle(tr("LoRA browser"));
  resize(760, 460);
  auto* outer = new QVBoxLayout(this);
  auto* top = new QHBoxLayout;
  folderEdit_ = new QLineEdit(this);
  folderEdit_->setPlaceholderText(tr("A folder of LoRA .safetensors files"));
  choose_ = new QPushButton(tr("Choose folder..."), this);
  top->addWidget(new QLabel(tr("Folder"), this));
  top->addWidget(folderEdit_, 1);
  top->addWidget(choose_);
  outer->addLayout(top);
  filter_ = new QLineEdit(this);
  filter_->setPlaceholderText(tr("Filter: file name, format or metadata (e.g. watercolor)"));
  filter_->setClearButtonEnabled(true);
  outer->addWidget(filter_);

  auto* split = new QSplitter(Qt::Horizontal, this);
  list_ = new QListWidget(split);
  list_->setUniformItemSizes(true);
  auto* right = new QWidget(split);
  auto* rl = new QVBoxLayout(right);
  rl->setContentsMargins(0, 0, 0, 0);
  summary_ = new QLabel(right);
  summary_->setWordWrap(true);
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  summary_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  rl->addWidget(summary_);
  meta_ = new QTableWidget(0, 2, right);
  meta_->setHorizontalHeaderLabels({tr("Metadata key"), tr("Value")});
  meta_->verticalHeader()->hide();
  meta_->horizontalHeader()->setSectionResizeMode(0, QHeaderView::ResizeToContents);
  meta_->horizontalHeader()->setStretchLastSection(true);
  meta_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  meta_->setWordWrap(false);
  rl->addWidget(meta_, 1);
  split->addWidget(list_);
  split->addWidget(right);
  split->setStretchFactor(0, 2);
  split->setStretchFactor(1, 3);
  outer->addWidget(split, 1);

  auto* bottom = new QHBoxLayout;
  add_ = new QPushButton(tr("Add to the LoRA list"), this);
  add_->setEnabled(false);
  auto* close = new QPushButton(tr("Close"), this);
  bottom->addStretch(1);
  bottom->addWidget(add_);
  bottom->addWidget(close);
  outer->addLayout(bottom);

  connect(choose_, &QPushButton::clicked, this, [this] {
    const QString d =
        QFileDialog::getExistingDirectory(this, tr("Choose a folder of LoRA files"), folder_);
    if (!d.isEmpty()) setFolder(d);
  });
  connect(folderEdit_, &QLineEdit::editingFinished, this, [this] {
    if (folderEdit_->text() != folder_) setFolder(folderEdit_->text());
  });
  connect(filter_, &QLineEdit::textChanged, this, [this] { applyFilter(); });
  connect(list_, &QListWidget::currentRowChanged, this, [this](int row) { select(row); });
  connect(list_, &QListWidget::itemDoubleClicked, this, [this] { addSelected(); });
  connect(add_, &QPushButton::clicked, this, [this] { addSelected(); });
  connect(close, &QPushButton::clicked, this, &QDialog::close);
}

int LoraBrowser::setFolder(const QString& dir) {
  folder_ = dir.isEmpty() ? QString() : QDir(dir).absolutePath();
  folderEdit_->setText(folder_);
  entries_.clear();
  QStringList paths;
  if (!folder_.isEmpty()) {
    QDirIterator it(folder_, {QStringLiteral("*.safetensors")}, QDir::Files | QDir::Readable,
                    QDirIterator::Subdirectories);
    while (it.hasNext() && paths.size() < kMaxFiles) paths << it.next();
  }
  std::sort(paths.begin(), paths.end());
  for (const QString& p : paths) {
    Entry e;
    e.path = p;
    e.size = QFileInfo(p).size();
    try {
      e.info = dit::inspectLoraFile(p.toStdString());
      e.ok = true;
    } catch (const std::exception& ex) {
      e.error = QString::fromUtf8(ex.what());
    }
    entries_.push_back(std::move(e));
  }
  {
    const QSignalBlocker block(list_);
    list_->clear();
    for (const Entry& e : entries_) {
      auto* item = new QListWidgetItem(QDir(folder_).relativeFilePath(e.path), list_);
      item->setToolTip(e.path);
      if (!e.ok) item->setForeground(QColor(0xff, 0x8a, 0x80));
    }
  }
  applyFilter();
  shown_ = -1;
  select(list_->count() > 0 ? 0 : -1);
  Q_EMIT folderChanged(folder_);
  return static_cast<int>(entries_.size());
}

QStringList LoraBrowser::files() const {
  QStringList out;
  for (const Entry& e : entries_) out << e.path;
  return out;
}

void LoraBrowser::applyFilter() {
  const QStringList words = filter_->text().split(QLatin1Char(' '), Qt::SkipEmptyParts);
  for (int i = 0; i < static_cast<int>(entries_.size()); ++i) {
    const Entry& e = entries_[static_cast<size_t>(i)];
    QString hay = e.path;
    if (e.ok) {
      hay += QLatin1Char(' ') + QString::fromStdString(e.info.summary());
      for (const auto& [k, v] : e.info.metadata)
        hay += QLatin1Char(' ') + QString::fromStdString(k) + QLatin1Char(' ') +
               QString::fromStdString(v);
    }
    bool match = true;
    for (const QString& w : words) match = match && hay.contains(w, Qt::CaseInsensitive);
    list_->item(i)->setHidden(!match);
  }
}

void LoraBrowser::select(int row) {
  if (row >= 0 && row < list_->count() && list_->currentRow() != row) {
    list_->setCurrentRow(row);  // comes back here through currentRowChanged
    return;
  }
  showEntry(row);
}

void LoraBrowser::showEntry(int index) {
  shown_ = index >= 0 && index < static_cast<int>(entries_.size()) ? index : -1;
  meta_->setRowCount(0);
  add_->setEnabled(shown_ >= 0);
  if (shown_ < 0) {
    summary_->setText(entries_.empty() && !folder_.isEmpty()
                          ? tr("No .safetensors files under %1").arg(folder_)
                          : QString());
    return;
  }
  const Entry& e = entries_[static_cast<size_t>(shown_)];
  QStringList lines;
  lines << QStringLiteral("<b>%1</b>").arg(QFileInfo(e.path).fileName().toHtmlEscaped());
  if (!e.ok) {
    lines << tr("not usable: %1").arg(e.error.toHtmlEscaped());
  } else {
    lines << tr("%1 · %2 on disk · LoRA tensors %3")
                 .arg(QString::fromStdString(e.info.summary()).toHtmlEscaped(), formatBytes(e.size),
                      formatBytes(static_cast<qint64>(e.info.bytes)));
    const QString refusal = loras_ ? loras_->refusal(e.path, e.info) : QString();
    lines << (refusal.isEmpty() ? tr("the loaded model takes it")
                                : QStringLiteral("<span style=\"color:#ff8a80\">%1</span>")
                                      .arg(refusal.toHtmlEscaped()));
  }
  summary_->setText(lines.join(QStringLiteral("<br>")));
  summary_->setToolTip(e.path);
  if (!e.ok) return;
  meta_->setRowCount(static_cast<int>(e.info.metadata.size()));
  int r = 0;
  for (const auto& [k, v] : e.info.metadata) {
    auto* key = new QTableWidgetItem(QString::fromStdString(k));
    auto* val = new QTableWidgetItem(shownValue(v));
    val->setToolTip(QString::fromStdString(v).left(4000));
    meta_->setItem(r, 0, key);
    meta_->setItem(r, 1, val);
    ++r;
  }
}

QString LoraBrowser::selectedFile() const {
  return shown_ >= 0 ? entries_[static_cast<size_t>(shown_)].path : QString();
}

bool LoraBrowser::addSelected() {
  if (shown_ < 0 || !loras_) return false;
  return loras_->addLora(entries_[static_cast<size_t>(shown_)].path, 1.0);
}

}  // namespace dit::ui
