// The mouse wheel scrolls the panel, not the field under the pointer: spin boxes, sliders and
// combo boxes take the wheel only when they have the keyboard focus (a click or Tab gives it;
// their focus policy is Qt::StrongFocus, so the wheel itself never does). Without focus the
// wheel scrolls the nearest scroll area around them instead.
#pragma once

#include <QObject>

class QWidget;

namespace dit::ui {

/// The application-wide event filter behind installWheelGuard().
class WheelGuard : public QObject {
  Q_OBJECT
 public:
  using QObject::QObject;
  /// Whether `w` is a field the guard holds the wheel back from (a spin box, a slider that is
  /// not a scroll bar, a combo box).
  static bool guards(const QWidget* w);

 protected:
  bool eventFilter(QObject* watched, QEvent* event) override;
};

/// Installs one WheelGuard on the application (again: nothing). Idempotent; the guard lives as
/// long as the application.
void installWheelGuard();

}  // namespace dit::ui
