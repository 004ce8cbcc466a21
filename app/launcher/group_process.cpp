#include "app/launcher/group_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace dit::launcher {

namespace {

constexpr std::size_t kTailBytes = 64 * 1024;
constexpr auto kReapTick = std::chrono::milliseconds(100);

// /proc/PID/stat after the command name: state, ppid, ... starttime (field 22).
struct ProcStat {
  char state = 0;
  pid_t ppid = 0;
  unsigned long long start = 0;
};

std::optional<ProcStat> procStat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return std::nullopt;
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(stat.substr(close + 1));
  ProcStat s;
  if (!(rest >> s.state >> s.ppid)) return std::nullopt;
  std::string skip;
  for (int field = 5; field < 22 && rest >> skip; ++field) {
  }
  rest >> s.start;
  return s;
}

std::string errnoText(int e) { return std::strerror(e); }

}  // namespace

std::string ExitStatus::describe() const {
  if (exited) return "exit code " + std::to_string(code);
  const char* name = ::strsignal(signal);
  return "signal " + std::to_string(signal) + (name ? std::string(" (") + name + ")" : "");
}

std::vector<std::string> LineBuffer::feed(std::string_view bytes) {
  std::vector<std::string> lines;
  while (!bytes.empty()) {
    const auto nl = bytes.find('\n');
    const std::string_view part = bytes.substr(0, nl);
    if (!overlong_) {
      const std::size_t room = max_ > buf_.size() ? max_ - buf_.size() : 0;
      buf_.append(part.substr(0, room));
      overlong_ = part.size() > room;
    }
    if (nl == std::string_view::npos) break;
    if (!buf_.empty() && buf_.back() == '\r') buf_.pop_back();
    lines.push_back(std::move(buf_));
    buf_.clear();
    overlong_ = false;
    bytes.remove_prefix(nl + 1);
  }
  return lines;
}

std::string LineBuffer::flush() {
  std::string rest = std::move(buf_);
  buf_.clear();
  overlong_ = false;
  if (!rest.empty() && rest.back() == '\r') rest.pop_back();
  return rest;
}

std::vector<pid_t> descendantPids(pid_t root) {
  std::map<pid_t, std::vector<pid_t>> children;
  std::error_code ec;
  for (const auto& d : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = d.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (const auto s = procStat(pid)) children[s->ppid].push_back(pid);
  }
  std::vector<pid_t> out;
  std::vector<pid_t> todo{root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    for (pid_t c : children[p]) {
      out.push_back(c);
      todo.push_back(c);
    }
  }
  return out;
}

GroupProcess::~GroupProcess() {
  // A running child, or descendants an armed teardown has not ended yet (orphans of mpirun).
  if (running() || (termAt_ && !tree_.empty()))
    terminate("", Teardown{std::chrono::milliseconds(0), std::chrono::seconds(2)});
  closeFd(in_);
  closeFd(out_);
  closeFd(err_);
  closeFd(pidfd_);
}

void GroupProcess::closeFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

