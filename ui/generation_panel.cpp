#include "ui/generation_panel.h"

#include <QCheckBox>
#include <QDir>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QRegularExpression>
#include <QRegularExpressionValidator>
#include <QSpinBox>
#include <QStyle>
#include <QToolButton>
#include <QVBoxLayout>

#include "app/common/request_values.h"
#include "app/protocol/limits.h"
#include "backend/models/family_registry.h"
#include "ui/image_input_panel.h"
#include "ui/reference_strip.h"
#include "ui/seed_text.h"
#include "ui/worker_command.h"

namespace dit::ui {

QString breakablePaths(QString text) {
  // U+200B ZERO WIDTH SPACE: a line may break there, nothing is drawn.
  text.replace(QLatin1Char('/'), QStringLiteral("/\u200B"));
  return text;
}

GenerationPanel::GenerationPanel(QWidget* parent) : QWidget(parent) {
  auto* outer = new QVBoxLayout(this);
  // Slim margins: the panel fits the left column of a 1024 px wide window without scrolling
  // sideways.
  outer->setContentsMargins(4, 4, 4, 4);

  auto* modelBox = new QGroupBox(tr("Model"), this);
  auto* ml = new QVBoxLayout(modelBox);
  ml->setContentsMargins(6, 6, 6, 6);
  auto* row = new QHBoxLayout;
  modelEdit_ = new QLineEdit(modelBox);
  modelEdit_->setPlaceholderText(
      tr("diffusers FLUX.1 or FLUX.2 [klein] folder, or a single FLUX.1 checkpoint file (BFL, fp8, "
         "ComfyUI all-in-one, GGUF)"));
  auto* browse = new QPushButton(tr("Browse…"), modelBox);
  browse->setToolTip(tr("Choose a diffusers model folder"));
  auto* browseFile = new QPushButton(tr("File…"), modelBox);
  browseFile->setObjectName("modelFileButton");
  browseFile->setToolTip(tr("Choose a single .safetensors or .gguf checkpoint"));
  auto* deflt = new QPushButton(tr("Default"), modelBox);
  deflt->setToolTip(tr("The embedded default model"));
  row->addWidget(modelEdit_, 1);
  row->addWidget(browse);
  row->addWidget(browseFile);
  row->addWidget(deflt);
  ml->addLayout(row);
  ml->addWidget(buildComponents(modelBox));
  modelSummary_ = new QLabel(modelBox);
  modelSummary_->setObjectName("hint");
  modelSummary_->setWordWrap(true);
  modelSummary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  // Wraps (paths break after their slashes) and never widens the column.
  modelSummary_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  ml->addWidget(modelSummary_);
  outer->addWidget(modelBox);

  auto* genBox = new QGroupBox(tr("Generation"), this);
  auto* form = new QFormLayout(genBox);
  form->setContentsMargins(6, 6, 6, 6);
  // A row whose label and field do not fit side by side (a family's long knob name in a narrow
  // column) puts its field under its label: the column never widens for a generated row.
  form->setRowWrapPolicy(QFormLayout::WrapLongRows);
  form_ = form;
  prompt_ = new QPlainTextEdit(genBox);
  prompt_->setPlaceholderText(tr("Prompt"));
  prompt_->setMinimumHeight(70);
  // The prompt with its history (the prompts generated with, newest first) under it.
  auto* promptBox = new QWidget(genBox);
  auto* pl = new QVBoxLayout(promptBox);
  pl->setContentsMargins(0, 0, 0, 0);
  pl->setSpacing(2);
  pl->addWidget(prompt_);
  promptHistory_ = new QToolButton(promptBox);
  promptHistory_->setObjectName("promptHistory");
  promptHistory_->setText(tr("History"));
  promptHistory_->setToolTip(tr("Prompts you generated with, newest first"));
  promptHistory_->setPopupMode(QToolButton::InstantPopup);
  promptMenu_ = new QMenu(promptHistory_);
  promptHistory_->setMenu(promptMenu_);
  // The worker's truncation warning for this prompt, at the prompt (until it is edited), beside
  // the History button.
  auto* underPrompt = new QHBoxLayout;
  underPrompt->setContentsMargins(0, 0, 0, 0);
  promptWarning_ = new QLabel(promptBox);
  promptWarning_->setObjectName("promptWarning");
  promptWarning_->setWordWrap(true);
  promptWarning_->setStyleSheet(QStringLiteral("color: #f0ad4e"));
  promptWarning_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);  // wraps
  promptWarning_->hide();
  underPrompt->addWidget(promptWarning_, 1);
  underPrompt->addWidget(promptHistory_, 0, Qt::AlignRight | Qt::AlignTop);
  pl->addLayout(underPrompt);
  prompt_->setParent(promptBox);
  form->addRow(tr("Prompt"), promptBox);
  negative_ = new QPlainTextEdit(genBox);
  negative_->setPlaceholderText(tr("Negative prompt (used when the model runs CFG)"));
  negative_->setMaximumHeight(48);
  form->addRow(tr("Negative"), negative_);
  // Ranges from the one limits table (app/protocol/limits): what the spin boxes accept is what
  // the worker accepts; a family knob's range is its declaration's.
  using dit::protocol::requestLimit;

