#include "app/launcher/worker_session.h"

#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <random>
#include <type_traits>

#include "app/protocol/port_probe.h"

namespace dit::launcher {

namespace {

std::string defaultIdTag() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%m%d%H%M%S", &tm);
  std::random_device rd;
  char hex[8];
  std::snprintf(hex, sizeof hex, "%04x", static_cast<unsigned>(rd() & 0xffffu));
  return std::string(buf) + hex;
}

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

bool isFatalError(const protocol::Event& ev) {
  if (ev.type != "error") return false;
  auto it = ev.data.find("fatal");
  return it != ev.data.end() && it->is_boolean() && it->get<bool>();
}

std::string rankMessage(int rank, const std::string& msg) {
  return rank >= 0 ? "rank " + std::to_string(rank) + ": " + msg : msg;
}

}  // namespace

WorkerSession::WorkerSession(SessionObserver* observer, std::string idTag)
    : observer_(observer ? observer : &none_),
      idTag_(idTag.empty() ? defaultIdTag() : std::move(idTag)) {}

WorkerSession::~WorkerSession() {
  if (!process_.running()) return;
  for (const QueuedRequest& r : queue_)
    if (r.sent) writeRequest(protocol::CancelRequest{r.id()});
  process_.terminate(protocol::requestLine(protocol::ShutdownRequest{}),
                     GroupProcess::Teardown{std::chrono::seconds(2), std::chrono::seconds(2)});
}

const char* WorkerSession::stateName(State s) {
  switch (s) {
    case State::Stopped:
      return "stopped";
    case State::Starting:
      return "starting";
    case State::Ready:
      return "ready";
    case State::Busy:
      return "busy";
    case State::Stopping:
      return "stopping";
    case State::Failed:
      return "failed";
  }
  return "";
}

void WorkerSession::setState(State s) {
  if (s == state_) return;
  state_ = s;
  observer_->stateChanged(s);
}

void WorkerSession::setStage(const std::string& s) {
  if (s == stage_) return;
  stage_ = s;
  observer_->stageChanged(s);
}

double WorkerSession::elapsedSeconds() const {
  return started_ ? std::chrono::duration<double>(SteadyClock::now() - *started_).count() : 0.0;
}

std::string WorkerSession::activeId() const {
  for (const QueuedRequest& r : queue_)
    if (r.sent) return r.id();
  return {};
}

int WorkerSession::indexOf(const std::string& id) const {
  for (std::size_t i = 0; i < queue_.size(); ++i)
    if (queue_[i].id() == id) return static_cast<int>(i);
  return -1;
}

void WorkerSession::dropSent() {
  bool any = false;
  for (int i = static_cast<int>(queue_.size()) - 1; i >= 0; --i) {
    if (!queue_[i].sent) continue;
    const std::string id = queue_[i].id();
    const int step = queue_[i].step;
    queue_.erase(queue_.begin() + i);
    any = true;
    observer_->requestCancelled(id, step);
  }
  if (any) observer_->queueChanged();
}

bool WorkerSession::start(const SessionLaunch& launch) {
  if (process_.running() || launch.argv.empty()) return false;
  stopRequested_ = sawBye_ = sawReady_ = stopWhenIdle_ = false;
  pids_.clear();
  hosts_.clear();
  lastRanks_.clear();
  world_ = launch.world;
  hostfileGroup_ =
      std::find(launch.argv.begin(), launch.argv.end(), "--hostfile") != launch.argv.end();
  readyInfo_ = nullptr;
  fatalEvent_.reset();
  fatalSeen_.clear();
  lastFailure_ = {};
  help_.clear();
  inHelp_ = false;
  dropSent();  // interrupted requests are not re-run by themselves
  setStage({});
  started_ = SteadyClock::now();
  observer_->logLine(-1, "info", "starting: " + shellQuoted(launch.argv));
  setState(State::Starting);
  try {
    process_.start(launch.argv, launch.env);
  } catch (const std::exception& e) {
    GroupFailure f;
    f.fatal = true;
    f.message = e.what();
    lastFailure_ = f;
    observer_->logLine(-1, "error", f.message);
    failAll(f.message);
    stopRequested_ = false;
    pendingRestart_.reset();
    setState(State::Failed);
    observer_->groupFailed(f);
    return true;
  }
  exitHandled_ = false;
  observer_->fdsChanged();
  return true;
}

