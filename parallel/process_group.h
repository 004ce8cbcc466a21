// ProcessGroup: the collectives DiT Studio's parallel strategies need, over a group of ranks.
//
// Semantics follow torch.distributed (c10d) collectives. Every member function is collective:
// all ranks of the group call it, in the same order, with agreeing arguments (same dtype, and the
// shapes the description requires). Implementations check agreement and throw
// CollectiveMismatchError naming the ranks and the calls instead of hanging; a peer that never
// arrives ends in CollectiveTimeoutError after timeoutSeconds().
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
  /// Backend name: "local", "mpi" or "nccl".
  virtual std::string backend() const = 0;

  /// In-place all-reduce of `t` (any shape; float32/16, bfloat16, int64).
  virtual void allreduce(at::Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;

  /// Gathers each rank's `t` along `dim`. Ranks may contribute different sizes along `dim`
  /// (uneven, "anything" modes) provided `sizes` lists every rank's size; with `sizes` empty all
  /// ranks must contribute the same shape. Result: concatenation in rank order.
  virtual at::Tensor allgather(const at::Tensor& t, int64_t dim,
                               const std::vector<int64_t>& sizes = {}) = 0;

  /// Reduce-scatter along dim 0: `t` has size() * n rows; rank r receives the sum over ranks of
  /// rows [r*n, (r+1)*n).
  virtual at::Tensor reduceScatter(const at::Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;

  /// All-to-all with uneven splits. `inputs[j]` is sent to rank j; returns `outputs` where
  /// `outputs[j]` came from rank j with shape `outputShapes[j]`. dtypes must agree.
  virtual std::vector<at::Tensor> allToAll(const std::vector<at::Tensor>& inputs,
                                           const std::vector<std::vector<int64_t>>& outputShapes) = 0;

  /// Broadcast of `t` (same shape and dtype on every rank) from `root`, in place.
  virtual void broadcast(at::Tensor& t, int root) = 0;

  /// Simultaneous send of `send` to rank `dst` and receive into a new tensor of `recvShape`
  /// (dtype of `send`) from rank `src` — the ring-attention K/V rotation step. Collective over the
  /// ranks involved (every rank of a ring calls it in the same step).
  virtual at::Tensor sendRecv(const at::Tensor& send, int dst, const std::vector<int64_t>& recvShape,
                              int src) = 0;

  /// Point-to-point send/recv (blocking).
  virtual void send(const at::Tensor& t, int dst, int tag = 0) = 0;
  virtual void recv(at::Tensor& t, int src, int tag = 0) = 0;

  virtual void barrier() = 0;

  /// Total bytes this rank has sent through this group (payload only), for per-rank reporting.
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
/// Example: `{ ScopedTimeout idle(*world, 0); world->broadcast(request, 0); }` for an idle wait.
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
