#include "ui/queue_model.h"

#include <QSet>

namespace dit::ui {

QueueModel::QueueModel(QObject* parent) : QAbstractListModel(parent) {}

QString QueueModel::rowText(const WorkerController::Request& r) {
  const QString state = r.sent
                            ? (r.step > 0 ? tr("step %1/%2").arg(r.step).arg(r.steps) : tr("sent"))
                            : tr("waiting");
  return QStringLiteral("%1  %2  %3")
      .arg(r.id, state, QString::fromStdString(r.params.prompt).left(60));
}

int QueueModel::rowOf(const QString& id) const {
  for (int i = 0; i < rows_.size(); ++i)
    if (rows_[i].id == id) return i;
  return -1;
}

QString QueueModel::idAt(int row) const {
  return row >= 0 && row < rows_.size() ? rows_[row].id : QString();
}

void QueueModel::sync(const QList<WorkerController::Request>& queue) {
  QSet<QString> keep;
  for (const auto& r : queue) keep.insert(r.id);
  for (int i = rows_.size() - 1; i >= 0; --i) {
    if (keep.contains(rows_[i].id)) continue;
    beginRemoveRows({}, i, i);
    rows_.removeAt(i);
    endRemoveRows();
  }
  // The controller only appends and removes, so the surviving rows are in queue order.
  for (int i = 0; i < queue.size(); ++i) {
    const auto& r = queue[i];
    if (i < rows_.size() && rows_[i].id == r.id) {
      if (rowText(rows_[i]) != rowText(r)) {
        rows_[i] = r;
        Q_EMIT dataChanged(index(i), index(i));
      } else {
        rows_[i] = r;
      }
      continue;
    }
    const int at = rowOf(r.id);
    if (at >= 0) {  // out of order (not expected): move it here
      beginMoveRows({}, at, at, {}, i);
      rows_.move(at, i);
      endMoveRows();
      rows_[i] = r;
      Q_EMIT dataChanged(index(i), index(i));
    } else {
      beginInsertRows({}, i, i);
      rows_.insert(i, r);
      endInsertRows();
    }
  }
}

int QueueModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}

QVariant QueueModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= rows_.size()) return {};
  const auto& r = rows_[index.row()];
  if (role == Qt::DisplayRole) return rowText(r);
  if (role == Qt::ToolTipRole) return QString::fromStdString(r.params.prompt);
  if (role == Qt::UserRole) return r.id;
  return {};
}

}  // namespace dit::ui
