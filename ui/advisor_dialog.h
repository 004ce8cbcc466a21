// Advisor dialog: inputs of adviseStrategy() (prefilled from the chosen model and request) and
// its recommendation, updated live; "Apply" hands the strategy to the editor.
#pragma once

#include <QDialog>

#include "ui/advisor.h"

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QLabel;
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

 Q_SIGNALS:
  void applyRequested(const dit::Strategy& strategy);

 private:
  void recompute();
  Advice advice_;
  AdvisorInput base_;
  QDoubleSpinBox* transformerB_;
  QDoubleSpinBox* otherB_;
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
