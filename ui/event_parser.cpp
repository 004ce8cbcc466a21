#include "ui/event_parser.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QRegularExpression>

namespace dit::ui {

std::optional<WorkerEvent> parseEventLine(const QByteArray& lineIn) {
  QByteArray line = lineIn;
  while (!line.isEmpty() && (line.endsWith('\n') || line.endsWith('\r'))) line.chop(1);
  int start = 0;
  while (start < line.size() && (line[start] == ' ' || line[start] == '\t')) ++start;
  // OpenMPI --tag-output: "[1,0]<stdout>:"
  if (start < line.size() && line[start] == '[') {
    const int close = line.indexOf("]<stdout>:", start);
    if (close > 0 && close < start + 32) start = close + int(sizeof("]<stdout>:")) - 1;
  }
  const QByteArray prefix(kEventPrefix);
  if (line.size() - start < prefix.size() + 2) return std::nullopt;
  if (line.mid(start, prefix.size()) != prefix) return std::nullopt;
  QJsonParseError pe;
  const QJsonDocument doc = QJsonDocument::fromJson(line.mid(start + prefix.size()), &pe);
  if (pe.error != QJsonParseError::NoError || !doc.isObject()) return std::nullopt;
  WorkerEvent ev;
  ev.data = doc.object();
  // The event name is in "event" (the worker's spelling); "type" is accepted too.
  QJsonValue t = ev.data.value("event");
  if (!t.isString()) t = ev.data.value("type");
  if (!t.isString() || t.toString().isEmpty()) return std::nullopt;
  ev.type = t.toString();
  return ev;
}

QList<QByteArray> LineSplitter::feed(const QByteArray& chunk) {
  buffer_.append(chunk);
  QList<QByteArray> lines;
  qsizetype from = 0;
  for (;;) {
    const qsizetype nl = buffer_.indexOf('\n', from);
    if (nl < 0) break;
    QByteArray line = buffer_.mid(from, nl - from);
    if (line.endsWith('\r')) line.chop(1);
    lines.append(line);
    from = nl + 1;
  }
  buffer_.remove(0, from);
  return lines;
}

QByteArray LineSplitter::flush() {
  QByteArray rest = buffer_;
  buffer_.clear();
  if (rest.endsWith('\r')) rest.chop(1);
  return rest;
}

QList<RankStats> parseRanks(const QJsonObject& event) {
  QList<RankStats> out;
  auto num = [](const QJsonObject& o, const char* key) -> qint64 {
    const QJsonValue v = o.value(QLatin1String(key));
    return v.isDouble() ? static_cast<qint64>(v.toDouble()) : -1;
  };
  for (const QJsonValue& v : event.value("ranks").toArray()) {
    const QJsonObject o = v.toObject();
    if (!o.value("rank").isDouble()) continue;
    RankStats r;
    r.rank = o.value("rank").toInt();
    r.stage = o.value("stage").toString();
    r.step = o.value("step").toInt(0);
    r.steps = o.value("steps").toInt(0);
    r.rss = num(o, "rss");
    r.rss_peak = num(o, "rss_peak");
    r.dev = num(o, "dev");
    r.dev_peak = num(o, "dev_peak");
    r.bytes_sent = num(o, "bytes_sent");
    r.step_ms = o.value("step_ms").isDouble() ? o.value("step_ms").toDouble() : -1;
    out.append(r);
  }
  return out;
}

std::optional<RankFailure> parseMpirunFailure(const QString& text) {
  static const QRegularExpression signalRe(
      QStringLiteral("process\\s+rank\\s+(\\d+)\\s+with\\s+PID\\s+(\\d+)\\s+on\\s+node\\s+(\\S+)\\s+"
                     "exited\\s+on\\s+signal\\s+(\\d+)(?:\\s+\\(([^)]*)\\))?"));
  static const QRegularExpression abortRe(
      QStringLiteral("MPI_ABORT\\s+was\\s+invoked\\s+on\\s+rank\\s+(\\d+)"
                     "(?:[\\s\\S]*?errorcode\\s+(\\d+))?"));
  static const QRegularExpression procRe(QStringLiteral(
      "Process\\s+name:\\s*\\[(?:\\[\\d+,\\d+\\]|[^\\]\\s@]+@\\d+),(\\d+)\\]\\s*"
      "(?:Exit\\s+code:\\s*(-?\\d+))?"));
  static const QRegularExpression primaryRe(QStringLiteral(
      "Primary\\s+job\\s+terminated\\s+normally,\\s+but\\s+(\\d+)\\s+process(?:es)?\\s+returned"));
  static const QRegularExpression noticedExitRe(
      QStringLiteral("process\\s+rank\\s+(\\d+)\\s+with\\s+PID\\s+(\\d+)\\s+on\\s+node\\s+(\\S+)\\s+"
                     "exited\\s+with\\s+(?:non-zero\\s+)?(?:status|exit\\s+code)\\s+(-?\\d+)"));

  QRegularExpressionMatch m = signalRe.match(text);
  if (m.hasMatch()) {
    RankFailure f;
    f.rank = m.captured(1).toInt();
    f.pid = m.captured(2).toLongLong();
    f.node = m.captured(3);
    f.signal = m.captured(4).toInt();
    const QString name = m.captured(5);
    f.reason = QStringLiteral("rank %1 (pid %2 on %3) was killed by signal %4%5")
                   .arg(f.rank)
                   .arg(f.pid)
                   .arg(f.node)
                   .arg(f.signal)
                   .arg(name.isEmpty() ? QString() : QStringLiteral(" (%1)").arg(name));
    return f;
  }
  m = noticedExitRe.match(text);
  if (m.hasMatch()) {
    RankFailure f;
    f.rank = m.captured(1).toInt();
    f.pid = m.captured(2).toLongLong();
    f.node = m.captured(3);
    f.exit_code = m.captured(4).toInt();
    f.reason = QStringLiteral("rank %1 (pid %2 on %3) exited with code %4")
                   .arg(f.rank).arg(f.pid).arg(f.node).arg(f.exit_code);
    return f;
  }
  m = abortRe.match(text);
  if (m.hasMatch()) {
    RankFailure f;
    f.rank = m.captured(1).toInt();
    if (!m.captured(2).isEmpty()) f.exit_code = m.captured(2).toInt();
    f.reason = QStringLiteral("rank %1 aborted the group (MPI_Abort%2)")
                   .arg(f.rank)
                   .arg(f.exit_code >= 0 ? QStringLiteral(", error code %1").arg(f.exit_code)
                                         : QString());
    return f;
  }
  m = procRe.match(text);
  if (m.hasMatch()) {
    RankFailure f;
    f.rank = m.captured(1).toInt();
    if (!m.captured(2).isEmpty()) f.exit_code = m.captured(2).toInt();
    f.reason = QStringLiteral("rank %1 exited with a non-zero code%2")
                   .arg(f.rank)
                   .arg(f.exit_code >= 0 ? QStringLiteral(" (%1)").arg(f.exit_code) : QString());
    return f;
  }
  m = primaryRe.match(text);
  if (m.hasMatch()) {
    RankFailure f;
    f.reason = QStringLiteral("%1 rank process returned a non-zero exit code").arg(m.captured(1));
    return f;
  }
  return std::nullopt;
}

int rankOfLogLine(const QString& line) {
  static const QRegularExpression spdlogRe(QStringLiteral("\\[rank\\s+(\\d+)\\s*/\\s*\\d+\\]"));
  static const QRegularExpression tagRe(QStringLiteral("^\\[\\d+,(\\d+)\\]<std(?:err|out)>:"));
  QRegularExpressionMatch m = tagRe.match(line);
  if (m.hasMatch()) return m.captured(1).toInt();
  m = spdlogRe.match(line);
  if (m.hasMatch()) return m.captured(1).toInt();
  return -1;
}

}  // namespace dit::ui
