// Liveness of the group's ranks (issue 16): every rank's pid and host, known to every rank, so the
// message that ends the group names the rank that stopped responding; the heartbeat's timeout;
// what this host can tell about a peer's process.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace dit::worker {

/// One rank's process, as every rank learns it at start-up.
struct Peer {
  int pid = -1;
  std::string host;
};

/// This host's name (gethostname).
std::string hostname();

/// Seconds a rank waits for the other side of an idle-loop heartbeat:
/// DITSTUDIO_HEARTBEAT_TIMEOUT_S, default 10, never above the collective timeout.
double heartbeatTimeoutSeconds();

/// What this host can tell about a peer's process: stopped (SIGSTOP, a debugger), exited, or
/// running. "" for a peer on another host (only its silence is known there).
std::string processState(const Peer& p, const std::string& myHost);

/// "rank R (pid P on HOST)".
std::string describePeer(int rank, const Peer& p);

/// Polls `reqs` until all complete or `seconds` pass; true when all completed.
bool waitAll(std::vector<MPI_Request>& reqs, double seconds);

/// After a collective timeout: what this host knows about every rank's process but `self`'s
/// ("; rank 1 (pid ...) stopped responding: ..." per rank that is not simply running; "" when
/// nothing is known).
std::string livenessReport(const std::vector<Peer>& peers, int self);

}  // namespace dit::worker
