// Log panel: every rank's lines (mpirun stderr, `log` and `error` events, stdout noise) with a
// rank filter.
#pragma once

#include <QList>
#include <QWidget>

class QComboBox;
class QPlainTextEdit;

namespace dit::ui {

/// Append-only log view with a rank filter.
class LogPanel : public QWidget {
  Q_OBJECT
 public:
  explicit LogPanel(QWidget* parent = nullptr);
  /// rank -1: launcher (mpirun / GUI). level: "stderr", "stdout", "info", "error", ...
  void append(int rank, const QString& level, const QString& message);
  /// Ensures the filter offers ranks 0..world-1.
  void setWorld(int world);
  void clear();
  /// All stored lines as shown under "all ranks".
  QString text() const;
  int lineCount() const { return static_cast<int>(lines_.size()); }
  /// The text view (errors are scrolled into view in it).
  QPlainTextEdit* view() const { return view_; }

 private:
  struct Line {
    int rank;
    QString level;
    QString text;
  };
  QString format(const Line& l) const;
  void refilter();
  bool passes(const Line& l) const;
  QComboBox* filter_;
  QPlainTextEdit* view_;
  QList<Line> lines_;
};

}  // namespace dit::ui
