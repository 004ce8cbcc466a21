#include "ui/strategy_editor.h"

#include <QCheckBox>
#include <QComboBox>
#include <QFileDialog>
#include <QFormLayout>
#include <QGridLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPainter>
#include <QPushButton>
#include <QScrollArea>
#include <QSpinBox>
#include <QVBoxLayout>

#include "ui/strategy_json.h"

namespace dit::ui {
namespace {
constexpr int kBoxW = 96, kMinBoxW = 58, kBoxH = 46, kGap = 6, kLabelW = 92;
}

MeshView::MeshView(QWidget* parent) : QWidget(parent) {
  setSizePolicy(QSizePolicy::Preferred, QSizePolicy::Preferred);
}

void MeshView::setStrategy(const dit::Strategy& s) {
  layout_ = computeMeshLayout(s);
  updateGeometry();
  update();
}

QSize MeshView::sizeHint() const {
  if (!layout_.valid) return {240, 40};
  return {kLabelW + layout_.cols * (kBoxW + kGap) + 8, layout_.rows * (kBoxH + kGap) + 8};
}

QSize MeshView::minimumSizeHint() const {
  if (!layout_.valid) return {200, 40};
  return {kLabelW + layout_.cols * (kMinBoxW + kGap) + 8, layout_.rows * (kBoxH + kGap) + 8};
}

int MeshView::boxWidth() const {
  if (layout_.cols <= 0) return kBoxW;
  const int fit = (width() - kLabelW - 8) / layout_.cols - kGap;
  return std::clamp(fit, kMinBoxW, kBoxW);
}

void MeshView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.setRenderHint(QPainter::Antialiasing);
  if (!layout_.valid) {
    p.setPen(QColor(0xff, 0x8a, 0x80));
    p.drawText(
        rect().adjusted(4, 4, -4, -4), Qt::AlignLeft | Qt::AlignTop | Qt::TextWordWrap,
        tr("No mesh: the degrees' product (%1) must equal the number of ranks.").arg(layout_.dims));
    return;
  }
  static const QColor rowColors[] = {QColor(0x2b, 0x4c, 0x7e), QColor(0x3c, 0x6e, 0x47),
                                     QColor(0x6e, 0x4c, 0x2b), QColor(0x5e, 0x36, 0x6e)};
  QFont small = font();
  small.setPointSizeF(std::max(6.5, small.pointSizeF() - 1.5));
  p.setFont(small);
  for (int row = 0; row < layout_.rows; ++row) {
    p.setPen(QColor(0x9a, 0xa4, 0xb2));
    p.drawText(QRect(2, 4 + row * (kBoxH + kGap), kLabelW - 6, kBoxH),
               Qt::AlignVCenter | Qt::AlignLeft, layout_.rowLabels.value(row));
  }
  for (const MeshCell& c : layout_.cells) {
    const int bw = boxWidth();
    const QRect r(kLabelW + c.col * (bw + kGap), 4 + c.row * (kBoxH + kGap), bw, kBoxH);
    // One colour per replica (dp, cfg); ring rows of a replica share it.
    QColor fill = rowColors[(c.coords[0] * 2 + c.coords[1]) % 4];
    if (c.coords[2] % 2 == 1) fill = fill.darker(115);
    if (c.coords[4] % 2 == 1) fill = fill.lighter(125);  // alternate shade inside a tp group
    p.setPen(QPen(fill.lighter(160), 1));
    p.setBrush(fill);
    p.drawRoundedRect(r, 5, 5);
    p.setPen(Qt::white);
    p.drawText(r.adjusted(3, 2, -3, -2), Qt::AlignCenter, c.label);
  }
}

