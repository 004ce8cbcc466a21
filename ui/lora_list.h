// LoRA list of the generation panel (issue 13): add / remove LoRA files, a strength per LoRA (a
// spin box over the protocol's -10 .. 10 in steps of 0.05, and a slider over -2 .. 2 that keeps
// a usable width), and what the file's header says (format, rank, modules: dit::inspectLoraFile,
// Torch-free), elided to the panel's width with the whole text in the tooltip. Recall ("use
// parameters") sets the list from a PNG's parameters; files that cannot be found or read stay in
// the list, marked, and are named by problems() and the warning line. A file the chosen model
// would refuse (a kohya file for a family that reads only diffusers LoRAs, a module the model does
// not have or whose shape differs) is refused here as it is added, with the worker's words.
#pragma once

#include <QString>
#include <QStringList>
#include <QWidget>
#include <memory>
#include <vector>

#include "app/protocol/protocol.h"
#include "backend/io/lora_file.h"

class QDoubleSpinBox;
class QLabel;
class QPushButton;
class QSlider;
class QVBoxLayout;

namespace dit {
class ParameterTable;
}

namespace dit::ui {

class ElidedLabel;
class LoraBrowser;

class LoraList : public QWidget {
  Q_OBJECT
 public:
  explicit LoraList(QWidget* parent = nullptr);

  /// Appends `file` at `strength` (clamped to the protocol's -10 .. 10). Reads its header;
  /// returns false (the row is kept, marked with the cause) when the file is missing, not a
  /// LoRA file, or refused by the model set with setModel().
  bool addLora(const QString& file, double strength = 1.0);
  void removeLora(int row);
  void clear();
  int count() const { return static_cast<int>(rows_.size()); }

  /// The model the LoRAs are checked against: its family's display name, the LoRA layouts it
  /// reads (FamilyCapabilities::lora_formats) and its declared parameter table (null: module
  /// names and shapes are not checked). Rechecks every row.
  void setModel(const QString& family, const std::vector<std::string>& loraFormats,
                std::shared_ptr<const dit::ParameterTable> parameters);

  /// The list as the request sends it (file, strength, and the sha256 a recalled entry carried).
  std::vector<dit::protocol::LoraRequest> loras() const;
  /// Replaces the list (recall); emits changed() once.
  void setLoras(const std::vector<dit::protocol::LoraRequest>& loras);
  /// One sentence per unusable entry ("LoRA file not found: /x/y.safetensors", "LoRA refused:
  /// /x/y.safetensors: module '...' does not exist in this model (a LoRA for another model?)"),
  /// empty when every file can be applied.
  QStringList problems() const;
  /// The worker's refusal of a LoRA file by the model set with setModel() (its words: "LoRA
  /// refused: FILE: ..."), empty when the model takes it or none is set.
  QString refusal(const QString& file, const dit::LoraFileInfo& info) const;

  /// "Browse folder...": opens (or raises) the LoRA browser over browseFolder() and returns it.
  LoraBrowser* openBrowser();
  LoraBrowser* browser() const { return browser_; }
  /// The folder the browser lists (the window keeps it across launches).
  void setBrowseFolder(const QString& dir) { browseFolder_ = dir; }
  QString browseFolder() const { return browseFolder_; }

  // Widgets exposed for tests.
  QSlider* strengthSlider(int row) const { return rows_.at(row).slider; }
  QDoubleSpinBox* strengthSpin(int row) const { return rows_.at(row).spin; }
  QLabel* infoLabel(int row) const;
  QLabel* nameLabel(int row) const;
  QPushButton* removeButton(int row) const { return rows_.at(row).remove; }
  QPushButton* addButton() const { return add_; }
  QPushButton* browseButton() const { return browse_; }
  QLabel* warningLabel() const { return warning_; }

 Q_SIGNALS:
  void changed();
  /// The browser was pointed at another folder.
  void browseFolderChanged(const QString& dir);

 private:
  struct Row {
    QWidget* box = nullptr;
    QString file, sha256, problem, modelProblem, summary;
    bool inspected = false;
    dit::LoraFileInfo info;
    QSlider* slider = nullptr;
    QDoubleSpinBox* spin = nullptr;
    ElidedLabel* name = nullptr;
    ElidedLabel* info_label = nullptr;
    QPushButton* remove = nullptr;
  };
  /// The worker's refusal of `r` by the current model, empty when it would be applied.
  QString modelRefusal(const Row& r) const;
  void showRowState(Row& r);
  void updateWarning();

  std::vector<Row> rows_;
  QVBoxLayout* rowsLayout_;
  QPushButton* add_;
  QPushButton* browse_;
  LoraBrowser* browser_ = nullptr;
  QString browseFolder_;
  QLabel* warning_;
  bool loading_ = false;
  QString family_;
  std::vector<std::string> loraFormats_;
  bool haveModel_ = false;
  std::shared_ptr<const dit::ParameterTable> parameters_;
};

}  // namespace dit::ui
