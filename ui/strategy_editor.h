// Strategy editor: ranks, device, tp/ring/ulysses/cfg/dp degrees, the anything modes, an
// optional hostfile and the group's run options (text-encoder placement, prompt cache, VAE
// tiling); shows the validation messages inline and the resulting mesh as a grid of
// rank boxes; opens the advisor.
#pragma once

#include <QStringList>
#include <QWidget>

#include "app/protocol/run_options.h"
#include "parallel/strategy.h"
#include "ui/mesh_layout.h"
#include "ui/worker_command.h"

class QCheckBox;
class QComboBox;
class QLabel;
class QLineEdit;
class QPushButton;
class QSpinBox;

namespace dit::ui {

/// Paints the mesh: one box per rank labelled with its coordinates, one row per replica.
class MeshView : public QWidget {
  Q_OBJECT
 public:
  explicit MeshView(QWidget* parent = nullptr);
  void setStrategy(const dit::Strategy& s);
  const MeshLayout& layout() const { return layout_; }
  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 protected:
  void paintEvent(QPaintEvent*) override;

 private:
  int boxWidth() const;
  MeshLayout layout_;
};

/// Edits a dit::Strategy (+ hostfile). Emits changed() on every edit.
class StrategyEditor : public QWidget {
  Q_OBJECT
 public:
  explicit StrategyEditor(QWidget* parent = nullptr);

  dit::Strategy strategy() const;
  void setStrategy(const dit::Strategy& s);
  QString hostfile() const;
  void setHostfile(const QString& path);
  /// The network/ssh settings of a hostfile group (fields trimmed).
  HostSettings hostSettings() const;
  /// Shows `h` in the network/ssh fields (no changed() per field: one at the end).
  void setHostSettings(const HostSettings& h);
  /// The group's run options: text-encoder placement, prompt cache, VAE tiling.
  dit::protocol::RunOptions runOptions() const;
  /// Shows `o` in the run-option fields (one changed() at the end). A placement this editor does
  /// not list is shown as "sharded".
  void setRunOptions(const dit::protocol::RunOptions& o);
  /// Shows the messages (start-blocking ones first). Empty lists show "valid".
  void setIssues(const QStringList& startIssues, const QStringList& requestIssues);
  QString issuesText() const;
  MeshView* meshView() const { return mesh_; }

  // Widgets exposed for tests.
  QSpinBox* worldSpin() const { return world_; }
  QSpinBox* tpSpin() const { return tp_; }
  QSpinBox* ringSpin() const { return ring_; }
  QSpinBox* ulyssesSpin() const { return ulysses_; }
  QSpinBox* cfgSpin() const { return cfg_; }
  QSpinBox* dpSpin() const { return dp_; }
  QComboBox* deviceCombo() const { return device_; }
  QLineEdit* hostfileEdit() const { return hostfile_; }
  QLineEdit* networkEdit() const { return network_; }
  QLineEdit* portRangeEdit() const { return portRange_; }
  QLineEdit* sshOptionsEdit() const { return sshOptions_; }
  QLineEdit* mpirunArgsEdit() const { return mpirunArgs_; }
  QComboBox* textEncoderCombo() const { return textEncoder_; }
  QSpinBox* promptCacheSpin() const { return promptCache_; }
  QSpinBox* vaeTilingSpin() const { return vaeTiling_; }

 Q_SIGNALS:
  void changed();
  void advisorRequested();

 private:
  QSpinBox* world_;
  QComboBox* device_;
  QSpinBox* tp_;
  QSpinBox* ring_;
  QSpinBox* ulysses_;
  QSpinBox* cfg_;
  QSpinBox* dp_;
  QCheckBox* ulyssesAnything_;
  QCheckBox* ringAnything_;
  QLineEdit* hostfile_;
  QLineEdit* network_;
  QLineEdit* portRange_;
  QLineEdit* sshOptions_;
  QLineEdit* mpirunArgs_;
  QComboBox* textEncoder_;
  QSpinBox* promptCache_;
  QSpinBox* vaeTiling_;
  QLabel* issues_;
  QLabel* summary_;
  MeshView* mesh_;
  bool loading_ = false;
};

}  // namespace dit::ui
