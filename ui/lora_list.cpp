#include "ui/lora_list.h"

#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QLabel>
#include <QPushButton>
#include <QSlider>
#include <QVBoxLayout>
#include <algorithm>
#include <cmath>

#include "backend/io/lora_file.h"

namespace dit::ui {

namespace {
constexpr int kSliderScale = 100;  // slider units per 1.0 of strength
constexpr double kSliderMax = 2.0;
}  // namespace

LoraList::LoraList(QWidget* parent) : QWidget(parent) {
  auto* outer = new QVBoxLayout(this);
  outer->setContentsMargins(0, 0, 0, 0);
  rowsLayout_ = new QVBoxLayout;
  outer->addLayout(rowsLayout_);
  add_ = new QPushButton(tr("Add LoRA..."), this);
  add_->setToolTip(tr("A LoRA .safetensors file (diffusers/PEFT or kohya) for the transformer"));
  outer->addWidget(add_, 0, Qt::AlignLeft);
  warning_ = new QLabel(this);
  warning_->setWordWrap(true);
  warning_->setStyleSheet(QStringLiteral("color: #c0392b"));
  warning_->hide();
  outer->addWidget(warning_);
  connect(add_, &QPushButton::clicked, this, [this] {
    const QStringList files = QFileDialog::getOpenFileNames(this, tr("Add LoRA files"), QString(),
                                                            tr("LoRA (*.safetensors)"));
    for (const QString& f : files) addLora(f);
  });
}

bool LoraList::addLora(const QString& file, double strength) {
  Row r;
  r.file = file;
  r.box = new QWidget(this);
  auto* h = new QHBoxLayout(r.box);
  h->setContentsMargins(0, 0, 0, 0);
  auto* name = new QLabel(QFileInfo(file).fileName(), r.box);
  name->setToolTip(file);
  r.slider = new QSlider(Qt::Horizontal, r.box);
  r.slider->setRange(static_cast<int>(-kSliderMax * kSliderScale),
                     static_cast<int>(kSliderMax * kSliderScale));
  r.slider->setSingleStep(5);
  r.slider->setPageStep(25);
  r.slider->setToolTip(tr("Strength (scaling = strength x alpha / rank)"));
  r.value = new QLabel(r.box);
  r.value->setMinimumWidth(40);
  r.info = new QLabel(r.box);
  r.remove = new QPushButton(tr("Remove"), r.box);
  h->addWidget(name, 1);
  h->addWidget(r.slider, 1);
  h->addWidget(r.value);
  h->addWidget(r.info, 1);
  h->addWidget(r.remove);
  try {
    if (!QFileInfo::exists(file)) throw std::runtime_error("");
    const LoraFileInfo info = inspectLoraFile(file.toStdString());
    r.info->setText(QString::fromStdString(info.summary()));
    r.info->setToolTip(QString::fromStdString(info.summary()));
  } catch (const std::exception& e) {
    r.problem = QFileInfo::exists(file)
                    ? tr("LoRA file unusable: %1").arg(QString::fromUtf8(e.what()))
                    : tr("LoRA file not found: %1").arg(file);
    r.info->setText(QFileInfo::exists(file) ? tr("unreadable") : tr("missing"));
    r.info->setToolTip(r.problem);
    r.info->setStyleSheet(QStringLiteral("color: #c0392b"));
  }
  const double s = std::clamp(strength, -kSliderMax, kSliderMax);
  r.slider->setValue(static_cast<int>(std::lround(s * kSliderScale)));
  r.value->setText(QString::number(s, 'f', 2));
  QSlider* slider = r.slider;
  QLabel* value = r.value;
  connect(slider, &QSlider::valueChanged, this, [this, value](int v) {
    value->setText(QString::number(static_cast<double>(v) / kSliderScale, 'f', 2));
    if (!loading_) Q_EMIT changed();
  });
  QWidget* box = r.box;
  connect(r.remove, &QPushButton::clicked, this, [this, box] {
    for (size_t i = 0; i < rows_.size(); ++i)
      if (rows_[i].box == box) {
        removeLora(static_cast<int>(i));
        return;
      }
  });
  rowsLayout_->addWidget(r.box);
  const bool ok = r.problem.isEmpty();
  rows_.push_back(std::move(r));
  updateWarning();
  if (!loading_) Q_EMIT changed();
  return ok;
}

void LoraList::removeLora(int row) {
  if (row < 0 || row >= count()) return;
  rows_[row].box->deleteLater();
  rowsLayout_->removeWidget(rows_[row].box);
  rows_.erase(rows_.begin() + row);
  updateWarning();
  if (!loading_) Q_EMIT changed();
}

void LoraList::clear() {
  const bool was = loading_;
  loading_ = true;
  while (count() > 0) removeLora(count() - 1);
  loading_ = was;
}

std::vector<dit::protocol::LoraRequest> LoraList::loras() const {
  std::vector<dit::protocol::LoraRequest> out;
  for (const auto& r : rows_) {
    dit::protocol::LoraRequest l;
    l.file = r.file.toStdString();
    l.strength = static_cast<double>(r.slider->value()) / kSliderScale;
    l.sha256 = r.sha256.toStdString();
    out.push_back(std::move(l));
  }
  return out;
}

void LoraList::setLoras(const std::vector<dit::protocol::LoraRequest>& loras) {
  loading_ = true;
  clear();
  for (const auto& l : loras) {
    addLora(QString::fromStdString(l.file), l.strength);
    rows_.back().sha256 = QString::fromStdString(l.sha256);
  }
  loading_ = false;
  updateWarning();
  Q_EMIT changed();
}

QStringList LoraList::problems() const {
  QStringList p;
  for (const auto& r : rows_)
    if (!r.problem.isEmpty()) p << r.problem;
  return p;
}

void LoraList::updateWarning() {
  const QStringList p = problems();
  warning_->setText(p.join(QLatin1Char('\n')));
  warning_->setVisible(!p.isEmpty());
}

}  // namespace dit::ui
