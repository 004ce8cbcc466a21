#include "ui/preset_panel.h"

#include <QCheckBox>
#include <QColor>
#include <QFileDialog>
#include <QGridLayout>
#include <QInputDialog>
#include <QLabel>
#include <QListWidget>
#include <QMessageBox>
#include <QPushButton>
#include <QVBoxLayout>

#include "ui/strategy_json.h"

namespace dit::ui {

PresetPanel::PresetPanel(PresetStore* store, std::function<Preset()> current, QWidget* parent)
    : QWidget(parent), store_(store), current_(std::move(current)) {
  auto* lay = new QVBoxLayout(this);
  list_ = new QListWidget(this);
  lay->addWidget(list_, 1);
  description_ = new QLabel(this);
  description_->setObjectName("hint");
  description_->setWordWrap(true);
  lay->addWidget(description_);
  error_ = new QLabel(this);
  error_->setObjectName("issues");
  error_->setWordWrap(true);
  error_->hide();
  lay->addWidget(error_);
  applyGeneration_ = new QCheckBox(tr("Also load its model, prompt and generation settings"), this);
  applyGeneration_->setObjectName("applyGeneration");
  applyGeneration_->setToolTip(
      tr("Off: Load sets the strategy only; your model, prompt, size, steps and seed stay as "
         "they are"));
  lay->addWidget(applyGeneration_);
  auto* grid = new QGridLayout;
  load_ = new QPushButton(tr("Load"), this);
  auto* save = new QPushButton(tr("Save current…"), this);
  rename_ = new QPushButton(tr("Rename…"), this);
  delete_ = new QPushButton(tr("Delete"), this);
  auto* import = new QPushButton(tr("Import…"), this);
  export_ = new QPushButton(tr("Export…"), this);
  grid->addWidget(load_, 0, 0);
  grid->addWidget(save, 0, 1);
  grid->addWidget(rename_, 1, 0);
  grid->addWidget(delete_, 1, 1);
  grid->addWidget(import, 2, 0);
  grid->addWidget(export_, 2, 1);
  lay->addLayout(grid);

  connect(list_, &QListWidget::currentRowChanged, this, [this] { updateButtons(); });
  connect(list_, &QListWidget::itemDoubleClicked, this, [this] { load_->click(); });
  connect(load_, &QPushButton::clicked, this, [this] {
    if (auto p = store_->find(selectedName())) Q_EMIT applyRequested(*p);
  });
  connect(save, &QPushButton::clicked, this, [this] {
    bool ok = false;
    const QString suggestion = store_->isBuiltin(selectedName()) || selectedName().isEmpty()
                                   ? store_->uniqueName(tr("My preset"))
                                   : selectedName();
    const QString name = QInputDialog::getText(this, tr("Save preset"), tr("Name:"),
                                               QLineEdit::Normal, suggestion, &ok);
    if (!ok || name.trimmed().isEmpty()) return;
    if (store_->find(name.trimmed()) && !store_->isBuiltin(name.trimmed()) &&
        QMessageBox::question(this, tr("Save preset"), tr("Replace \"%1\"?").arg(name.trimmed())) !=
            QMessageBox::Yes)
      return;
    saveCurrentAs(name);
  });
  connect(rename_, &QPushButton::clicked, this, [this] {
    bool ok = false;
    const QString name = QInputDialog::getText(this, tr("Rename preset"), tr("New name:"),
                                               QLineEdit::Normal, selectedName(), &ok);
    if (ok) renameSelected(name);
  });
  connect(delete_, &QPushButton::clicked, this, [this] {
    if (QMessageBox::question(this, tr("Delete preset"),
                              tr("Delete \"%1\"?").arg(selectedName())) == QMessageBox::Yes)
      deleteSelected();
  });
  connect(import, &QPushButton::clicked, this, [this] {
    const QString f =
        QFileDialog::getOpenFileName(this, tr("Import presets"), QString(), tr("Presets (*.json)"));
    if (!f.isEmpty()) importFile(f);
  });
  connect(export_, &QPushButton::clicked, this, [this] {
    const QString f = QFileDialog::getSaveFileName(
        this, tr("Export preset"), selectedName() + ".json", tr("Presets (*.json)"));
    if (!f.isEmpty()) exportSelected(f);
  });
  refresh();
}

void PresetPanel::refresh(const QString& selectName) {
  const QString keep = selectName.isEmpty() ? selectedName() : selectName;
  list_->clear();
  for (const Preset& p : store_->presets()) {
    auto* item =
        new QListWidgetItem(p.builtin ? QStringLiteral("◆ %1").arg(p.name) : p.name, list_);
    item->setData(Qt::UserRole, p.name);
    const QStringList issues = check_ ? check_(p) : QStringList();
    item->setToolTip(
        QStringLiteral("%1\n%2%3%4")
            .arg(p.builtin ? tr("built-in (read-only)") : tr("user preset"))
            .arg(strategyText(p.strategy))
            .arg(p.description.isEmpty() ? QString() : "\n" + p.description)
            .arg(issues.isEmpty()
                     ? QString()
                     : "\n" + tr("Cannot run here: %1").arg(issues.join(QStringLiteral("; ")))));
    if (!issues.isEmpty()) {
      item->setText(QStringLiteral("✕ ") + item->text());
      item->setForeground(QColor(0x8a, 0x8f, 0x98));
    }
  }
  select(keep);
  updateButtons();
}

QString PresetPanel::selectedName() const {
  const QListWidgetItem* it = list_->currentItem();
  return it ? it->data(Qt::UserRole).toString() : QString();
}

void PresetPanel::select(const QString& name) {
  for (int i = 0; i < list_->count(); ++i) {
    if (list_->item(i)->data(Qt::UserRole).toString() == name) {
      list_->setCurrentRow(i);
      return;
    }
  }
}

void PresetPanel::updateButtons() {
  const QString n = selectedName();
  const bool has = !n.isEmpty();
  const bool user = has && !store_->isBuiltin(n);
  load_->setEnabled(has);
  rename_->setEnabled(user);
  delete_->setEnabled(user);
  export_->setEnabled(has);
  if (auto p = store_->find(n)) {
    const QStringList issues = check_ ? check_(*p) : QStringList();
    description_->setText(
        strategyText(p->strategy) + (p->description.isEmpty() ? QString() : "\n" + p->description) +
        (issues.isEmpty()
             ? QString()
             : "\n" + tr("Cannot run here: %1").arg(issues.join(QStringLiteral("; ")))));
  } else
    description_->clear();
}

bool PresetPanel::applyGeneration() const { return applyGeneration_->isChecked(); }

void PresetPanel::setChecker(std::function<QStringList(const Preset&)> check) {
  check_ = std::move(check);
  refresh();
}

QStringList PresetPanel::issuesOf(const QString& name) const {
  const auto p = store_->find(name);
  return p && check_ ? check_(*p) : QStringList();
}

void PresetPanel::showError(const QString& e) {
  lastError_ = e;
  error_->setText(e);
  error_->setVisible(!e.isEmpty());
}

bool PresetPanel::saveCurrentAs(const QString& name) {
  Preset p = current_();
  p.name = name.trimmed();
  QString err;
  if (!store_->save(p, &err)) {
    showError(err);
    return false;
  }
  showError({});
  refresh(p.name);
  return true;
}

bool PresetPanel::renameSelected(const QString& to) {
  QString err;
  if (!store_->rename(selectedName(), to, &err)) {
    showError(err);
    return false;
  }
  showError({});
  refresh(to.trimmed());
  return true;
}

bool PresetPanel::deleteSelected() {
  QString err;
  if (!store_->remove(selectedName(), &err)) {
    showError(err);
    return false;
  }
  showError({});
  refresh();
  return true;
}

bool PresetPanel::importFile(const QString& path) {
  QString err;
  const QStringList added = store_->importFrom(path, &err);
  if (added.isEmpty()) {
    showError(err);
    return false;
  }
  showError({});
  refresh(added.first());
  return true;
}

bool PresetPanel::exportSelected(const QString& path) {
  QString err;
  if (!store_->exportTo(path, {selectedName()}, &err)) {
    showError(err);
    return false;
  }
  showError({});
  return true;
}

}  // namespace dit::ui
