// GroupProcess: one started worker group (mpirun, or ditstudio-isolate exec'ing mpirun) as a
// POSIX child, in a process group of its own, with its stdin, stdout and stderr as non-blocking
// pipes read line by line, and the ONE teardown policy of every front end:
//   shutdown line on stdin (then stdin closed) -> `grace` -> SIGTERM to the process group and
//   every descendant (mpirun puts its ssh sessions and daemons in process groups of their own)
//   -> `kill_after` -> SIGKILL to the same set.
// Nothing here blocks except wait(); a caller's event loop polls fds() and calls the step
// functions (readStdout/readStderr, reap, advance), so one thread can drive many groups.
// No Torch, no Qt, no protocol knowledge (the shutdown line is the caller's).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "app/launcher/launch.h"

namespace dit::launcher {

using SteadyClock = std::chrono::steady_clock;

/// How a group process ended.
struct ExitStatus {
  bool exited = false;  ///< exited normally (code valid); false: killed by `signal`
  int code = 0;
  int signal = 0;
  /// The shell's convention: the exit code, or 128 + the signal.
  int shellCode() const { return exited ? code : 128 + signal; }
  /// "exit code 3" / "signal 9 (Killed)".
  std::string describe() const;
};

/// Splits a byte stream into lines (without "\n"; a trailing "\r" stripped); keeps a trailing
/// partial line for the next chunk. At most `max_line` bytes of one line are kept (the rest of
/// an endless line is dropped, so a runaway writer cannot make the reader hold more).
class LineBuffer {
 public:
  explicit LineBuffer(std::size_t max_line = 64u << 20) : max_(max_line) {}
  std::vector<std::string> feed(std::string_view bytes);
  /// The partial last line ("" when none), cleared.
  std::string flush();

 private:
  std::string buf_;
  std::size_t max_;
  bool overlong_ = false;
};

/// Every process below `root` (children, their children, ...), from /proc. Empty when `root` has
/// none or /proc cannot be read.
std::vector<pid_t> descendantPids(pid_t root);

/// One child process group. Not copyable; the destructor ends a running group with the teardown
/// policy (blocking, at most grace + kill_after + 1 s).
class GroupProcess {
 public:
  /// The teardown policy's delays.
  struct Teardown {
    std::chrono::milliseconds grace{5000};       ///< after the shutdown line, before SIGTERM
    std::chrono::milliseconds kill_after{3000};  ///< after SIGTERM, before SIGKILL
    /// false: SIGKILL at the end of the grace, no SIGTERM first. For a group already ending on
    /// a fatal error: an mpirun caught in its own abort with a host it cannot reach (a dropped
    /// link) crashes on SIGTERM and prints a backtrace (OpenMPI 4.1), and it has nothing left
    /// to clean up that SIGTERM would let it do. Sticky: once armed, later calls keep it.
    bool sigterm = true;
  };
  enum class Stream { Stdout, Stderr };

  GroupProcess() = default;
  GroupProcess(const GroupProcess&) = delete;
  GroupProcess& operator=(const GroupProcess&) = delete;
  ~GroupProcess();

  /// Starts argv[0] (looked up in PATH) with argv in a new process group, the environment of
  /// this process plus `env` (NAME, VALUE pairs, replacing existing names), SIGPIPE ignored in
  /// this process. Throws std::invalid_argument for an empty argv, std::logic_error when a group
  /// runs, and std::runtime_error "cannot start PROGRAM: REASON" when it cannot be executed (the
  /// exec error comes back through a close-on-exec pipe, so a missing program fails here).
  void start(const std::vector<std::string>& argv,
             const std::vector<std::pair<std::string, std::string>>& env = {});

  /// A child was started and has not been reaped yet.
  bool running() const { return pid_ > 0 && !exit_; }
  /// Started at least once (running or exited).
  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  std::optional<ExitStatus> exitStatus() const { return exit_; }

