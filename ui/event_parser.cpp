#include "ui/event_parser.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QRegularExpression>

#include "ui/json_io.h"

namespace dit::ui {

std::optional<WorkerEvent> parseEventLine(const QByteArray& line) {
  auto ev = dit::protocol::parseEventLine(
      std::string_view(line.constData(), static_cast<size_t>(line.size())));
  if (!ev) return std::nullopt;
  return WorkerEvent{QString::fromStdString(ev->type), toQJsonObject(ev->data)};
}

std::optional<WorkerEventInLine> findEventInLine(const QByteArray& line) {
  auto found = dit::protocol::findEventInLine(
      std::string_view(line.constData(), static_cast<size_t>(line.size())));
  if (!found) return std::nullopt;
  return WorkerEventInLine{
      static_cast<qsizetype>(found->offset),
      WorkerEvent{QString::fromStdString(found->event.type), toQJsonObject(found->event.data)}};
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
  for (const dit::protocol::RankStats& p : dit::protocol::parseRanks(toNlohmann(event))) {
    RankStats r;
    r.rank = p.rank;
    r.stage = QString::fromStdString(p.stage);
    r.step = p.step;
    r.steps = p.steps;
    r.rss = p.rss;
    r.rss_peak = p.rss_peak;
    r.dev = p.dev;
    r.dev_peak = p.dev_peak;
    r.bytes_sent = p.bytes_sent;
    r.step_ms = p.step_ms;
    out.append(r);
  }
  return out;
}

std::optional<RankFailure> parseMpirunFailure(const QString& text) {
  const auto p = dit::launcher::parseMpirunFailure(text.toStdString());
  if (!p) return std::nullopt;
  RankFailure f;
  f.rank = p->rank;
  f.pid = p->pid;
  f.signal = p->signal;
  f.exit_code = p->exit_code;
  f.node = QString::fromStdString(p->node);
  f.reason = QString::fromStdString(p->reason);
  return f;
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
