#include "ui/seed_text.h"

#include <cmath>
#include <limits>

namespace dit::ui {

QString seedRangeText() { return QStringLiteral("0 .. 18446744073709551615 (2^64 - 1)"); }

QString seedText(std::uint64_t seed) { return QString::number(qulonglong(seed)); }

std::optional<std::uint64_t> parseSeedText(const QString& text, QString* error) {
  const QString t = text.trimmed();
  auto fail = [&](const QString& why) -> std::optional<std::uint64_t> {
    if (error)
      *error = QStringLiteral("seed must be a whole number in %1, %2").arg(seedRangeText(), why);
    return std::nullopt;
  };
  if (t.isEmpty()) return fail(QStringLiteral("got an empty field"));
  std::uint64_t v = 0;
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  for (const QChar c : t) {
    if (c < QLatin1Char('0') || c > QLatin1Char('9'))
      return fail(QStringLiteral("got \"%1\"").arg(t.left(40)));
    const std::uint64_t d = static_cast<std::uint64_t>(c.unicode() - '0');
    if (v > (kMax - d) / 10) return fail(QStringLiteral("got %1 (too large)").arg(t.left(40)));
    v = v * 10 + d;
  }
  return v;
}

std::optional<std::uint64_t> seedFromQJson(const QJsonValue& value) {
  if (value.isString()) return parseSeedText(value.toString());
  if (!value.isDouble()) return std::nullopt;
  const qint64 i = value.toInteger(-1);  // exact when Qt holds an integer
  if (i >= 0) return static_cast<std::uint64_t>(i);
  // A double (an older file, or a number Qt could not hold as qint64): only below 2^53 is it
  // certainly the seed that was written.
  const double d = value.toDouble(-1);
  if (d >= 0 && d < 9007199254740992.0 && std::floor(d) == d) return static_cast<std::uint64_t>(d);
  return std::nullopt;
}

QJsonValue seedToQJson(std::uint64_t seed) { return seedText(seed); }

}  // namespace dit::ui