  auto* sizeRow = new QHBoxLayout;
  width_ = new QSpinBox(genBox);
  height_ = new QSpinBox(genBox);
  for (QSpinBox* b : {width_, height_}) {
    b->setRange(16, static_cast<int>(requestLimit(b == width_ ? "width" : "height").hi));
    b->setSuffix(tr(" px"));
    b->setKeyboardTracking(false);
  }
  sizeRow->addWidget(width_);
  sizeRow->addWidget(new QLabel(QStringLiteral("×"), genBox));
  sizeRow->addWidget(height_);
  form->addRow(tr("Size"), sizeRow);
  sizeHint_ = new QLabel(genBox);
  sizeHint_->setObjectName("hint");
  sizeHint_->setWordWrap(true);
  sizeHint_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  form->addRow(QString(), sizeHint_);

  steps_ = new QSpinBox(genBox);
  steps_->setRange(static_cast<int>(requestLimit("steps").lo),
                   static_cast<int>(requestLimit("steps").hi));
  form->addRow(tr("Steps"), steps_);
  guidance_ = new QDoubleSpinBox(genBox);
  guidance_->setRange(requestLimit("guidance").lo, requestLimit("guidance").hi);
  guidance_->setSingleStep(0.5);
  form->addRow(tr("Guidance"), guidance_);
  // One row per knob a model family declares (FamilySpec::knobs): range, default and help from
  // the declaration; shown for the models whose request has it (applyRequestSpec).
  for (const dit::FieldSpec& k : dit::allFamilyKnobs()) {
    auto* spin = new QDoubleSpinBox(genBox);
    spin->setObjectName(QStringLiteral("knob_") + QString::fromStdString(k.name));
    spin->setRange(k.min, k.max);
    spin->setDecimals(k.type == dit::FieldType::Int ? 0 : 3);
    spin->setSingleStep(k.type == dit::FieldType::Int ? 1.0 : 0.05);
    spin->setValue(k.default_value);
    spin->setToolTip(QString::fromStdString(k.name + " (" + k.diffusers_arg + "): " + k.help));
    QString label = QString::fromStdString(k.name);
    label.replace(QLatin1Char('_'), QLatin1Char(' '));
    label.replace(QRegularExpression(QStringLiteral("\\bcfg\\b")), QStringLiteral("CFG"));
    label[0] = label[0].toUpper();
    form->addRow(label, spin);
    knobs_.emplace_back(k.name, spin);
  }

  auto* seedRow = new QHBoxLayout;
  seed_ = new QLineEdit(genBox);
  // Digits only (20 at most); the value is checked against 0 .. 2^64-1 by seedError().
  seed_->setValidator(new QRegularExpressionValidator(QRegularExpression("[0-9]{0,20}"), seed_));
  seed_->setToolTip(
      tr("Seed: a whole number in %1 (unsigned 64-bit, as PyTorch's)").arg(seedRangeText()));
  randomSeed_ = new QCheckBox(tr("Random"), genBox);
  seedRow->addWidget(seed_, 1);
  seedRow->addWidget(randomSeed_);
  form->addRow(tr("Seed"), seedRow);
  auto* lastRow = new QHBoxLayout;
  lastSeedLabel_ = new QLabel(tr("last seed: -"), genBox);
  lastSeedLabel_->setObjectName("hint");
  lastSeedLabel_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  reuseSeed_ = new QPushButton(tr("Reuse"), genBox);
  reuseSeed_->setEnabled(false);
  lastRow->addWidget(lastSeedLabel_, 1);
  lastRow->addWidget(reuseSeed_);
  form->addRow(QString(), lastRow);

