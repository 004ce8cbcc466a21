// Per-rank monitor: a table (pid, stage, step, ms/step, host RSS and device memory current/peak,
// bytes sent) and a QtCharts line chart of each rank's memory over time.
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
  /// Device memory series are drawn when `device` is "cuda".
  void setDevice(const QString& device);
  QTableView* table() const { return table_; }
  /// The memory chart (the window shows it in a tab of its own; it is this widget's until then).
  QChartView* chartView() const { return chartView_; }
  /// Number of series currently in the chart.
  int seriesCount() const;

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
  QList<QLineSeries*> rss_;
  QList<QLineSeries*> dev_;
  QString device_ = QStringLiteral("cpu");
  double maxY_ = 1;
};

}  // namespace dit::ui
