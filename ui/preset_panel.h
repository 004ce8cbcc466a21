// Preset panel: list of built-in and user presets with load, save, rename, delete, import and
// export. The file work is PresetStore's; this widget only asks for names and paths.
#pragma once

#include <QWidget>
#include <functional>

#include "ui/preset_store.h"

class QCheckBox;
class QLabel;
class QListWidget;
class QPushButton;

namespace dit::ui {

/// Lists a PresetStore and edits it. `current` supplies the preset to save (strategy +
/// generation parameters of the window).
class PresetPanel : public QWidget {
  Q_OBJECT
 public:
  PresetPanel(PresetStore* store, std::function<Preset()> current, QWidget* parent = nullptr);

  /// Re-reads the store into the list, selecting `select` if given.
  void refresh(const QString& select = QString());
  QString selectedName() const;
  void select(const QString& name);
  QListWidget* list() const { return list_; }
  /// "Also load the prompt and generation settings" (off by default: Load applies the strategy
  /// and leaves the prompt, size, steps and seed alone).
  bool applyGeneration() const;
  QCheckBox* applyGenerationCheck() const { return applyGeneration_; }
  /// What this build/machine (and model) says against a preset, shown in the list before it is
  /// loaded: an unusable preset is marked "✕" with the reasons in its tooltip and description.
  void setChecker(std::function<QStringList(const Preset&)> check);
  /// The checker's issues for preset `name` (empty: it can run here).
  QStringList issuesOf(const QString& name) const;

  // Dialog-free operations (the buttons call these after asking); return false and show the
  // error in the panel on failure.
  bool saveCurrentAs(const QString& name);
  bool renameSelected(const QString& to);
  bool deleteSelected();
  bool importFile(const QString& path);
  bool exportSelected(const QString& path);
  QString lastError() const { return lastError_; }

 Q_SIGNALS:
  /// The user asked to load a preset into the editor and panel.
  void applyRequested(const dit::ui::Preset& preset);

 private:
  void showError(const QString& e);
  void updateButtons();
  PresetStore* store_;
  std::function<Preset()> current_;
  std::function<QStringList(const Preset&)> check_;
  QCheckBox* applyGeneration_;
  QListWidget* list_;
  QLabel* description_;
  QLabel* error_;
  QPushButton* load_;
  QPushButton* rename_;
  QPushButton* delete_;
  QPushButton* export_;
  QString lastError_;
};

}  // namespace dit::ui
