// Per-rank figures for the monitor: a table model (one row per rank) that also keeps the memory
// time series drawn by the chart. Fed from WorkerController's `hello` and `ranks` events.
#pragma once

#include <QAbstractTableModel>
#include <QList>
#include <QMap>
#include <QString>

#include "ui/event_parser.h"

namespace dit::ui {

/// Table model of the process group's ranks.
class RankMonitorModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column {
    Rank,
    Pid,
    Place,
    Stage,
    Step,
    StepMs,
    Rss,
    RssPeak,
    Dev,
    DevPeak,
    Sent,
    ColumnCount
  };
  /// One point of the memory series: t in seconds since the group started, bytes.
  struct Sample {
    double t = 0;
    qint64 rss = 0;
    qint64 dev = 0;
  };

  explicit RankMonitorModel(QObject* parent = nullptr);

  /// Clears everything and shows `world` empty rows.
  void reset(int world);
  void setPid(int rank, qint64 pid);
  /// Host name and device ("cpu", "cuda:1") of a rank, shown as "host · device".
  void setPlace(int rank, const QString& host, const QString& device);
  /// The place shown: "host · device", plus " · BLAS CORE" where the rank's BLAS core differs
  /// from rank 0's (issue 36: a remote rank on a slower kernel).
  QString place(int rank) const;
  /// The BLAS kernel a rank runs, from its `hello` event: `core` (e.g. "SkylakeX") and `summary`
  /// (library, core, selection, thread policy), shown in the Place column's tooltip.
  void setBlas(int rank, const QString& core, const QString& summary);
  QString blasCore(int rank) const;
  /// Sets every rank's stage (not the failed ones), e.g. "stopped" once the group has exited,
  /// "exited" or "unknown" once another rank died, "idle" between requests. ms/step keeps the
  /// last measured step's time (its tooltip says so). `clearSteps`: the step column is cleared.
  void setStageAll(const QString& stage, bool clearSteps = true);
  /// Applies a `ranks` event taken at `t` seconds. A rank's ms/step keeps the last measured
  /// step's time while the event reports none (the worker's events after loading and after each
  /// request say 0).
  void update(const QList<RankStats>& ranks, double t);
  /// Whether a rank has a device to report: its place names one ("cuda:0"), or its events carry
  /// device memory (dev or dev_peak above 0). CPU ranks report 0.
  bool hasDevice(int rank) const;
  /// Marks a rank as failed (red row, stage "failed: why").
  void markFailed(int rank, const QString& why);
  int world() const { return static_cast<int>(rows_.size()); }
  RankStats stats(int rank) const;
  qint64 pid(int rank) const;
  bool failed(int rank) const;
  const QList<Sample>& samples(int rank) const;
  /// Sum of the ranks' bytes_sent.
  qint64 totalBytesSent() const;

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  QVariant headerData(int section, Qt::Orientation o, int role) const override;

 Q_SIGNALS:
  /// New samples were appended (t of the newest one).
  void samplesAdded(double t);
  /// A rank was found to have a device (its first device memory figure, or its place).
  void deviceFound(int rank);

 private:
  struct Row {
    RankStats stats;
    qint64 pid = -1;
    QString host, device;
    QString blasCore, blasSummary;
    bool failed = false;
    bool sawDevice = false;  ///< an event carried device memory
    QString failure;
    QList<Sample> samples;
  };
  void ensure(int rank);
  QList<Row> rows_;
};

}  // namespace dit::ui