  images_ = new QSpinBox(genBox);
  images_->setRange(static_cast<int>(requestLimit("num_images").lo),
                    static_cast<int>(requestLimit("num_images").hi));
  images_->setToolTip(tr("Images per request (split across data-parallel replicas)"));
  form->addRow(tr("Images"), images_);
  repeat_ = new QSpinBox(genBox);
  repeat_->setObjectName("repeat");
  repeat_->setRange(1, 100);
  repeat_->setPrefix(QStringLiteral("× "));
  repeat_->setToolTip(
      tr("Queue this many requests with one Generate (a fixed seed advances by the images per "
         "request each time)"));
  form->addRow(tr("Repeat"), repeat_);
  loras_ = new LoraList(genBox);
  form->addRow(tr("LoRAs"), loras_);
  outer->addWidget(genBox);
  refs_ = new ReferenceStrip(this);
  outer->addWidget(refs_);
  imagePanel_ = new ImageInputPanel(this);
  outer->addWidget(imagePanel_, 1);

  setParams(startingParams());
  setPromptHistory({});

  auto emitChanged = [this] {
    if (!loading_) Q_EMIT changed();
  };
  connect(prompt_, &QPlainTextEdit::textChanged, this, emitChanged);
  connect(negative_, &QPlainTextEdit::textChanged, this, emitChanged);
  // A warning about the prompt as it was sent goes once the prompt is edited.
  for (QPlainTextEdit* e : {prompt_, negative_})
    connect(e, &QPlainTextEdit::textChanged, this, [this] {
      if (!promptWarnings_.isEmpty()) showPromptWarnings({});
    });
  connect(steps_, &QSpinBox::valueChanged, this, emitChanged);
  connect(guidance_, &QDoubleSpinBox::valueChanged, this, emitChanged);
  for (const auto& [name, spin] : knobs_) {
    connect(spin, &QDoubleSpinBox::valueChanged, this, emitChanged);
    // The references' fitted sizes follow the rule's auto-resize knob (Kontext's _auto_resize).
    connect(spin, &QDoubleSpinBox::valueChanged, this, [this, n = name](double v) {
      if (n == model_.request.references.auto_resize_field) refs_->setAutoResize(v != 0);
    });
  }
  connect(seed_, &QLineEdit::textChanged, this, [this, emitChanged] {
    const QString err = seedError();
    seed_->setProperty("invalid", !err.isEmpty());
    seed_->setToolTip(err.isEmpty() ? tr("Seed: a whole number in %1 (unsigned 64-bit, as "
                                         "PyTorch's)")
                                          .arg(seedRangeText())
                                    : err);
    seed_->style()->unpolish(seed_);
    seed_->style()->polish(seed_);
    emitChanged();
  });
  connect(images_, &QSpinBox::valueChanged, this, emitChanged);
  connect(imagePanel_, &ImageInputPanel::changed, this, emitChanged);
  connect(refs_, &ReferenceStrip::changed, this, emitChanged);
  connect(refs_, &ReferenceStrip::sizeRequested, this, [this](int w, int h) {
    width_->setValue(w);
    height_->setValue(h);
  });
  connect(loras_, &LoraList::changed, this, emitChanged);
  connect(randomSeed_, &QCheckBox::toggled, this, [this, emitChanged](bool on) {
    seed_->setEnabled(!on);
    emitChanged();
  });
  for (QSpinBox* b : {width_, height_}) {
    connect(b, &QSpinBox::valueChanged, this, emitChanged);
    connect(b, &QSpinBox::editingFinished, this, [this, b] { snapSize(b); });
  }
  connect(reuseSeed_, &QPushButton::clicked, this, [this] {
    if (!hasLastSeed_) return;
    randomSeed_->setChecked(false);
    seed_->setText(seedText(lastSeed_));
  });
  connect(browse, &QPushButton::clicked, this, [this] {
    const QString d =
        QFileDialog::getExistingDirectory(this, tr("Choose a diffusers model folder"), modelDir());
    if (!d.isEmpty()) setModelDir(d);
  });
  connect(browseFile, &QPushButton::clicked, this, [this] {
    const QString f = QFileDialog::getOpenFileName(
        this, tr("Choose a FLUX.1 checkpoint file (BFL, fp8, ComfyUI all-in-one, GGUF)"),
        modelDir(),
        tr("Checkpoints (*.safetensors *.gguf);;safetensors (*.safetensors);;GGUF (*.gguf)"));
    if (!f.isEmpty()) setModelDir(f);
  });
  // The embedded model is complete: no component of another model stays with it.
  connect(deflt, &QPushButton::clicked, this, [this] {
    setSources(ModelSourcePaths{defaultModelDir(), {}});
  });
  connect(modelEdit_, &QLineEdit::editingFinished, this, [this] {
    if (QDir::cleanPath(modelEdit_->text()) != model_.path) applyModel();
  });
}