void WorkerSession::stop(std::chrono::milliseconds grace) {
  pendingRestart_.reset();
  shutdownGroup(grace, /*dropUnsent=*/true);
}

void WorkerSession::shutdownGroup(std::chrono::milliseconds grace, bool dropUnsent) {
  if (!process_.running()) {
    if (state_ != State::Failed) setState(State::Stopped);
    return;
  }
  if (stopRequested_) return;
  stopRequested_ = true;
  setState(State::Stopping);
  // Stop = cancel: unsent requests are dropped, the worker cancels the running one at its next
  // step (and drops the ones it queued), then shuts down cleanly.
  bool dropped = false;
  for (int i = static_cast<int>(queue_.size()) - 1; i >= 0 && dropUnsent; --i) {
    if (queue_[i].sent) continue;
    const std::string id = queue_[i].id();
    queue_.erase(queue_.begin() + i);
    dropped = true;
    observer_->requestCancelled(id, 0);
  }
  if (dropped) observer_->queueChanged();
  for (const QueuedRequest& r : queue_)
    if (r.sent) writeRequest(protocol::CancelRequest{r.id()});
  process_.beginTeardown(protocol::requestLine(protocol::ShutdownRequest{}),
                         GroupProcess::Teardown{std::max(grace, std::chrono::milliseconds(0)),
                                                std::chrono::seconds(3)});
  // The exit, even one already seen, is handled on the caller's next turn (never inside stop():
  // a caller may be in the middle of its own handling, such as a window's close event).
  observer_->fdsChanged();
}

void WorkerSession::restart(const SessionLaunch& launch) {
  if (!process_.running()) {
    start(launch);
    return;
  }
  restartTo(launch);
}

void WorkerSession::stopForRestart() {
  if (process_.running()) restartTo(std::nullopt);
}

void WorkerSession::restartTo(const std::optional<SessionLaunch>& launch) {
  // In-flight requests are cancelled with the old group (the worker stops at its next step);
  // unsent ones move to the new one.
  for (int i = static_cast<int>(queue_.size()) - 1; i >= 0; --i) {
    if (!queue_[i].sent) continue;
    const std::string id = queue_[i].id();
    writeRequest(protocol::CancelRequest{id});
    queue_.erase(queue_.begin() + i);
    observer_->requestCancelled(id, 0);
  }
  observer_->queueChanged();
  pendingRestart_ = launch;  // before: the old group may be found gone at once
  shutdownGroup(std::chrono::seconds(3), /*dropUnsent=*/false);
}

void WorkerSession::stopWhenIdle() {
  stopWhenIdle_ = true;
  maybeStopWhenIdle();
}

void WorkerSession::maybeStopWhenIdle() {
  if (stopWhenIdle_ && queue_.empty() && process_.running() && !stopRequested_) stop();
}

std::string WorkerSession::submit(protocol::GenerateRequest request) {
  if (request.id.empty()) request.id = "r" + std::to_string(nextId_++) + "-" + idTag_;
  QueuedRequest q;
  q.steps = request.params.steps;
  q.request = std::move(request);
  queue_.push_back(std::move(q));
  observer_->queueChanged();
  if (sawReady_ && process_.running() && !stopRequested_) flushQueue();
  return queue_.back().id();
}

bool WorkerSession::cancel(const std::string& id) {
  const int i = indexOf(id);
  if (i < 0) return false;
  if (!queue_[i].sent) {
    queue_.erase(queue_.begin() + i);
    observer_->requestCancelled(id, 0);
    observer_->queueChanged();
    updateBusy();
    maybeStopWhenIdle();
    return true;
  }
  writeRequest(protocol::CancelRequest{id});
  return true;
}

