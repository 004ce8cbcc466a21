#include "parallel/runtime.h"

#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "app/protocol/protocol.h"

namespace dit {

namespace {

std::mutex& outputMutex() {
  static std::mutex m;
  return m;
}

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

// Invalid UTF-8 (e.g. echoed from a bad request line) is replaced, never thrown
// (protocol::eventLine).
void emitEvent(const nlohmann::json& event) { writeLine(protocol::eventLine(event)); }
void emitEvent(const nlohmann::ordered_json& event) { writeLine(protocol::eventLine(event)); }

void abortGroup(int rank, const std::string& message) {
  nlohmann::ordered_json ev;
  ev["event"] = "error";
  ev["id"] = nullptr;
  ev["rank"] = rank;
  ev["message"] = message;
  ev["fatal"] = true;
  std::string line;
  try {
    // Replace invalid UTF-8 instead of throwing from dump().
    line = protocol::eventLine(ev);
  } catch (...) {
    line = std::string(protocol::kEventPrefix) +
           "{\"event\":\"error\",\"id\":null,\"rank\":" + std::to_string(rank) +
           ",\"message\":\"(unprintable message)\",\"fatal\":true}";
  }
  writeLine(line);
  std::fprintf(stderr, "[rank %d] fatal: %s\n", rank, message.c_str());
  std::fflush(stderr);
  if (mpiActive()) MPI_Abort(MPI_COMM_WORLD, 1);
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
