// Work: the handle of one asynchronous collective, as c10d's Work
// (torch/csrc/distributed/c10d/Work.hpp).
//
// Every ProcessGroup collective starts the operation and returns a std::shared_ptr<Work>
// (c10d: c10::intrusive_ptr<Work>). The caller later waits for it; results (allgather,
// reduceScatter, allToAll, sendRecv) are read from the Work after completion.
//
// Errors: argument errors that one rank can see alone (undefined tensor, dim out of range, dtype
// not reducible, wrong number of inputs) and the agreement verdicts of ProcessGroupChecked are
// thrown by the issuing call, as c10d does. Errors of the transfer itself (a peer that never
// arrives: CollectiveTimeoutError; an MPI/NCCL failure: std::runtime_error) are thrown by wait()
// (and by result()/results(), which wait), and kept in exception() afterwards.
//
// Stream contract (c10d Work::wait / Work::synchronize):
//  - ProcessGroupMPI and the local group: wait() blocks the calling thread until the data is in
//    the output tensors (CUDA tensors are staged through host memory, so they are ready too).
//  - ProcessGroupNCCL: the collective runs on the group's communication stream; wait() makes the
//    caller's *current* CUDA stream wait for it (an event recorded after the collective) and does
//    not block the host. Work queued later on the current stream sees the results. isCompleted()
//    queries that event without blocking. With DITSTUDIO_NCCL_BLOCKING_WAIT=1, wait() also blocks
//    the host until the GPU finished, with the group's deadline.
//
// Lifetime: a Work refers to its group; wait for it (or drop it) before the group is destroyed.
// Dropping a Work that is still running waits for it in the destructor (errors are kept by the
// group: it becomes unusable after a timeout), so buffers MPI or NCCL still write into stay alive.
//
// Threading: as the groups (parallel/runtime.h): only the thread that calls MPI uses a Work.
#pragma once

#include <ATen/core/Tensor.h>

#include <exception>
#include <memory>
#include <vector>

namespace dit {

class Work {
 public:
  virtual ~Work() = default;
  Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  /// Non-blocking: true once the collective has finished, successfully or not (MPI: MPI_Test,
  /// which also progresses it; NCCL: the end event has been reached). Never throws for the
  /// collective's own failure (see exception()); throws std::runtime_error only if the backend's
  /// query itself fails.
  bool isCompleted();
  /// True when completed without error.
  bool isSuccess();
  /// The collective's error once it completed with one (else nullptr). Never waits.
  std::exception_ptr exception() const { return error_; }

  /// Waits for completion (see the stream contract above) and makes the outputs valid; rethrows
  /// the collective's error (CollectiveTimeoutError, std::runtime_error) on every call after a
  /// failure. Idempotent.
  void wait();

  /// The single output tensor after wait() (waits first if needed): allgather and reduceScatter
  /// (the new tensor), sendRecv (the received tensor), allreduce/broadcast/recv (the in-place
  /// tensor). Throws std::logic_error for a call with no single output (allToAll, barrier, send).
  const at::Tensor& result();
  /// Every output tensor after wait() (waits first if needed): allToAll's outputs in rank order,
  /// or the single result as a one-element vector; empty for barrier and send.
  const std::vector<at::Tensor>& results();

  /// A Work that is already complete with `outputs` (a local group, a group of one rank).
  static std::shared_ptr<Work> completed(std::vector<at::Tensor> outputs = {});

 protected:
  /// Backend step: advances the operation without blocking; returns true once it has finished
  /// (then finish() runs). May throw: the error is stored and completes the Work.
  virtual bool test() = 0;
  /// Backend step: blocks until finished or throws (deadline, failure).
  virtual void block() = 0;
  /// Backend step, once, after success: copies back, concatenates, counts bytes, and calls
  /// setOutputs(). Runs on the waiting thread (NCCL: after the current stream was made to wait).
  virtual void finish() = 0;
  void setOutputs(std::vector<at::Tensor> outputs) { outputs_ = std::move(outputs); }
  /// True once wait()/isCompleted() recorded the end (success or error).
  bool done() const { return done_; }
  /// Backend hook for the destructor of a subclass: waits if still running, swallowing the error.
  void waitQuietly() noexcept;

 private:
  void complete(std::exception_ptr e);

  bool done_ = false;  // the backend operation ended (finish() ran or an error was stored)
  std::exception_ptr error_;
  std::vector<at::Tensor> outputs_;
};

}  // namespace dit
