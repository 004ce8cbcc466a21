#include "parallel/runtime.h"

#include <fcntl.h>
#include <mpi.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>

#include "parallel/event_lines.h"

namespace dit {

namespace {

std::mutex& outputMutex() {
  static std::mutex m;
  return m;
}

// The installed line formatters (under outputMutex()); empty: the defaults.
EventLineFormatter& eventFormatter() {
  static EventLineFormatter f;
  return f;
}
FatalLineFormatter& fatalFormatter() {
  static FatalLineFormatter f;
  return f;
}

constexpr const char* kDefaultEventPrefix = "@@DIT ";

bool mpiActive() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void writeLine(const std::string& line) {
  std::lock_guard<std::mutex> lock(outputMutex());
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// Bytes written to `fd` (a pipe, socket or pty) that its reader has not taken yet; 0 when the
// kernel cannot tell (a file, or an ioctl it refuses).
int unreadOutputBytes(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return 0;
  int n = 0;
  // A pipe answers FIONREAD at either end; a pty or a socket counts its unsent output (TIOCOUTQ).
  const unsigned long request = S_ISFIFO(st.st_mode)                     ? FIONREAD
                                : (S_ISSOCK(st.st_mode) || ::isatty(fd)) ? TIOCOUTQ
                                                                         : 0;
  if (request == 0 || ::ioctl(fd, request, &n) != 0) return 0;
  return n;
}

// Waits until mpirun's I/O forwarder has read what this rank wrote to stdout and stderr (at most
// 500 ms, polling every 5 ms; a pty may not report its queue), then `settle` more for it to read
// the rest and pass the lines on. Bounded, so a reader that stopped reading cannot hold up the
// caller for more than 500 ms + settle.
void waitForOutputForwarded(std::chrono::milliseconds settle) {
  using namespace std::chrono;
  const auto deadline = steady_clock::now() + milliseconds(500);
  while (steady_clock::now() < deadline &&
         (unreadOutputBytes(STDOUT_FILENO) > 0 || unreadOutputBytes(STDERR_FILENO) > 0))
    std::this_thread::sleep_for(milliseconds(5));
  std::this_thread::sleep_for(settle);
}

// Reads "<key>:   <n> kB" from /proc/self/status.
uint64_t procStatusBytes(const char* key) {
  std::ifstream in("/proc/self/status");
  if (!in) return 0;
  const std::string prefix = std::string(key) + ":";
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, prefix.size(), prefix) != 0) continue;
    try {
      size_t pos = prefix.size();
      const uint64_t kb = std::stoull(line.substr(pos));
      return kb * 1024ULL;
    } catch (...) {
      return 0;
    }
  }
  return 0;
}

}  // namespace

void initRuntime(int& argc, char**& argv) {
  int init = 0;
  MPI_Initialized(&init);
  if (init) return;
  int provided = 0;
  const int rc = MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS)
    throw std::runtime_error("MPI_Init_thread failed with code " + std::to_string(rc));
  if (provided < MPI_THREAD_FUNNELED) {
    throw std::runtime_error("MPI provides thread level " + std::to_string(provided) +
                             ", DiT Studio needs MPI_THREAD_FUNNELED");
  }
}

void finalizeRuntime() {
  if (mpiActive()) MPI_Finalize();
}

bool runtimeActive() { return mpiActive(); }

int worldRank() {
  if (!mpiActive()) return 0;
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int worldSize() {
  if (!mpiActive()) return 1;
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

int localRank() {
  static int cached = -1;
  if (cached >= 0) return cached;
  if (!mpiActive()) return 0;
  if (const char* env = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK"); env && *env) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v >= 0 && v < INT_MAX) {
      cached = static_cast<int>(v);
      return cached;
    }
  }
  MPI_Comm node;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
      MPI_SUCCESS)
    return 0;
  int r = 0;
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  cached = r;
  return r;
}

int localDeviceIndex(int localRank, int deviceCount) {
  if (deviceCount < 1)
    throw std::invalid_argument("no CUDA device is visible on this host (device count " +
                                std::to_string(deviceCount) +
                                "; CPU-only LibTorch, or CUDA_VISIBLE_DEVICES empty)");
  if (localRank < 0)
    throw std::invalid_argument("local rank " + std::to_string(localRank) + " is negative");
  return localRank % deviceCount;
}

void setEventLineFormatter(EventLineFormatter f) {
  std::lock_guard<std::mutex> lock(outputMutex());
  eventFormatter() = std::move(f);
}

void setFatalLineFormatter(FatalLineFormatter f) {
  std::lock_guard<std::mutex> lock(outputMutex());
  fatalFormatter() = std::move(f);
}

