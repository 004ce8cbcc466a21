#include "ui/advisor_dialog.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDialogButtonBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QPushButton>
#include <QSpinBox>
#include <QTextBrowser>
#include <QVBoxLayout>
#include <cmath>
#include <exception>

namespace dit::ui {

AdvisorDialog::AdvisorDialog(QWidget* parent) : QDialog(parent) {
  setWindowTitle(tr("Strategy advisor"));
  auto* lay = new QHBoxLayout(this);
  auto* form = new QFormLayout;
  // The loaded model (what setInput() gives), or a known model by name (weights not needed).
  model_ = new QComboBox(this);
  model_->addItem(tr("Loaded model"), -1);
  const std::vector<KnownModel> known = knownModels();
  for (size_t i = 0; i < known.size(); ++i) model_->addItem(known[i].name, static_cast<int>(i));
  model_->setToolTip(tr("Size the strategy for the loaded model or for a known model"));
  form->addRow(tr("Model"), model_);
  transformerB_ = new QDoubleSpinBox(this);
  transformerB_->setRange(0.000001, 1000);
  transformerB_->setDecimals(6);
  transformerB_->setSuffix(" B");
  // The count comes from the model's declared parameter table (the plan shards exactly those).
  transformerB_->setReadOnly(true);
  transformerB_->setButtonSymbols(QAbstractSpinBox::NoButtons);
  transformerB_->setToolTip(
      tr("The model's declared transformer parameters; its tensor-parallel plan "
         "decides which are split across tp ranks"));
  form->addRow(tr("Transformer params"), transformerB_);
  otherB_ = new QDoubleSpinBox(this);
  otherB_->setRange(0, 1000);
  otherB_->setDecimals(6);
  otherB_->setSuffix(" B");
  otherB_->setToolTip(tr("Text encoders + VAE: replicated on every rank"));
  form->addRow(tr("Other params"), otherB_);
  dtype_ = new QComboBox(this);
  dtype_->addItem("bf16 / fp16", 2.0);
  dtype_->addItem("fp32", 4.0);
  dtype_->addItem("fp8", 1.0);
  form->addRow(tr("Weights dtype"), dtype_);
  devices_ = new QSpinBox(this);
  devices_->setRange(1, 1024);
  form->addRow(tr("Devices"), devices_);
  memory_ = new QDoubleSpinBox(this);
  memory_->setRange(0.5, 4096);
  memory_->setSuffix(" GiB");
  form->addRow(tr("Memory per device"), memory_);
  interconnect_ = new QComboBox(this);
  interconnect_->addItem(tr("NVLink"), int(Interconnect::NVLink));
  interconnect_->addItem(tr("PCIe"), int(Interconnect::PCIe));
  interconnect_->addItem(tr("CPU ranks (MPI)"), int(Interconnect::CPU));
  form->addRow(tr("Interconnect"), interconnect_);
  width_ = new QSpinBox(this);
  height_ = new QSpinBox(this);
  for (QSpinBox* b : {width_, height_}) {
    b->setRange(16, 8192);
    b->setSingleStep(16);
  }
  auto* sz = new QHBoxLayout;
  sz->addWidget(width_);
  sz->addWidget(new QLabel("×", this));
  sz->addWidget(height_);
  form->addRow(tr("Resolution"), sz);
  trueCfg_ = new QCheckBox(tr("negative prompt with CFG > 1"), this);
  form->addRow(tr("True CFG"), trueCfg_);
  images_ = new QSpinBox(this);
  images_->setRange(1, 1024);
  form->addRow(tr("Images per request"), images_);
  lay->addLayout(form);

  auto* right = new QVBoxLayout;
  result_ = new QTextBrowser(this);
  result_->setMinimumWidth(380);
  right->addWidget(result_, 1);
  auto* bb = new QDialogButtonBox(this);
  planButton_ = bb->addButton(tr("Plan for me"), QDialogButtonBox::ActionRole);
  planButton_->setToolTip(
      tr("Place each component (transformer, text encoder, VAE) on these devices: every strategy "
         "the model's rules allow, sized by the memory model, the fastest that fits, with the "
         "reasons and the rejected alternatives"));
  auto* apply = bb->addButton(tr("Apply to editor"), QDialogButtonBox::AcceptRole);
  apply_ = apply;
  bb->addButton(QDialogButtonBox::Close);
  right->addWidget(bb);
  lay->addLayout(right, 1);
  connect(apply, &QPushButton::clicked, this, [this] {
    if (!issues_.isEmpty()) return;
    if (planned_) {
      if (plan_.fits) {
        Q_EMIT applyRequested(plan_.strategy);
        Q_EMIT planApplied(plan_);
      }
    } else {
      Q_EMIT applyRequested(advice_.strategy);
    }
  });
  connect(planButton_, &QPushButton::clicked, this, [this] { planForMe(); });
  connect(bb, &QDialogButtonBox::rejected, this, &QDialog::reject);

  for (QDoubleSpinBox* b : {transformerB_, otherB_, memory_})
    connect(b, &QDoubleSpinBox::valueChanged, this, [this] { recompute(); });
  for (QSpinBox* b : {devices_, width_, height_, images_})
    connect(b, &QSpinBox::valueChanged, this, [this] { recompute(); });
  connect(dtype_, &QComboBox::currentIndexChanged, this, [this] { recompute(); });
  connect(interconnect_, &QComboBox::currentIndexChanged, this, [this] { recompute(); });
  connect(trueCfg_, &QCheckBox::toggled, this, [this] { recompute(); });
  connect(model_, &QComboBox::currentIndexChanged, this, [this] {
    const int k = model_->currentData().toInt();
    AdvisorInput in = input();
    if (k < 0) {
      in.transformer = loaded_.transformer;
      in.other_params = loaded_.other_params;
    } else {
      const KnownModel m = knownModels().at(static_cast<size_t>(k));
      in.transformer = m.transformer;
      in.other_params = m.other_params;
      in.text_len = m.text_len;
    }
    const bool wasLoading = loading_;
    loading_ = true;
    base_ = in;
    transformerB_->setValue(transformerParameters(in) / 1e9);
    otherB_->setValue(in.other_params / 1e9);
    loading_ = wasLoading;
    recompute();
  });
  setInput(AdvisorInput{});
}

void AdvisorDialog::setInput(const AdvisorInput& in) {
  loading_ = true;
  base_ = in;
  loaded_ = in;
  model_->setCurrentIndex(0);
  transformerB_->setValue(transformerParameters(in) / 1e9);
  otherB_->setValue(in.other_params / 1e9);
  dtype_->setCurrentIndex(in.bytes_per_param >= 4 ? 1 : in.bytes_per_param <= 1 ? 2 : 0);
  devices_->setValue(in.num_devices);
  memory_->setValue(in.memory_gib_per_device);
  interconnect_->setCurrentIndex(interconnect_->findData(int(in.interconnect)));
  width_->setValue(in.width);
  height_->setValue(in.height);
  trueCfg_->setChecked(in.true_cfg);
  images_->setValue(in.images_per_request);
  loading_ = false;
  recompute();
}

AdvisorInput AdvisorDialog::input() const {
  AdvisorInput in = base_;
  in.other_params = otherB_->value() * 1e9;
  in.bytes_per_param = dtype_->currentData().toDouble();
  in.num_devices = devices_->value();
  in.memory_gib_per_device = memory_->value();
  in.interconnect = static_cast<Interconnect>(interconnect_->currentData().toInt());
  in.width = width_->value();
  in.height = height_->value();
  in.true_cfg = trueCfg_->isChecked();
  in.images_per_request = images_->value();
  return in;
}

void AdvisorDialog::recompute() {
  if (loading_) return;
  planned_ = false;  // an input changed: the plan shown no longer describes it
  advice_ = adviseStrategy(input());
  QString html = QStringLiteral("<h3>%1</h3><ul>").arg(advice_.title.toHtmlEscaped());
  for (const QString& r : advice_.reasons) html += "<li>" + r.toHtmlEscaped() + "</li>";
  html += "</ul>";
  if (!advice_.warnings.isEmpty()) {
    html += "<p style='color:#ffb74d'><b>Warnings</b></p><ul>";
    for (const QString& w : advice_.warnings)
      html += "<li style='color:#ffb74d'>" + w.toHtmlEscaped() + "</li>";
    html += "</ul>";
  }
  html += QStringLiteral(
              "<p>Per rank: weights %1 GiB, activations %2 GiB, total about %3 GiB of %4 GiB "
              "usable%5.</p>")
              .arg(advice_.weights_gib, 0, 'f', 2)
              .arg(advice_.activations_gib, 0, 'f', 2)
              .arg(advice_.total_gib, 0, 'f', 2)
              .arg(advice_.usable_gib, 0, 'f', 1)
              .arg(advice_.fits ? QString() : QStringLiteral(" — <b>does not fit</b>"));
  issues_ = check_ ? check_(advice_.strategy) : QStringList();
  if (!issues_.isEmpty()) {
    html += QStringLiteral("<p style='color:#ff6b6b'><b>%1</b></p><ul>")
                .arg(tr("The editor would refuse this strategy with the current model, resolution "
                        "and request; Apply is disabled:")
                         .toHtmlEscaped());
    for (const QString& i : issues_)
      html += "<li style='color:#ff6b6b'>" + i.toHtmlEscaped() + "</li>";
    html += "</ul>";
  }
  apply_->setEnabled(issues_.isEmpty());
  apply_->setToolTip(issues_.isEmpty() ? tr("Hand this strategy to the strategy editor")
                                       : issues_.join('\n'));
  result_->setHtml(html);
}

void AdvisorDialog::setChecker(std::function<QStringList(const dit::Strategy&)> check) {
  check_ = std::move(check);
  recompute();
}

void AdvisorDialog::planForMe() {
  const AdvisorInput in = input();
  dit::PlannerModel model;
  try {
    if (model_->currentData().toInt() >= 0) {
      model = dit::plannerModel(dit::findKnownModel(model_->currentText().toStdString()));
    } else {
      // The loaded model as the dialog knows it: its declared transformer, the rest whole on
      // every rank (the plan's note says so).
      dit::KnownModel k;
      k.name = tr("Loaded model").toStdString();
      k.dims = in.transformer;
      k.other_parameters = in.other_params;
      k.text_len = in.text_len;
      model = dit::plannerModel(k);
    }
    dit::PlannerRanks ranks;
    ranks.count = in.num_devices;
    ranks.memory_per_rank =
        static_cast<uint64_t>(in.memory_gib_per_device * 1024.0 * 1024.0 * 1024.0);
    ranks.device = in.interconnect == Interconnect::CPU ? "cpu" : "cuda";
    dit::PlannerRequest req;
    req.width = in.width;
    req.height = in.height;
    req.text_len = in.text_len;
    req.element_bytes = static_cast<int64_t>(std::lround(in.bytes_per_param));
    req.dtype = req.element_bytes >= 4 ? "float32" : req.element_bytes <= 1 ? "fp8" : "bfloat16";
    req.true_cfg = in.true_cfg;
    plan_ = dit::planPlacement(model, ranks, req);
  } catch (const std::exception& e) {
    planned_ = false;
    result_->setHtml(QStringLiteral("<p style='color:#ff6b6b'>%1</p>")
                         .arg(QString::fromStdString(e.what()).toHtmlEscaped()));
    apply_->setEnabled(false);
    return;
  }
  planned_ = true;
  showPlan();
}

void AdvisorDialog::showPlan() {
  const auto esc = [](const std::string& s) { return QString::fromStdString(s).toHtmlEscaped(); };
  const auto bytes = [&](uint64_t b) { return esc(dit::formatBytes(b)); };
  QString html = QStringLiteral("<h3>%1</h3>")
                     .arg(plan_.fits ? tr("Plan: %1").arg(esc(plan_.strategy.describe()))
                                     : tr("Nothing fits"));
  if (!plan_.fits) html += "<p style='color:#ff6b6b'>" + esc(plan_.message) + "</p>";
  if (plan_.any_valid) {
    html += "<table cellspacing='0' cellpadding='3' border='1'><tr><th>" + tr("component") +
            "</th><th>" + tr("weights per rank") + "</th><th>" + tr("placement") + "</th></tr>";
    for (const dit::ComponentPlacement& c : plan_.components)
      html += "<tr><td>" + esc(c.component) + "</td><td>" + bytes(c.weights_per_rank) +
              "</td><td>" + esc(c.placement) + "</td></tr>";
    html += "</table>";
    const dit::MemoryEstimate& e = plan_.memory;
    html += "<p>" + tr("Per rank: weights %1 + max(activations %2 + attention %3, VAE decode %4) "
                       "= peak %5 of %6 usable")
                        .arg(bytes(e.weights), bytes(e.activations), bytes(e.attention),
                             bytes(e.vae_decode), bytes(e.peak()), bytes(plan_.usable));
    if (plan_.fits) html += tr("; headroom %1").arg(bytes(plan_.headroom));
    html += ".</p><p><b>" + tr("Why") + "</b></p><ul>";
    for (const std::string& r : plan_.reasons) html += "<li>" + esc(r) + "</li>";
    for (const dit::ComponentPlacement& c : plan_.components)
      html += "<li>" + esc(c.component) + ": " + esc(c.reason) + "</li>";
    html += "</ul>";
  }
  html += "<p><b>" + tr("Rejected") + "</b></p><ul>";
  for (const dit::PlanAlternative& a : plan_.alternatives)
    html += "<li>" + esc(a.what) + ": " + esc(a.why) + "</li>";
  html += "</ul>";
  issues_ = plan_.fits && check_ ? check_(plan_.strategy) : QStringList();
  if (!issues_.isEmpty()) {
    html += QStringLiteral("<p style='color:#ff6b6b'><b>%1</b></p><ul>")
                .arg(tr("The editor would refuse this strategy with the current model, resolution "
                        "and request; Apply is disabled:")
                         .toHtmlEscaped());
    for (const QString& i : issues_)
      html += "<li style='color:#ff6b6b'>" + i.toHtmlEscaped() + "</li>";
    html += "</ul>";
  }
  apply_->setEnabled(plan_.fits && issues_.isEmpty());
  apply_->setToolTip(!plan_.fits         ? tr("Nothing fits: no strategy to hand over")
                     : issues_.isEmpty() ? tr("Hand the plan's strategy to the strategy editor "
                                              "and save a preset that records the plan")
                                         : issues_.join('\n'));
  result_->setHtml(html);
}

}  // namespace dit::ui
