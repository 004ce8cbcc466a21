#include "ui/rank_monitor.h"

#include <QChart>
#include <QChartView>
#include <QHeaderView>
#include <QLabel>
#include <QLineSeries>
#include <QSplitter>
#include <QTableView>
#include <QVBoxLayout>
#include <QValueAxis>

#include "ui/model_info.h"

namespace dit::ui {

RankMonitor::RankMonitor(RankMonitorModel* model, QWidget* parent)
    : QWidget(parent), model_(model) {
  auto* lay = new QVBoxLayout(this);
  lay->setContentsMargins(0, 0, 0, 0);
  auto* split = new QSplitter(Qt::Vertical, this);
  table_ = new QTableView(split);
  table_->setModel(model_);
  table_->verticalHeader()->hide();
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table_->horizontalHeader()->setStretchLastSection(true);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setAlternatingRowColors(true);
  QFont tf = table_->font();  // a compact table: every column fits a 1024 px wide window
  tf.setPointSizeF(std::max(7.0, tf.pointSizeF() - 1));
  table_->setFont(tf);
  table_->horizontalHeader()->setFont(tf);
  table_->verticalHeader()->setDefaultSectionSize(QFontMetrics(tf).height() + 6);
  table_->setMinimumHeight(table_->fontMetrics().height() * 4);

  chart_ = new QChart;
  chart_->setTheme(QChart::ChartThemeDark);
  chart_->setBackgroundBrush(QColor(0x16, 0x18, 0x1b));
  chart_->setTitle(tr("Host memory (RSS) per rank; dashed: device memory"));
  chart_->legend()->setAlignment(Qt::AlignBottom);
  chart_->setMargins(QMargins(4, 4, 4, 4));
  axisX_ = new QValueAxis(chart_);
  axisX_->setTitleText(tr("seconds"));
  axisX_->setLabelFormat("%.0f");
  axisX_->setRange(0, 10);
  axisY_ = new QValueAxis(chart_);
  axisY_->setLabelFormat("%.0f");
  axisY_->setRange(0, 1);
  chart_->addAxis(axisX_, Qt::AlignBottom);
  chart_->addAxis(axisY_, Qt::AlignLeft);
  QFont small = chart_->font();
  small.setPointSizeF(std::max(6.5, small.pointSizeF() - 2));
  for (QValueAxis* a : {axisX_, axisY_}) {
    a->setLabelsFont(small);
    a->setTitleFont(small);
    a->setTickCount(5);
  }
  axisY_->setTitleText(tr("MiB"));
  chart_->legend()->setFont(small);
  QFont titleFont = small;
  titleFont.setBold(true);
  chart_->setTitleFont(titleFont);
  chartView_ = new QChartView(chart_, split);
  chartView_->setRenderHint(QPainter::Antialiasing);
  chartView_->setMinimumHeight(140);
  split->addWidget(table_);
  split->addWidget(chartView_);
  split->setStretchFactor(0, 1);
  split->setStretchFactor(1, 2);
  lay->addWidget(split, 1);
  totals_ = new QLabel(this);
  totals_->setObjectName("hint");
  lay->addWidget(totals_);

  connect(model_, &QAbstractItemModel::modelReset, this, [this] { rebuildSeries(); });
  connect(model_, &QAbstractItemModel::rowsInserted, this, [this] { rebuildSeries(); });
  connect(model_, &RankMonitorModel::samplesAdded, this, &RankMonitor::appendSamples);
}

void RankMonitor::setDevice(const QString& device) {
  if (device == device_) return;
  device_ = device;
  rebuildSeries();
}

int RankMonitor::seriesCount() const { return static_cast<int>(chart_->series().size()); }

void RankMonitor::rebuildSeries() {
  chart_->removeAllSeries();
  rss_.clear();
  dev_.clear();
  maxY_ = 1;
  const int n = model_->world();
  for (int r = 0; r < n; ++r) {
    auto* s = new QLineSeries(chart_);
    s->setName(n > 8 ? QString() : tr("rank %1 RSS").arg(r));
    chart_->addSeries(s);
    s->attachAxis(axisX_);
    s->attachAxis(axisY_);
    rss_ << s;
    if (device_ == "cuda") {
      auto* d = new QLineSeries(chart_);
      d->setName(n > 8 ? QString() : tr("rank %1 device").arg(r));
      QPen pen = d->pen();
      pen.setStyle(Qt::DashLine);
      d->setPen(pen);
      chart_->addSeries(d);
      d->attachAxis(axisX_);
      d->attachAxis(axisY_);
      dev_ << d;
    }
  }
  chart_->legend()->setVisible(n <= 8);
  // Replay what the model already holds.
  double tmax = 10;
  for (int r = 0; r < n; ++r) {
    for (const auto& smp : model_->samples(r)) {
      rss_[r]->append(smp.t, smp.rss / 1048576.0);
      maxY_ = std::max(maxY_, smp.rss / 1048576.0);
      if (r < dev_.size()) {
        dev_[r]->append(smp.t, smp.dev / 1048576.0);
        maxY_ = std::max(maxY_, smp.dev / 1048576.0);
      }
      tmax = std::max(tmax, smp.t);
    }
  }
  axisX_->setRange(0, tmax);
  axisX_->applyNiceNumbers();
  axisY_->setRange(0, maxY_ * 1.1);
  axisY_->applyNiceNumbers();
  axisY_->setLabelFormat(axisY_->max() < 10 ? "%.1f"
                                            : "%.0f");  // no repeated labels on small ranges
}

void RankMonitor::appendSamples(double t) {
  if (rss_.size() != model_->world()) rebuildSeries();
  for (int r = 0; r < rss_.size(); ++r) {
    const auto& s = model_->samples(r);
    if (s.isEmpty() || s.last().t != t) continue;
    const double rss = s.last().rss / 1048576.0;
    rss_[r]->append(t, rss);
    maxY_ = std::max(maxY_, rss);
    if (r < dev_.size()) {
      const double dev = s.last().dev / 1048576.0;
      dev_[r]->append(t, dev);
      maxY_ = std::max(maxY_, dev);
    }
  }
  axisX_->setRange(0, std::max(10.0, t));
  axisX_->applyNiceNumbers();
  axisY_->setRange(0, maxY_ * 1.1);
  axisY_->applyNiceNumbers();
  axisY_->setLabelFormat(axisY_->max() < 10 ? "%.1f"
                                            : "%.0f");  // no repeated labels on small ranges
  totals_->setText(tr("sent by all ranks: %1").arg(formatBytes(model_->totalBytesSent())));
}

}  // namespace dit::ui