void GroupProcess::start(const std::vector<std::string>& argv,
                         const std::vector<std::pair<std::string, std::string>>& env) {
  if (argv.empty() || argv.front().empty())
    throw std::invalid_argument("GroupProcess::start: no program to start");
  if (running()) throw std::logic_error("GroupProcess::start: a group is already running");
  closeFd(in_);
  closeFd(out_);
  closeFd(err_);
  closeFd(pidfd_);
  pid_ = -1;
  exit_.reset();
  termAt_.reset();
  killAt_.reset();
  termSent_ = killSent_ = skipTerm_ = false;
  tree_.clear();
  errTail_.clear();
  outLines_ = LineBuffer();
  errLines_ = LineBuffer();
  // A group that dies before reading its stdin must not end this process (EPIPE instead).
  ::signal(SIGPIPE, SIG_IGN);

  // Everything the child needs is built before fork (the caller may have threads: no malloc
  // after fork).
  std::vector<std::string> envStrings;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    const std::string_view name = kv.substr(0, kv.find('='));
    const bool replaced =
        std::any_of(env.begin(), env.end(), [&](const auto& p) { return p.first == name; });
    if (!replaced) envStrings.emplace_back(kv);
  }
  for (const auto& [name, value] : env) envStrings.push_back(name + "=" + value);
  std::vector<char*> envp, args;
  for (auto& s : envStrings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argCopy = argv;
  for (auto& a : argCopy) args.push_back(a.data());
  args.push_back(nullptr);

  int inPipe[2], outPipe[2], errPipe[2], execPipe[2];
  if (::pipe2(inPipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe2: " + errnoText(errno));
  if (::pipe2(outPipe, O_CLOEXEC) != 0 || ::pipe2(errPipe, O_CLOEXEC) != 0 ||
      ::pipe2(execPipe, O_CLOEXEC) != 0)
    throw std::runtime_error("pipe2: " + errnoText(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {inPipe[0], inPipe[1], outPipe[0], outPipe[1], errPipe[0], errPipe[1],
                   execPipe[0], execPipe[1]})
      ::close(fd);
    throw std::runtime_error("cannot start " + argv.front() + ": fork: " + errnoText(e));
  }
  if (pid == 0) {
    // mpirun and what it starts here (ranks, ssh to the other hosts) form a process group of
    // their own, so that the teardown can end all of them together.
    ::setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGQUIT, SIGHUP}) ::signal(sig, SIG_DFL);
    ::dup2(inPipe[0], 0);
    ::dup2(outPipe[1], 1);
    ::dup2(errPipe[1], 2);
    ::execvpe(args[0], args.data(), envp.data());
    const int e = errno;
    (void)!::write(execPipe[1], &e, sizeof e);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no race with a signal sent right after start()
  ::close(inPipe[0]);
  ::close(outPipe[1]);
  ::close(errPipe[1]);
  ::close(execPipe[1]);
  int execErrno = 0;
  ssize_t got;
  do got = ::read(execPipe[0], &execErrno, sizeof execErrno);
  while (got < 0 && errno == EINTR);
  ::close(execPipe[0]);
  if (got == static_cast<ssize_t>(sizeof execErrno)) {
    ::close(inPipe[1]);
    ::close(outPipe[0]);
    ::close(errPipe[0]);
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    throw std::runtime_error("cannot start " + argv.front() + ": " + errnoText(execErrno));
  }
  pid_ = pid;
  in_ = inPipe[1];
  out_ = outPipe[0];
  err_ = errPipe[0];
  for (int fd : {out_, err_}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd_ >= 0) ::fcntl(pidfd_, F_SETFD, FD_CLOEXEC);
}

std::vector<std::string> GroupProcess::read(Stream s) {
  int& fd = s == Stream::Stdout ? out_ : err_;
  LineBuffer& lines = s == Stream::Stdout ? outLines_ : errLines_;
  std::vector<std::string> out;
  if (fd < 0) return out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      const std::string_view chunk(buf, static_cast<std::size_t>(n));
      if (s == Stream::Stderr) {
        errTail_.append(chunk);
        if (errTail_.size() > kTailBytes) errTail_.erase(0, errTail_.size() - kTailBytes);
      }
      for (auto& l : lines.feed(chunk)) out.push_back(std::move(l));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // End of file (or an error that ends the stream): the partial last line counts.
    if (std::string rest = lines.flush(); !rest.empty()) out.push_back(std::move(rest));
    closeFd(fd);
    break;
  }
  return out;
}

