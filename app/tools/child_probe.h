// A check run in a forked child process, for steps that cannot be undone in the calling process
// (entering a namespace, becoming another user): ditstudio-isolate's probe before it isolates
// itself, and the exposure test's probe of what an ordinary user may do. Plain POSIX,
// header-only; no Torch, no Qt.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace dit::tools {

/// Forks; the child calls `step()`, which returns nullptr when every step worked or a static text
/// naming the step that failed (with errno still set by it), and reports "STEP: strerror(errno)"
/// to the parent through a pipe. The child makes only system calls after `step()` returns (the
/// caller may have other threads), and `step()` should do the same. Returns "" when the child
/// succeeded, its report when it failed, "pipe: ..." / "fork: ..." when the child could not be
/// started, and `fallback` when it ended without a report (a signal, say). Never throws.
template <class Step>
std::string probeInChild(Step&& step, const char* fallback = "the probe process failed") {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return std::string("pipe: ") + std::strerror(errno);
  const pid_t pid = ::fork();
  if (pid < 0) return std::string("fork: ") + std::strerror(errno);
  if (pid == 0) {
    ::close(fds[0]);
    const char* failed = step();
    if (!failed) ::_exit(0);
    const char* why = std::strerror(errno);
    if (::write(fds[1], failed, std::strlen(failed)) < 0 || ::write(fds[1], ": ", 2) < 0 ||
        ::write(fds[1], why, std::strlen(why)) < 0)
      ::_exit(2);
    ::_exit(1);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  return msg.empty() ? std::string(fallback) : msg;
}

}  // namespace dit::tools
