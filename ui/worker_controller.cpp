#include "ui/worker_controller.h"

#include <QByteArray>
#include <QDir>
#include <QThread>
#include <QTimer>
#include <algorithm>
#include <cmath>

#include "ui/json_io.h"
#include "ui/log_text.h"

namespace dit::ui {

namespace {

QString qs(const std::string& s) { return QString::fromStdString(s); }

WorkerController::State toQtState(dit::launcher::WorkerSession::State s) {
  using S = dit::launcher::WorkerSession::State;
  switch (s) {
    case S::Stopped:
      return WorkerController::State::Stopped;
    case S::Starting:
      return WorkerController::State::Starting;
    case S::Ready:
      return WorkerController::State::Ready;
    case S::Busy:
      return WorkerController::State::Busy;
    case S::Stopping:
      return WorkerController::State::Stopping;
    case S::Failed:
      return WorkerController::State::Failed;
  }
  return WorkerController::State::Stopped;
}

// Runs `work` on a thread of its own and `done(result)` on `context`'s thread once it ends
// (nothing when `context` is gone by then). The thread owns copies of what `work` captured.
template <typename Work, typename Done>
void runOffThread(QObject* context, Work work, Done done) {
  using R = decltype(work());
  auto result = std::make_shared<R>();
  QThread* t = QThread::create([result, work = std::move(work)]() mutable { *result = work(); });
  QObject::connect(t, &QThread::finished, context,
                   [result, done = std::move(done)]() mutable { done(std::move(*result)); });
  QObject::connect(t, &QThread::finished, t, &QObject::deleteLater);
  t->start();
}

}  // namespace

// The session's news as the controller's signals.
class WorkerController::View : public dit::launcher::SessionObserver {
 public:
  explicit View(WorkerController* c) : c_(c) {}