void WorkerSession::cancelAll() {
  std::vector<std::string> ids;
  for (const QueuedRequest& r : queue_) ids.push_back(r.id());
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) cancel(*it);
}

bool WorkerSession::writeRequest(const protocol::Request& r) {
  // Serialised by the protocol module: 64-bit seeds as JSON integers, never through a double.
  return process_.writeLine(protocol::requestLine(r));
}

void WorkerSession::flushQueue() {
  bool any = false;
  for (QueuedRequest& r : queue_) {
    if (r.sent) continue;
    protocol::GenerateRequest g = r.request;
    if (prepareRequest) prepareRequest(g);
    if (!writeRequest(g)) break;
    r.sent = true;
    any = true;
  }
  if (any) observer_->queueChanged();
  updateBusy();
}

void WorkerSession::updateBusy() {
  if (!sawReady_ || stopRequested_ || !process_.running()) return;
  setState(queue_.empty() ? State::Ready : State::Busy);
}

void WorkerSession::failAll(const std::string& message) {
  const std::vector<QueuedRequest> copy = std::move(queue_);
  queue_.clear();
  for (const QueuedRequest& r : copy) observer_->requestFailed(r.id(), message);
  if (!copy.empty()) observer_->queueChanged();
}

// ------------------------------------------------------------------------------ poll loop

std::vector<WorkerSession::PollFd> WorkerSession::pollFds() const {
  std::vector<PollFd> fds;
  if (process_.stdoutFd() >= 0) fds.push_back({process_.stdoutFd(), FdKind::Stdout});
  if (process_.stderrFd() >= 0) fds.push_back({process_.stderrFd(), FdKind::Stderr});
  if (process_.exitFd() >= 0) fds.push_back({process_.exitFd(), FdKind::Exit});
  return fds;
}

void WorkerSession::onReadable(int fd) {
  if (fd < 0) return;
  if (fd == process_.stdoutFd()) {
    for (const std::string& l : process_.read(GroupProcess::Stream::Stdout)) handleStdoutLine(l);
    if (process_.stdoutFd() < 0) observer_->fdsChanged();
  } else if (fd == process_.stderrFd()) {
    for (const std::string& l : process_.read(GroupProcess::Stream::Stderr)) handleStderrLine(l);
    if (process_.stderrFd() < 0) observer_->fdsChanged();
  } else if (fd == process_.exitFd()) {
    advanceTeardown();
  }
}

std::optional<SteadyClock::time_point> WorkerSession::nextTimeout() const {
  // The child was reaped while an event was handled (a fatal error starts the teardown): its
  // exit is handled on the next turn of the caller's loop.
  if (!exitHandled_ && !process_.running()) return SteadyClock::time_point{};  // due
  return process_.nextTimeout();
}

void WorkerSession::onTimeout() { advanceTeardown(); }

void WorkerSession::advanceTeardown() {
  const int sent = process_.advance();
  if (sent == SIGTERM)
    observer_->logLine(-1, "info",
                       "the group did not exit after shutdown; ending mpirun's process group and "
                       "its descendants (SIGTERM)");
  else if (sent == SIGKILL && fatalEvent_)
    observer_->logLine(-1, "info",
                       "mpirun did not end the group after the error; killing its process group "
                       "and its descendants");
  else if (sent == SIGKILL)
    observer_->logLine(-1, "info", "killing mpirun's process group and its descendants");
  if (!process_.running() && !exitHandled_) handleExit();
}

void WorkerSession::feedStdout(std::string_view bytes) {
  for (const std::string& l : fed_.feed(bytes)) handleStdoutLine(l);
}

void WorkerSession::pollOnce(std::chrono::milliseconds maxWait) { pollSessions({this}, maxWait); }

