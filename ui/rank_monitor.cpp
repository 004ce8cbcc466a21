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
  chart_->setTitle(tr("Host memory (RSS) per rank"));
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
  connect(model_, &RankMonitorModel::deviceFound, this, [this] { rebuildSeries(); });
}

void RankMonitor::setDevice(const QString& device) {
  if (device == device_) return;
  device_ = device;
  rebuildSeries();
}

int RankMonitor::seriesCount() const { return static_cast<int>(chart_->series().size()); }

bool RankMonitor::plotsDevice(int rank) const {
  return model_->hasDevice(rank) || device_.startsWith(QLatin1String("cuda"));
}

QString RankMonitor::seriesName(int rank) const {
  return rank >= 0 && rank < series_.size() ? series_[rank]->name() : QString();
}

QList<QPointF> RankMonitor::seriesPoints(int rank) const {
  return rank >= 0 && rank < series_.size() ? series_[rank]->points() : QList<QPointF>();
}

QString RankMonitor::chartTitle() const { return chart_->title(); }

namespace {
double sampleMiB(const RankMonitorModel::Sample& s, bool device) {
  return static_cast<double>(device ? s.dev : s.rss) / 1048576.0;
}
}  // namespace

void RankMonitor::rebuildSeries() {
  chart_->removeAllSeries();
  series_.clear();
  device_of_.clear();
  maxY_ = 1;
  const int n = model_->world();
  int devices = 0;
  for (int r = 0; r < n; ++r) {
    // One line per rank: what bounds it, device memory where there is a device, else host RSS.
    const bool dev = plotsDevice(r);
    devices += dev;
    auto* s = new QLineSeries(chart_);
    s->setName(dev ? tr("rank %1 device").arg(r) : tr("rank %1 RSS").arg(r));
    chart_->addSeries(s);
    s->attachAxis(axisX_);
    s->attachAxis(axisY_);
    series_ << s;
    device_of_ << dev;
  }
  chart_->setTitle(devices == 0 ? tr("Host memory (RSS) per rank")
                   : devices == n
                       ? tr("Device memory per rank")
                       : tr("Memory per rank: device where there is one, else host RSS"));
  chart_->legend()->setVisible(n <= 8);
  // Replay what the model already holds.
  double tmax = 10;
  for (int r = 0; r < n; ++r) {
    QList<QPointF> pts;
    for (const auto& smp : model_->samples(r)) {
      const double v = sampleMiB(smp, device_of_[r]);
      pts.append(QPointF(smp.t, v));
      maxY_ = std::max(maxY_, v);
      tmax = std::max(tmax, smp.t);
    }
    series_[r]->replace(pts);
  }
  axisX_->setRange(0, tmax);
  axisX_->applyNiceNumbers();
  axisY_->setRange(0, maxY_ * 1.1);
  axisY_->applyNiceNumbers();
  axisY_->setLabelFormat(axisY_->max() < 10 ? "%.1f"
                                            : "%.0f");  // no repeated labels on small ranges
}

void RankMonitor::appendSamples(double t) {
  if (series_.size() != model_->world()) rebuildSeries();
  for (int r = 0; r < series_.size(); ++r) {
    const auto& s = model_->samples(r);
    if (s.isEmpty() || s.last().t != t) continue;
    // Already there when a rank's device was found in this event (the rebuild replayed it).
    if (series_[r]->count() > 0 && series_[r]->at(series_[r]->count() - 1).x() == t) continue;
    const double v = sampleMiB(s.last(), device_of_[r]);
    series_[r]->append(t, v);
    maxY_ = std::max(maxY_, v);
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
