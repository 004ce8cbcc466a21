// LoRA list of the generation panel (issue 13): add / remove LoRA files, a strength slider per
// LoRA (-2 .. 2 in steps of 0.05; the protocol accepts -10 .. 10) and what the file's header says
// (format, rank, modules: dit::inspectLoraFile, Torch-free). Recall ("use parameters") sets the
// list from a PNG's parameters; files that cannot be found or read stay in the list, marked, and
// are named by problems() and the warning line.
#pragma once

#include <QString>
#include <QStringList>
#include <QWidget>
#include <vector>

#include "app/protocol/protocol.h"

class QLabel;
class QPushButton;
class QSlider;
class QVBoxLayout;

namespace dit::ui {

class LoraList : public QWidget {
  Q_OBJECT
 public:
  explicit LoraList(QWidget* parent = nullptr);

  /// Appends `file` at `strength` (clamped to the slider's -2 .. 2). Reads its header; returns
  /// false (the row is kept, marked with the cause) when the file is missing or not a LoRA file.
  bool addLora(const QString& file, double strength = 1.0);
  void removeLora(int row);
  void clear();
  int count() const { return static_cast<int>(rows_.size()); }

  /// The list as the request sends it (file, strength, and the sha256 a recalled entry carried).
  std::vector<dit::protocol::LoraRequest> loras() const;
  /// Replaces the list (recall); emits changed() once.
  void setLoras(const std::vector<dit::protocol::LoraRequest>& loras);
  /// One sentence per unusable entry ("LoRA file not found: /x/y.safetensors"), empty when all
  /// files were read.
  QStringList problems() const;

  // Widgets exposed for tests.
  QSlider* strengthSlider(int row) const { return rows_.at(row).slider; }
  QLabel* infoLabel(int row) const { return rows_.at(row).info; }
  QPushButton* removeButton(int row) const { return rows_.at(row).remove; }
  QPushButton* addButton() const { return add_; }
  QLabel* warningLabel() const { return warning_; }

 Q_SIGNALS:
  void changed();

 private:
  struct Row {
    QWidget* box = nullptr;
    QString file, sha256, problem;
    QSlider* slider = nullptr;
    QLabel* value = nullptr;
    QLabel* info = nullptr;
    QPushButton* remove = nullptr;
  };
  void updateWarning();

  std::vector<Row> rows_;
  QVBoxLayout* rowsLayout_;
  QPushButton* add_;
  QLabel* warning_;
  bool loading_ = false;
};

}  // namespace dit::ui
