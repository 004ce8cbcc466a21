#include "ui/wheel_guard.h"

#include <QAbstractScrollArea>
#include <QAbstractSlider>
#include <QAbstractSpinBox>
#include <QApplication>
#include <QComboBox>
#include <QEvent>
#include <QScrollBar>
#include <QWheelEvent>

namespace dit::ui {

bool WheelGuard::guards(const QWidget* w) {
  if (!w) return false;
  if (qobject_cast<const QAbstractSpinBox*>(w) || qobject_cast<const QComboBox*>(w)) return true;
  return qobject_cast<const QAbstractSlider*>(w) && !qobject_cast<const QScrollBar*>(w);
}

bool WheelGuard::eventFilter(QObject* watched, QEvent* event) {
  if (event->type() != QEvent::Wheel && event->type() != QEvent::Polish)
    return QObject::eventFilter(watched, event);
  auto* w = qobject_cast<QWidget*>(watched);
  if (!w || !guards(w)) return QObject::eventFilter(watched, event);
  if (event->type() == QEvent::Polish) {
    // Qt::WheelFocus (the spin boxes' default) would give them the focus on the wheel itself.
    if (w->focusPolicy() == Qt::WheelFocus) w->setFocusPolicy(Qt::StrongFocus);
    return QObject::eventFilter(watched, event);
  }
  if (w->hasFocus()) return QObject::eventFilter(watched, event);
  // Not for this field: the scroll area around it scrolls (through its viewport, as a wheel
  // over the panel's background would), and the field never sees the event.
  for (QWidget* p = w->parentWidget(); p; p = p->parentWidget()) {
    auto* area = qobject_cast<QAbstractScrollArea*>(p);
    if (!area) continue;
    const auto* we = static_cast<QWheelEvent*>(event);
    QWidget* vp = area->viewport();
    QWheelEvent copy(vp->mapFromGlobal(we->globalPosition()), we->globalPosition(),
                     we->pixelDelta(), we->angleDelta(), we->buttons(), we->modifiers(),
                     we->phase(), we->inverted(), we->source(), we->pointingDevice());
    QCoreApplication::sendEvent(vp, &copy);
    break;
  }
  event->accept();  // handled: QApplication hands it to no other parent
  return true;
}

void installWheelGuard() {
  if (!qApp || qApp->findChild<WheelGuard*>(QString(), Qt::FindDirectChildrenOnly)) return;
  qApp->installEventFilter(new WheelGuard(qApp));
}

}  // namespace dit::ui
