// ditstudio-isolate: runs a program (mpirun, for single-host process groups) in a network
// namespace of its own whose only interface is loopback, so that no socket the group opens -
// OpenMPI 4.1's mpirun keeps a wildcard out-of-band listener no MCA parameter removes
// (open-mpi/ompi#12668), OpenMPI 5's prterun does too - can be reached from another machine.
//
//   ditstudio-isolate PROGRAM [ARGS...]
//
// As root: unshare(CLONE_NEWNET). As any other user: unshare(CLONE_NEWUSER | CLONE_NEWNET) with
// the user's own uid and gid mapped onto themselves (files, devices and permissions are those of
// the user; nothing runs as root). Then `lo` is brought up (SIOCSIFFLAGS) and PROGRAM is
// executed in place (same pid, same stdin/stdout/stderr, so signals and pipes reach it as
// before). Processes stay in the caller's PID, mount and IPC namespaces: shared memory between
// ranks, /dev/shm, GPUs (CUDA IPC; NCCL finds only `lo` and bootstraps over it) work unchanged.
//
// When the kernel refuses (user namespaces disabled, e.g. kernel.unprivileged_userns_clone=0 or
// AppArmor's restriction of unprivileged user namespaces, or a seccomp filter in a container),
// one line on stderr says which call failed and why, and PROGRAM runs in the caller's namespace
// (the group's MCA parameters still confine the ranks to shared memory and the out-of-band
// channel to loopback). DITSTUDIO_NETWORK_ISOLATION=0 skips the namespace (said on stderr).
// Exit status: PROGRAM's (exec), 127 when it cannot be executed, 2 on a usage error.
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "app/tools/child_probe.h"

namespace {

const char* kName = "ditstudio-isolate";

// Writes `text` to `path` (uid_map, gid_map, setgroups); false with errno set on failure.
bool writeFile(const char* path, const std::string& text) {
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  errno = err;
  return n == static_cast<ssize_t>(text.size());
}

// Enters a new network namespace (and, when not root, a user namespace mapping the caller's ids
// onto themselves) and brings its loopback interface up. On failure returns the failed step
// (errno set by it); nullptr when isolated.
const char* isolate() {
  const uid_t uid = ::getuid();
  const gid_t gid = ::getgid();
  if (::geteuid() == 0) {
    if (::unshare(CLONE_NEWNET) != 0) return "unshare(CLONE_NEWNET)";
  } else {
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0)
      return "unshare(CLONE_NEWUSER | CLONE_NEWNET)";
    if (!writeFile("/proc/self/setgroups", "deny")) return "writing /proc/self/setgroups";
    if (!writeFile("/proc/self/uid_map", std::to_string(uid) + " " + std::to_string(uid) + " 1"))
      return "writing /proc/self/uid_map";
    if (!writeFile("/proc/self/gid_map", std::to_string(gid) + " " + std::to_string(gid) + " 1"))
      return "writing /proc/self/gid_map";
  }
  const int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return "socket(AF_INET)";
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  bool ok = ::ioctl(s, SIOCGIFFLAGS, &ifr) == 0;
  if (ok) {
    ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
    ok = ::ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
  }
  const int err = errno;
  ::close(s);
  errno = err;
  if (!ok) return "bringing up the namespace's loopback interface (SIOCSIFFLAGS lo)";
  return nullptr;
}

// Tries isolate() in a child process first: a namespace half entered (unshare succeeded, the
// uid map or the loopback refused) cannot be left, so the real process enters only when the
// whole sequence is known to work. Returns "" or "STEP: CAUSE".
std::string probe() { return dit::tools::probeInChild(isolate, "probe process failed"); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fprintf(argc < 2 ? stderr : stdout,
                 "usage: %s PROGRAM [ARGS...]\n"
                 "Runs PROGRAM in a network namespace of its own with only loopback up (the\n"
                 "single-host process group's sockets unreachable from other machines).\n"
                 "DITSTUDIO_NETWORK_ISOLATION=0 runs it without.\n",
                 kName);
    return argc < 2 ? 2 : 0;
  }
  const char* off = std::getenv("DITSTUDIO_NETWORK_ISOLATION");
  if (off && std::strcmp(off, "0") == 0) {
    std::fprintf(stderr,
                 "%s: network isolation off (DITSTUDIO_NETWORK_ISOLATION=0): the group's "
                 "launcher may listen on every interface\n",
                 kName);
  } else if (const std::string failed = probe(); !failed.empty()) {
    std::fprintf(stderr,
                 "%s: network isolation unavailable (%s); running without it: the "
                 "group's launcher may listen on every interface\n",
                 kName, failed.c_str());
  } else if (const char* failed2 = isolate()) {
    // The probe succeeded, so this is not expected; half-entered namespaces cannot be left.
    const int err = errno;
    std::fprintf(stderr, "%s: network isolation failed (%s: %s)\n", kName, failed2,
                 std::strerror(err));
    return 127;
  }
  ::execvp(argv[1], argv + 1);
  const int err = errno;
  std::fprintf(stderr, "%s: cannot execute %s: %s\n", kName, argv[1], std::strerror(err));
  return 127;
}
