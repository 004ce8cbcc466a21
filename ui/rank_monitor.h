// Per-rank monitor: a table (pid, stage, step, ms/step, host RSS and device memory current/peak,
// bytes sent) and a QtCharts line chart of each rank's memory over time: device memory for a rank
// that has a device (its events carry device memory, or its place names one), host RSS otherwise.
#pragma once

#include <QWidget>

#include "ui/rank_monitor_model.h"

class QChart;
class QChartView;
class QLabel;
class QLineSeries;
class QTableView;
class QValueAxis;

namespace dit::ui {

/// Shows a RankMonitorModel.
class RankMonitor : public QWidget {
  Q_OBJECT
 public:
  explicit RankMonitor(RankMonitorModel* model, QWidget* parent = nullptr);
  /// The strategy's device ("cpu", "cuda"): with a device every rank's line is its device
  /// memory, before its first figure arrives too.
  void setDevice(const QString& device);
  /// Whether rank `r`'s line plots device memory (else host RSS).
  bool plotsDevice(int rank) const;
  QTableView* table() const { return table_; }
  /// The memory chart (the window shows it in a tab of its own; it is this widget's until then).
  QChartView* chartView() const { return chartView_; }
  /// Number of series currently in the chart.
  int seriesCount() const;
  /// Rank `r`'s line: its name ("rank 0 device", "rank 0 RSS") and points (seconds, MiB).
  QString seriesName(int rank) const;
  QList<QPointF> seriesPoints(int rank) const;
  QString chartTitle() const;

 private:
  void rebuildSeries();
  void appendSamples(double t);
  RankMonitorModel* model_;
  QTableView* table_;
  QChart* chart_;
  QChartView* chartView_;
  QValueAxis* axisX_;
  QValueAxis* axisY_;
  QLabel* totals_;
  QList<QLineSeries*> series_;
  QList<bool> device_of_;  ///< per rank: whether its series plots device memory
  QString device_ = QStringLiteral("cpu");
  double maxY_ = 1;
};

}  // namespace dit::ui