StrategyEditor::StrategyEditor(QWidget* parent) : QWidget(parent) {
  auto* outer = new QVBoxLayout(this);
  auto* box = new QGroupBox(tr("Parallel strategy"), this);
  auto* form = new QFormLayout(box);
  // A row that does not fit beside its label goes under it: the tab never scrolls sideways.
  form->setRowWrapPolicy(QFormLayout::WrapLongRows);
  auto spin = [box](int lo, int hi, const QString& tip) {
    auto* s = new QSpinBox(box);
    s->setRange(lo, hi);
    s->setToolTip(tip);
    return s;
  };
  world_ = spin(1, 1024, tr("Number of ranks (mpirun -np): one per GPU"));
  device_ = new QComboBox(box);
  device_->addItems({"cpu", "cuda"});
  auto* row0 = new QHBoxLayout;
  row0->addWidget(world_, 1);
  row0->addWidget(new QLabel(tr("device"), box));
  row0->addWidget(device_, 1);
  form->addRow(tr("Ranks"), row0);
  tp_ = spin(1, 1024, tr("Tensor parallel: split weight matrices (must divide the head count)"));
  form->addRow(tr("tp degree"), tp_);
  ring_ = spin(1, 1024, tr("Ring attention: split the sequence, pass K/V around a ring"));
  ringAnything_ = new QCheckBox(tr("ring anything"), box);
  ringAnything_->setToolTip(tr("Uneven sequence split (ulysses must be 1)"));
  auto* rr = new QHBoxLayout;
  rr->addWidget(ring_, 1);
  rr->addWidget(ringAnything_);
  form->addRow(tr("ring degree"), rr);
  ulysses_ = spin(1, 1024, tr("Ulysses attention: all-to-all from sequence to heads"));
  ulyssesAnything_ = new QCheckBox(tr("ulysses anything"), box);
  ulyssesAnything_->setToolTip(tr("Uneven sequence/head split (ring must be 1)"));
  auto* ur = new QHBoxLayout;
  ur->addWidget(ulysses_, 1);
  ur->addWidget(ulyssesAnything_);
  form->addRow(tr("ulysses degree"), ur);
  cfg_ = spin(
      1, 2,
      tr("CFG parallel: 2 computes conditional and unconditional halves at once (needs true CFG)"));
  form->addRow(tr("cfg degree"), cfg_);
  dp_ = spin(1, 1024, tr("Data parallel: replicas generating different images"));
  form->addRow(tr("dp degree"), dp_);
  auto* hr = new QHBoxLayout;
  hostfile_ = new QLineEdit(box);
  hostfile_->setPlaceholderText(tr("optional mpirun hostfile"));
  auto* hb = new QPushButton(tr("…"), box);
  hr->addWidget(hostfile_, 1);
  hr->addWidget(hb);
  form->addRow(tr("Hostfile"), hr);
  // Hostfile groups only (docs/multi-host.md); a single-host group stays on loopback.
  auto hostField = [box](const QString& placeholder, const QString& tip) {
    auto* e = new QLineEdit(box);
    e->setPlaceholderText(placeholder);
    e->setToolTip(tip);
    return e;
  };
  network_ = hostField(tr("e.g. 10.0.0.0/24 or eth1"),
                       tr("With a hostfile: the interfaces or CIDR subnets (comma-separated) the "
                          "group's MPI traffic may use (--network-interface)"));
  form->addRow(tr("Network"), network_);
  portRange_ = hostField(tr("e.g. 50000-50100"),
                         tr("With a hostfile: TCP ports MIN-MAX for everything the group "
                            "listens on (mpirun's channel and the ranks'; at least 4), for "
                            "firewalls (--port-range)"));
  form->addRow(tr("Port range"), portRange_);
  sshOptions_ = hostField(tr("e.g. -i ~/.ssh/cluster -p 2222"),
                          tr("With a hostfile: ssh options, after -o BatchMode=yes -o "
                             "ConnectTimeout=10 (--ssh-options)"));
  form->addRow(tr("ssh options"), sshOptions_);
  mpirunArgs_ = hostField(tr("extra mpirun arguments"),
                          tr("With a hostfile: extra mpirun arguments, whitespace-separated "
                             "(--mpirun-args)"));
  form->addRow(tr("mpirun args"), mpirunArgs_);
  // The group's run options (app/protocol/run_options.h): the worker starts with them.
  textEncoder_ = new QComboBox(box);
  for (const std::string& name : dit::protocol::textEncoderPlacementChoices())
    textEncoder_->addItem(QString::fromStdString(name));
  textEncoder_->setToolTip(
      tr("Where the text encoder lives (--text-encoder-placement): sharded under the tp group "
         "(default); own-rank: one rank of each tp x cp group encodes and broadcasts, the others "
         "never load it; host-streamed: weights in host memory, one layer at a time on the "
         "device (Qwen3 / Mistral / Qwen2.5-VL encoders); once: loaded per request, freed "
         "before the steps"));
  form->addRow(tr("Text encoder"), textEncoder_);
  promptCache_ = spin(0, dit::protocol::kMaxPromptCacheEntries,
                      tr("Prompt embeddings kept for the last N distinct prompts, so a queue of "
                         "variations encodes each prompt once (--prompt-cache; 0: off)"));
  promptCache_->setSpecialValueText(tr("off"));
  form->addRow(tr("Prompt cache"), promptCache_);
  vaeTiling_ = spin(-1, dit::protocol::kMaxVaeTilePixels,
                    tr("Decode the image in tiles of this many pixels (--vae-tiling, diffusers' "
                       "enable_tiling(), overlap 0.25); 0: the VAE's sample_size; the tiles are "
                       "shared over the group's ranks"));
  vaeTiling_->setSpecialValueText(tr("off"));
  vaeTiling_->setSuffix(tr(" px"));
  vaeTiling_->setValue(-1);
  form->addRow(tr("VAE tiling"), vaeTiling_);
  auto* buttons = new QHBoxLayout;
  auto* fill = new QPushButton(tr("Ranks = product"), box);
  fill->setToolTip(tr("Set the number of ranks to dp × cfg × ring × ulysses × tp"));
  auto* advisor = new QPushButton(tr("Advisor…"), box);
  advisor->setToolTip(
      tr("Recommend a strategy from model size, GPU memory, interconnect and resolution"));
  buttons->addWidget(fill);
  buttons->addStretch(1);
  buttons->addWidget(advisor);
  form->addRow(buttons);
  outer->addWidget(box);

  summary_ = new QLabel(this);
  summary_->setObjectName("hint");
  summary_->setWordWrap(true);
  // Both wrap in the column's width; a long word (a module path) never widens the tab.
  summary_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  outer->addWidget(summary_);
  issues_ = new QLabel(this);
  issues_->setObjectName("issues");
  issues_->setWordWrap(true);
  issues_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  issues_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  outer->addWidget(issues_);

  // A short title (a group box's title sets its minimum width); the legend wraps under it.
  auto* meshBox = new QGroupBox(tr("Mesh"), this);
  auto* mlay = new QVBoxLayout(meshBox);
  auto* legend = new QLabel(tr("A row per dp/cfg/ring group, ulysses × tp across"), meshBox);
  legend->setObjectName("hint");
  legend->setWordWrap(true);
  legend->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  mlay->addWidget(legend);
  mesh_ = new MeshView(meshBox);
  auto* scroll = new QScrollArea(meshBox);
  scroll->setWidget(mesh_);
  scroll->setWidgetResizable(true);
  scroll->setFrameShape(QFrame::NoFrame);
  scroll->setMinimumHeight(110);
  mlay->addWidget(scroll);
  outer->addWidget(meshBox, 1);

  auto emitChanged = [this] {
    const dit::Strategy s = strategy();
    mesh_->setStrategy(s);
    summary_->setText(strategyText(s));
    if (!loading_) Q_EMIT changed();
  };
  for (QSpinBox* s : {world_, tp_, ring_, ulysses_, cfg_, dp_, promptCache_, vaeTiling_})
    connect(s, &QSpinBox::valueChanged, this, emitChanged);
  connect(device_, &QComboBox::currentTextChanged, this, emitChanged);
  connect(textEncoder_, &QComboBox::currentTextChanged, this, emitChanged);
  connect(ulyssesAnything_, &QCheckBox::toggled, this, emitChanged);
  connect(ringAnything_, &QCheckBox::toggled, this, emitChanged);
  for (QLineEdit* e : {hostfile_, network_, portRange_, sshOptions_, mpirunArgs_})
    connect(e, &QLineEdit::textChanged, this, emitChanged);
  connect(fill, &QPushButton::clicked, this, [this] {
    world_->setValue(tp_->value() * ring_->value() * ulysses_->value() * cfg_->value() *
                     dp_->value());
  });
  connect(advisor, &QPushButton::clicked, this, &StrategyEditor::advisorRequested);
  connect(hb, &QPushButton::clicked, this, [this] {
    const QString f = QFileDialog::getOpenFileName(this, tr("mpirun hostfile"), hostfile_->text());
    if (!f.isEmpty()) hostfile_->setText(f);
  });
  setStrategy(dit::Strategy{});
}