QWidget* GenerationPanel::buildComponents(QWidget* parent) {
  auto* wrap = new QWidget(parent);
  auto* wl = new QVBoxLayout(wrap);
  wl->setContentsMargins(0, 0, 0, 0);
  wl->setSpacing(2);
  componentsToggle_ = new QToolButton(wrap);
  componentsToggle_->setObjectName("componentsToggle");
  componentsToggle_->setText(tr("Components"));
  componentsToggle_->setToolButtonStyle(Qt::ToolButtonTextBesideIcon);
  componentsToggle_->setArrowType(Qt::RightArrow);
  componentsToggle_->setCheckable(true);
  componentsToggle_->setAutoRaise(true);
  componentsToggle_->setToolTip(
      tr("Where the parts the model file lacks come from, as ditstudio-cli's --config, --vae, "
         "--text-encoder, --text-encoder-2, --tokenizer and --tokenizer-2: a GGUF or single "
         "transformer file needs a VAE and text encoders, and a config folder for what its "
         "tensors cannot say. With a diffusers folder they replace its components."));
  wl->addWidget(componentsToggle_);
  componentsBox_ = new QWidget(wrap);
  componentsBox_->setObjectName("componentsBox");
  auto* form = new QFormLayout(componentsBox_);
  form->setContentsMargins(12, 0, 0, 0);
  form->setRowWrapPolicy(QFormLayout::WrapLongRows);
  form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
  for (const ModelComponents::Field& f : ModelComponents::fields()) {
    auto* edit = new QLineEdit(componentsBox_);
    edit->setObjectName(QStringLiteral("component_") + QLatin1String(f.key));
    edit->setPlaceholderText(f.folderOnly ? tr("%1: a folder").arg(QLatin1String(f.flag))
                                          : tr("%1: a component folder or single file (the "
                                               "model's own when empty)")
                                                .arg(QLatin1String(f.flag)));
    edit->setToolTip(edit->placeholderText());
    auto* pick = new QToolButton(componentsBox_);
    pick->setText(QStringLiteral("…"));
    pick->setToolTip(tr("Choose the %1").arg(tr(f.label)));
    const QString label = tr(f.label);
    auto choose = [this, edit, label](bool file) {
      const QString start = edit->text().isEmpty() ? modelDir() : edit->text();
      const QString got =
          file ? QFileDialog::getOpenFileName(this, tr("Choose the %1 file").arg(label), start,
                                              tr("Checkpoints (*.safetensors *.gguf)"))
               : QFileDialog::getExistingDirectory(this, tr("Choose the %1 folder").arg(label),
                                                   start);
      if (got.isEmpty()) return;
      edit->setText(got);
      Q_EMIT edit->editingFinished();
    };
    if (f.folderOnly) {
      connect(pick, &QToolButton::clicked, this, [choose] { choose(false); });
    } else {
      auto* menu = new QMenu(pick);
      menu->addAction(tr("File…"), this, [choose] { choose(true); });
      menu->addAction(tr("Folder…"), this, [choose] { choose(false); });
      pick->setMenu(menu);
      pick->setPopupMode(QToolButton::InstantPopup);
    }
    auto* r = new QHBoxLayout;
    r->setContentsMargins(0, 0, 0, 0);
    r->addWidget(edit, 1);
    r->addWidget(pick);
    form->addRow(tr(f.label), r);
    componentEdits_.push_back(edit);
    connect(edit, &QLineEdit::editingFinished, this, [this] {
      if (components() != appliedComponents_) applyModel();
    });
  }
  componentsToggle_->setVisible(false);  // offered by showComponentState
  componentsBox_->setVisible(false);
  wl->addWidget(componentsBox_);
  connect(componentsToggle_, &QToolButton::toggled, this, [this](bool on) {
    componentsToggle_->setArrowType(on ? Qt::DownArrow : Qt::RightArrow);
    componentsBox_->setVisible(on);
  });
  return wrap;
}

