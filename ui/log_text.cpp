#include "ui/log_text.h"

#include <QRegularExpression>

#include "ui/event_parser.h"

namespace dit::ui {

QString logText(const QByteArray& line) {
  const QByteArray marker(kEventPrefix.data(), qsizetype(kEventPrefix.size()));
  const qsizetype at = line.indexOf(marker.trimmed());
  if (at >= 0) {
    static const QRegularExpression typeRe(QStringLiteral("\"(?:event|type)\"\\s*:\\s*\"(\\w+)\""));
    const QString rest = QString::fromUtf8(line.mid(at, 200));
    const QRegularExpressionMatch m = typeRe.match(rest);
    const QString before = QString::fromUtf8(line.left(std::min<qsizetype>(at, 300))).trimmed();
    const QString summary =
        QStringLiteral("[cut worker event%1, %2 bytes not shown]")
            .arg(m.hasMatch() ? QStringLiteral(" \"%1\"").arg(m.captured(1)) : QString())
            .arg(line.size() - at);
    return before.isEmpty() ? summary : before + QLatin1Char(' ') + summary;
  }
  QString text = QString::fromUtf8(line);
  static const QRegularExpression b64(QStringLiteral("[A-Za-z0-9+/]{120,}={0,2}"));
  if (text.size() >= 120) {
    QRegularExpressionMatch m;
    qsizetype from = 0;
    while ((m = b64.match(text, from)).hasMatch()) {
      const QString r =
          QStringLiteral("[%1 bytes of binary data not shown]").arg(m.capturedLength());
      text.replace(m.capturedStart(), m.capturedLength(), r);
      from = m.capturedStart() + r.size();
    }
  }
  constexpr qsizetype kMax = 2000;
  if (text.size() > kMax)
    text = text.left(kMax) +
           QStringLiteral("… [%1 more characters not shown]").arg(text.size() - kMax);
  return text;
}

}  // namespace dit::ui
