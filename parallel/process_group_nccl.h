// ProcessGroupNCCL: the ProcessGroup collectives on CUDA tensors with NCCL, compiled only when
// CMake found NCCL and a CUDA LibTorch (compile definition DITSTUDIO_HAVE_NCCL, public on
// dit_engine). Follows c10d ProcessGroupNCCL (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp).
//
// - All NCCL functions are asynchronous. Each call records an event on the caller's current CUDA
//   stream, makes the group's communication stream (one per group, from LibTorch's stream pool)
//   wait for it, enqueues the NCCL operation there and records an end event; it returns at once
//   with a Work. Work::wait() makes the caller's current stream wait for the end event; it does
//   not block the host (parallel/work.h). Tensors used on the communication stream are recorded
//   with the caching allocator (recordStream), so freeing them early is safe.
// - Same-order rule: all ranks issue the group's calls in the same order with agreeing arguments
//   (process_group.h). Nothing is checked per call (no host round trip): wrap the group in
//   ProcessGroupChecked (DITSTUDIO_CHECK_COLLECTIVES=1 with DeviceMesh) to debug a mismatch.
// - Bootstrap: group rank 0 calls ncclGetUniqueId and broadcasts it over the group's
//   ProcessGroupMPI; every rank then calls ncclCommInitRank on its CUDA device.
// - CPU tensors passed to this group go through its ProcessGroupMPI.
// - barrier() blocks the host (with the group deadline) until a 1-element all-reduce enqueued
//   after everything on the current stream has finished on every rank.
// - DITSTUDIO_NCCL_BLOCKING_WAIT=1: Work::wait() also blocks the host until the collective
//   finished on the GPU (polling, with the group deadline), aborting the NCCL communicator on
//   timeout (CollectiveTimeoutError) or on an asynchronous NCCL error (std::runtime_error).
//
// Every member function that communicates is collective: all ranks of the group call it in the
// same order.
#pragma once

#include <memory>

#include "parallel/process_group.h"

namespace dit {

class ProcessGroupMPI;

#ifdef DITSTUDIO_HAVE_NCCL
inline constexpr bool kHaveNCCL = true;
/// Creates the NCCL communicator over the ranks of `mpi` on CUDA device `device` (collective over
/// `mpi`: all its ranks call it in the same order). `mpi` carries the bootstrap and CPU-tensor
/// calls; it is owned by the returned group. Throws std::runtime_error with NCCL's error string
/// on failure.
std::shared_ptr<ProcessGroup> makeNCCLProcessGroup(std::shared_ptr<ProcessGroupMPI> mpi,
                                                   int device);
/// Makes `device` the current CUDA device of the calling thread (c10::cuda::set_device).
void setCurrentCudaDevice(int device);
#else
inline constexpr bool kHaveNCCL = false;
/// Not built with NCCL: always throws std::runtime_error.
std::shared_ptr<ProcessGroup> makeNCCLProcessGroup(std::shared_ptr<ProcessGroupMPI> mpi,
                                                   int device);
/// Not built with NCCL: does nothing (the engine passes explicit devices).
void setCurrentCudaDevice(int device);
#endif

}  // namespace dit
