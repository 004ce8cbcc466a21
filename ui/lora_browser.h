// The LoRA browser: every .safetensors file under a chosen folder (subfolders too), each with
// what its own header says (format, rank, modules, size: dit::inspectLoraFile, Torch-free),
// whether the loaded model takes it (LoraList::refusal, the worker's words), and the file's own
// "__metadata__" (a trainer's ss_* keys, modelspec.*, the PEFT config of lora_adapter_metadata).
// A filter over names and metadata; "Add" (or a double click) puts the file in the LoRA list.
#pragma once

#include <QDialog>
#include <QString>
#include <QStringList>
#include <vector>

#include "backend/io/lora_file.h"

class QLabel;
class QLineEdit;
class QListWidget;
class QPushButton;
class QTableWidget;

namespace dit::ui {

class LoraList;

class LoraBrowser : public QDialog {
  Q_OBJECT
 public:
  explicit LoraBrowser(LoraList* list, QWidget* parent = nullptr);

  /// Lists the .safetensors files under `dir` (at most 2000, sorted by path) and reads each
  /// header. Returns the number of files found.
  int setFolder(const QString& dir);
  QString folder() const { return folder_; }
  /// Files listed (all, before the filter), as absolute paths.
  QStringList files() const;
  /// Shows file `row` of the list (its summary, verdict and metadata).
  void select(int row);
  /// The shown file's path ("" when none).
  QString selectedFile() const;
  /// Adds the shown file to the LoRA list at strength 1; returns what LoraList::addLora returns.
  bool addSelected();

  // Widgets exposed for tests.
  QListWidget* fileList() const { return list_; }
  QLineEdit* folderEdit() const { return folderEdit_; }
  QLineEdit* filterEdit() const { return filter_; }
  QLabel* summaryLabel() const { return summary_; }
  QTableWidget* metadataTable() const { return meta_; }
  QPushButton* addButton() const { return add_; }
  QPushButton* chooseButton() const { return choose_; }

 Q_SIGNALS:
  /// The folder changed (the window remembers it).
  void folderChanged(const QString& dir);

 private:
  struct Entry {
    QString path, error;
    bool ok = false;
    dit::LoraFileInfo info;
    qint64 size = 0;
  };
  void applyFilter();
  void showEntry(int index);

  LoraList* loras_;
  QString folder_;
  std::vector<Entry> entries_;
  int shown_ = -1;
  QLineEdit* folderEdit_;
  QPushButton* choose_;
  QLineEdit* filter_;
  QListWidget* list_;
  QLabel* summary_;
  QTableWidget* meta_;
  QPushButton* add_;
};

}  // namespace dit::ui