ModelComponents GenerationPanel::components() const {
  ModelComponents c;
  const auto& fields = ModelComponents::fields();
  for (size_t i = 0; i < fields.size(); ++i)
    c.*fields[i].member = componentEdits_[i]->text().trimmed();
  return c;
}

QLineEdit* GenerationPanel::componentEdit(const QString& key) const {
  const auto& fields = ModelComponents::fields();
  for (size_t i = 0; i < fields.size(); ++i)
    if (key == QLatin1String(fields[i].key)) return componentEdits_[i];
  return nullptr;
}

void GenerationPanel::setSources(const ModelSourcePaths& s) {
  modelEdit_->setText(s.model);
  const auto& fields = ModelComponents::fields();
  for (size_t i = 0; i < fields.size(); ++i)
    componentEdits_[i]->setText(s.components.*fields[i].member);
  applyModel();
}

void GenerationPanel::showComponentState() {
  askedFlag_ = model_.ok ? QString() : flagAskedFor(model_.error);
  const auto& fields = ModelComponents::fields();
  for (size_t i = 0; i < fields.size(); ++i) {
    QLineEdit* e = componentEdits_[i];
    const bool asked = askedFlag_ == QLatin1String(fields[i].flag);
    e->setProperty("invalid", asked);
    e->setToolTip(asked ? model_.error : e->placeholderText());
    e->style()->unpolish(e);
    e->style()->polish(e);
  }
  // Offered (and opened) when the model needs them (a component missing, a single file) or has
  // them; a complete diffusers folder with none given shows no row for them.
  const bool singleFile = QFileInfo(modelDir()).isFile();
  const bool offer = !askedFlag_.isEmpty() || singleFile || !components().isEmpty();
  componentsToggle_->setVisible(offer);
  if (offer) componentsToggle_->setChecked(true);
  componentsBox_->setVisible(offer && componentsToggle_->isChecked());
}

GenerationParams GenerationPanel::params() const {
  GenerationParams p;
  p.prompt = prompt_->toPlainText().toStdString();
  p.negative_prompt = negative_->toPlainText().toStdString();
  p.width = width_->value();
  p.height = height_->value();
  p.steps = steps_->value();
  p.guidance = guidance_->value();
  // The knobs the loaded model reads (another family's would be refused as unknown; one it
  // declares as not read, greyed out, would only be a note that it is ignored).
  p.options.clear();
  for (const auto& [name, spin] : knobs_)
    if (const dit::FieldSpec* f = model_.request.field(name); f && f->read)
      p.options[name] = spin->value();
  // A text box cannot tell diffusers' negative_prompt=None from "": in the GUI a true-CFG scale
  // (the family's guider field) above its threshold runs true CFG against the negative prompt as
  // typed, empty included (the embedded model's CFG is against the empty prompt). Below it an
  // empty box is no negative prompt.
  const dit::GuiderSpec& g = model_.request.guider;
  p.negative_prompt_given = g.kind == dit::GuiderSpec::Kind::TrueCfg &&
                            dit::requestValues(p).number(g.scale_field, 1.0) > g.threshold;
  // Exact (never through a double); a malformed field keeps the default and seedError() says why.
  if (const auto seed = parseSeedText(seed_->text())) p.seed = *seed;
  p.random_seed = randomSeed_->isChecked();
  p.num_images = images_->value();
  imagePanel_->apply(p);
  refs_->apply(p);
  p.loras = loras_->loras();
  return p;
}

