#include "ui/strategy_json.h"

#include <QStringList>

#include "app/protocol/protocol.h"
#include "ui/json_io.h"

namespace dit::ui {

QJsonObject strategyToJson(const dit::Strategy& s) {
  return toQJsonObject(dit::protocol::strategyToJson(s));
}

dit::Strategy strategyFromJson(const QJsonObject& j) {
  return dit::protocol::strategyFromJson(toNlohmann(j));
}

bool sameStrategy(const dit::Strategy& a, const dit::Strategy& b) {
  return a.world == b.world && a.tp_degree == b.tp_degree && a.ring_degree == b.ring_degree &&
         a.ulysses_degree == b.ulysses_degree && a.cfg_degree == b.cfg_degree &&
         a.dp_degree == b.dp_degree && a.ulysses_anything == b.ulysses_anything &&
         a.ring_anything == b.ring_anything && a.device == b.device;
}

QString strategyText(const dit::Strategy& s) {
  QStringList parts;
  if (s.dp_degree > 1) parts << QStringLiteral("dp %1").arg(s.dp_degree);
  if (s.cfg_degree > 1) parts << QStringLiteral("cfg %1").arg(s.cfg_degree);
  if (s.ring_degree > 1)
    parts
        << QStringLiteral("ring %1%2").arg(s.ring_degree).arg(s.ring_anything ? " (anything)" : "");
  if (s.ulysses_degree > 1)
    parts << QStringLiteral("ulysses %1%2")
                 .arg(s.ulysses_degree)
                 .arg(s.ulysses_anything ? " (anything)" : "");
  if (s.tp_degree > 1) parts << QStringLiteral("tp %1").arg(s.tp_degree);
  const QString head = QStringLiteral("%1 rank%2 (%3)")
                           .arg(s.world)
                           .arg(s.world == 1 ? "" : "s")
                           .arg(QString::fromStdString(s.device));
  return parts.isEmpty() ? head + QStringLiteral(": replicated") : head + ": " + parts.join(" x ");
}

}  // namespace dit::ui
