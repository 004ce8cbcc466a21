#include "ui/rank_monitor_model.h"

#include <QBrush>
#include <QColor>

#include "ui/model_info.h"

namespace dit::ui {

RankMonitorModel::RankMonitorModel(QObject* parent) : QAbstractTableModel(parent) {}

void RankMonitorModel::reset(int world) {
  beginResetModel();
  rows_.clear();
  for (int r = 0; r < world; ++r) {
    Row row;
    row.stats.rank = r;
    rows_.append(row);
  }
  endResetModel();
}

void RankMonitorModel::ensure(int rank) {
  if (rank < rows_.size()) return;
  beginInsertRows({}, rows_.size(), rank);
  while (rows_.size() <= rank) {
    Row row;
    row.stats.rank = rows_.size();
    rows_.append(row);
  }
  endInsertRows();
}

void RankMonitorModel::setPid(int rank, qint64 pid) {
  if (rank < 0) return;
  ensure(rank);
  rows_[rank].pid = pid;
  Q_EMIT dataChanged(index(rank, 0), index(rank, ColumnCount - 1));
}

void RankMonitorModel::setPlace(int rank, const QString& host, const QString& device) {
  if (rank < 0 || rank > 4096) return;
  ensure(rank);
  const bool had = hasDevice(rank);
  rows_[rank].host = host;
  rows_[rank].device = device;
  Q_EMIT dataChanged(index(rank, Place), index(rank, Place));
  if (!had && hasDevice(rank)) Q_EMIT deviceFound(rank);
}

void RankMonitorModel::setBlas(int rank, const QString& core, const QString& summary) {
  if (rank < 0 || rank > 4096) return;
  ensure(rank);
  rows_[rank].blasCore = core;
  rows_[rank].blasSummary = summary;
  // Rank 0's core is the reference of every other row's.
  if (rank == 0)
    Q_EMIT dataChanged(index(0, Place), index(static_cast<int>(rows_.size()) - 1, Place));
  else
    Q_EMIT dataChanged(index(rank, Place), index(rank, Place));
}

QString RankMonitorModel::blasCore(int rank) const {
  return rank >= 0 && rank < rows_.size() ? rows_[rank].blasCore : QString();
}

QString RankMonitorModel::place(int rank) const {
  if (rank < 0 || rank >= rows_.size()) return {};
  const Row& r = rows_[rank];
  // The short host name (the full one is in the tooltip).
  QString host = r.host.section(QLatin1Char('.'), 0, 0);
  if (host.size() > 18) host = host.left(17) + QStringLiteral("…");
  QString p = host.isEmpty()
                  ? r.device
                  : (r.device.isEmpty() ? host : host + QStringLiteral(" · ") + r.device);
  const QString& ref = rows_[0].blasCore;
  if (rank > 0 && !r.blasCore.isEmpty() && !ref.isEmpty() &&
      r.blasCore.compare(ref, Qt::CaseInsensitive) != 0)
    p += (p.isEmpty() ? QString() : QStringLiteral(" · ")) + QStringLiteral("BLAS ") + r.blasCore;
  return p;
}

void RankMonitorModel::setStageAll(const QString& stage, bool clearSteps) {
  for (Row& r : rows_) {
    if (r.failed) continue;
    r.stats.stage = stage;  // ms/step: the last measured step's time stays
    if (clearSteps) {
      r.stats.step = 0;
      r.stats.steps = 0;
    }
  }
  if (!rows_.isEmpty()) Q_EMIT dataChanged(index(0, Stage), index(rows_.size() - 1, StepMs));
}

void RankMonitorModel::update(const QList<RankStats>& ranks, double t) {
  for (const RankStats& s : ranks) {
    if (s.rank < 0 || s.rank > 4096) continue;
    ensure(s.rank);
    Row& row = rows_[s.rank];
    const double lastStepMs = row.stats.step_ms;
    row.stats = s;
    // The events after loading and after each request carry no step time (0): the last measured
    // step's stays, so an idle group still says how fast it ran.
    if (!(s.step_ms > 0) && lastStepMs > 0) row.stats.step_ms = lastStepMs;
    const bool had = hasDevice(s.rank);
    if (s.dev > 0 || s.dev_peak > 0) row.sawDevice = true;
    if (!had && hasDevice(s.rank)) Q_EMIT deviceFound(s.rank);
    row.samples.append({t, std::max<qint64>(0, s.rss), std::max<qint64>(0, s.dev)});
    if (row.samples.size() > 2000) row.samples.removeFirst();
    Q_EMIT dataChanged(index(s.rank, 0), index(s.rank, ColumnCount - 1));
  }
  if (!ranks.isEmpty()) Q_EMIT samplesAdded(t);
}

void RankMonitorModel::markFailed(int rank, const QString& why) {
  if (rank < 0) return;
  ensure(rank);
  rows_[rank].failed = true;
  rows_[rank].failure = why;
  Q_EMIT dataChanged(index(rank, 0), index(rank, ColumnCount - 1));
}

RankStats RankMonitorModel::stats(int rank) const {
  return rank >= 0 && rank < rows_.size() ? rows_[rank].stats : RankStats{};
}

qint64 RankMonitorModel::pid(int rank) const {
  return rank >= 0 && rank < rows_.size() ? rows_[rank].pid : -1;
}

bool RankMonitorModel::hasDevice(int rank) const {
  if (rank < 0 || rank >= rows_.size()) return false;
  const Row& r = rows_[rank];
  return r.sawDevice || (!r.device.isEmpty() && !r.device.startsWith(QLatin1String("cpu")));
}

bool RankMonitorModel::failed(int rank) const {
  return rank >= 0 && rank < rows_.size() && rows_[rank].failed;
}

const QList<RankMonitorModel::Sample>& RankMonitorModel::samples(int rank) const {
  static const QList<Sample> empty;
  return rank >= 0 && rank < rows_.size() ? rows_[rank].samples : empty;
}

qint64 RankMonitorModel::totalBytesSent() const {
  qint64 n = 0;
  for (const Row& r : rows_) n += std::max<qint64>(0, r.stats.bytes_sent);
  return n;
}

int RankMonitorModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}

int RankMonitorModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : ColumnCount;
}

QVariant RankMonitorModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= rows_.size()) return {};
  const Row& row = rows_[index.row()];
  const RankStats& s = row.stats;
  auto mem = [](qint64 b) { return b < 0 ? QStringLiteral("-") : formatBytes(b); };
  if (role == Qt::DisplayRole) {
    switch (index.column()) {
      case Rank:
        return index.row();
      case Pid:
        return row.pid < 0 ? QStringLiteral("-") : QString::number(row.pid);
      case Place: {
        const QString p = place(index.row());
        return p.isEmpty() ? QStringLiteral("-") : p;
      }
      case Stage:
        return row.failed ? QStringLiteral("FAILED")
                          : (s.stage.isEmpty() ? QStringLiteral("-") : s.stage);
      case Step:
        return s.steps > 0 ? QStringLiteral("%1/%2").arg(s.step).arg(s.steps) : QStringLiteral("-");
      case StepMs:
        return s.step_ms < 0 ? QStringLiteral("-") : QString::number(s.step_ms, 'f', 1);
      case Rss:
        return mem(s.rss);
      case RssPeak:
        return mem(s.rss_peak);
      case Dev:
        return mem(s.dev);
      case DevPeak:
        return mem(s.dev_peak);
      case Sent:
        return mem(s.bytes_sent);
    }
  } else if (role == Qt::ToolTipRole && row.failed) {
    return row.failure;
  } else if (role == Qt::ToolTipRole && index.column() == StepMs && s.step_ms > 0 &&
             s.stage != QLatin1String("denoising")) {
    return tr("the last measured denoising step (nothing runs now)");
  } else if (role == Qt::ToolTipRole && index.column() == Place &&
             (!row.host.isEmpty() || !row.blasSummary.isEmpty())) {
    QString tip =
        row.host.isEmpty() ? QString() : QStringLiteral("%1 · %2").arg(row.host, row.device);
    if (!row.blasSummary.isEmpty())
      tip += (tip.isEmpty() ? QString() : QStringLiteral("\n")) + tr("BLAS: ") + row.blasSummary;
    return tip;
  } else if (role == Qt::ForegroundRole && row.failed) {
    return QBrush(QColor(0xff, 0x6b, 0x6b));
  } else if (role == Qt::TextAlignmentRole && index.column() != Stage && index.column() != Place) {
    return int(Qt::AlignRight | Qt::AlignVCenter);
  }
  return {};
}

QVariant RankMonitorModel::headerData(int section, Qt::Orientation o, int role) const {
  if (o != Qt::Horizontal || role != Qt::DisplayRole) return {};
  switch (section) {
    case Rank:
      return QStringLiteral("Rank");
    case Pid:
      return QStringLiteral("PID");
    case Place:
      return QStringLiteral("Host · device");
    case Stage:
      return QStringLiteral("Stage");
    case Step:
      return QStringLiteral("Step");
    case StepMs:
      return QStringLiteral("ms/step");
    case Rss:
      return QStringLiteral("Host RSS");
    case RssPeak:
      return QStringLiteral("RSS peak");
    case Dev:
      return QStringLiteral("Device");
    case DevPeak:
      return QStringLiteral("Dev peak");
    case Sent:
      return QStringLiteral("Sent");
  }
  return {};
}

}  // namespace dit::ui
