#include "ui/lora_list.h"

#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QLabel>
#include <QPushButton>
#include <QSignalBlocker>
#include <QSlider>
#include <QVBoxLayout>
#include <algorithm>
#include <cmath>

#include "parallel/tensor_parallel/sharding_plan.h"
#include "ui/elided_label.h"
#include "ui/lora_browser.h"

namespace dit::ui {

namespace {
constexpr int kSliderScale = 100;  // slider units per 1.0 of strength
constexpr double kSliderMax = 2.0;

// parallel/tensor_parallel/layers.cpp's shapeStr, for the worker's own sentence.
std::string shapeText(std::initializer_list<int64_t> s) {
  std::string o = "[";
  bool first = true;
  for (int64_t v : s) {
    o += (first ? "" : ", ") + std::to_string(v);
    first = false;
  }
  return o + "]";
}
}  // namespace

LoraList::LoraList(QWidget* parent) : QWidget(parent) {
  auto* outer = new QVBoxLayout(this);
  outer->setContentsMargins(0, 0, 0, 0);
  rowsLayout_ = new QVBoxLayout;
  outer->addLayout(rowsLayout_);
  add_ = new QPushButton(tr("Add LoRA..."), this);
  add_->setToolTip(tr("A LoRA .safetensors file (diffusers/PEFT or kohya) for the transformer"));
  browse_ = new QPushButton(tr("Browse folder..."), this);
  browse_->setToolTip(
      tr("The LoRA files of a folder, each with its own metadata and whether this model takes "
         "it"));
  auto* buttons = new QHBoxLayout;
  buttons->addWidget(add_);
  buttons->addWidget(browse_);
  buttons->addStretch(1);
  outer->addLayout(buttons);
  warning_ = new QLabel(this);
  warning_->setWordWrap(true);
  warning_->setStyleSheet(QStringLiteral("color: #c0392b"));
  // A long path in a refusal must wrap, not widen the panel.
  warning_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  warning_->hide();
  outer->addWidget(warning_);
  connect(browse_, &QPushButton::clicked, this, [this] {
    if (browseFolder_.isEmpty()) {
      const QString d =
          QFileDialog::getExistingDirectory(this, tr("Choose a folder of LoRA files"));
      if (d.isEmpty()) return;
      browseFolder_ = d;
      Q_EMIT browseFolderChanged(d);
    }
    openBrowser();
  });
  connect(add_, &QPushButton::clicked, this, [this] {
    const QStringList files = QFileDialog::getOpenFileNames(this, tr("Add LoRA files"), QString(),
                                                            tr("LoRA (*.safetensors)"));
    for (const QString& f : files) addLora(f);
  });
}

LoraBrowser* LoraList::openBrowser() {
  if (!browser_) {
    browser_ = new LoraBrowser(this, window());
    browser_->setWindowFlag(Qt::Window);
    connect(browser_, &LoraBrowser::folderChanged, this, [this](const QString& dir) {
      browseFolder_ = dir;
      Q_EMIT browseFolderChanged(dir);
    });
  }
  if (browser_->folder() != browseFolder_ || browser_->files().isEmpty())
    browser_->setFolder(browseFolder_);
  browser_->show();
  browser_->raise();
  return browser_;
}

QLabel* LoraList::infoLabel(int row) const { return rows_.at(row).info_label; }
QLabel* LoraList::nameLabel(int row) const { return rows_.at(row).name; }

bool LoraList::addLora(const QString& file, double strength) {
  Row r;
  r.file = file;
  r.box = new QWidget(this);
  // Two lines: name and Remove; the strength slider and its spin box with the file's summary.
  // Every text is elided (whole in the tooltip) so a long name never widens the panel.
  auto* v = new QVBoxLayout(r.box);
  v->setContentsMargins(0, 0, 0, 4);
  v->setSpacing(2);
  auto* top = new QHBoxLayout;
  r.name = new ElidedLabel(QFileInfo(file).fileName(), r.box);
  r.name->setBaseToolTip(file);
  r.remove = new QPushButton(tr("Remove"), r.box);
  top->addWidget(r.name, 1);
  top->addWidget(r.remove);
  v->addLayout(top);
  auto* mid = new QHBoxLayout;
  r.slider = new QSlider(Qt::Horizontal, r.box);
  r.slider->setRange(static_cast<int>(-kSliderMax * kSliderScale),
                     static_cast<int>(kSliderMax * kSliderScale));
  r.slider->setSingleStep(5);
  r.slider->setPageStep(25);
  r.slider->setMinimumWidth(120);  // never a 12 px handle where a small drag jumps to -2
  r.slider->setToolTip(
      tr("Strength -2 .. 2 (the box beside it takes -10 .. 10; scaling = "
         "strength x alpha / rank)"));
  r.spin = new QDoubleSpinBox(r.box);
  r.spin->setRange(-dit::protocol::kMaxLoraStrength, dit::protocol::kMaxLoraStrength);
  r.spin->setDecimals(2);
  r.spin->setSingleStep(0.05);
  r.spin->setKeyboardTracking(false);
  r.spin->setToolTip(tr("Strength (scaling = strength x alpha / rank)"));
  mid->addWidget(r.slider, 1);
  mid->addWidget(r.spin);
  v->addLayout(mid);
  r.info_label = new ElidedLabel(QString(), r.box);
  r.info_label->setObjectName("hint");
  v->addWidget(r.info_label);
  try {
    if (!QFileInfo::exists(file)) throw std::runtime_error("");
    r.info = inspectLoraFile(file.toStdString());
    r.inspected = true;
    r.summary = QString::fromStdString(r.info.summary());
  } catch (const std::exception& e) {
    r.problem = QFileInfo::exists(file)
                    ? tr("LoRA file unusable: %1").arg(QString::fromUtf8(e.what()))
                    : tr("LoRA file not found: %1").arg(file);
    r.summary = QFileInfo::exists(file) ? tr("unreadable") : tr("missing");
  }
  r.modelProblem = modelRefusal(r);
  showRowState(r);
  const double s =
      std::clamp(strength, -dit::protocol::kMaxLoraStrength, dit::protocol::kMaxLoraStrength);
  r.spin->setValue(s);
  r.slider->setValue(
      static_cast<int>(std::lround(std::clamp(s, -kSliderMax, kSliderMax) * kSliderScale)));
  QSlider* slider = r.slider;
  QDoubleSpinBox* spin = r.spin;
  connect(slider, &QSlider::valueChanged, this, [this, spin](int value) {
    const double s = static_cast<double>(value) / kSliderScale;
    if (std::abs(spin->value() - s) < 1e-9) return;
    {
      const QSignalBlocker block(spin);
      spin->setValue(s);
    }
    if (!loading_) Q_EMIT changed();
  });
  connect(spin, &QDoubleSpinBox::valueChanged, this, [this, slider](double value) {
    {
      const QSignalBlocker block(slider);
      slider->setValue(
          static_cast<int>(std::lround(std::clamp(value, -kSliderMax, kSliderMax) * kSliderScale)));
    }
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
  const bool ok = r.problem.isEmpty() && r.modelProblem.isEmpty();
  rows_.push_back(std::move(r));
  updateWarning();
  if (!loading_) Q_EMIT changed();
  return ok;
}

QString LoraList::modelRefusal(const Row& r) const {
  return r.inspected ? refusal(r.file, r.info) : QString();
}

QString LoraList::refusal(const QString& fileName, const dit::LoraFileInfo& info) const {
  if (!haveModel_) return {};
  // The worker's sentences (app/worker/generate.cpp "LoRA refused: " + the loader's error:
  // backend/nn/lora_loader.cpp, parallel/tensor_parallel/lora.cpp).
  const QString head = tr("LoRA refused: ");
  if (loraFormats_.empty()) return head + tr("%1: %2 takes no LoRA files").arg(fileName, family_);
  if (info.format == dit::LoraFormat::Kohya) {
    if (std::find(loraFormats_.begin(), loraFormats_.end(), "kohya") == loraFormats_.end())
      return head + tr("%1: this model family takes no kohya LoRA files").arg(fileName);
    return {};  // kohya names map through the family's own table (checked by the worker)
  }
  if (!parameters_ || parameters_->empty()) return {};
  const std::string file = fileName.toStdString();
  for (const auto& m : info.modules) {
    const dit::ParameterInfo* p = parameters_->find(m.name + ".weight");
    if (!p)
      return head +
             QString::fromStdString(file + ": module '" + m.name +
                                    "' does not exist in this model (a LoRA for another model?)");
    if (p->shape.size() != 2 || p->shape[0] != m.out || p->shape[1] != m.in) {
      const int64_t o = p->shape.size() == 2 ? p->shape[0] : 0;
      const int64_t i = p->shape.size() == 2 ? p->shape[1] : 0;
      return head + QString::fromStdString(
                        file + ": module '" + m.name + "': LoRA A " + shapeText({m.rank, m.in}) +
                        " and B " + shapeText({m.out, m.rank}) + " do not fit the layer's weight " +
                        shapeText({o, i}) + " (expected A [r, " + std::to_string(i) + "], B [" +
                        std::to_string(o) + ", r]; a LoRA for another model?)");
    }
  }
  return {};
}

void LoraList::showRowState(Row& r) {
  const QString why = !r.problem.isEmpty() ? r.problem : r.modelProblem;
  if (why.isEmpty()) {
    r.info_label->setText(r.summary);
    r.info_label->setBaseToolTip(r.summary);
    r.info_label->setObjectName("hint");
  } else {
    // The refusal at the row, as typed (the file stays listed).
    r.info_label->setText(
        r.problem.isEmpty() ? tr("refused: %1").arg(r.modelProblem.mid(tr("LoRA refused: ").size()))
                            : r.summary);
    r.info_label->setBaseToolTip(why);
    r.info_label->setObjectName("issues");
  }
  r.info_label->setProperty("invalid", !why.isEmpty());
  r.info_label->setStyleSheet(why.isEmpty() ? QString() : QStringLiteral("color: #ff8a80"));
}

void LoraList::setModel(const QString& family, const std::vector<std::string>& loraFormats,
                        std::shared_ptr<const dit::ParameterTable> parameters) {
  family_ = family;
  loraFormats_ = loraFormats;
  parameters_ = std::move(parameters);
  haveModel_ = true;
  bool any = false;
  for (Row& r : rows_) {
    const QString before = r.modelProblem;
    r.modelProblem = modelRefusal(r);
    if (before != r.modelProblem) {
      showRowState(r);
      any = true;
    }
  }
  updateWarning();
  if (any && !loading_) Q_EMIT changed();
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
    l.strength = std::round(r.spin->value() * 100.0) / 100.0;
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
  for (const auto& r : rows_) {
    if (!r.problem.isEmpty())
      p << r.problem;
    else if (!r.modelProblem.isEmpty())
      p << r.modelProblem;
  }
  return p;
}

void LoraList::updateWarning() {
  const QStringList p = problems();
  warning_->setText(p.join(QLatin1Char('\n')));
  warning_->setVisible(!p.isEmpty());
}

}  // namespace dit::ui
