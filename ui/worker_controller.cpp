#include "ui/worker_controller.h"

#include <QDateTime>
#include <QDir>
#include <QJsonArray>
#include <QJsonDocument>
#include <QRandomGenerator>

#include "ui/log_text.h"
#include "ui/seed_text.h"

namespace dit::ui {

WorkerController::WorkerController(QObject* parent) : QObject(parent) {
  // Request ids name the image files: unique across launches (a restart of the app must not
  // reuse "r1"), short enough for the queue and the log.
  launchTag_ = QDateTime::currentDateTime().toString(QStringLiteral("MMddHHmmss")) +
               QStringLiteral("%1").arg(QRandomGenerator::global()->bounded(0x10000), 4, 16,
                                        QLatin1Char('0'));
  terminateTimer_.setSingleShot(true);
  killTimer_.setSingleShot(true);
  connect(&terminateTimer_, &QTimer::timeout, this, [this] {
    if (!isRunning()) return;
    Q_EMIT logLine(-1, QStringLiteral("info"),
                   QStringLiteral("the group did not exit after shutdown; terminating mpirun"));
    process_->terminate();
    killTimer_.start(3000);
  });
  connect(&killTimer_, &QTimer::timeout, this, [this] {
    if (!isRunning()) return;
    Q_EMIT logLine(-1, QStringLiteral("info"), QStringLiteral("killing mpirun"));
    process_->kill();
  });
}

WorkerController::~WorkerController() {
  if (!isRunning()) return;
  QProcess* p = process_;
  p->disconnect(this);
  stopRequested_ = true;
  const QByteArray bye = QByteArray::fromStdString(
      dit::protocol::requestLine(dit::protocol::ShutdownRequest{}) + "\n");
  p->write(bye);
  p->waitForBytesWritten(500);
  if (!p->waitForFinished(2000)) {
    p->terminate();
    if (!p->waitForFinished(3000)) {
      p->kill();
      p->waitForFinished(1000);
    }
  }
}

QString WorkerController::stateName(State s) {
  switch (s) {
    case State::Stopped:
      return QStringLiteral("stopped");
    case State::Starting:
      return QStringLiteral("starting");
    case State::Ready:
      return QStringLiteral("ready");
    case State::Busy:
      return QStringLiteral("busy");
    case State::Stopping:
      return QStringLiteral("stopping");
    case State::Failed:
      return QStringLiteral("failed");
  }
  return {};
}

void WorkerController::setState(State s) {
  if (s == state_) return;
  state_ = s;
  Q_EMIT stateChanged(s);
}

void WorkerController::setStage(const QString& stage) {
  if (stage == stage_) return;
  stage_ = stage;
  Q_EMIT stageChanged(stage);
}

void WorkerController::dropSent() {
  bool any = false;
  for (int i = queue_.size() - 1; i >= 0; --i) {
    if (!queue_[i].sent) continue;
    const QString id = queue_[i].id;
    const int step = queue_[i].step;
    queue_.removeAt(i);
    any = true;
    Q_EMIT requestCancelled(id, step);
  }
  if (any) Q_EMIT queueChanged();
}

double WorkerController::elapsedSeconds() const {
  return clock_.isValid() ? clock_.elapsed() / 1000.0 : 0.0;
}

bool WorkerController::start(const LaunchConfig& config) {
  if (isRunning()) return false;
  if (process_) {
    process_->deleteLater();
    process_ = nullptr;
  }
  try {
    command_ = buildLaunchCommand(config);
  } catch (const std::invalid_argument& e) {
    Q_EMIT logLine(-1, QStringLiteral("error"), QString::fromStdString(e.what()));
    return false;
  }
  config_ = config;
  stopRequested_ = false;
  sawBye_ = false;
  sawReady_ = false;
  out_ = LineSplitter();
  err_ = LineSplitter();
  stderrTail_.clear();
  pids_.clear();
  lastRanks_.clear();
  world_ = config.strategy.world;
  readyInfo_ = {};
  fatalEvent_.reset();
  lastFailure_ = {};
  dropSent();  // interrupted requests are not re-run by themselves
  setStage(QString());
  clock_.start();

  process_ = new QProcess(this);
  process_->setProcessChannelMode(QProcess::SeparateChannels);
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  env.insert(QStringLiteral("OMP_NUM_THREADS"), QStringLiteral("1"));
  process_->setProcessEnvironment(env);
  connect(process_, &QProcess::readyReadStandardOutput, this,
          [this] { handleStdout(process_->readAllStandardOutput()); });
  connect(process_, &QProcess::readyReadStandardError, this,
          [this] { handleStderr(process_->readAllStandardError()); });
  connect(process_, &QProcess::finished, this, &WorkerController::handleFinished);
  connect(process_, &QProcess::errorOccurred, this, &WorkerController::handleProcessError);
  Q_EMIT logLine(-1, QStringLiteral("info"),
                 QStringLiteral("starting: %1").arg(command_.display()));
  setState(State::Starting);
  process_->start(command_.program, command_.arguments);
  return true;
}

void WorkerController::stop(int graceMs) {
  pendingRestart_.reset();
  shutdownGroup(graceMs, /*dropUnsent=*/true);
}

void WorkerController::shutdownGroup(int graceMs, bool dropUnsent) {
  if (!isRunning()) {
    if (state_ != State::Failed) setState(State::Stopped);
    return;
  }
  if (stopRequested_) return;
  stopRequested_ = true;
  setState(State::Stopping);
  // Stop = cancel: unsent requests are dropped, the worker cancels the running one at its next
  // step (and drops the ones it queued), then shuts down cleanly.
  bool dropped = false;
  for (int i = queue_.size() - 1; i >= 0 && dropUnsent; --i) {
    if (queue_[i].sent) continue;
    const QString id = queue_[i].id;
    queue_.removeAt(i);
    dropped = true;
    Q_EMIT requestCancelled(id, 0);
  }
  if (dropped) Q_EMIT queueChanged();
  for (const Request& r : queue_)
    if (r.sent) writeLine(dit::protocol::CancelRequest{r.id.toStdString()});
  writeLine(dit::protocol::ShutdownRequest{});
  process_->closeWriteChannel();
  terminateTimer_.start(std::max(0, graceMs));
}

void WorkerController::restart(const LaunchConfig& config) {
  if (!isRunning()) {
    start(config);
    return;
  }
  // In-flight requests are cancelled with the old group (the worker stops at its next step);
  // unsent ones move to the new one.
  for (int i = queue_.size() - 1; i >= 0; --i) {
    if (!queue_[i].sent) continue;
    const QString id = queue_[i].id;
    writeLine(dit::protocol::CancelRequest{id.toStdString()});
    queue_.removeAt(i);
    Q_EMIT requestCancelled(id, 0);
  }
  Q_EMIT queueChanged();
  shutdownGroup(3000, /*dropUnsent=*/false);
  pendingRestart_ = config;
}

QString WorkerController::submit(const GenerationParams& params) {
  Request r;
  r.id = QStringLiteral("r%1-%2").arg(nextId_++).arg(launchTag_);
  r.params = params;
  r.steps = params.steps;
  queue_.append(r);
  Q_EMIT queueChanged();
  if (sawReady_ && isRunning() && !stopRequested_) flushQueue();
  return r.id;
}

bool WorkerController::cancel(const QString& id) {
  const int i = indexOf(id);
  if (i < 0) return false;
  if (!queue_[i].sent) {
    queue_.removeAt(i);
    Q_EMIT requestCancelled(id, 0);
    Q_EMIT queueChanged();
    updateBusy();
    return true;
  }
  writeLine(dit::protocol::CancelRequest{id.toStdString()});
  return true;
}

void WorkerController::cancelAll() {
  const QList<Request> copy = queue_;
  for (int i = copy.size() - 1; i >= 0; --i) cancel(copy[i].id);
}

QString WorkerController::activeId() const {
  for (const Request& r : queue_)
    if (r.sent) return r.id;
  return {};
}

int WorkerController::indexOf(const QString& id) const {
  for (int i = 0; i < queue_.size(); ++i)
    if (queue_[i].id == id) return i;
  return -1;
}

bool WorkerController::writeLine(const dit::protocol::Request& request) {
  if (!isRunning() || process_->state() != QProcess::Running) return false;
  // Serialised by the protocol module: 64-bit seeds as JSON integers, never through a double.
  const QByteArray line = QByteArray::fromStdString(dit::protocol::requestLine(request) + "\n");
  return process_->write(line) == line.size();
}

void WorkerController::flushQueue() {
  bool any = false;
  for (Request& r : queue_) {
    if (r.sent) continue;
    dit::protocol::GenerateRequest g;
    g.id = r.id.toStdString();
    g.params = r.params;
    if (!outputDir_.isEmpty()) {
      QDir().mkpath(outputDir_);
      g.output_dir = outputDir_.toStdString();
    }
    g.preview_every = previewEvery_;
    if (maxSequenceLength_ > 0) g.params.max_sequence_length = maxSequenceLength_;
    if (!writeLine(g)) break;
    r.sent = true;
    any = true;
  }
  if (any) Q_EMIT queueChanged();
  updateBusy();
}

void WorkerController::updateBusy() {
  if (!sawReady_ || stopRequested_ || !isRunning()) return;
  setState(queue_.isEmpty() ? State::Ready : State::Busy);
}

void WorkerController::handleStdout(const QByteArray& bytes) {
  for (QByteArray line : out_.feed(bytes)) {
    // mpirun interleaves the ranks' output in pieces: an event may follow other text (or a cut
    // event) on the line; that text is logged.
    if (auto found = findEventInLine(line)) {
      line.truncate(found->offset);
      if (!line.trimmed().isEmpty()) {
        const QString text = logText(line);
        Q_EMIT logLine(rankOfLogLine(text), QStringLiteral("stdout"), text);
      }
      handleEvent(found->event);
    } else if (!line.trimmed().isEmpty()) {
      // Also a cut event line (mpirun killed mid-line, a piece of a preview): summarised, its
      // base64 never reaches the log.
      const QString text = logText(line);
      Q_EMIT logLine(rankOfLogLine(text), QStringLiteral("stdout"), text);
    }
  }
}

void WorkerController::handleStderr(const QByteArray& bytes) {
  stderrTail_.append(bytes);
  if (stderrTail_.size() > 65536) stderrTail_.remove(0, stderrTail_.size() - 65536);
  for (QByteArray line : err_.feed(bytes)) {
    // A rank that aborts the group writes its fatal `error` event to stderr as well (mpirun may
    // drop its last stdout line on MPI_Abort, OpenMPI 5), possibly in the middle of a line of
    // another rank's stderr: that event is handled (a repeat of the stdout copy is ignored in
    // handleEvent), the text before it is log output.
    if (auto found = findEventInLine(line); found && found->event.type == QLatin1String("error") &&
                                            found->event.data.value("fatal").toBool(false)) {
      handleEvent(found->event);
      line.truncate(found->offset);
    }
    if (line.trimmed().isEmpty()) continue;
    const QString text = logText(line);
    Q_EMIT logLine(rankOfLogLine(text), QStringLiteral("stderr"), text);
  }
}

bool WorkerController::isRepeatedFatalError(const WorkerEvent& ev) const {
  if (ev.type != QLatin1String("error") || !ev.data.value("fatal").toBool(false) || !fatalEvent_)
    return false;
  const int rank = ev.data.value("rank").toInt(-1);
  const QString msg = ev.data.value("message").toString();
  return fatalEvent_->rank == rank &&
         fatalEvent_->message ==
             (rank >= 0 ? QStringLiteral("rank %1: %2").arg(rank).arg(msg) : msg);
}

void WorkerController::handleEvent(const WorkerEvent& ev) {
  if (isRepeatedFatalError(ev)) return;  // the stderr copy of a fatal error already handled
  const QJsonObject& d = ev.data;
  Q_EMIT eventReceived(ev);
  const QString id = d.value("id").toString();
  if (ev.type == "hello") {
    const int rank = d.value("rank").toInt(-1);
    const qint64 pid = static_cast<qint64>(d.value("pid").toDouble(-1));
    if (d.contains("world")) world_ = d.value("world").toInt(world_);
    if (rank >= 0) pids_[rank] = pid;
    Q_EMIT helloReceived(rank, world_, pid);
  } else if (ev.type == "ready") {
    readyInfo_ = d;
    sawReady_ = true;
    if (d.contains("world")) world_ = d.value("world").toInt(world_);
    Q_EMIT readyReceived(d);
    setStage(QStringLiteral("idle"));
    if (!stopRequested_) {
      setState(State::Ready);
      flushQueue();
    }
  } else if (ev.type == "status") {
    setStage(d.value("stage").toString());
    Q_EMIT statusReceived(d.value("stage").toString(), d.value("message").toString());
  } else if (ev.type == "ranks") {
    const QList<RankStats> ranks = parseRanks(d);
    for (const RankStats& r : ranks) {
      lastRanks_[r.rank] = r;
      // Rank 0 leads every request: its stage is the group's (the worker sends `status` only
      // for loading).
      if (r.rank == 0 && !r.stage.isEmpty()) setStage(r.stage);
    }
    Q_EMIT ranksUpdated(ranks);
  } else if (ev.type == "accepted") {
    const int i = indexOf(id);
    if (i >= 0) queue_[i].queue_position = d.value("queue_position").toInt(-1);
    Q_EMIT queueChanged();
  } else if (ev.type == "progress") {
    const int i = indexOf(id);
    const int step = d.value("step").toInt();
    const int steps = d.value("steps").toInt();
    const int imageIndex = d.value("image_index").toInt(0);
    if (i >= 0) {
      queue_[i].step = step;
      queue_[i].steps = steps;
      queue_[i].image_index = imageIndex;
    }
    Q_EMIT progressReceived(id, step, steps, d.value("step_ms").toDouble(-1),
                            d.value("eta_s").toDouble(-1), imageIndex);
  } else if (ev.type == "preview") {
    QImage img;
    img.loadFromData(QByteArray::fromBase64(d.value("png").toString().toLatin1()), "PNG");
    if (!img.isNull())
      Q_EMIT previewReceived(id, d.value("step").toInt(), d.value("image_index").toInt(0), img);
  } else if (ev.type == "image") {
    ImageResult r;
    r.id = id;
    r.image_index = d.value("image_index").toInt(0);
    r.path = d.value("path").toString();
    // Exact over the whole uint64 range: toQJsonObject keeps integers above 2^63-1 as text.
    if (const auto seed = seedFromQJson(d.value("seed"))) {
      r.seed = *seed;
      r.hasSeed = true;
    }
    r.params = d.value("params").toObject();
    r.seconds = d.value("seconds").toDouble(0);
    Q_EMIT imageReceived(r);
  } else if (ev.type == "done" || ev.type == "cancelled") {
    const int i = indexOf(id);
    if (i < 0) return;  // already finished (e.g. a cancel that arrived after `done`)
    queue_.removeAt(i);
    if (ev.type == "done")
      Q_EMIT requestDone(id, d.value("seconds").toDouble(0));
    else
      Q_EMIT requestCancelled(id, d.value("step").toInt(0));
    Q_EMIT queueChanged();
    if (queue_.isEmpty()) setStage(QStringLiteral("idle"));
    updateBusy();
  } else if (ev.type == "error") {
    WorkerFailure f;
    f.id = id;
    f.rank = d.value("rank").toInt(-1);
    f.pid = pids_.value(f.rank, -1);
    f.fatal = d.value("fatal").toBool(false);
    const QString msg = d.value("message").toString();
    f.message = f.rank >= 0 ? QStringLiteral("rank %1: %2").arg(f.rank).arg(msg) : msg;
    if (f.fatal) fatalEvent_ = f;
    lastFailure_ = f;
    Q_EMIT logLine(f.rank, QStringLiteral("error"), msg);
    Q_EMIT errorReported(f);
    if (!id.isEmpty() && !f.fatal) {
      const int i = indexOf(id);
      if (i >= 0) queue_.removeAt(i);
      Q_EMIT requestFailed(id, f.message);
      Q_EMIT queueChanged();
      updateBusy();
    }
  } else if (ev.type == "log") {
    Q_EMIT logLine(d.value("rank").toInt(-1), d.value("level").toString("info"),
                   d.value("message").toString());
  } else if (ev.type == "bye") {
    sawBye_ = true;
  }
}

WorkerFailure WorkerController::buildCrashFailure(int exitCode, QProcess::ExitStatus status) const {
  WorkerFailure f;
  f.fatal = true;
  const QString err = QString::fromLocal8Bit(stderrTail_);
  const std::optional<RankFailure> mp = parseMpirunFailure(err);
  if (fatalEvent_) {
    f = *fatalEvent_;
    f.fatal = true;
    if (mp && !mp->reason.isEmpty()) f.detail = QStringLiteral("mpirun: %1").arg(mp->reason);
  } else if (mp) {
    f.rank = mp->rank;
    f.pid = mp->pid > 0 ? mp->pid : pids_.value(mp->rank, -1);
    f.message = mp->reason;
    // OpenMPI sometimes reports "PID 0"; the rank's hello event has the real one.
    if (mp->pid <= 0 && f.pid > 0)
      f.message.replace(QStringLiteral("(pid %1 ").arg(mp->pid),
                        QStringLiteral("(pid %1 ").arg(f.pid));
    if (f.rank >= 0 && lastRanks_.contains(f.rank)) {
      const RankStats& r = lastRanks_[f.rank];
      if (!r.stage.isEmpty())
        f.message +=
            r.steps > 0
                ? QStringLiteral(" while %1 (step %2/%3)").arg(r.stage).arg(r.step).arg(r.steps)
                : QStringLiteral(" while %1").arg(r.stage);
    }
  } else if (status == QProcess::CrashExit) {
    f.message = QStringLiteral("mpirun crashed");
  } else {
    f.message = sawReady_
                    ? QStringLiteral("the worker group exited unexpectedly (mpirun exit code %1)")
                          .arg(exitCode)
                    : QStringLiteral("the worker group failed to start (mpirun exit code %1)")
                          .arg(exitCode);
  }
  // Last meaningful stderr lines for context.
  QStringList lines = err.split('\n', Qt::SkipEmptyParts);
  QStringList tail;
  for (int i = lines.size() - 1; i >= 0 && tail.size() < 6; --i) {
    const QString l = lines[i].trimmed();
    // Fatal events copied to stderr are already the failure's message.
    if (l.isEmpty() || l.startsWith("----") ||
        l.contains(QLatin1String(kEventPrefix.data(), qsizetype(kEventPrefix.size()))))
      continue;
    tail.prepend(l);
  }
  if (!tail.isEmpty()) f.detail += (f.detail.isEmpty() ? "" : "\n") + tail.join('\n');
  return f;
}

void WorkerController::failAll(const QString& message) {
  const QList<Request> copy = queue_;
  queue_.clear();
  for (const Request& r : copy) Q_EMIT requestFailed(r.id, message);
  if (!copy.isEmpty()) Q_EMIT queueChanged();
}

void WorkerController::handleFinished(int exitCode, QProcess::ExitStatus status) {
  terminateTimer_.stop();
  killTimer_.stop();
  // Drain what is left in the pipes.
  if (process_) {
    handleStdout(process_->readAllStandardOutput());
    handleStderr(process_->readAllStandardError());
  }
  if (QByteArray rest = out_.flush(); !rest.isEmpty()) handleStdout(rest + "\n");
  if (QByteArray rest = err_.flush(); !rest.isEmpty()) handleStderr(rest + "\n");
  sawReady_ = false;
  if (stopRequested_) {
    Q_EMIT logLine(-1, QStringLiteral("info"),
                   QStringLiteral("worker group stopped (mpirun exit code %1)").arg(exitCode));
    dropSent();  // cancelled by stop() (a worker that exited before saying so included)
    setStage(QStringLiteral("stopped"));
    setState(State::Stopped);
    Q_EMIT groupStopped(exitCode);
  } else {
    const WorkerFailure f = buildCrashFailure(exitCode, status);
    lastFailure_ = f;
    Q_EMIT logLine(f.rank, QStringLiteral("error"), f.message);
    failAll(f.message);
    setStage(QStringLiteral("failed"));
    setState(State::Failed);
    Q_EMIT groupFailed(f);
  }
  stopRequested_ = false;
  if (pendingRestart_) {
    const LaunchConfig next = *pendingRestart_;
    pendingRestart_.reset();
    start(next);
  }
}

void WorkerController::handleProcessError(QProcess::ProcessError error) {
  if (error != QProcess::FailedToStart) return;  // crashes arrive through finished()
  WorkerFailure f;
  f.fatal = true;
  f.message = QStringLiteral("cannot start %1: %2").arg(command_.program, process_->errorString());
  lastFailure_ = f;
  Q_EMIT logLine(-1, QStringLiteral("error"), f.message);
  failAll(f.message);
  stopRequested_ = false;
  pendingRestart_.reset();
  setState(State::Failed);
  Q_EMIT groupFailed(f);
}

}  // namespace dit::ui