void pollSessions(const std::vector<WorkerSession*>& sessions, std::chrono::milliseconds maxWait) {
  std::vector<pollfd> fds;
  std::vector<WorkerSession*> owner;
  auto until = SteadyClock::now() + maxWait;
  for (WorkerSession* s : sessions) {
    for (const auto& p : s->pollFds()) {
      fds.push_back(pollfd{p.fd, POLLIN, 0});
      owner.push_back(s);
    }
    if (auto t = s->nextTimeout(); t && *t < until) until = *t;
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - SteadyClock::now());
  const int waitMs = static_cast<int>(std::max<long long>(0, ms.count()));
  if (fds.empty()) {
    if (waitMs > 0) ::poll(nullptr, 0, waitMs);
  } else {
    ::poll(fds.data(), fds.size(), waitMs);
    for (std::size_t i = 0; i < fds.size(); ++i)
      if (fds[i].revents != 0) owner[i]->onReadable(fds[i].fd);
  }
  // Only due deadlines, as an event loop's timer would run them.
  const auto now = SteadyClock::now();
  for (WorkerSession* s : sessions)
    if (auto t = s->nextTimeout(); t && *t <= now) s->onTimeout();
}

// ------------------------------------------------------------------------------ streams

void WorkerSession::handleStdoutLine(const std::string& line) {
  // mpirun interleaves the ranks' output in pieces: an event may follow other text (or a cut
  // event) on the line; that text is output.
  if (auto found = protocol::findEventInLine(line)) {
    const std::string before = line.substr(0, found->offset);
    if (!trimmed(before).empty()) observer_->outputLine(GroupProcess::Stream::Stdout, before);
    handleEvent(found->event);
  } else if (!trimmed(line).empty()) {
    observer_->outputLine(GroupProcess::Stream::Stdout, line);
  }
}

void WorkerSession::handleStderrLine(const std::string& line) {
  // A rank that aborts the group writes its fatal `error` event to stderr as well (mpirun may
  // drop its last stdout line on MPI_Abort, OpenMPI 5), possibly in the middle of a line of
  // another rank's stderr: that event is handled (a repeat of the stdout copy is dropped), the
  // text before it is output.
  std::string text = line;
  const bool afterFatal = fatalEvent_.has_value();
  if (auto found = protocol::findEventInLine(line); found && isFatalError(found->event)) {
    handleEvent(found->event);
    text = line.substr(0, found->offset);
    // A rank's own output cut by the event: shown as it is.
    if (!trimmed(text).empty()) observer_->outputLine(GroupProcess::Stream::Stderr, text);
    return;
  }
  // OpenMPI's reports come as blocks between rules of dashes (show_help): held until the block
  // is complete, then shown only when no cause is known (issue 36: no raw OpenMPI text where the
  // launcher names the cause).
  const bool rule = text.size() >= 20 && text.find_first_not_of('-') == std::string::npos;
  if (rule || inHelp_) {
    help_.push_back(text);
    if (rule && help_.size() > 1)
      flushHelp();
    else
      inHelp_ = true;
    if (help_.size() > 400) flushHelp();  // not a block after all: no unbounded hold
    return;
  }
  if (trimmed(text).empty()) return;
  // OpenMPI 5's abort of the rank that lost its peer ("[vm:00000] *** An error occurred in
  // Socket closed", ...): the session names the cause (crashFailure).
  const bool peerAbort = isMpiAbortLine(text) && peerLostReported();
  if (afterFatal || peerAbort)  // the named cause came first: what follows is the teardown's noise
    observer_->logLine(-1, "debug", text);
  else
    observer_->outputLine(GroupProcess::Stream::Stderr, text);
}

void WorkerSession::flushHelp() {
  inHelp_ = false;
  std::string block;
  for (const std::string& l : help_) block += l + "\n";
  const bool known = fatalEvent_ || parseHostFailure(block) || parseMpirunFailure(block) ||
                     parseHostFailure(process_.stderrTail()) || peerLostReported();
  for (const std::string& l : help_) {
    if (trimmed(l).empty()) continue;
    if (known)
      observer_->logLine(-1, "debug", l);
    else
      observer_->outputLine(GroupProcess::Stream::Stderr, l);
  }
  help_.clear();
}