bool GroupProcess::writeLine(const std::string& line) {
  if (in_ < 0 || !running()) return false;
  const std::string data = line + "\n";
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(in_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

void GroupProcess::closeStdin() { closeFd(in_); }

bool GroupProcess::reap() {
  if (pid_ <= 0 || exit_) return false;
  int status = 0;
  pid_t r;
  do r = ::waitpid(pid_, &status, WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  ExitStatus e;
  if (r < 0) {  // not our child any more (someone else reaped it): report it as gone
    e.exited = true;
    e.code = -1;
  } else if (WIFEXITED(status)) {
    e.exited = true;
    e.code = WEXITSTATUS(status);
  } else {
    e.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  }
  exit_ = e;
  closeFd(pidfd_);
  closeFd(in_);
  return true;
}

void GroupProcess::remember(const std::vector<pid_t>& pids) {
  for (pid_t p : pids)
    if (std::find(tree_.begin(), tree_.end(), p) == tree_.end()) tree_.push_back(p);
}

void GroupProcess::signalAll(int sig) {
  if (running()) {
    remember(descendantPids(pid_));
    ::kill(-pid_, sig);  // the process group (mpirun and the ranks it started here)
    ::kill(pid_, sig);   // the leader, should it have left its group
  }
  // Descendants in process groups of their own (ssh sessions, daemons), also once orphaned.
  for (pid_t p : tree_) ::kill(p, sig);
}

void GroupProcess::beginTeardown(const std::string& shutdown_line, Teardown policy) {
  if (!running()) return;
  if (!shutdown_line.empty() && in_ >= 0) writeLine(shutdown_line);
  closeStdin();
  if (!policy.sigterm) skipTerm_ = true;
  const auto now = SteadyClock::now();
  const auto term = now + policy.grace;
  if (!termAt_ || term < *termAt_) termAt_ = term;
  const auto kill = *termAt_ + policy.kill_after;
  if (!killAt_ || kill < *killAt_) killAt_ = kill;
  remember(descendantPids(pid_));
  advance(now);
}

int GroupProcess::advance(SteadyClock::time_point now) {
  reap();
  if (!termAt_) return 0;
  if (running()) remember(descendantPids(pid_));
  // Forget descendants that are gone (their pids may be reused later).
  tree_.erase(std::remove_if(tree_.begin(), tree_.end(),
                             [](pid_t p) {
                               const auto s = procStat(p);
                               return !s || s->state == 'Z' || s->state == 'X';
                             }),
              tree_.end());
  int sent = 0;
  if (!termSent_ && now >= *termAt_) {
    termSent_ = true;
    if (skipTerm_) killSent_ = true;  // SIGKILL now, instead of SIGTERM
    if (running() || !tree_.empty()) {
      sent = skipTerm_ ? SIGKILL : SIGTERM;
      signalAll(sent);
    }
  }
  if (!killSent_ && killAt_ && now >= *killAt_) {
    killSent_ = true;
    if (running() || !tree_.empty()) {
      signalAll(SIGKILL);
      sent = SIGKILL;
    }
  }
  reap();
  return sent;
}

std::optional<SteadyClock::time_point> GroupProcess::nextTimeout() const {
  std::optional<SteadyClock::time_point> next;
  auto consider = [&](SteadyClock::time_point t) {
    if (!next || t < *next) next = t;
  };
  const bool anyLeft = running() || !tree_.empty();
  if (termAt_ && anyLeft) {
    if (!termSent_)
      consider(*termAt_);
    else if (!killSent_ && killAt_)
      consider(*killAt_);
    // While the teardown runs, descendants are looked up again (new ones, orphans).
    consider(SteadyClock::now() + kReapTick);
  }
  if (running() && pidfd_ < 0) consider(SteadyClock::now() + kReapTick);
  return next;
}

std::optional<ExitStatus> GroupProcess::wait(
    std::chrono::milliseconds timeout,
    const std::function<void(Stream, const std::string&)>& onLine) {
  const auto deadline = SteadyClock::now() + timeout;
  auto settled = [&] { return exit_ && (tree_.empty() || !termAt_ || killSent_); };
  auto drain = [&] {
    for (Stream s : {Stream::Stdout, Stream::Stderr})
      for (const auto& l : read(s))
        if (onLine) onLine(s, l);
  };
  for (;;) {
    advance();
    // After the exit, what is left in the pipes is read (without waiting for their end: a
    // descendant may still hold them open).
    const auto now = SteadyClock::now();
    if (settled() || now >= deadline) {
      drain();
      return exit_;
    }
    auto until = deadline;
    if (auto t = nextTimeout(); t && *t < until) until = *t;
    if (exit_ && !tree_.empty() && termAt_ && !killSent_) until = std::min(until, now + kReapTick);
    std::vector<pollfd> fds;
    for (int fd : {out_, err_, pidfd_})
      if (fd >= 0) fds.push_back(pollfd{fd, POLLIN, 0});
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count();
    const int waitMs = static_cast<int>(std::clamp<long long>(ms, 0, 1000));
    if (fds.empty()) {
      ::usleep(static_cast<useconds_t>(std::max(1, waitMs)) * 1000);
    } else if (::poll(fds.data(), fds.size(), waitMs) < 0 && errno != EINTR) {
      return exit_;
    }
    drain();
  }
}

std::optional<ExitStatus> GroupProcess::terminate(const std::string& shutdown_line,
                                                  Teardown policy) {
  if (!running() && tree_.empty()) return exit_;
  if (running()) {
    beginTeardown(shutdown_line, policy);
  } else {  // the child has exited: only its descendants are left, ended now
    const auto now = SteadyClock::now();
    if (!termAt_ || now < *termAt_) termAt_ = now;
    const auto kill = *termAt_ + policy.kill_after;
    if (!killAt_ || kill < *killAt_) killAt_ = kill;
  }
  return wait(policy.grace + policy.kill_after + std::chrono::seconds(1));
}

}  // namespace dit::launcher
