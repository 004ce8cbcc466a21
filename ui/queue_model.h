// The request queue as a list model for the window's queue view. Updated in place from
// WorkerController's queue (rows inserted, removed and changed by request id, never reset), so a
// selection survives the progress events that arrive several times a second.
#pragma once

#include <QAbstractListModel>
#include <QList>

#include "ui/worker_controller.h"

namespace dit::ui {

/// One row per queued request: "<id>  <waiting | sent | step s/n>  <prompt>"; Qt::UserRole holds
/// the request id.
class QueueModel : public QAbstractListModel {
  Q_OBJECT
 public:
  explicit QueueModel(QObject* parent = nullptr);
  /// Makes the rows equal `queue` with the fewest changes: removed ids' rows are removed, new
  /// ids inserted at their position, changed rows get dataChanged. Rows keep their identity.
  void sync(const QList<WorkerController::Request>& queue);
  /// Row of request `id`, -1 when not queued.
  int rowOf(const QString& id) const;
  QString idAt(int row) const;
  static QString rowText(const WorkerController::Request& r);

  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;

 private:
  QList<WorkerController::Request> rows_;
};

}  // namespace dit::ui