  void stateChanged(State s) override {
    for (auto* o : c_->taps_) o->stateChanged(s);
    if (s == State::Starting && c_->pendingRestart_) {  // restart(): the new group starts
      c_->config_ = c_->pendingRestart_->first;
      c_->command_ = c_->pendingRestart_->second;
      c_->pendingRestart_.reset();
    }
    if (s == State::Starting) c_->readyInfo_ = {};
    if (s == State::Stopped || s == State::Failed) {
      c_->stallTimer_.stop();
      if (c_->pendingHostStart_) {  // restart() of a hostfile group: its pre-flight, then it
        const LaunchConfig next = *c_->pendingHostStart_;
        c_->pendingHostStart_.reset();
        QTimer::singleShot(0, c_, [c = c_, next] { c->start(next); });
      }
    }
    Q_EMIT c_->stateChanged(toQtState(s));
  }
  void stageChanged(const std::string& s) override {
    for (auto* o : c_->taps_) o->stageChanged(s);
    Q_EMIT c_->stageChanged(qs(s));
  }
  void event(const protocol::Event& raw, const protocol::WorkerEvent& ev) override {
    for (auto* o : c_->taps_) o->event(raw, ev);
    const WorkerEvent we{qs(raw.type), toQJsonObject(raw.data)};
    if (c_->watch_) c_->watch_->noteEvent();  // the stall check counts from the last event
    Q_EMIT c_->eventReceived(we);
    if (const auto* h = std::get_if<protocol::HelloEvent>(&ev)) {
      Q_EMIT c_->helloReceived(h->rank, c_->session_.world(), static_cast<qint64>(h->pid));
    } else if (std::holds_alternative<protocol::ReadyEvent>(ev)) {
      c_->readyInfo_ = we.data;
      Q_EMIT c_->readyReceived(we.data);
    } else if (const auto* st = std::get_if<protocol::StatusEvent>(&ev)) {
      Q_EMIT c_->statusReceived(qs(st->stage), qs(st->message));
    } else if (std::holds_alternative<protocol::RanksEvent>(ev)) {
      Q_EMIT c_->ranksUpdated(parseRanks(we.data));
    } else if (const auto* p = std::get_if<protocol::ProgressEvent>(&ev)) {
      Q_EMIT c_->progressReceived(qs(p->id), p->step, p->steps, p->step_ms, p->eta_s,
                                  p->image_index);
    } else if (const auto* pv = std::get_if<protocol::PreviewEvent>(&ev)) {
      QImage img;
      img.loadFromData(QByteArray::fromBase64(QByteArray::fromStdString(pv->png)), "PNG");
      if (!img.isNull()) Q_EMIT c_->previewReceived(qs(pv->id), pv->step, pv->image_index, img);
    } else if (const auto* i = std::get_if<protocol::ImageEvent>(&ev)) {
      ImageResult r;
      r.id = qs(i->id);
      r.image_index = i->image_index;
      r.path = qs(i->path);
      r.seed = i->seed;  // exact over the whole uint64 range
      r.hasSeed = i->has_seed;
      r.params = we.data.value("params").toObject();
      r.seconds = i->seconds;
      Q_EMIT c_->imageReceived(r);
    }
  }
  void queueChanged() override {
    for (auto* o : c_->taps_) o->queueChanged();
    Q_EMIT c_->queueChanged();
  }
  void requestDone(const std::string& id, double seconds) override {
    c_->external_.erase(id);
    for (auto* o : c_->taps_) o->requestDone(id, seconds);
    Q_EMIT c_->requestDone(qs(id), seconds);
  }
  void requestCancelled(const std::string& id, int step) override {
    c_->external_.erase(id);
    for (auto* o : c_->taps_) o->requestCancelled(id, step);
    Q_EMIT c_->requestCancelled(qs(id), step);
  }
  void requestFailed(const std::string& id, const std::string& message) override {
    if (c_->naming_) {  // the group's fatal error, emitted once it is named
      c_->heldRequestFailures_.emplace_back(id, message);
      return;
    }
    c_->emitRequestFailed(id, message);
  }
  void errorReported(const dit::launcher::GroupFailure& f) override {
    for (auto* o : c_->taps_) o->errorReported(f);
    // A rank silent on another host: named by its host's answer (off this thread) first.
    if (f.fatal && c_->watch_ && c_->watch_->active() && !c_->named_.count(f.message) &&
        dit::launcher::RemoteRankWatch::hasSilentRank(f.message)) {
      c_->nameSilentRanks(f);
      return;
    }
    Q_EMIT c_->errorReported(c_->toQt(f));
  }
  void groupFailed(const dit::launcher::GroupFailure& f) override {
    if (c_->naming_) {  // emitted once the fatal error it repeats is named
      c_->heldFailure_ = f;
      return;
    }
    c_->emitGroupFailed(f);
  }
  void groupStopped(int exitCode) override {
    for (auto* o : c_->taps_) o->groupStopped(exitCode);
    Q_EMIT c_->groupStopped(exitCode);
  }
  void logLine(int rank, const std::string& level, const std::string& text) override {
    for (auto* o : c_->taps_) o->logLine(rank, level, text);
    // The group's failure naming a disconnected remote rank (OpenMPI 5's peer-disconnect
    // report): named by its host's answer (off this thread) first; the request failures and
    // groupFailed that follow are held until then.
    if (level == "error" && c_->watch_ && c_->watch_->active() && !c_->naming_ &&
        !c_->named_.count(text) && dit::launcher::RemoteRankWatch::hasDisconnectedRank(text)) {
      dit::launcher::GroupFailure f;
      f.rank = rank;
      f.message = text;
      f.fatal = true;
      c_->nameSilentRanks(f, /*reportError=*/false);
      return;
    }
    Q_EMIT c_->logLine(rank, qs(level), qs(text));
  }
  void outputLine(dit::launcher::GroupProcess::Stream s, const std::string& line) override {
    // Summarised (a cut preview's base64 never reaches the log), attributed to its rank.
    const QString text = logText(QByteArray::fromStdString(line));
    Q_EMIT c_->logLine(rankOfLogLine(text),
                       s == dit::launcher::GroupProcess::Stream::Stdout ? QStringLiteral("stdout")
                                                                        : QStringLiteral("stderr"),
                       text);
  }
  void fdsChanged() override { c_->syncNotifiers(); }

