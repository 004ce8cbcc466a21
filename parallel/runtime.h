// Process-level runtime of a worker rank: MPI start-up and shutdown, the event stream on stdout
// (one line per event, formatted by the formatters the program's main installs, see
// parallel/event_lines.h: the worker installs app/protocol's; parallel/ knows no protocol),
// group-wide abort on a fatal error, and per-rank memory figures for the `ranks` event.
//
// Threading: MPI is initialised with MPI_THREAD_FUNNELED — only the thread that called
// initRuntime() may call MPI (or any ProcessGroup). Other threads (e.g. rank 0's stdin reader) may
// call emitEvent(), the memory helpers and, as a last resort, abortGroup().
#pragma once

#include <cstdint>
#include <exception>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>

namespace dit {

/// Initialises MPI (MPI_Init_thread, requesting MPI_THREAD_FUNNELED) unless it already is.
/// Every rank calls it once, first thing in main(), before any other function of parallel/.
/// Idempotent. Throws std::runtime_error when MPI cannot be initialised or provides less than
/// FUNNELED threading.
void initRuntime(int& argc, char**& argv);

/// Finalises MPI if initRuntime() (or anyone) initialised it and it is not finalised yet. All
/// ranks call it last in main(), after every ProcessGroup has been released and all collectives
/// have completed (MPI_Finalize is collective over MPI_COMM_WORLD).
void finalizeRuntime();

/// True between initRuntime() (or any MPI_Init) and finalizeRuntime().
bool runtimeActive();

/// Rank in MPI_COMM_WORLD (0 when MPI is not active: single-process use). Local, no communication.
int worldRank();
/// Size of MPI_COMM_WORLD (1 when MPI is not active). Local, no communication.
int worldSize();
/// Index of this rank among the ranks on the same host (0-based). From the launcher's
/// OMPI_COMM_WORLD_LOCAL_RANK when set (OpenMPI's mpirun sets it on every rank; no
/// communication), else from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) on the first call, which is
/// then collective over MPI_COMM_WORLD: all ranks call it the first time in the same order —
/// DeviceMesh's constructor does. 0 when MPI is not active. Cached after the first call.
int localRank();

/// The one rule for which CUDA device a rank uses: local rank `localRank` on a host with
/// `deviceCount` visible devices uses device localRank % deviceCount (ranks share devices
/// round-robin when a host runs more ranks than it has GPUs). Used by DeviceMesh (and through
/// DeviceMesh::deviceIndex() by the pipeline and the NCCL communicator). Pure function. Throws
/// std::invalid_argument when deviceCount < 1 or localRank < 0.
int localDeviceIndex(int localRank, int deviceCount);

/// Writes the installed EventLineFormatter's line for `event` (parallel/event_lines.h; by default
/// the "@@DIT " prefix, then the object on one line) + "\n" to stdout and flushes; the
/// ordered_json overload always writes the default form. Thread-safe (one line is never interleaved
/// with another event). Local, no communication; any rank may call it.
void emitEvent(const nlohmann::json& event);
void emitEvent(const nlohmann::ordered_json& event);

/// Fatal error on this rank: prints exactly one line, the installed FatalLineFormatter's
/// (parallel/event_lines.h; by default and with the worker's protocol formatter)
///   @@DIT {"event":"error","id":null,"rank":R,"message":"...","fatal":true}
/// to stdout (flushed), the same line and a human-readable "[rank R] fatal: ..." line to stderr
/// (the stderr copy survives when mpirun drops the rank's last stdout line on abort, as OpenMPI
/// 5's prterun sometimes does; readers drop the repeated event; written after mpirun has read the
/// stdout line, at least 50 ms later), waits until mpirun has read both streams (at most about
/// 1.2 s in all), then calls MPI_Abort(MPI_COMM_WORLD, 1) so that mpirun ends
/// every rank (or _Exit(1) at once when MPI is not active). Not collective: one failing rank
/// calls it and the whole group goes down; any thread may call it. Never returns.
[[noreturn]] void abortGroup(int rank, const std::string& message);

/// Text for an exception: what(), or "unknown exception" for non-std exceptions.
std::string describeException(std::exception_ptr e);

/// Runs `fn()` and returns its result; any exception escaping it ends the group through
/// abortGroup(worldRank(), what()). Typical use: `return dit::runOrAbort([&] { return run(); });`
/// in every rank's main(). Collective semantics are those of `fn`.
template <class F>
auto runOrAbort(F&& fn) -> decltype(std::forward<F>(fn)()) {
  try {
    return std::forward<F>(fn)();
  } catch (...) {
    abortGroup(worldRank(), describeException(std::current_exception()));
  }
}

/// Current resident set size of this process in bytes (VmRSS of /proc/self/status); 0 when
/// unavailable. Local, no communication.
uint64_t residentSetBytes();
/// Peak resident set size of this process in bytes (VmHWM of /proc/self/status); 0 when
/// unavailable. Local, no communication.
uint64_t peakResidentSetBytes();
/// Resets VmHWM to the current VmRSS (Linux: "5" written to /proc/self/clear_refs) so the peak of
/// one phase (e.g. loading) can be read afterwards. Returns false when the kernel refuses.
bool resetPeakResidentSet();

}  // namespace dit
