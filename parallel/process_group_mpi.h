// ProcessGroupMPI: the ProcessGroup collectives over an MPI communicator (OpenMPI), for host
// tensors; CUDA tensors are staged through host memory.
//
// Robustness (DESIGN.md section 1: no hung collectives):
//  - Agreement: before every call the ranks exchange a small fixed-size header (op, call number,
//    dtype, shapes, root/dim/peers, per-rank sizes) over a private control communicator. Every
//    rank receives every header, so every rank reaches the same verdict: on disagreement all of
//    them throw CollectiveMismatchError naming the ranks, their calls and the sizes, and the group
//    stays usable. Argument errors that only show up by comparing ranks (e.g. reduce-scatter rows
//    not divisible by the group size) throw std::invalid_argument the same way.
//  - Deadline: all MPI operations are nonblocking (MPI_I*) and polled with MPI_Test plus a short
//    yield/sleep (little CPU while idle, which matters on oversubscribed machines); past
//    timeoutSeconds() they throw CollectiveTimeoutError naming the op, the group and the ranks
//    that never arrived. After a timeout the group is unusable (calls throw std::runtime_error):
//    the normal reaction is abortGroup() (parallel/runtime.h).
//
// Every member function that communicates is collective: all ranks of the group call it in the
// same order (send/recv: the two ranks involved, in matching order).
#pragma once

#include <mpi.h>

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/process_group.h"

