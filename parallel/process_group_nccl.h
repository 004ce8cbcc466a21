// ProcessGroupNCCL: the ProcessGroup collectives on CUDA tensors with NCCL, compiled only when
// CMake found NCCL and a CUDA LibTorch (compile definition DITSTUDIO_HAVE_NCCL, public on
// dit_engine).
//
// - Bootstrap: group rank 0 calls ncclGetUniqueId and MPI_Bcasts it over the group's MPI
//   communicator; every rank then calls ncclCommInitRank on its CUDA device.
// - Collectives are enqueued on LibTorch's current CUDA stream of the tensor's device
//   (c10::cuda::getCurrentCUDAStream) and return without synchronising the host; results are
//   ready for later work on that stream. Uneven allgather and all-to-all use grouped
//   ncclSend/ncclRecv.
// - Agreement: before every call the ranks run the same host-side agreement exchange as
//   ProcessGroupMPI (op, call number, dtype, shapes; CollectiveMismatchError / timeout naming the
//   ranks), so a mismatch or a missing rank never hangs the GPU.
// - CPU tensors passed to this group go through its ProcessGroupMPI.
// - DITSTUDIO_NCCL_BLOCKING_WAIT=1 additionally waits (polling, with the group deadline) for every
//   collective to finish on the GPU, aborting the NCCL communicator on timeout.
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
/// `mpi`: all its ranks call it in the same order). `mpi` carries the agreement exchange, the
/// bootstrap and CPU-tensor calls; it is owned by the returned group. Throws std::runtime_error
/// with NCCL's error string on failure.
std::shared_ptr<ProcessGroup> makeNCCLProcessGroup(std::shared_ptr<ProcessGroupMPI> mpi, int device);
/// Makes `device` the current CUDA device of the calling thread (c10::cuda::set_device).
void setCurrentCudaDevice(int device);
#else
inline constexpr bool kHaveNCCL = false;
/// Not built with NCCL: always throws std::runtime_error.
std::shared_ptr<ProcessGroup> makeNCCLProcessGroup(std::shared_ptr<ProcessGroupMPI> mpi, int device);
/// Not built with NCCL: does nothing (the engine passes explicit devices).
void setCurrentCudaDevice(int device);
#endif

}  // namespace dit
