// Advisor dialog: inputs of adviseStrategy() (prefilled from the chosen model and request) and
// its recommendation, updated live; "Plan for me" runs the placement planner
// (backend/models/placement_planner.h) on the same inputs and shows where each component lives,
// the memory per rank and the reasons; "Apply" hands the strategy shown to the editor (and, for a
// plan, asks the window to save it as a preset).
#pragma once

#include <QDialog>
#include <QStringList>
#include <functional>

#include "backend/models/placement_planner.h"
#include "ui/advisor.h"

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QPushButton;
class QSpinBox;
class QTextBrowser;

namespace dit::ui {

/// Non-modal dialog around adviseStrategy().
class AdvisorDialog : public QDialog {
  Q_OBJECT
 public:
  explicit AdvisorDialog(QWidget* parent = nullptr);
  /// Prefills the model/request inputs.
  void setInput(const AdvisorInput& in);
  AdvisorInput input() const;
  Advice advice() const { return advice_; }
  /// What the editor would say against a strategy (the window's validation at the current model,
  /// resolution and request, and this build/machine). The advice is checked with it: Apply is
  /// enabled only for a strategy the editor accepts, otherwise the reasons are shown.
  void setChecker(std::function<QStringList(const dit::Strategy&)> check);
  /// The checker's issues with the current advice (empty: Apply hands over a valid strategy).
  QStringList issues() const { return issues_; }
  QPushButton* applyButton() const { return apply_; }
  QPushButton* planButton() const { return planButton_; }
  /// Runs the placement planner on the dialog's inputs (the chosen known model with its text
  /// encoders' own sharding, or the loaded model with its other parameters whole on every rank;
  /// the devices and their memory; CPU ranks for the CPU interconnect) and shows the plan; while
  /// shown (until an input changes) Apply hands over the plan's strategy, when it fits.
  void planForMe();
  /// A plan is shown (planForMe ran and no input changed since).
  bool hasPlan() const { return planned_; }
  const dit::Plan& plan() const { return plan_; }

 Q_SIGNALS:
  void applyRequested(const dit::Strategy& strategy);
  /// Apply with a plan shown that fits (after applyRequested with its strategy): the window
  /// saves a preset that records the plan and its reasons (ui/preset_plan.h).
  void planApplied(const dit::Plan& plan);

 private:
  void recompute();
  void showPlan();
  Advice advice_;
  dit::Plan plan_;
  bool planned_ = false;
  QPushButton* planButton_ = nullptr;
  QStringList issues_;
  std::function<QStringList(const dit::Strategy&)> check_;
  QPushButton* apply_ = nullptr;
  AdvisorInput base_;
  AdvisorInput loaded_;  ///< what setInput() gave ("Loaded model")
  QDoubleSpinBox* transformerB_;
  QDoubleSpinBox* otherB_;
  QComboBox* model_;
  QComboBox* dtype_;
  QSpinBox* devices_;
  QDoubleSpinBox* memory_;
  QComboBox* interconnect_;
  QSpinBox* width_;
  QSpinBox* height_;
  QCheckBox* trueCfg_;
  QSpinBox* images_;
  QTextBrowser* result_;
  bool loading_ = false;
};

}  // namespace dit::ui
