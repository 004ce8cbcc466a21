// ProcessGroup: the collectives DiT Studio's parallel strategies need, over a group of ranks.
//
// Semantics follow torch.distributed (c10d) collectives:
//  - Asynchronous: every collective starts the operation and returns a std::shared_ptr<Work>
//    (parallel/work.h; c10d returns c10::intrusive_ptr<Work>). Call wait() before reading an
//    in-place tensor, and read new outputs with Work::result()/results(). Several collectives may
//    be in flight at once and be waited in any order. Inputs (and in-place tensors) must not be
//    modified before their Work completed. Synchronous use: `g.allreduce(t)->wait();`,
//    `at::Tensor all = g.allgather(t, 0)->result();`.
//  - Same order (the rule c10d ProcessGroupNCCL states): every member function that communicates
//    is collective; all ranks of the group *issue* their calls in the same order, with agreeing
//    arguments (same dtype, and the shapes the description requires). The backends do not check
//    this: a violation hangs until the deadline or corrupts data. ProcessGroupChecked
//    (parallel/process_group_checked.h; c10d ProcessGroupWrapper) checks it before every call and
//    throws CollectiveMismatchError naming the ranks and the calls instead; DeviceMesh wraps its
//    groups in it by default for MPI (opt-in for NCCL: DITSTUDIO_CHECK_COLLECTIVES).
//  - A peer that never arrives ends in CollectiveTimeoutError after timeoutSeconds(), thrown by
//    Work::wait() (or by the checked group's agreement exchange, naming the missing ranks).
//  - Errors one rank can see alone (undefined tensor, dim out of range, wrong number of inputs)
//    are thrown by the issuing call (std::invalid_argument).
//
// Tensors may live on the CPU or (for ProcessGroupNCCL, or staged through host memory by
// ProcessGroupMPI) on a CUDA device. Inputs need not be contiguous; outputs are new contiguous
// tensors on the input's device unless stated otherwise.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/work.h"

namespace dit {

/// Raised when ranks disagree on a collective (different op, dtype or size).
class CollectiveMismatchError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};
/// Raised when a collective did not complete within the group's timeout.
class CollectiveTimeoutError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class ReduceOp { Sum, Max, Min };

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  /// This rank's index in the group, 0 <= rank() < size().
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Backend name: "local", "mpi" or "nccl" (a ProcessGroupChecked reports its wrapped group's).
  virtual std::string backend() const = 0;

  /// In-place all-reduce of `t` (any shape; float32/16, bfloat16, int64); `t` holds the result
  /// after wait() (also result()).
  [[nodiscard]] virtual std::shared_ptr<Work> allreduce(at::Tensor& t,
                                                        ReduceOp op = ReduceOp::Sum) = 0;

  /// Gathers each rank's `t` along `dim`. Ranks may contribute different sizes along `dim`
  /// (uneven, "anything" modes) provided `sizes` lists every rank's size; with `sizes` empty all
  /// ranks must contribute the same shape. result(): the concatenation in rank order.
  [[nodiscard]] virtual std::shared_ptr<Work> allgather(const at::Tensor& t, int64_t dim,
                                                        const std::vector<int64_t>& sizes = {}) = 0;

  /// Reduce-scatter along dim 0: `t` has size() * n rows; rank r receives the sum over ranks of
  /// rows [r*n, (r+1)*n) as result(). std::invalid_argument when t.size(0) % size() != 0.
  [[nodiscard]] virtual std::shared_ptr<Work> reduceScatter(const at::Tensor& t,
                                                            ReduceOp op = ReduceOp::Sum) = 0;

  /// All-to-all with uneven splits. `inputs[j]` is sent to rank j; results()[j] came from rank j
  /// with shape `outputShapes[j]`. dtypes must agree; inputs.size() == outputShapes.size() ==
  /// size() (std::invalid_argument otherwise).
  [[nodiscard]] virtual std::shared_ptr<Work> allToAll(
      const std::vector<at::Tensor>& inputs,
      const std::vector<std::vector<int64_t>>& outputShapes) = 0;

  /// Broadcast of `t` (same shape and dtype on every rank) from `root`, in place (after wait()).
  [[nodiscard]] virtual std::shared_ptr<Work> broadcast(at::Tensor& t, int root) = 0;

  /// Simultaneous send of `send` to rank `dst` and receive into a new tensor (result()) of
  /// `recvShape` (dtype of `send`) from rank `src` — the ring-attention K/V rotation step.
  /// Collective over the group: every rank calls it in the same step, and the (dst, src) pairs
  /// form a permutation.
  [[nodiscard]] virtual std::shared_ptr<Work> sendRecv(const at::Tensor& send, int dst,
                                                       const std::vector<int64_t>& recvShape,
                                                       int src) = 0;

  /// Point-to-point send of `t` to `dst` / receive into `t` from `src` (in place, after wait()).
  /// Sends between one pair of ranks are matched in order; the two ends agree on dtype, shape
  /// and tag (0 <= tag). Involves only the two ranks.
  [[nodiscard]] virtual std::shared_ptr<Work> send(const at::Tensor& t, int dst, int tag = 0) = 0;
  [[nodiscard]] virtual std::shared_ptr<Work> recv(at::Tensor& t, int src, int tag = 0) = 0;

  /// Completes once every rank has issued it (no payload).
  [[nodiscard]] virtual std::shared_ptr<Work> barrier() = 0;

  /// Total bytes this rank has sent through this group (payload only, counted when a collective
  /// completes on this rank), for per-rank reporting.
  virtual uint64_t bytesSent() const = 0;

  /// Group name used in messages ("world", "tp", "cp", ...). Local, no communication.
  virtual std::string name() const { return backend(); }
  /// Seconds a call may wait for its peers before CollectiveTimeoutError; 0 means no deadline
  /// (e.g. idle ranks waiting for the next request). Local, no communication.
  virtual double timeoutSeconds() const { return 0.0; }
  /// Sets timeoutSeconds() for later calls (a local setting: set the same value on every rank of
  /// the group, between collectives). Ignored by groups that never wait (the local group).
  virtual void setTimeoutSeconds(double /*seconds*/) {}
};

/// Sets a group's timeout for the lifetime of this object and restores the previous value.
/// Example: `{ ScopedTimeout idle(*world, 0); world->broadcast(request, 0)->wait(); }` for an idle
/// wait.
class ScopedTimeout {
 public:
  ScopedTimeout(ProcessGroup& g, double seconds) : g_(g), old_(g.timeoutSeconds()) {
    g_.setTimeoutSeconds(seconds);
  }
  ~ScopedTimeout() { g_.setTimeoutSeconds(old_); }
  ScopedTimeout(const ScopedTimeout&) = delete;
  ScopedTimeout& operator=(const ScopedTimeout&) = delete;

 private:
  ProcessGroup& g_;
  double old_;
};

/// A group of one rank (no communication). Used for degree-1 mesh dimensions and the CLI.
std::shared_ptr<ProcessGroup> makeLocalProcessGroup();

}  // namespace dit
