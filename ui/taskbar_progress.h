// Progress on the taskbar / dock where the platform offers it. On Linux that is the Unity
// LauncherEntry D-Bus signal (com.canonical.Unity.LauncherEntry.Update on the session bus), which
// KDE Plasma's task manager, GNOME's Dash to Dock / Ubuntu Dock and other docks read for the
// application's desktop file (application://ditstudio.desktop): a progress bar and the number of
// queued requests on the window's icon. Built without QtDBus, or with no session bus, it does
// nothing (the window title carries the progress everywhere).
#pragma once

#include <QObject>
#include <QString>

namespace dit::ui {

class TaskbarProgress : public QObject {
  Q_OBJECT
 public:
  explicit TaskbarProgress(QObject* parent = nullptr);
  ~TaskbarProgress() override;

  /// Whether this build can signal progress (QtDBus was found).
  static bool supported();
  /// Sends to the D-Bus bus at `address` instead of the session bus (tests use a private bus).
  /// Returns whether it is connected.
  bool setBusAddress(const QString& address);
  /// Whether a bus is connected (signals go out).
  bool connected() const;
  /// The desktop file's URI the signal names.
  static QString appUri() { return QStringLiteral("application://ditstudio.desktop"); }
  /// The object path the signal is sent from.
  static QString objectPath();

  /// `fraction` 0 .. 1 shows the bar (rounded to whole percent); < 0 hides it. `queued` > 0
  /// shows that count on the icon. Sends only what changed.
  void setProgress(double fraction, int queued = 0);
  double progress() const { return progress_; }
  bool progressVisible() const { return visible_; }
  int queued() const { return queued_; }
  /// Signals sent so far.
  int sentCount() const { return sent_; }

 private:
  void send();
  QString connectionName_;
  double progress_ = 0;
  bool visible_ = false;
  int queued_ = 0;
  int sent_ = 0;
  bool haveState_ = false;
};

}  // namespace dit::ui