// ------------------------------------------------------------------------------ events

bool WorkerSession::isRepeatedFatal(const protocol::Event& ev) const {
  if (!isFatalError(ev) || fatalSeen_.empty()) return false;
  const auto e = std::get<protocol::ErrorEvent>(protocol::decodeEvent(ev));
  return std::find(fatalSeen_.begin(), fatalSeen_.end(),
                   std::make_pair(e.rank, rankMessage(e.rank, e.message))) != fatalSeen_.end();
}

void WorkerSession::handleEvent(const protocol::Event& ev) {
  // abortGroup writes a fatal error to stdout and stderr: the second copy is dropped.
  if (isRepeatedFatal(ev)) return;
  const protocol::WorkerEvent typed = protocol::decodeEvent(ev);
  // Bookkeeping the observer may read while it handles the event.
  if (const auto* h = std::get_if<protocol::HelloEvent>(&typed)) {
    if (ev.data.contains("world")) world_ = h->world;
    if (h->rank >= 0) pids_[h->rank] = h->pid;
    if (h->rank >= 0 && !h->host.empty()) hosts_[h->rank] = h->host;
  } else if (const auto* r = std::get_if<protocol::ReadyEvent>(&typed)) {
    readyInfo_ = ev.data;
    sawReady_ = true;
    if (ev.data.contains("world")) world_ = r->world;
  } else if (const auto* st = std::get_if<protocol::StatusEvent>(&typed)) {
    setStage(st->stage);
  } else if (const auto* rk = std::get_if<protocol::RanksEvent>(&typed)) {
    for (const protocol::RankStats& r : rk->ranks) {
      lastRanks_[r.rank] = r;
      // Rank 0 leads every request: its stage is the group's.
      if (r.rank == 0 && !r.stage.empty()) setStage(r.stage);
    }
  } else if (const auto* a = std::get_if<protocol::AcceptedEvent>(&typed)) {
    if (const int i = indexOf(a->id); i >= 0) {
      queue_[i].queue_position = a->queue_position;
      queue_[i].accepted = true;
    }
  } else if (const auto* p = std::get_if<protocol::ProgressEvent>(&typed)) {
    if (const int i = indexOf(p->id); i >= 0) {
      queue_[i].step = p->step;
      queue_[i].steps = p->steps;
      queue_[i].image_index = p->image_index;
    }
  }
  observer_->event(ev, typed);
  // Consequences: state, queue, request outcomes.
  if (std::holds_alternative<protocol::ReadyEvent>(typed)) {
    setStage("idle");
    if (!stopRequested_) {
      setState(State::Ready);
      flushQueue();
      maybeStopWhenIdle();
    }
  } else if (std::holds_alternative<protocol::AcceptedEvent>(typed)) {
    observer_->queueChanged();
  } else if (std::holds_alternative<protocol::DoneEvent>(typed) ||
             std::holds_alternative<protocol::CancelledEvent>(typed)) {
    const auto* done = std::get_if<protocol::DoneEvent>(&typed);
    const auto* cancelled = std::get_if<protocol::CancelledEvent>(&typed);
    const std::string& id = done ? done->id : cancelled->id;
    const int i = indexOf(id);
    if (i < 0) return;  // already finished (e.g. a cancel that arrived after `done`)
    queue_.erase(queue_.begin() + i);
    if (done)
      observer_->requestDone(id, done->seconds);
    else
      observer_->requestCancelled(id, cancelled->step);
    observer_->queueChanged();
    if (queue_.empty()) setStage("idle");
    updateBusy();
    maybeStopWhenIdle();
  } else if (const auto* e = std::get_if<protocol::ErrorEvent>(&typed)) {
    handleError(*e);
  } else if (const auto* l = std::get_if<protocol::LogEvent>(&typed)) {
    observer_->logLine(l->rank, l->level.empty() ? "info" : l->level, l->message);
  } else if (std::holds_alternative<protocol::ByeEvent>(typed)) {
    sawBye_ = true;
  }
}

