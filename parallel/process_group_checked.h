// ProcessGroupChecked: a ProcessGroup decorator that checks, before every call, that all ranks
// issue the same collective with agreeing arguments (c10d ProcessGroupWrapper, which runs the same
// kind of check over a separate gloo group before forwarding to the wrapped NCCL group).
//
// Before forwarding a call to the wrapped group, the ranks exchange a small fixed-size header (op,
// call number, dtype, shapes, root/dim/peers, per-rank sizes) over the checker's own MPI
// communicator. Every rank receives every header, so every rank reaches the same verdict:
//  - on disagreement all of them throw CollectiveMismatchError naming the ranks, their calls and
//    the sizes, e.g. "collective mismatch on group 'world' (2 ranks: world 0,1): shapes differ:
//    rank 0 [4] (16 B), rank 1 [5] (20 B); calls: rank 0 allreduce(sum, float32 [4], 16 B)
//    (call #3), rank 1 ...", and the group stays usable (nothing was sent);
//  - argument errors that only show up by comparing ranks (reduce-scatter rows not divisible by
//    the group size, a broadcast root outside the group) throw std::invalid_argument the same way;
//  - a rank that never arrives ends in CollectiveTimeoutError after the wrapped group's
//    timeoutSeconds(), naming the ranks whose headers are missing ("rank(s) 1 (world 1) never
//    arrived at this call"); the checker is unusable afterwards (std::runtime_error).
// Point-to-point send/recv are checked pairwise (both ends see the same verdict).
//
// The exchange is blocking and host-side: it costs one small all-to-all of headers per call and
// a host synchronisation, which is why DeviceMesh turns it on by default only for the MPI backend
// (CPU; the payload is host-side anyway) and leaves it off for NCCL, where it would serialise the
// host with the GPU stream (DITSTUDIO_CHECK_COLLECTIVES=1 turns it on for debugging; =0 turns it
// off on MPI). See DeviceMesh.
//
// Channel: a duplicate of the communicator the wrapped group was built on, private to the
// checker, so headers can never match the wrapped group's payload messages (an MPI group's own
// communicators, or NCCL's, which do not go through MPI at all). The wrapped group's Work is
// returned unchanged: the check is done when the call returns, the payload still completes
// asynchronously.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/collective_call.h"
#include "parallel/process_group.h"

namespace dit {

class ProcessGroupChecked final : public ProcessGroup {
 public:
  /// Wraps `inner`. `comm` must hold the same ranks as `inner` in the same order (its rank and size
  /// equal inner->rank()/size(); std::invalid_argument otherwise); it is duplicated, the caller
  /// keeps ownership. Collective over `comm`: all its ranks construct the wrapper at the same
  /// point.
  ProcessGroupChecked(std::shared_ptr<ProcessGroup> inner, MPI_Comm comm);
  /// Frees the duplicated communicator (locally, if MPI is still active and nothing is pending).
  ~ProcessGroupChecked() override;
  ProcessGroupChecked(const ProcessGroupChecked&) = delete;
  ProcessGroupChecked& operator=(const ProcessGroupChecked&) = delete;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  std::string name() const override { return inner_->name(); }
  double timeoutSeconds() const override { return inner_->timeoutSeconds(); }
  void setTimeoutSeconds(double seconds) override { inner_->setTimeoutSeconds(seconds); }
  uint64_t bytesSent() const override { return inner_->bytesSent(); }

  /// Each call: local argument checks, agree() (or agreePair() for send/recv), then the wrapped
  /// group's call, whose Work is returned.
  std::shared_ptr<Work> allreduce(at::Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> allgather(const at::Tensor& t, int64_t dim,
                                  const std::vector<int64_t>& sizes = {}) override;
  std::shared_ptr<Work> reduceScatter(const at::Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> allToAll(const std::vector<at::Tensor>& inputs,
                                 const std::vector<std::vector<int64_t>>& outputShapes) override;
  std::shared_ptr<Work> broadcast(at::Tensor& t, int root) override;
  std::shared_ptr<Work> sendRecv(const at::Tensor& send, int dst,
                                 const std::vector<int64_t>& recvShape, int src) override;
  std::shared_ptr<Work> send(const at::Tensor& t, int dst, int tag = 0) override;
  std::shared_ptr<Work> recv(at::Tensor& t, int src, int tag = 0) override;
  std::shared_ptr<Work> barrier() override;

  /// The wrapped group.
  const std::shared_ptr<ProcessGroup>& wrapped() const { return inner_; }
  /// "group 'tp' (2 ranks: world 0,1)".
  std::string describeGroup() const;

  /// Exchanges `mine` with every rank of the group and checks that the calls agree; returns all
  /// ranks' calls (index = group rank). Collective: all ranks call it for the same logical call.
  /// Throws CollectiveMismatchError / std::invalid_argument (same verdict on every rank) or
  /// CollectiveTimeoutError.
  std::vector<CallInfo> agree(const CallInfo& mine);
  /// Pairwise agreement for a point-to-point transfer (`mine.op` Send or Recv, peer `peer`).
  /// Returns the peer's call. Both ranks throw CollectiveMismatchError on disagreement.
  CallInfo agreePair(const CallInfo& mine, int peer);

 private:
  void ensureUsable() const;
  [[noreturn]] void timeout(const std::string& what, const std::string& detail,
                            std::vector<MPI_Request>& reqs, const std::vector<int>& reqKind);
  std::vector<int64_t> encode(const CallInfo& c, int64_t seq) const;

  std::shared_ptr<ProcessGroup> inner_;
  MPI_Comm ctrl_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<int> worldRanks_;
  int64_t seq_ = 0;
  std::vector<int64_t> sendSeq_, recvSeq_;
  bool broken_ = false;
  std::string brokenReason_;
  // Header buffers of exchanges abandoned at a timeout (MPI may still write into them).
  std::vector<std::shared_ptr<std::vector<int64_t>>> graveyard_;
};

/// Wraps `inner` in a ProcessGroupChecked over `comm` (see its constructor).
std::shared_ptr<ProcessGroup> makeCheckedProcessGroup(std::shared_ptr<ProcessGroup> inner,
                                                      MPI_Comm comm);

}  // namespace dit