void GenerationPanel::setParams(const GenerationParams& p) {
  loading_ = true;
  prompt_->setPlainText(QString::fromStdString(p.prompt));
  negative_->setPlainText(QString::fromStdString(p.negative_prompt));
  width_->setValue(p.width);
  height_->setValue(p.height);
  steps_->setValue(p.steps);
  guidance_->setValue(p.guidance);
  for (const auto& [name, spin] : knobs_) {
    const dit::FieldSpec* f = model_.request.field(name);
    const auto it = p.options.find(name);
    if (it != p.options.end())
      spin->setValue(it->second);
    else if (f)
      spin->setValue(f->default_value);
  }
  seed_->setText(seedText(p.seed));
  randomSeed_->setChecked(p.random_seed);
  seed_->setEnabled(!p.random_seed);
  images_->setValue(p.num_images);
  imagePanel_->restore(p);
  refs_->restore(p);
  loras_->setLoras(p.loras);
  loading_ = false;
  snapSize(width_);
  snapSize(height_);
  Q_EMIT changed();
}

QString GenerationPanel::modelDir() const { return modelEdit_->text().trimmed(); }

void GenerationPanel::setModelDir(const QString& dir) {
  modelEdit_->setText(dir);
  applyModel();
}

void GenerationPanel::applyModel() {
  const QString previous = model_.path;
  const dit::RequestSpec previousRequest = model_.ok ? model_.request : dit::RequestSpec{};
  appliedComponents_ = components();
  model_ = readModelInfo(sources().toSources());
  showComponentState();
  imagePanel_->setCapabilities(model_.family, model_.capabilities);
  refs_->setModel(model_.family, model_.request, model_.ok ? model_.sizeMultiple() : 16);
  if (model_.ok)
    loras_->setModel(model_.family, model_.capabilities.lora_formats, model_.dims().parameters);
  applyRequestSpec();
  // A knob row the previous model did not read starts at the newly chosen model's declared
  // default (Qwen-Image's true_cfg_scale 4 after a klein model, Z-Image's shift from the folder's
  // scheduler_config.json); a value the user could set for the previous model is kept, as the
  // other fields are.
  if (model_.ok && model_.path != previous)
    for (const auto& [name, spin] : knobs_) {
      const dit::FieldSpec* f = model_.request.field(name);
      const dit::FieldSpec* was = previousRequest.field(name);
      if (f && !(was && was->read)) spin->setValue(f->default_value);
    }
  // A newly chosen model's recommended settings (e.g. the embedded model's true CFG 5 against
  // the empty prompt) over the current ones; the prompt, seed and the rest are kept.
  if (model_.ok && !model_.default_settings.isEmpty() && model_.path != previous) {
    QString problem;
    setParams(withModelDefaults(model_.default_settings, params(), &problem));
    if (!problem.isEmpty()) model_.notes << tr("default settings not applied: %1").arg(problem);
  }
  if (model_.ok) {
    modelSummary_->setText(breakablePaths(model_.summary()));
    modelSummary_->setObjectName("hint");
  } else {
    modelSummary_->setText(breakablePaths(tr("Model problem: %1").arg(model_.error)));
    modelSummary_->setObjectName("issues");
  }
  modelSummary_->style()->unpolish(modelSummary_);
  modelSummary_->style()->polish(modelSummary_);
  const int step = model_.ok ? model_.sizeMultiple() : 16;
  for (QSpinBox* b : {width_, height_}) {
    b->setSingleStep(step);
    b->setMinimum(step);
  }
  sizeHint_->clear();
  snapSize(width_);
  snapSize(height_);
  Q_EMIT modelChanged(model_.path);
  Q_EMIT changed();
}