void WorkerSession::handleError(const protocol::ErrorEvent& e) {
  GroupFailure f;
  f.id = e.id.value_or("");
  f.rank = e.rank;
  if (auto it = pids_.find(e.rank); it != pids_.end()) f.pid = it->second;
  f.fatal = e.fatal;
  f.message = rankMessage(e.rank, e.message);
  // The queue entry this error ends (-1: none).
  int failed = f.fatal || f.id.empty() ? -1 : indexOf(f.id);
  if (e.refused && !f.fatal && failed < 0) {
    // A line refused without a readable id: rank 0 answers the lines in order, each generate
    // with `accepted` or a refusal, so it is the oldest sent request not accepted yet (found by
    // position: a refused duplicate shares its id with the live request).
    for (std::size_t i = 0; i < queue_.size() && failed < 0; ++i)
      if (queue_[i].sent && !queue_[i].accepted) failed = static_cast<int>(i);
    if (failed >= 0) f.id = queue_[static_cast<std::size_t>(failed)].id();
  }
  if (f.fatal) {
    fatalSeen_.emplace_back(f.rank, f.message);
    // The first fatal error is the cause; the ones after it are the teardown's consequences.
    if (!fatalEvent_) fatalEvent_ = f;
  }
  lastFailure_ = f;
  observer_->logLine(f.rank, "error", e.message);
  observer_->errorReported(f);
  if (f.fatal && process_.running()) {
    // The group is going down: mpirun should exit within seconds, but it can wait forever on a
    // host it cannot reach (a link that dropped mid-run). Bounded by the teardown policy.
    process_.beginTeardown({}, fatalTeardown_);
    observer_->fdsChanged();
  }
  if (!f.id.empty() && !f.fatal) {
    if (failed >= 0) queue_.erase(queue_.begin() + failed);
    observer_->requestFailed(f.id, f.message);
    observer_->queueChanged();
    updateBusy();
    maybeStopWhenIdle();
  }
}

bool WorkerSession::peerLostReported() const {
  const std::string& tail = process_.stderrTail();
  if (tail.find("unexpectedly") == std::string::npos &&
      tail.find("Socket closed") == std::string::npos)
    return false;  // cheap test first: the regexes only when the words are there
  const std::optional<RankFailure> mp = parseMpirunFailure(tail);
  return mp && mp->peer_lost;
}

namespace {
// "host.example" and "host" name the same machine here (names, not addresses: "10.0.0.1" and
// "10.0.0.2" do not).
bool sameHost(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  if (a == b) return true;
  auto isName = [](const std::string& h) {
    return std::any_of(h.begin(), h.end(), [](unsigned char c) { return std::isalpha(c); }) &&
           h.find(':') == std::string::npos;
  };
  return isName(a) && isName(b) && a.substr(0, a.find('.')) == b.substr(0, b.find('.'));
}
}  // namespace