std::string defaultEventLine(const nlohmann::json& event) {
  return kDefaultEventPrefix + event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string defaultFatalLine(const FatalError& e) {
  nlohmann::ordered_json ev;
  ev["event"] = "error";
  ev["id"] = nullptr;
  ev["rank"] = e.rank;
  ev["message"] = e.message;
  ev["fatal"] = true;
  return kDefaultEventPrefix +
         ev.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void emitEvent(const nlohmann::json& event) {
  EventLineFormatter f;
  {
    std::lock_guard<std::mutex> lock(outputMutex());
    f = eventFormatter();
  }
  writeLine(f ? f(event) : defaultEventLine(event));
}

// Insertion order kept; not reformatted by the installed formatter (which takes a sorted json).
void emitEvent(const nlohmann::ordered_json& event) {
  writeLine(kDefaultEventPrefix +
            event.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
}

namespace {

// A rank whose parent is a daemon mpirun started on another host over ssh (OpenMPI 4 orted,
// OpenMPI 5 prted) leaves behind, before MPI_Abort, a detached process that ends that daemon
// kDaemonGraceSeconds later if it is still there. Normally mpirun tears the daemon down within
// seconds; when the link to mpirun's host is down, nothing ever reaches the daemon, and it would
// stay forever (issue 18). Only async-signal-safe calls after fork().
// Start time (clock ticks since boot, field 22 of /proc/PID/stat) of the process `statPath`
// names; 0 when it is gone. Async-signal-safe: no allocation.
unsigned long long startTimeOf(const char* statPath) {
  char buf[1024];
  const int fd = ::open(statPath, O_RDONLY);
  if (fd < 0) return 0;
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');
  if (!p) return 0;
  for (int field = 2; field < 22 && *p; ++p)  // p at the space before field 22
    if (p[1] == ' ') ++field;
  unsigned long long t = 0;
  while (*p == ' ') ++p;
  for (; *p >= '0' && *p <= '9'; ++p) t = t * 10 + static_cast<unsigned>(*p - '0');
  return t;
}

void endRemoteDaemonLater() {
  constexpr unsigned kDaemonGraceSeconds = 10;
  const pid_t daemon = ::getppid();
  std::string comm;
  {
    std::ifstream in("/proc/" + std::to_string(daemon) + "/comm");
    std::getline(in, comm);
  }
  if (comm != "orted" && comm != "prted") return;  // mpirun itself: the launcher ends it
  // The same process later, not another one that got its pid.
  char statPath[64];
  std::snprintf(statPath, sizeof statPath, "/proc/%d/stat", static_cast<int>(daemon));
  const unsigned long long started = startTimeOf(statPath);
  if (started == 0) return;
  const pid_t child = ::fork();
  if (child != 0) {
    if (child > 0)
      while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
      }
    return;
  }
  ::setsid();
  if (::fork() != 0) ::_exit(0);
  for (int fd = 0; fd < 1024; ++fd) ::close(fd);
  ::sleep(kDaemonGraceSeconds);
  if (startTimeOf(statPath) != started) ::_exit(0);
  ::kill(daemon, SIGTERM);  // the daemon ends its ranks, then itself
  ::sleep(3);
  if (startTimeOf(statPath) == started) ::kill(daemon, SIGKILL);
  ::_exit(0);
}

}  // namespace

void abortGroup(int rank, const std::string& message) {
  std::string line;
  try {
    FatalLineFormatter f;
    {
      std::lock_guard<std::mutex> lock(outputMutex());
      f = fatalFormatter();
    }
    line = f ? f(FatalError{rank, message}) : defaultFatalLine(FatalError{rank, message});
  } catch (...) {
    line = std::string(kDefaultEventPrefix) +
           "{\"event\":\"error\",\"id\":null,\"rank\":" + std::to_string(rank) +
           ",\"message\":\"(unprintable message)\",\"fatal\":true}";
  }
  writeLine(line);
  // The same event on stderr: when MPI_Abort tears the job down, OpenMPI 5's prterun sometimes
  // drops the aborting rank's last stdout line, so the CLI and the GUI could not name the rank.
  // They scan stderr for events too and drop the second copy (same rank and message). Written
  // once mpirun has read the stdout line: OpenMPI 5 reads stdout (a pty) in pieces, and a copy
  // written at once can land inside the stdout line in a merged stream, cutting both.
  if (mpiActive()) waitForOutputForwarded(std::chrono::milliseconds(50));
  {
    std::lock_guard<std::mutex> lock(outputMutex());
    std::fprintf(stderr, "%s\n[rank %d] fatal: %s\n", line.c_str(), rank, message.c_str());
    std::fflush(stderr);
  }
  if (mpiActive()) {
    waitForOutputForwarded(std::chrono::milliseconds(100));
    endRemoteDaemonLater();
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::_Exit(1);
}

std::string describeException(std::exception_ptr e) {
  try {
    if (e) std::rethrow_exception(e);
    return "unknown error";
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

uint64_t residentSetBytes() { return procStatusBytes("VmRSS"); }
uint64_t peakResidentSetBytes() { return procStatusBytes("VmHWM"); }

bool resetPeakResidentSet() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

}  // namespace dit
