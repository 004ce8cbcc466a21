// ProcessGroupMPI: the ProcessGroup collectives over an MPI communicator (OpenMPI), for host
// tensors; CUDA tensors are staged through host memory.
//
// Asynchronous (parallel/work.h): each call starts one nonblocking MPI operation (MPI_Iallreduce,
// MPI_Iallgatherv, MPI_Ireduce_scatter_block, MPI_Ialltoallv, MPI_Ibcast, MPI_Isend/MPI_Irecv,
// MPI_Ibarrier) and returns its Work; Work::wait() completes it. Nonblocking collectives on one
// communicator match in issue order, so several may be in flight and be waited in any order.
//
// Same-order rule (process_group.h): all ranks issue the group's collectives in the same order
// with agreeing arguments. This class does not check it (no extra round trip per call); wrap it
// in ProcessGroupChecked (parallel/process_group_checked.h) for CollectiveMismatchError naming
// the ranks and calls, and for timeouts naming the ranks that never arrived. DeviceMesh does so by
// default.
//
// Deadline (DESIGN.md section 1: no hung collectives): Work::wait() polls with MPI_Test plus a
// short yield/sleep (little CPU while idle, which matters on oversubscribed machines); when the
// operation has not completed timeoutSeconds() after wait() started polling, it throws
// CollectiveTimeoutError naming the op and the group. The deadline counts from wait(), not from
// the issue, so host compute overlapped with the transfer never counts as a hang. After a timeout
// the group is unusable (calls throw std::runtime_error): the normal reaction is abortGroup()
// (parallel/runtime.h).
//
// Every member function that communicates is collective: all ranks of the group call it in the
// same order (send/recv: the two ranks involved, in matching order).
#pragma once

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/process_group.h"