dit::Strategy StrategyEditor::strategy() const {
  dit::Strategy s;
  s.world = world_->value();
  s.device = device_->currentText().toStdString();
  s.tp_degree = tp_->value();
  s.ring_degree = ring_->value();
  s.ulysses_degree = ulysses_->value();
  s.cfg_degree = cfg_->value();
  s.dp_degree = dp_->value();
  s.ulysses_anything = ulyssesAnything_->isChecked();
  s.ring_anything = ringAnything_->isChecked();
  return s;
}

void StrategyEditor::setStrategy(const dit::Strategy& s) {
  loading_ = true;
  world_->setValue(s.world);
  device_->setCurrentText(QString::fromStdString(s.device));
  tp_->setValue(s.tp_degree);
  ring_->setValue(s.ring_degree);
  ulysses_->setValue(s.ulysses_degree);
  cfg_->setValue(s.cfg_degree);
  dp_->setValue(s.dp_degree);
  ulyssesAnything_->setChecked(s.ulysses_anything);
  ringAnything_->setChecked(s.ring_anything);
  loading_ = false;
  mesh_->setStrategy(strategy());
  summary_->setText(strategyText(strategy()));
  Q_EMIT changed();
}

QString StrategyEditor::hostfile() const { return hostfile_->text().trimmed(); }