  /// Readable fds for a poll loop: stdout, stderr (each until its end of file) and a pidfd that
  /// becomes readable when the child exits (-1 where the kernel has no pidfd_open: then call
  /// reap() on a timer; nextTimeout() says when).
  int stdoutFd() const { return out_; }
  int stderrFd() const { return err_; }
  int exitFd() const { return pidfd_; }

  /// Reads what is available on the stream (non-blocking) and returns its complete lines. At end
  /// of file the partial last line is returned too and the fd is closed (its fd becomes -1).
  std::vector<std::string> read(Stream s);
  /// The partial last line of the stream read so far ("" when none), cleared.
  std::string flushPartial(Stream s) {
    return (s == Stream::Stdout ? outLines_ : errLines_).flush();
  }
  /// Stops reading stdout and stderr (closes them; descendants may still hold the pipes open).
  void closeOutput() {
    closeFd(out_);
    closeFd(err_);
  }
  /// stderr's last 64 KiB (for mpirun's reports of a rank that died).
  const std::string& stderrTail() const { return errTail_; }
  /// mpirun's report of a rank that died, parsed from stderrTail() (parseMpirunFailure).
  std::optional<RankFailure> rankFailure() const { return parseMpirunFailure(errTail_); }

  /// Writes `line` + "\n" to the child's stdin (blocking until written; the worker reads its
  /// stdin continuously). False when stdin is closed or the child is gone.
  bool writeLine(const std::string& line);
  void closeStdin();
  bool stdinOpen() const { return in_ >= 0; }

  /// Reaps the child when it has exited (waitpid WNOHANG). Returns true when it exited now.
  bool reap();

  /// Starts the teardown: writes `shutdown_line` (when not empty and stdin is open), closes
  /// stdin and arms the deadlines (SIGTERM at now + grace, SIGKILL kill_after later). A second
  /// call never delays an armed deadline (it may bring it forward). No-op when not running.
  void beginTeardown(const std::string& shutdown_line, Teardown policy);
  /// Sends what the armed deadlines call for at `now` (SIGTERM, then SIGKILL, to the process
  /// group and every descendant seen since the teardown began; SIGKILL at once where the policy
  /// said sigterm = false) and reaps the child. Returns the signal sent now (0 when none).
  int advance(SteadyClock::time_point now = SteadyClock::now());
  /// The next time advance() or reap() has something to do; nullopt when nothing is armed and
  /// exitFd() reports the exit.
  std::optional<SteadyClock::time_point> nextTimeout() const;
  /// The teardown started (and the group has not been started again since).
  bool tearingDown() const { return termAt_.has_value(); }

  /// Blocks until the child exited or `timeout` passed, running the armed teardown deadlines;
  /// stdout and stderr keep being read into `onLine` (may be empty) so that a child writing a
  /// lot never blocks on a full pipe. Returns the exit status when it ended.
  std::optional<ExitStatus> wait(
      std::chrono::milliseconds timeout,
      const std::function<void(Stream, const std::string&)>& onLine = nullptr);
  /// Runs the whole policy and waits: beginTeardown(shutdown_line, policy), then wait() up to
  /// grace + kill_after + 1 s. Also ends descendants left after the child exited.
  std::optional<ExitStatus> terminate(const std::string& shutdown_line, Teardown policy);

  /// The pids signalled by the teardown so far (the process group leader's descendants).
  const std::vector<pid_t>& signalledDescendants() const { return tree_; }

 private:
  void signalAll(int sig);
  void closeFd(int& fd);
  void remember(const std::vector<pid_t>& pids);

  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1, pidfd_ = -1;
  LineBuffer outLines_, errLines_;
  std::string errTail_;
  std::optional<ExitStatus> exit_;
  std::optional<SteadyClock::time_point> termAt_, killAt_;
  bool termSent_ = false, killSent_ = false, skipTerm_ = false;
  std::vector<pid_t> tree_;
};

}  // namespace dit::launcher