namespace dit {

/// The default collective deadline: DITSTUDIO_COLLECTIVE_TIMEOUT_S (seconds, > 0; 0 = none) from
/// the environment, else 300 s. Local, no communication.
double defaultCollectiveTimeoutSeconds();

/// Polls `reqs` with MPI_Test until all completed (true) or `timeoutSeconds` passed (false, the
/// unfinished requests left pending; timeoutSeconds <= 0: no deadline). Spins briefly, then
/// yields, then sleeps up to 1 ms between tests. Throws std::runtime_error if MPI_Test fails.
/// Local (progresses only this rank's requests).
bool pollRequests(std::vector<MPI_Request>& reqs, double timeoutSeconds);
/// A start-up step's arrival check, before a blocking collective that has no deadline of its own
/// (MPI_Comm_split / MPI_Comm_dup while the process groups are created, the start-up exchanges):
/// every rank of `comm` tells rank 0 it arrived and waits for rank 0's verdict. Rank 0 waits up to
/// `timeoutSeconds` for all; the others up to timeoutSeconds + a grace of min(timeoutSeconds, 5)
/// s for the verdict. Collective over `comm`, O(size) messages. Throws std::runtime_error
/// "collective timeout: <what> did not complete within T s on rank R (world): rank(s) 2, 3 never
/// arrived (stopped, crashed, or MPI traffic between the hosts does not get through)" on rank 0
/// and on every rank that arrived, or "...: rank 0 never answered (...)" on the others when rank
/// 0 is the one missing. timeoutSeconds <= 0: no deadline (returns once all arrived).
void checkStartupArrival(MPI_Comm comm, const std::string& what,
                         double timeoutSeconds = defaultCollectiveTimeoutSeconds());
/// World ranks (in MPI_COMM_WORLD) of the ranks of `comm`, in `comm` rank order. Local.
std::vector<int> worldRanksOf(MPI_Comm comm);
/// "group 'tp' (2 ranks: world 0,1)". Local.
std::string describeGroup(const std::string& name, const std::vector<int>& worldRanks);

class ProcessGroupMPI final : public ProcessGroup {
 public:
  /// Builds the group over the ranks of `comm` (which it duplicates twice: collectives and
  /// point-to-point on one, sendRecv on the other so its tag never matches a user send; the caller
  /// keeps ownership of `comm`). Collective over `comm`: all its ranks construct their groups in
  /// the same order. `name` appears in every error message. timeoutSeconds <= 0: no deadline.
  ProcessGroupMPI(MPI_Comm comm, std::string name,
                  double timeoutSeconds = defaultCollectiveTimeoutSeconds());
  /// Frees the duplicated communicators (locally, if MPI is still active and nothing is pending).
  ~ProcessGroupMPI() override;
  ProcessGroupMPI(const ProcessGroupMPI&) = delete;
  ProcessGroupMPI& operator=(const ProcessGroupMPI&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  std::string name() const override { return name_; }
  double timeoutSeconds() const override { return timeout_; }
  void setTimeoutSeconds(double seconds) override { timeout_ = seconds; }

  /// See ProcessGroup (MPI_Iallreduce, in place in `t` after wait()). Sum/Max/Min over float32,
  /// float64, int64, int32, int16, int8, uint8; float16 and bfloat16 are reduced in float32 and
  /// rounded back. Bytes counted: 2(n-1)/n of the buffer handed to MPI (ring-algorithm equivalent).
  std::shared_ptr<Work> allreduce(at::Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  /// See ProcessGroup (MPI_Iallgatherv). Any dtype. Bytes counted: (n-1) x this rank's part.
  std::shared_ptr<Work> allgather(const at::Tensor& t, int64_t dim,
                                  const std::vector<int64_t>& sizes = {}) override;
  /// See ProcessGroup (MPI_Ireduce_scatter_block); dtypes as allreduce. t.size(0) must divide by
  /// size() (std::invalid_argument otherwise). Bytes counted: (n-1)/n x buffer.
  std::shared_ptr<Work> reduceScatter(const at::Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  /// See ProcessGroup (MPI_Ialltoallv). inputs.size() and outputShapes.size() must equal size();
  /// the numel rank i sends to j must equal the numel of rank j's outputShapes[i]. Bytes counted:
  /// everything sent to other ranks.
  std::shared_ptr<Work> allToAll(const std::vector<at::Tensor>& inputs,
                                 const std::vector<std::vector<int64_t>>& outputShapes) override;
  /// See ProcessGroup (MPI_Ibcast). Bytes counted on the root: (n-1) x tensor.
  std::shared_ptr<Work> broadcast(at::Tensor& t, int root) override;
  /// See ProcessGroup (MPI_Isend + MPI_Irecv on the second communicator). dst == rank() requires
  /// src == rank() (a local copy). Bytes counted: the tensor sent (0 when dst is this rank).
  std::shared_ptr<Work> sendRecv(const at::Tensor& send, int dst,
                                 const std::vector<int64_t>& recvShape, int src) override;
  /// MPI_Isend of `t` to `dst` with `tag` (0 <= tag <= MPI_TAG_UB); the receiver calls
  /// recv(…, this rank, same tag) with the same dtype and shape.
  std::shared_ptr<Work> send(const at::Tensor& t, int dst, int tag = 0) override;
  /// MPI_Irecv into `t` (its dtype and shape define what is expected; filled after wait()).
  std::shared_ptr<Work> recv(at::Tensor& t, int src, int tag = 0) override;
  /// MPI_Ibarrier. No payload.
  std::shared_ptr<Work> barrier() override;
  uint64_t bytesSent() const override { return bytes_.load(); }

  /// The collective communicator (a duplicate of the constructor's; do not free).
  MPI_Comm comm() const { return data_; }
  /// World rank of group rank `r`.
  int worldRankOf(int r) const { return worldRanks_.at(static_cast<size_t>(r)); }
  /// "group 'tp' (2 ranks: world 0,1)".
  std::string describeGroup() const;
  /// Adds to bytesSent() (for a backend that moves the payload itself, e.g. ProcessGroupNCCL).
  void addBytesSent(uint64_t n) { bytes_ += n; }
  /// Throws std::runtime_error if a previous call timed out (the group state is undefined).
  void ensureUsable() const;

 private:
  friend class MPIWork;
  /// Wraps started requests into a Work. kinds[i]: 0 collective (cannot be cancelled or freed),
  /// 1 receive, 2 send. `keep`: buffers MPI reads or writes until completion. `finish` runs once
  /// after success and returns the outputs.
  std::shared_ptr<Work> makeWork(std::string what, std::vector<MPI_Request> reqs,
                                 std::vector<int> kinds, std::vector<at::Tensor> keep,
                                 std::function<std::vector<at::Tensor>()> finish);
  /// Marks the group broken, cancels/frees what MPI allows, keeps `keep` alive and throws
  /// CollectiveTimeoutError.
  [[noreturn]] void timeout(const std::string& what, const std::string& detail,
                            std::vector<MPI_Request>& reqs, const std::vector<int>& reqKind,
                            std::vector<at::Tensor> keep);
  void check(int rc, const char* fn) const;

  MPI_Comm data_ = MPI_COMM_NULL;
  MPI_Comm ring_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::string name_;
  double timeout_ = 300.0;
  std::vector<int> worldRanks_;
  std::atomic<uint64_t> bytes_{0};
  bool broken_ = false;
  std::string brokenReason_;
  // Buffers of operations abandoned at a timeout (MPI may still write into them).
  std::vector<at::Tensor> graveyard_;
};

}  // namespace dit