void StrategyEditor::setHostfile(const QString& path) { hostfile_->setText(path); }

HostSettings StrategyEditor::hostSettings() const {
  HostSettings h;
  h.networkInterface = network_->text().trimmed();
  h.portRange = portRange_->text().trimmed();
  h.sshOptions = sshOptions_->text().trimmed();
  h.mpirunArgs = mpirunArgs_->text().trimmed();
  return h;
}

void StrategyEditor::setHostSettings(const HostSettings& h) {
  loading_ = true;
  network_->setText(h.networkInterface);
  portRange_->setText(h.portRange);
  sshOptions_->setText(h.sshOptions);
  mpirunArgs_->setText(h.mpirunArgs);
  loading_ = false;
  Q_EMIT changed();
}

dit::protocol::RunOptions StrategyEditor::runOptions() const {
  dit::protocol::RunOptions o;
  o.text_encoder_placement = textEncoder_->currentText().toStdString();
  o.prompt_cache = promptCache_->value();
  o.vae_tiling = vaeTiling_->value();
  return o;
}

void StrategyEditor::setRunOptions(const dit::protocol::RunOptions& o) {
  loading_ = true;
  const int at = textEncoder_->findText(QString::fromStdString(o.text_encoder_placement));
  textEncoder_->setCurrentIndex(at >= 0 ? at : 0);
  promptCache_->setValue(o.prompt_cache);
  vaeTiling_->setValue(o.vae_tiling);
  loading_ = false;
  Q_EMIT changed();
}

void StrategyEditor::setIssues(const QStringList& startIssues, const QStringList& requestIssues) {
  QStringList lines;
  for (const QString& m : startIssues) lines << QStringLiteral("✖ ") + m;
  for (const QString& m : requestIssues) lines << QStringLiteral("⚠ ") + m;
  issues_->setText(lines.isEmpty() ? QString() : lines.join('\n'));
  issues_->setVisible(!lines.isEmpty());
  summary_->setText(strategyText(strategy()) + (lines.isEmpty() ? tr(" — valid") : QString()));
}

QString StrategyEditor::issuesText() const { return issues_->text(); }

}  // namespace dit::ui