 private:
  WorkerController* c_;
};

WorkerController::WorkerController(QObject* parent)
    : QObject(parent), view_(std::make_unique<View>(this)), session_(view_.get()) {
  timer_.setSingleShot(true);
  // A request that never reached a worker is not lost with a group that failed to start.
  session_.keepUnsentOnFailedStart = true;
  connect(&timer_, &QTimer::timeout, this, [this] {
    session_.onTimeout();
    armTimer();
  });
  stallTimer_.setInterval(1000);
  connect(&stallTimer_, &QTimer::timeout, this, &WorkerController::checkStall);
  // Request ids name the image files: unique across launches (the session's tag: creation time
  // plus a random part).
  session_.prepareRequest = [this](dit::protocol::GenerateRequest& g) {
    if (!outputDir_.isEmpty()) {
      QDir().mkpath(outputDir_);
      g.output_dir = outputDir_.toStdString();
    }
    g.preview_every = previewEvery_;
    if (maxSequenceLength_ > 0) g.params.max_sequence_length = maxSequenceLength_;
  };
  // Another front end's requests (submitRequest: the Serve API's jobs) keep their own output
  // folder and preview cadence.
  session_.prepareRequest = [this,
                             window = session_.prepareRequest](dit::protocol::GenerateRequest& g) {
    if (!external_.count(g.id)) window(g);
  };
}

WorkerController::~WorkerController() {
  // A pre-flight still running stops before its next host; its result goes nowhere (the
  // thread's news is delivered to this object only while it lives).
  if (checkCancelled_) checkCancelled_->store(true);
  // The session's destructor runs the teardown policy (bounded); nothing is signalled any more.
  session_.setObserver(nullptr);
  qDeleteAll(notifiers_);
  notifiers_.clear();
}

QString WorkerController::stateName(State s) {
  using S = dit::launcher::WorkerSession::State;
  static const S map[] = {S::Stopped, S::Starting, S::Ready, S::Busy, S::Stopping, S::Failed};
  return QString::fromLatin1(dit::launcher::WorkerSession::stateName(map[static_cast<int>(s)]));
}

void WorkerController::syncNotifiers() {
  for (QSocketNotifier* n : notifiers_) {
    n->setEnabled(false);
    n->deleteLater();  // may be the one whose activation is running
  }
  notifiers_.clear();
  for (const auto& p : session_.pollFds()) {
    auto* n = new QSocketNotifier(p.fd, QSocketNotifier::Read, this);
    const int fd = p.fd;
    connect(n, &QSocketNotifier::activated, this, [this, fd] {
      session_.onReadable(fd);
      armTimer();
    });
    notifiers_.append(n);
  }
  armTimer();
}

void WorkerController::armTimer() {
  const auto next = session_.nextTimeout();
  if (!next) {
    timer_.stop();
    return;
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      *next - dit::launcher::SteadyClock::now())
                      .count();
  timer_.start(static_cast<int>(std::clamp<long long>(ms, 0, 60000)));
}

WorkerFailure WorkerController::toQt(const dit::launcher::GroupFailure& f) const {
  WorkerFailure w;
  w.id = qs(f.id);
  w.rank = f.rank;
  w.pid = static_cast<qint64>(f.pid);
  w.message = namedMessage(f.message);
  // The rank's own copies of a named error (its stderr lines) in the same words.
  w.detail = qs(named_.count(f.message) && watch_ ? watch_->rewriteKnown(f.detail) : f.detail);
  w.fatal = f.fatal;
  w.host = qs(f.host);
  return w;
}

QString WorkerController::namedMessage(const std::string& message) const {
  const auto named = named_.find(message);
  return qs(named != named_.end() ? named->second : message);
}

WorkerController::State WorkerController::state() const { return toQtState(session_.state()); }

double WorkerController::elapsedSeconds() const { return session_.elapsedSeconds(); }

QMap<int, qint64> WorkerController::rankPids() const {
  QMap<int, qint64> out;
  for (const auto& [rank, pid] : session_.rankPids()) out[rank] = static_cast<qint64>(pid);
  return out;
}

QList<WorkerController::Request> WorkerController::queue() const {
  QList<Request> out;
  for (const dit::launcher::QueuedRequest& q : session_.queue()) {
    Request r;
    r.id = qs(q.id());
    r.params = q.request.params;
    r.sent = q.sent;
    r.step = q.step;
    r.steps = q.steps;
    r.image_index = q.image_index;
    r.queue_position = static_cast<int>(q.queue_position);
    out.append(r);
  }
  return out;
}

QString WorkerController::activeId() const { return qs(session_.activeId()); }

bool WorkerController::start(const LaunchConfig& config) {
  if (isRunning() || checking_) return false;
  try {
    (void)buildLaunchCommand(config);  // a refused argv (no ranks, a bad port range): no start
  } catch (const std::invalid_argument& e) {
    Q_EMIT logLine(-1, QStringLiteral("error"), QString::fromStdString(e.what()));
    return false;
  }
  watch_.reset();
  named_.clear();
  naming_ = false;  // a naming still running for an earlier group is dropped
  ++namingSerial_;
  heldError_.reset();
  heldFailure_.reset();
  heldRequestFailures_.clear();
  // dit_launcher's one group start (the CLI's and the server's too): the spec, the pre-flight of
  // a hostfile group's other hosts, the argv, the watch that names a silent remote rank.
  dit::launcher::GroupSpec spec = groupSpec(config);
  spec.preflight = preflight_;
  spec.state_query = stateQuery_;
  if (config.hostfile.isEmpty()) {
    dit::launcher::PreparedGroup group;
    try {
      group = dit::launcher::prepareGroup(spec);  // no host to ask: no I/O
    } catch (const std::exception& e) {
      Q_EMIT logLine(-1, QStringLiteral("error"), QString::fromStdString(e.what()));
      return false;
    }
    return startSession(config, group);
  }
  // A hostfile group: the plan and the pre-flight of every other host (ssh: seconds a host) on a
  // worker thread, as ditstudio-cli runs them; the group starts when they pass.
  const bool preflight = preflight_;
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  checkCancelled_ = cancelled;
  checking_ = true;
  Q_EMIT hostCheckChanged(true);
  Q_EMIT logLine(-1, QStringLiteral("info"),
                 preflight
                     ? tr("checking the hosts of %1 over ssh (pre-flight)").arg(config.hostfile)
                     : tr("planning the hostfile %1 (pre-flight off)").arg(config.hostfile));
  const quint64 serial = ++checkSerial_;
  runOffThread(
      this,
      [spec, cancelled] {
        HostCheckOutcome out;
        try {
          dit::launcher::HostGroupProgress progress;
          progress.cancelled = [cancelled] { return cancelled->load(); };
          out.group = dit::launcher::prepareGroup(spec, progress);
        } catch (const dit::launcher::GroupRefused& e) {
          out.error = e.what();
          out.host = e.host;
        } catch (const std::exception& e) {
          out.error = e.what();
        } catch (...) {
          out.error = "the pre-flight failed for an unknown reason";
        }
        return out;
      },
      [this, serial, config](HostCheckOutcome out) {
        if (serial != checkSerial_ || !checking_) return;  // abandoned (stop, restart)
        checkCancelled_.reset();
        checking_ = false;
        if (!out.error.empty()) {
          const QString message = qs(out.error);
          Q_EMIT logLine(-1, QStringLiteral("error"), message);
          Q_EMIT hostCheckChanged(false);
          Q_EMIT hostCheckFailed(qs(out.host), message);
          return;
        }
        const QString plan = qs(out.group.planText());
        Q_EMIT logLine(-1, QStringLiteral("info"),
                       tr("hostfile %1: %2").arg(config.hostfile, plan));
        for (const dit::launcher::PreflightResult& r : out.group.hosts.hosts)
          Q_EMIT logLine(-1, QStringLiteral("info"),
                         tr("pre-flight %1: ok (worker, model fingerprint %2, %3 ms)")
                             .arg(qs(r.host), qs(r.fingerprint))
                             .arg(std::lround(r.seconds * 1000)));
        stall_ = dit::launcher::RemoteRankWatch::stallAfter();
        Q_EMIT hostCheckChanged(false);
        Q_EMIT hostCheckPassed(plan);
        startSession(config, out.group);
      });
  return true;
}

bool WorkerController::startSession(const LaunchConfig& config,
                                    const dit::launcher::PreparedGroup& group) {
  config_ = config;
  command_ = launchCommand(group.session.argv);
  pendingRestart_.reset();
  // A hostfile group's watch names its silent remote ranks; a group on this host has none.
  if (group.watch && group.watch->active()) watch_ = group.watch;
  const bool ok = session_.start(group.session);
  syncNotifiers();
  if (ok && watch_ && watch_->active()) {
    watch_->noteEvent();
    stallTimer_.start();
  }
  return ok;
}

void WorkerController::abandonHostCheck() {
  if (!checking_) return;
  if (checkCancelled_) checkCancelled_->store(true);
  checkCancelled_.reset();
  ++checkSerial_;  // its result, when it comes, is ignored
  checking_ = false;
  Q_EMIT logLine(-1, QStringLiteral("info"), tr("pre-flight abandoned: no group started"));
  Q_EMIT hostCheckChanged(false);
}

void WorkerController::checkStall() {
  if (!watch_ || session_.state() != dit::launcher::WorkerSession::State::Busy ||
      !watch_->stallDue(stall_) || !watch_->claimStall())
    return;
  // Every other host asked over ssh (bounded) off this thread; the stopped and exited ranks are
  // kept by the watch for the fatal error that follows.
  runOffThread(
      this,
      [watch = watch_,
       pids = session_.rankPids()]() -> std::vector<dit::launcher::RemoteRankState> {
        try {
          return watch->askStall(pids);
        } catch (...) {  // documented not to throw; a thread must never let one out
          return {};
        }
      },
      [this](const std::vector<dit::launcher::RemoteRankState>& named) {
        for (const dit::launcher::RemoteRankState& r : named)
          Q_EMIT logLine(-1, QStringLiteral("warning"),
                         tr("rank %1 (pid %2 on %3) is %4 (asked over ssh while the group stalled)")
                             .arg(r.rank)
                             .arg(r.pid)
                             .arg(qs(r.host), qs(r.state)));
      });
}

void WorkerController::nameSilentRanks(const dit::launcher::GroupFailure& f, bool reportError) {
  if (naming_) {  // a second fatal error while the first is named: shown as it is
    if (reportError)
      Q_EMIT errorReported(toQt(f));
    else
      Q_EMIT logLine(-1, QStringLiteral("error"), qs(f.message));
    return;
  }
  naming_ = true;
  heldError_ = f;
  heldIsError_ = reportError;
  heldFailure_.reset();
  // Ranks the stall check named are named from what it kept; others are asked now (ssh,
  // bounded: 10 s a host).
  runOffThread(
      this,
      [watch = watch_, message = f.message]() -> std::string {
        try {
          return watch->rewrite(message);
        } catch (...) {  // documented not to throw; a thread must never let one out
          return message;
        }
      },
      [this, serial = namingSerial_](const std::string& named) {
        if (serial != namingSerial_) return;  // for a group before the last start()
        naming_ = false;
        if (!heldError_) return;
        named_[heldError_->message] = named;
        // The group's own failure line was held back: shown named (or as it was) in its place.
        if (named != heldError_->message || !heldIsError_)
          Q_EMIT logLine(heldError_->rank, QStringLiteral("error"), qs(named));
        const dit::launcher::GroupFailure e = *heldError_;
        heldError_.reset();
        if (heldIsError_) Q_EMIT errorReported(toQt(e));
        const auto requests = std::move(heldRequestFailures_);
        heldRequestFailures_.clear();
        for (const auto& [id, message] : requests) emitRequestFailed(id, message);
        if (heldFailure_) {
          const dit::launcher::GroupFailure g = *heldFailure_;
          heldFailure_.reset();
          emitGroupFailed(g);
        }
      });
}

QString WorkerController::hostPlan() const {
  return watch_ ? qs(dit::launcher::describeHostPlan(watch_->plan())) : QString();
}

void WorkerController::stop(int graceMs) {
  pendingHostStart_.reset();
  if (checking_) {
    abandonHostCheck();
    session_.cancelAll();  // never sent: dropped, as stop() drops unsent requests
    return;
  }
  pendingRestart_.reset();
  session_.stop(std::chrono::milliseconds(std::max(0, graceMs)));
  armTimer();
}

void WorkerController::restart(const LaunchConfig& config) {
  if (checking_) abandonHostCheck();
  pendingHostStart_.reset();
  if (!isRunning()) {
    start(config);
    return;
  }
  try {
    (void)buildLaunchCommand(config);
  } catch (const std::invalid_argument& e) {
    Q_EMIT logLine(-1, QStringLiteral("error"), QString::fromStdString(e.what()));
    return;
  }
  if (!config.hostfile.isEmpty()) {
    // The new hostfile group starts after its pre-flight, once the old group has exited.
    pendingHostStart_ = config;
    session_.stopForRestart();
    armTimer();
    return;
  }
  // A group on this host: nothing to ask other hosts about.
  dit::launcher::PreparedGroup group;
  try {
    group = dit::launcher::prepareGroup(groupSpec(config));
  } catch (const std::exception& e) {
    Q_EMIT logLine(-1, QStringLiteral("error"), QString::fromStdString(e.what()));
    return;
  }
  watch_.reset();
  stallTimer_.stop();
  pendingRestart_ = std::make_pair(config, launchCommand(group.session.argv));
  session_.restart(group.session);
  armTimer();
}

void WorkerController::emitRequestFailed(const std::string& id, const std::string& message) {
  external_.erase(id);
  // The other observers get the message as the hosts named it, as the window shows it.
  const QString named = namedMessage(message);
  for (auto* o : taps_) o->requestFailed(id, named.toStdString());
  Q_EMIT requestFailed(qs(id), named);
}

void WorkerController::emitGroupFailed(const dit::launcher::GroupFailure& f) {
  const WorkerFailure w = toQt(f);
  dit::launcher::GroupFailure named = f;
  named.message = w.message.toStdString();
  for (auto* o : taps_) o->groupFailed(named);
  Q_EMIT groupFailed(w);
}

void WorkerController::addObserver(dit::launcher::SessionObserver* observer) {
  if (!observer || std::find(taps_.begin(), taps_.end(), observer) != taps_.end()) return;
  taps_.push_back(observer);
  // What it missed: the group's state and, when it is ready, its ready event.
  observer->stateChanged(session_.state());
  if (!session_.stage().empty()) observer->stageChanged(session_.stage());
  if (session_.readyInfo().is_object()) {
    const dit::protocol::Event ready{"ready", session_.readyInfo()};
    observer->event(ready, dit::protocol::decodeEvent(ready));
  }
}

void WorkerController::removeObserver(dit::launcher::SessionObserver* observer) {
  taps_.erase(std::remove(taps_.begin(), taps_.end(), observer), taps_.end());
}

QString WorkerController::submitRequest(dit::protocol::GenerateRequest request) {
  if (!request.id.empty()) external_.insert(request.id);
  const QString id = qs(session_.submit(std::move(request)));
  armTimer();
  return id;
}

QString WorkerController::submit(const GenerationParams& params) {
  dit::protocol::GenerateRequest g;
  g.params = params;
  const QString id = qs(session_.submit(std::move(g)));
  armTimer();
  return id;
}

bool WorkerController::cancel(const QString& id) {
  const bool ok = session_.cancel(id.toStdString());
  armTimer();
  return ok;
}

void WorkerController::cancelAll() {
  session_.cancelAll();
  armTimer();
}

void WorkerController::handleStdout(const QByteArray& bytes) {
  session_.feedStdout(std::string_view(bytes.constData(), static_cast<size_t>(bytes.size())));
}

}  // namespace dit::ui