namespace dit {

/// The default collective deadline: DITSTUDIO_COLLECTIVE_TIMEOUT_S (seconds, > 0; 0 = none) from
/// the environment, else 300 s. Local, no communication.
double defaultCollectiveTimeoutSeconds();

/// Kinds of call checked by the agreement exchange.
enum class CallOp : int64_t {
  AllReduce = 1,
  AllGather = 2,
  ReduceScatter = 3,
  AllToAll = 4,
  Broadcast = 5,
  SendRecv = 6,
  Barrier = 7,
  Send = 8,
  Recv = 9,
};

/// What one rank is about to do, as exchanged before the payload. Shapes of up to 8 dimensions
/// are shown in messages; longer shapes are still compared exactly (by hash).
struct CallInfo {
  CallOp op = CallOp::Barrier;
  int64_t dtype = -1;          ///< at::ScalarType as an integer, -1: none
  std::vector<int64_t> shape;  ///< the tensor this rank contributes / sends
  int64_t a = 0;               ///< allreduce/reduceScatter: ReduceOp; allgather: dim; broadcast: root;
                               ///< sendRecv/send: dst; recv: src
  int64_t b = 0;               ///< allgather: number of per-rank sizes given; allToAll: inputs.size();
                               ///< sendRecv: src; send/recv: tag
  int64_t c = 0;               ///< allToAll: outputShapes.size()
  std::vector<int64_t> shape2; ///< sendRecv: recvShape
  std::vector<int64_t> perRank;///< allgather: sizes (size() entries); allToAll: numel sent to each
                               ///< rank, then numel expected from each rank (2 x size() entries)
};

/// Human-readable form of one call, e.g. "allreduce(sum, float32 [4,4], 64 B)". Local, no
/// communication.
std::string describeCall(const CallInfo& c);

class ProcessGroupMPI final : public ProcessGroup {
 public:
  /// Builds the group over the ranks of `comm` (which it duplicates twice: payload and control
  /// traffic; the caller keeps ownership of `comm`). Collective over `comm`: all its ranks
  /// construct their groups in the same order. `name` appears in every error message.
  /// timeoutSeconds <= 0: no deadline.
  ProcessGroupMPI(MPI_Comm comm, std::string name, double timeoutSeconds = defaultCollectiveTimeoutSeconds());
  /// Frees the duplicated communicators (locally, if MPI is still active).
  ~ProcessGroupMPI() override;
  ProcessGroupMPI(const ProcessGroupMPI&) = delete;
  ProcessGroupMPI& operator=(const ProcessGroupMPI&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  std::string name() const override { return name_; }
  double timeoutSeconds() const override { return timeout_; }
  void setTimeoutSeconds(double seconds) override { timeout_ = seconds; }

  /// See ProcessGroup. Sum/Max/Min over float32, float64, int64, int32, int16, int8, uint8;
  /// float16 and bfloat16 are reduced in float32 and rounded back. Bytes counted: 2(n-1)/n of
  /// the buffer handed to MPI (ring-algorithm equivalent).
  void allreduce(at::Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  /// See ProcessGroup (MPI_Iallgatherv). Any dtype. Bytes counted: (n-1) x this rank's part.
  at::Tensor allgather(const at::Tensor& t, int64_t dim, const std::vector<int64_t>& sizes = {}) override;
  /// See ProcessGroup (MPI_Ireduce_scatter_block); dtypes as allreduce. t.size(0) must divide by
  /// size() (std::invalid_argument on every rank otherwise). Bytes counted: (n-1)/n x buffer.
  at::Tensor reduceScatter(const at::Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  /// See ProcessGroup (MPI_Ialltoallv). inputs.size() and outputShapes.size() must equal size();
  /// the numel rank i sends to j must equal the numel of rank j's outputShapes[i]. Bytes counted:
  /// everything sent to other ranks.
  std::vector<at::Tensor> allToAll(const std::vector<at::Tensor>& inputs,
                                   const std::vector<std::vector<int64_t>>& outputShapes) override;
  /// See ProcessGroup (MPI_Ibcast). Bytes counted on the root: (n-1) x tensor.
  void broadcast(at::Tensor& t, int root) override;
  /// See ProcessGroup. Collective over the whole group: every rank calls it in the same step;
  /// the (dst, src) pairs must form a consistent permutation and each recvShape must equal the
  /// shape its sender sends. Bytes counted: the tensor sent (0 when dst is this rank).
  at::Tensor sendRecv(const at::Tensor& send, int dst, const std::vector<int64_t>& recvShape, int src) override;
  /// Blocking point-to-point send; the receiver must call recv(…, this rank, same tag) with the
  /// same dtype and shape; sends between one pair are matched in order (a shape/dtype/tag
  /// disagreement throws CollectiveMismatchError on both ranks). 0 <= tag <= MPI_TAG_UB.
  void send(const at::Tensor& t, int dst, int tag = 0) override;
  /// Blocking point-to-point receive into `t` (its dtype and shape define what is expected).
  void recv(at::Tensor& t, int src, int tag = 0) override;
  /// All ranks have arrived (the agreement exchange itself synchronises). No payload.
  void barrier() override;
  uint64_t bytesSent() const override { return bytes_.load(); }

  /// The payload communicator (a duplicate of the constructor's; do not free).
  MPI_Comm comm() const { return data_; }
  /// World rank of group rank `r`.
  int worldRankOf(int r) const { return worldRanks_.at(static_cast<size_t>(r)); }
  /// "group 'tp' (2 ranks: world 0,1)".
  std::string describeGroup() const;

  // ---- Agreement control plane (also used by ProcessGroupNCCL for its checks) ----

  /// Exchanges `mine` with every rank of the group and checks that the calls agree; returns all
  /// ranks' calls (index = group rank). Collective: all ranks call it for the same logical call.
  /// Throws CollectiveMismatchError / std::invalid_argument (same verdict on every rank) or
  /// CollectiveTimeoutError.
  std::vector<CallInfo> agree(const CallInfo& mine);
  /// Pairwise agreement for a point-to-point transfer (`mine.op` Send or Recv, peer `peer`).
  /// Returns the peer's call. Both ranks throw CollectiveMismatchError on disagreement.
  CallInfo agreePair(const CallInfo& mine, int peer);
  /// Adds to bytesSent() (for a backend that moves the payload itself).
  void addBytesSent(uint64_t n) { bytes_ += n; }
  /// Throws std::runtime_error if a previous call timed out (the group state is undefined).
  void ensureUsable() const;

 private:
  /// Polls until every request completes or the deadline passes (false, requests left pending).
  bool poll(std::vector<MPI_Request>& reqs) const;
  /// Marks the group broken, cancels/frees what MPI allows (reqKind: 0 collective, 1 receive,
  /// 2 send) and throws CollectiveTimeoutError.
  [[noreturn]] void timeout(const std::string& what, const std::string& detail, std::vector<MPI_Request>& reqs,
                            const std::vector<int>& reqKind);
  /// Waits for requests; on timeout marks the group broken, keeps `keep` alive and throws.
  void wait(std::vector<MPI_Request>& reqs, const std::string& what, std::vector<at::Tensor> keep);
  std::vector<int64_t> encode(const CallInfo& c, int64_t seq) const;
  void check(int rc, const char* fn) const;

  MPI_Comm data_ = MPI_COMM_NULL;
  MPI_Comm ctrl_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::string name_;
  double timeout_ = 300.0;
  int64_t seq_ = 0;
  std::vector<int64_t> sendSeq_, recvSeq_;
  std::vector<int> worldRanks_;
  std::atomic<uint64_t> bytes_{0};
  bool broken_ = false;
  std::string brokenReason_;
  // Buffers of operations abandoned at a timeout (MPI may still write into them).
  std::vector<at::Tensor> graveyard_;
  std::vector<std::shared_ptr<std::vector<int64_t>>> graveyardHeaders_;
};

}  // namespace dit