void GenerationPanel::applyRequestSpec() {
  auto label = [this](QWidget* field) {
    return qobject_cast<QLabel*>(form_->labelForField(field));
  };
  // Every row from the model's declared request (dit::RequestSpec): enabled when the model
  // reads the field, else disabled with the reason as its tooltip.
  const dit::RequestSpec& spec = model_.request;
  const QString family = model_.family.isEmpty() ? tr("this model") : model_.family;
  auto describe = [&](QWidget* w, const char* name) {
    const dit::FieldSpec* f = spec.field(name);
    const bool read = f && f->read;
    w->setEnabled(read);
    w->setToolTip(read ? tr("%1 for %2: %3")
                             .arg(QString::fromStdString(f->diffusers_arg), family,
                                  QString::fromStdString(f->help))
                       : tr("%1 is not read by %2: %3")
                             .arg(QString::fromLatin1(name), family,
                                  f ? QString::fromStdString(f->not_read) : QString()));
    return read;
  };
  const bool guidanceIsCfg = spec.guider.kind == dit::GuiderSpec::Kind::ClassicCfg &&
                             spec.guider.scale_field == "guidance";
  describe(guidance_, "guidance");
  if (QLabel* l = label(guidance_)) l->setText(guidanceIsCfg ? tr("CFG scale") : tr("Guidance"));
  switch (spec.guider.kind) {
    case dit::GuiderSpec::Kind::TrueCfg:
      negative_->setPlaceholderText(tr("Negative prompt (used with %1 > %2)")
                                        .arg(QString::fromStdString(spec.guider.scale_field))
                                        .arg(spec.guider.threshold));
      break;
    case dit::GuiderSpec::Kind::ClassicCfg:
      negative_->setPlaceholderText(tr("Negative prompt (used when CFG runs; empty: \"\")"));
      break;
    case dit::GuiderSpec::Kind::None:
      negative_->setPlaceholderText(tr("Negative prompt (not used by %1)").arg(family));
      break;
  }
  for (const auto& [name, spin] : knobs_) {
    const dit::FieldSpec* f = spec.field(name);
    form_->setRowVisible(spin, f != nullptr);
    if (f) describe(spin, name.c_str());
    if (f && name == spec.references.auto_resize_field) refs_->setAutoResize(spin->value() != 0);
  }
}

QDoubleSpinBox* GenerationPanel::knobSpin(const QString& name) const {
  for (const auto& [n, spin] : knobs_)
    if (QString::fromStdString(n) == name) return spin;
  return nullptr;
}

QString GenerationPanel::fieldLabel(QWidget* field) const {
  const auto* l = qobject_cast<QLabel*>(form_->labelForField(field));
  return l ? l->text() : QString();
}

bool GenerationPanel::fieldShown(QWidget* field) const { return form_->isRowVisible(field); }

void GenerationPanel::snapSize(QSpinBox* box) {
  const int step = box->singleStep();
  const int v = box->value();
  if (step <= 1 || v % step == 0) return;
  const int snapped = std::max(step, (v + step / 2) / step * step);
  box->setValue(snapped);
  sizeHint_->setText(tr("%1 rounded from %2 to %3 px (a multiple of %4 = 2 × vae_scale_factor)")
                         .arg(box == width_ ? tr("Width") : tr("Height"))
                         .arg(v)
                         .arg(snapped)
                         .arg(step));
}

void GenerationPanel::setLastSeed(std::uint64_t seed) {
  lastSeed_ = seed;
  hasLastSeed_ = true;
  lastSeedLabel_->setText(tr("last seed: %1").arg(seedText(seed)));
  reuseSeed_->setEnabled(true);
}

QStringList GenerationPanel::requestIssues() const {
  QStringList out = loras_->problems();
  for (const QString& i : imagePanel_->issues() + refs_->issues())
    if (!out.contains(i)) out << i;
  return out;
}

void GenerationPanel::setPromptHistory(const QStringList& prompts) {
  promptMenu_->clear();
  for (const QString& p : prompts) {
    QString shown = p.simplified();
    if (shown.size() > 70) shown = shown.left(69) + QStringLiteral("…");
    QAction* a = promptMenu_->addAction(shown);
    a->setToolTip(p);
    a->setData(p);
    connect(a, &QAction::triggered, this, [this, p] { prompt_->setPlainText(p); });
  }
  promptHistory_->setEnabled(!prompts.isEmpty());
}

int GenerationPanel::repeatCount() const { return repeat_->value(); }

QString GenerationPanel::seedError() const {
  if (randomSeed_->isChecked()) return {};
  QString err;
  return parseSeedText(seed_->text(), &err) ? QString() : err;
}

void GenerationPanel::showPromptWarnings(const QStringList& warnings) {
  promptWarnings_ = warnings;
  QStringList lines;
  for (const QString& w : warnings) lines << QStringLiteral("⚠ ") + w;
  promptWarning_->setText(lines.join(QLatin1Char('\n')));
  promptWarning_->setToolTip(warnings.join(QLatin1Char('\n')));
  promptWarning_->setVisible(!warnings.isEmpty());
}

}  // namespace dit::ui