std::string WorkerSession::peerLostMessage(const RankFailure& mp, GroupFailure& f) const {
  // The rank that lost its peer: its pid from the report (or its hello), its host likewise.
  int reporter = mp.rank;
  if (reporter < 0 && mp.pid > 0)
    for (const auto& [r, p] : pids_)
      if (p == mp.pid) reporter = r;
  std::int64_t reporterPid = mp.pid;
  if (reporterPid <= 0 && reporter >= 0)
    if (auto it = pids_.find(reporter); it != pids_.end()) reporterPid = it->second;
  std::string reporterHost = mp.node;
  if (reporterHost.empty() && reporter >= 0)
    if (auto it = hosts_.find(reporter); it != hosts_.end()) reporterHost = it->second;
  std::string who = reporter >= 0 ? "rank " + std::to_string(reporter) : std::string("a rank");
  if (reporterPid > 0 && !reporterHost.empty())
    who += " (pid " + std::to_string(reporterPid) + " on " + reporterHost + ")";
  else if (reporterPid > 0)
    who += " (pid " + std::to_string(reporterPid) + ")";
  else if (!reporterHost.empty())
    who += " (on " + reporterHost + ")";
  // The suspects: the ranks on the peer host, from their hello events. When OpenMPI's report
  // names no peer host (its short "Socket closed" form, seen on OpenMPI 5 under load), a TCP
  // socket between ranks joins two hosts: the suspects are the ranks on a host other than the
  // reporter's (the hostfile group's watch then asks their hosts over ssh).
  std::vector<int> suspects;
  std::string reporterHello;
  if (auto it = hosts_.find(reporter); reporter >= 0 && it != hosts_.end())
    reporterHello = it->second;
  for (const auto& [r, h] : hosts_) {
    if (r == reporter) continue;
    if (!mp.peer_host.empty() ? sameHost(h, mp.peer_host)
                              : !reporterHello.empty() && !h.empty() && h != reporterHello &&
                                    !sameHost(h, reporterHello))
      suspects.push_back(r);
  }
  if (mp.peer_host.empty() && suspects.empty())
    return who + " lost its connection to another rank mid-run (OpenMPI: socket closed) and " +
           "OpenMPI ended the group";
  if (suspects.empty())
    return "a rank on " + mp.peer_host + " disconnected: " + who +
           " lost its connection to it mid-run";
  std::string clauses;
  for (int r : suspects) {
    const auto pid = pids_.find(r);
    if (!clauses.empty()) clauses += " or ";
    clauses += "rank " + std::to_string(r) + " (pid " +
               std::to_string(pid != pids_.end() ? pid->second : -1) + " on " + hosts_.at(r) +
               ") disconnected";
  }
  if (suspects.size() == 1) {
    f.rank = suspects.front();
    if (auto it = pids_.find(f.rank); it != pids_.end()) f.pid = it->second;
  }
  return clauses + ": " + who + " lost its connection to " +
         (suspects.size() == 1   ? std::string("it")
          : mp.peer_host.empty() ? std::string("one of them")
                                 : "a rank on " + mp.peer_host) +
         " mid-run";
}

GroupFailure WorkerSession::crashFailure(const ExitStatus& status, bool wasReady) const {
  GroupFailure f;
  f.fatal = true;
  const std::optional<RankFailure> mp = process_.rankFailure();
  if (fatalEvent_) {
    f = *fatalEvent_;
    f.fatal = true;
    if (mp && !mp->reason.empty()) f.detail = "mpirun: " + mp->reason;
  } else if (mp && mp->peer_lost) {
    // OpenMPI 5 (issue 36): the rank that saw its peer's socket close was aborted at once and
    // prterun reports that abort; the peer is the cause. OpenMPI's own text adds nothing.
    f.message = peerLostMessage(*mp, f);
    // Before `ready` a lost connection is how OpenMPI 5 ends a group whose traffic does not get
    // through (OpenMPI 4 spins until the start-up collective times out, with this advice).
    if (!wasReady && hostfileGroup_) {
      if (const auto at = f.message.rfind(" mid-run"); at != std::string::npos)
        f.message.replace(at, 8, " during the group's start-up");
      f.message += ". Likely " + protocol::hostNetworkAdvice();
    }
    return f;
  } else if (mp) {
    f.rank = mp->rank;
    f.pid = mp->pid;
    if (mp->pid <= 0)
      if (auto it = pids_.find(mp->rank); it != pids_.end()) f.pid = it->second;
    f.message = mp->reason;
    // OpenMPI sometimes reports "PID 0"; the rank's hello event has the real one.
    const std::string reported = "(pid " + std::to_string(mp->pid) + " ";
    if (mp->pid <= 0 && f.pid > 0)
      if (auto at = f.message.find(reported); at != std::string::npos)
        f.message.replace(at, reported.size(), "(pid " + std::to_string(f.pid) + " ");
    if (auto it = lastRanks_.find(f.rank); f.rank >= 0 && it != lastRanks_.end()) {
      const protocol::RankStats& r = it->second;
      if (!r.stage.empty())
        f.message += r.steps > 0 ? " while " + r.stage + " (step " + std::to_string(r.step) + "/" +
                                       std::to_string(r.steps) + ")"
                                 : " while " + r.stage;
    }
  } else if (const auto hf = parseHostFailure(process_.stderrTail())) {
    // ssh could not reach a host of the hostfile: no daemon there, no rank started.
    f.host = hf->host;
    f.message = (hf->host.empty() ? std::string("a host of the hostfile") : "host " + hf->host) +
                ": " + hf->cause + "; mpirun could not start the group there" +
                (hf->fix.empty() ? std::string() : ". " + hf->fix);
  } else if (!status.exited) {
    f.message = "mpirun was ended by " + status.describe();
  } else {
    f.message = std::string(wasReady ? "the worker group exited unexpectedly"
                                     : "the worker group failed to start") +
                " (mpirun exit code " + std::to_string(status.code) + ")";
    if (!wasReady && hostfileGroup_) f.message += ". Perhaps " + protocol::hostNetworkAdvice();
  }
  // ssh's cause and its fix are the message: OpenMPI's text around them adds nothing (issue 36).
  if (!f.host.empty() ||
      (f.rank < 0 && f.message.find("mpirun could not start the group there") != std::string::npos))
    return f;
  // The last meaningful stderr lines, for context (fatal events copied there are the message).
  std::vector<std::string> tail;
  const std::string& err = process_.stderrTail();
  std::size_t end = err.size();
  while (end > 0 && tail.size() < 6) {
    const std::size_t nl = err.rfind('\n', end - 1);
    const std::size_t from = nl == std::string::npos ? 0 : nl + 1;
    const std::string l = trimmed(err.substr(from, end - from));
    if (!l.empty() && l.rfind("----", 0) != 0 &&
        l.find(protocol::kEventPrefix) == std::string::npos)
      tail.insert(tail.begin(), l);
    if (nl == std::string::npos) break;
    end = nl;
  }
  for (const std::string& l : tail) f.detail += (f.detail.empty() ? "" : "\n") + l;
  return f;
}

