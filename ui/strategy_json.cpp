#include "ui/strategy_json.h"

#include <QRegularExpression>
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

std::optional<dit::Strategy> strategyFromParams(const QJsonValue& v) {
  if (v.isObject()) {
    try {
      return strategyFromJson(v.toObject());
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  if (!v.isString()) return std::nullopt;
  // dit::Strategy::describe(): "<world> rank[s]: <part> x <part> ...[ on <device>]".
  QString text = v.toString().trimmed();
  static const QRegularExpression head(QStringLiteral("^(\\d+) ranks?: (.*)$"));
  const QRegularExpressionMatch m = head.match(text);
  if (!m.hasMatch()) return std::nullopt;
  dit::Strategy s;
  s.world = m.captured(1).toInt();
  QString rest = m.captured(2);
  const qsizetype on = rest.lastIndexOf(QStringLiteral(" on "));
  if (on >= 0) {
    s.device = rest.mid(on + 4).trimmed().toStdString();
    rest = rest.left(on);
  }
  if (rest.trimmed() == QLatin1String("no parallelism")) return s;
  static const QRegularExpression part(
      QStringLiteral("^(tp|ring|ulysses|cfg|dp) (\\d+)( \\(anything\\))?$"));
  for (const QString& p : rest.split(QStringLiteral(" x "))) {
    const QRegularExpressionMatch pm = part.match(p.trimmed());
    if (!pm.hasMatch()) return std::nullopt;
    const int d = pm.captured(2).toInt();
    const QString name = pm.captured(1);
    const bool anything = !pm.captured(3).isEmpty();
    if (name == QLatin1String("tp"))
      s.tp_degree = d;
    else if (name == QLatin1String("ring")) {
      s.ring_degree = d;
      s.ring_anything = anything;
    } else if (name == QLatin1String("ulysses")) {
      s.ulysses_degree = d;
      s.ulysses_anything = anything;
    } else if (name == QLatin1String("cfg"))
      s.cfg_degree = d;
    else
      s.dp_degree = d;
  }
  return s;
}

}  // namespace dit::ui
