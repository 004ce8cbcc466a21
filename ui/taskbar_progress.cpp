#include "ui/taskbar_progress.h"

#include <QVariantMap>
#include <algorithm>
#include <cmath>

#ifdef DITSTUDIO_HAVE_DBUS
#include <QDBusConnection>
#include <QDBusMessage>
#endif

namespace dit::ui {

TaskbarProgress::TaskbarProgress(QObject* parent) : QObject(parent) {}

TaskbarProgress::~TaskbarProgress() {
#ifdef DITSTUDIO_HAVE_DBUS
  if (visible_ || queued_ > 0) setProgress(-1, 0);  // no bar left on the icon
  if (!connectionName_.isEmpty()) QDBusConnection::disconnectFromBus(connectionName_);
#endif
}

bool TaskbarProgress::supported() {
#ifdef DITSTUDIO_HAVE_DBUS
  return true;
#else
  return false;
#endif
}

QString TaskbarProgress::objectPath() {
  return QStringLiteral("/com/canonical/unity/launcherentry/ditstudio");
}

bool TaskbarProgress::setBusAddress(const QString& address) {
#ifdef DITSTUDIO_HAVE_DBUS
  if (!connectionName_.isEmpty()) QDBusConnection::disconnectFromBus(connectionName_);
  connectionName_ = QStringLiteral("ditstudio-taskbar-%1").arg(reinterpret_cast<quintptr>(this));
  return QDBusConnection::connectToBus(address, connectionName_).isConnected();
#else
  Q_UNUSED(address);
  return false;
#endif
}

bool TaskbarProgress::connected() const {
#ifdef DITSTUDIO_HAVE_DBUS
  return (connectionName_.isEmpty() ? QDBusConnection::sessionBus()
                                    : QDBusConnection(connectionName_))
      .isConnected();
#else
  return false;
#endif
}

void TaskbarProgress::setProgress(double fraction, int queued) {
  const bool visible = fraction >= 0;
  const double p = visible ? std::round(std::clamp(fraction, 0.0, 1.0) * 100.0) / 100.0 : 0.0;
  queued = std::max(0, queued);
  if (haveState_ && visible == visible_ && p == progress_ && queued == queued_) return;
  haveState_ = true;
  visible_ = visible;
  progress_ = p;
  queued_ = queued;
  send();
}

void TaskbarProgress::send() {
#ifdef DITSTUDIO_HAVE_DBUS
  QDBusConnection bus =
      connectionName_.isEmpty() ? QDBusConnection::sessionBus() : QDBusConnection(connectionName_);
  if (!bus.isConnected()) return;
  QDBusMessage m = QDBusMessage::createSignal(
      objectPath(), QStringLiteral("com.canonical.Unity.LauncherEntry"), QStringLiteral("Update"));
  QVariantMap props;
  props.insert(QStringLiteral("progress"), progress_);
  props.insert(QStringLiteral("progress-visible"), visible_);
  props.insert(QStringLiteral("count"), static_cast<qint64>(queued_));
  props.insert(QStringLiteral("count-visible"), queued_ > 0);
  m << appUri() << props;
  if (bus.send(m)) ++sent_;
#endif
}

}  // namespace dit::ui