void WorkerSession::handleExit() {
  exitHandled_ = true;
  // What is left in the pipes (the child wrote it before it exited), then the partial lines.
  for (const std::string& l : process_.read(GroupProcess::Stream::Stdout)) handleStdoutLine(l);
  for (const std::string& l : process_.read(GroupProcess::Stream::Stderr)) handleStderrLine(l);
  if (std::string rest = process_.flushPartial(GroupProcess::Stream::Stdout); !rest.empty())
    handleStdoutLine(rest);
  if (std::string rest = process_.flushPartial(GroupProcess::Stream::Stderr); !rest.empty())
    handleStderrLine(rest);
  if (!help_.empty()) flushHelp();
  process_.closeOutput();
  observer_->fdsChanged();
  const ExitStatus status = process_.exitStatus().value_or(ExitStatus{});
  const int code = status.shellCode();
  const bool wasReady = sawReady_;
  sawReady_ = false;
  if (stopRequested_) {
    observer_->logLine(-1, "info", "worker group stopped (mpirun " + status.describe() + ")");
    dropSent();  // cancelled by stop() (a worker that exited before saying so included)
    setStage("stopped");
    setState(State::Stopped);
    observer_->groupStopped(code);
  } else {
    const GroupFailure f = crashFailure(status, wasReady);
    lastFailure_ = f;
    observer_->logLine(f.rank, "error", f.message);
    if (wasReady || !keepUnsentOnFailedStart) {
      failAll(f.message);
    } else if (!queue_.empty()) {
      // No request reached a worker (they are sent after `ready`): they wait for the next start.
      observer_->logLine(-1, "info",
                         std::to_string(queue_.size()) +
                             " request(s) stay queued: they run when the group starts");
    }
    setStage("failed");
    setState(State::Failed);
    observer_->groupFailed(f);
  }
  stopRequested_ = false;
  if (pendingRestart_) {
    const SessionLaunch next = *pendingRestart_;
    pendingRestart_.reset();
    start(next);
  }
}

}  // namespace dit::launcher
