#include "ui/strategy_json.h"

#include <QStringList>

namespace dit::ui {

QJsonObject strategyToJson(const dit::Strategy& s) {
  QJsonObject j;
  j["world"] = s.world;
  j["tp_degree"] = s.tp_degree;
  j["ring_degree"] = s.ring_degree;
  j["ulysses_degree"] = s.ulysses_degree;
  j["cfg_degree"] = s.cfg_degree;
  j["dp_degree"] = s.dp_degree;
  j["ulysses_anything"] = s.ulysses_anything;
  j["ring_anything"] = s.ring_anything;
  j["device"] = QString::fromStdString(s.device);
  return j;
}

dit::Strategy strategyFromJson(const QJsonObject& j) {
  dit::Strategy s;
  s.tp_degree = j.value("tp_degree").toInt(1);
  s.ring_degree = j.value("ring_degree").toInt(1);
  s.ulysses_degree = j.value("ulysses_degree").toInt(1);
  s.cfg_degree = j.value("cfg_degree").toInt(1);
  s.dp_degree = j.value("dp_degree").toInt(1);
  s.ulysses_anything = j.value("ulysses_anything").toBool(false);
  s.ring_anything = j.value("ring_anything").toBool(false);
  s.device = j.value("device").toString("cpu").toStdString();
  const int product = s.tp_degree * s.ring_degree * s.ulysses_degree * s.cfg_degree * s.dp_degree;
  if (j.contains("world")) s.world = j.value("world").toInt(product);
  else if (j.contains("ranks")) s.world = j.value("ranks").toInt(product);
  else if (j.contains("np")) s.world = j.value("np").toInt(product);
  else s.world = product;
  return s;
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
    parts << QStringLiteral("ring %1%2").arg(s.ring_degree).arg(s.ring_anything ? " (anything)" : "");
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
