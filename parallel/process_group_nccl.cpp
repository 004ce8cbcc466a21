// ProcessGroupNCCL (compiled only with DITSTUDIO_HAVE_NCCL). See process_group_nccl.h.
//
// Written against APIs present in both LibTorch 1.13 and 2.x (c10::cuda::getCurrentCUDAStream,
// c10::cuda::getStreamFromPool, c10::cuda::CUDAGuard, c10::cuda::set_device,
// c10::cuda::CUDACachingAllocator::recordStream, at::cuda::CUDAEvent) and NCCL >= 2.13
// (ncclGetLastError, ncclCommGetAsyncError, ncclCommAbort, grouped ncclSend/ncclRecv,
// ncclBfloat16).
#include "parallel/process_group_nccl.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "parallel/collective_call.h"
#include "parallel/process_group_mpi.h"

namespace dit {

namespace {

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  return ncclSum;
}

bool ncclReduceType(at::ScalarType t, ncclDataType_t* out) {
  switch (t) {
    case at::kFloat:
      *out = ncclFloat32;
      return true;
    case at::kHalf:
      *out = ncclFloat16;
      return true;
    case at::kBFloat16:
      *out = ncclBfloat16;
      return true;
    case at::kDouble:
      *out = ncclFloat64;
      return true;
    case at::kLong:
      *out = ncclInt64;
      return true;
    case at::kInt:
      *out = ncclInt32;
      return true;
    case at::kChar:
      *out = ncclInt8;
      return true;
    case at::kByte:
      *out = ncclUint8;
      return true;
    default:
      return false;
  }
}

bool envBlockingWait() {
  const char* v = std::getenv("DITSTUDIO_NCCL_BLOCKING_WAIT");
  return v && *v && std::strcmp(v, "0") != 0;
}

class ProcessGroupNCCL;

// The Work of one enqueued NCCL operation: an end event on the communication stream.
class NCCLWork final : public Work {
 public:
  NCCLWork(ProcessGroupNCCL* g, std::string what, c10::DeviceIndex device,
           std::unique_ptr<at::cuda::CUDAEvent> end, std::vector<at::Tensor> keep,
           std::function<std::vector<at::Tensor>()> fin, bool hostBlock)
      : g_(g),
        what_(std::move(what)),
        device_(device),
        end_(std::move(end)),
        keep_(std::move(keep)),
        finish_(std::move(fin)),
        hostBlock_(hostBlock) {}
  ~NCCLWork() override {
    // Nothing to wait for on the host: the caching allocator keeps the buffers (recordStream).
  }

 protected:
  bool test() override { return end_->query(); }
  void block() override;
  void finish() override {
    // Stream contract: later work on the caller's current stream sees the results.
    end_->block(c10::cuda::getCurrentCUDAStream(device_));
    keep_.clear();
    if (finish_) setOutputs(finish_());
  }

 private:
  ProcessGroupNCCL* g_;
  std::string what_;
  c10::DeviceIndex device_;
  std::unique_ptr<at::cuda::CUDAEvent> end_;
  std::vector<at::Tensor> keep_;
  std::function<std::vector<at::Tensor>()> finish_;
  bool hostBlock_;
};

class ProcessGroupNCCL final : public ProcessGroup {
 public:
  ProcessGroupNCCL(std::shared_ptr<ProcessGroupMPI> mpi, int device)
      : mpi_(std::move(mpi)),
        device_(static_cast<c10::DeviceIndex>(device)),
        commStream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true,
                                                 static_cast<c10::DeviceIndex>(device))),
        blockingWait_(envBlockingWait()) {
    if (!mpi_) throw std::invalid_argument("ProcessGroupNCCL: null MPI group");
    c10::cuda::CUDAGuard guard(device_);
    // Bootstrap: rank 0's unique id reaches every rank through MPI (with the group deadline).
    at::Tensor id = at::zeros({static_cast<int64_t>(sizeof(ncclUniqueId))}, at::kByte);
    if (mpi_->rank() == 0) {
      ncclUniqueId uid;
      check(ncclGetUniqueId(&uid), "ncclGetUniqueId");
      std::memcpy(id.data_ptr(), &uid, sizeof(uid));
    }
    mpi_->broadcast(id, 0)->wait();
    ncclUniqueId uid;
    std::memcpy(&uid, id.data_ptr(), sizeof(uid));
    check(ncclCommInitRank(&comm_, mpi_->size(), uid, mpi_->rank()), "ncclCommInitRank");
  }

  ~ProcessGroupNCCL() override {
    if (comm_ && !aborted_) ncclCommDestroy(comm_);
  }

  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  std::string backend() const override { return "nccl"; }
  std::string name() const override { return mpi_->name(); }
  double timeoutSeconds() const override { return mpi_->timeoutSeconds(); }
  void setTimeoutSeconds(double s) override { mpi_->setTimeoutSeconds(s); }
  uint64_t bytesSent() const override { return mpi_->bytesSent(); }

  std::shared_ptr<Work> allreduce(at::Tensor& t, ReduceOp op) override {
    if (!t.defined()) throw std::invalid_argument("allreduce: undefined tensor");
    if (t.device().is_cpu()) return mpi_->allreduce(t, op);
    requireDevice(t, "allreduce");
    ncclDataType_t type;
    if (!ncclReduceType(t.scalar_type(), &type))
      throw std::invalid_argument("allreduce on " + mpi_->describeGroup() + ": dtype " +
                                  dtypeName(static_cast<int64_t>(t.scalar_type())) +
                                  " cannot be reduced by NCCL");
    if (size() == 1) return Work::completed({t});
    at::Tensor work = t.contiguous();
    at::Tensor out = t;
    const uint64_t bytes = static_cast<uint64_t>(2 * (size() - 1) * work.nbytes() / size());
    return enqueue(
        describeCall(allreduceCall(t, op)), {work},
        [&](cudaStream_t s) {
          check(ncclAllReduce(work.data_ptr(), work.data_ptr(), static_cast<size_t>(work.numel()),
                              type, ncclOp(op), comm_, s),
                "ncclAllReduce");
        },
        [this, work, out, bytes]() mutable {
          mpi_->addBytesSent(bytes);
          if (!work.is_same(out)) out.copy_(work);
          return std::vector<at::Tensor>{out};
        });
  }

  std::shared_ptr<Work> allgather(const at::Tensor& t, int64_t dim,
                                  const std::vector<int64_t>& sizes) override {
    if (!t.defined()) throw std::invalid_argument("allgather: undefined tensor");
    if (t.device().is_cpu()) return mpi_->allgather(t, dim, sizes);
    requireDevice(t, "allgather");
    const int64_t nd = t.dim();
    const int64_t d = dim < 0 ? dim + nd : dim;
    if (d < 0 || d >= nd)
      throw std::invalid_argument("allgather on " + mpi_->describeGroup() + ": dim " +
                                  std::to_string(dim) + " out of range for a " +
                                  std::to_string(nd) + "-d tensor");
    const int n = size(), me = rank();
    if (!sizes.empty() &&
        (sizes.size() != static_cast<size_t>(n) || sizes[static_cast<size_t>(me)] != t.size(d)))
      throw std::invalid_argument(
          "allgather on " + mpi_->describeGroup() + ": the per-rank sizes " + shapeString(sizes) +
          " do not fit a group of " + std::to_string(n) + " ranks where rank " +
          std::to_string(me) + " contributes " + std::to_string(t.size(d)));
    if (n == 1) return Work::completed({t.clone(at::MemoryFormat::Contiguous)});
    const CallInfo c = allgatherCall(t, d, sizes);
    at::Tensor x = t.contiguous();
    int64_t inner = 1;
    for (int64_t k = 0; k < nd; ++k)
      if (k != d) inner *= t.size(k);
    std::vector<int64_t> rows(static_cast<size_t>(n)), offs(static_cast<size_t>(n));
    int64_t total = 0;
    bool even = true;
    for (int r = 0; r < n; ++r) {
      rows[r] = sizes.empty() ? t.size(d) : sizes[r];
      offs[r] = total;
      total += rows[r] * inner;
      if (rows[r] != rows[0]) even = false;
    }
    at::Tensor recv = at::empty({total}, x.options());
    const size_t es = x.element_size();
    if (!even)
      recv.narrow(0, offs[me], rows[me] * inner).copy_(x.view({-1}));  // on the current stream
    const uint64_t bytes = static_cast<uint64_t>(x.nbytes()) * static_cast<uint64_t>(n - 1);
    return enqueue(
        describeCall(c), {x, recv},
        [&](cudaStream_t s) {
          if (even) {
            check(ncclAllGather(x.data_ptr(), recv.data_ptr(), static_cast<size_t>(x.numel()) * es,
                                ncclInt8, comm_, s),
                  "ncclAllGather");
            return;
          }
          auto* rbase = static_cast<char*>(recv.data_ptr());
          check(ncclGroupStart(), "ncclGroupStart");
          for (int p = 0; p < n; ++p) {
            if (p == me) continue;
            if (x.numel() > 0)
              check(ncclSend(x.data_ptr(), static_cast<size_t>(x.numel()) * es, ncclInt8, p, comm_,
                             s),
                    "ncclSend");
            if (rows[p] * inner > 0)
              check(ncclRecv(rbase + offs[p] * es, static_cast<size_t>(rows[p] * inner) * es,
                             ncclInt8, p, comm_, s),
                    "ncclRecv");
          }
          check(ncclGroupEnd(), "ncclGroupEnd");
        },
        [this, c, d, n, recv, rows, offs, inner, bytes]() {
          mpi_->addBytesSent(bytes);
          int64_t sumRows = 0;
          for (int64_t r : rows) sumRows += r;
          std::vector<int64_t> outShape = c.shape;
          outShape[d] = sumRows;
          if (d == 0) return std::vector<at::Tensor>{recv.view(outShape)};
          std::vector<at::Tensor> parts;
          for (int r = 0; r < n; ++r) {
            std::vector<int64_t> s = c.shape;
            s[d] = rows[r];
            parts.push_back(recv.narrow(0, offs[r], rows[r] * inner).view(s));
          }
          return std::vector<at::Tensor>{at::cat(parts, d)};
        });
  }

  std::shared_ptr<Work> reduceScatter(const at::Tensor& t, ReduceOp op) override {
    if (!t.defined()) throw std::invalid_argument("reduceScatter: undefined tensor");
    if (t.device().is_cpu()) return mpi_->reduceScatter(t, op);
    requireDevice(t, "reduceScatter");
    if (t.dim() < 1)
      throw std::invalid_argument("reduceScatter needs a tensor with at least 1 dimension");
    ncclDataType_t type;
    if (!ncclReduceType(t.scalar_type(), &type))
      throw std::invalid_argument("reduceScatter: dtype " +
                                  dtypeName(static_cast<int64_t>(t.scalar_type())) +
                                  " cannot be reduced by NCCL");
    if (t.size(0) % size() != 0)
      throw std::invalid_argument("reduceScatter on " + mpi_->describeGroup() + ": dim 0 size " +
                                  std::to_string(t.size(0)) +
                                  " is not divisible by the group size " + std::to_string(size()));
    if (size() == 1) return Work::completed({t.clone(at::MemoryFormat::Contiguous)});
    at::Tensor x = t.contiguous();
    std::vector<int64_t> outShape(t.sizes().begin(), t.sizes().end());
    outShape[0] /= size();
    at::Tensor recv = at::empty(outShape, x.options());
    const uint64_t bytes = static_cast<uint64_t>((size() - 1) * x.nbytes() / size());
    return enqueue(
        describeCall(reduceScatterCall(t, op)), {x, recv},
        [&](cudaStream_t s) {
          check(ncclReduceScatter(x.data_ptr(), recv.data_ptr(), static_cast<size_t>(recv.numel()),
                                  type, ncclOp(op), comm_, s),
                "ncclReduceScatter");
        },
        [this, recv, bytes]() {
          mpi_->addBytesSent(bytes);
          return std::vector<at::Tensor>{recv};
        });
  }

  std::shared_ptr<Work> allToAll(const std::vector<at::Tensor>& inputs,
                                 const std::vector<std::vector<int64_t>>& outputShapes) override {
    if (inputs.empty()) throw std::invalid_argument("allToAll: no inputs");
    if (inputs[0].defined() && inputs[0].device().is_cpu())
      return mpi_->allToAll(inputs, outputShapes);
    const int n = size(), me = rank();
    const at::ScalarType dt = inputs[0].scalar_type();
    for (size_t j = 0; j < inputs.size(); ++j) {
      if (!inputs[j].defined())
        throw std::invalid_argument("allToAll: undefined input " + std::to_string(j));
      requireDevice(inputs[j], "allToAll");
      if (inputs[j].scalar_type() != dt)
        throw std::invalid_argument("allToAll on " + mpi_->describeGroup() +
                                    ": inputs have different dtypes");
    }
    if (inputs.size() != static_cast<size_t>(n) || outputShapes.size() != static_cast<size_t>(n))
      throw std::invalid_argument("allToAll on " + mpi_->describeGroup() + ": rank " +
                                  std::to_string(me) + " passes " + std::to_string(inputs.size()) +
                                  " inputs and " + std::to_string(outputShapes.size()) +
                                  " output shapes for a group of " + std::to_string(n) + " ranks");
    if (inputs[static_cast<size_t>(me)].numel() != numelOf(outputShapes[static_cast<size_t>(me)]))
      throw CollectiveMismatchError(
          "collective mismatch on " + mpi_->describeGroup() + ": rank " + std::to_string(me) +
          " sends " + std::to_string(inputs[static_cast<size_t>(me)].numel()) +
          " elements to itself but expects " + shapeString(outputShapes[static_cast<size_t>(me)]));
    if (n == 1) return Work::completed({inputs[0].contiguous().view(outputShapes[0]).clone()});
    std::vector<at::Tensor> xs, outs;
    for (const auto& x : inputs) xs.push_back(x.contiguous());
    for (int j = 0; j < n; ++j) outs.push_back(at::empty(outputShapes[j], xs[0].options()));
    if (outs[me].numel() > 0)
      outs[me].view({-1}).copy_(xs[me].view({-1}));  // on the current stream
    const size_t es = xs[0].element_size();
    uint64_t sent = 0;
    for (int j = 0; j < n; ++j)
      if (j != me) sent += xs[j].nbytes();
    std::vector<at::Tensor> used = xs;
    used.insert(used.end(), outs.begin(), outs.end());
    return enqueue(
        describeCall(allToAllCall(inputs, outputShapes, n)), used,
        [&](cudaStream_t s) {
          check(ncclGroupStart(), "ncclGroupStart");
          for (int j = 0; j < n; ++j) {
            if (j == me) continue;
            if (xs[j].numel() > 0)
              check(ncclSend(xs[j].data_ptr(), static_cast<size_t>(xs[j].numel()) * es, ncclInt8, j,
                             comm_, s),
                    "ncclSend");
            if (outs[j].numel() > 0)
              check(ncclRecv(outs[j].data_ptr(), static_cast<size_t>(outs[j].numel()) * es,
                             ncclInt8, j, comm_, s),
                    "ncclRecv");
          }
          check(ncclGroupEnd(), "ncclGroupEnd");
        },
        [this, outs, sent]() {
          mpi_->addBytesSent(sent);
          return outs;
        });
  }

  std::shared_ptr<Work> broadcast(at::Tensor& t, int root) override {
    if (!t.defined()) throw std::invalid_argument("broadcast: undefined tensor");
    if (t.device().is_cpu()) return mpi_->broadcast(t, root);
    requireDevice(t, "broadcast");
    if (root < 0 || root >= size())
      throw std::invalid_argument("broadcast on " + mpi_->describeGroup() + ": root " +
                                  std::to_string(root) + " outside the group of " +
                                  std::to_string(size()) + " ranks");
    if (size() == 1) return Work::completed({t});
    at::Tensor work = t.contiguous();
    at::Tensor out = t;
    const uint64_t bytes =
        rank() == root ? static_cast<uint64_t>(work.nbytes()) * static_cast<uint64_t>(size() - 1)
                       : 0;
    return enqueue(
        describeCall(broadcastCall(t, root)), {work},
        [&](cudaStream_t s) {
          check(ncclBroadcast(work.data_ptr(), work.data_ptr(), static_cast<size_t>(work.nbytes()),
                              ncclInt8, root, comm_, s),
                "ncclBroadcast");
        },
        [this, work, out, bytes]() mutable {
          mpi_->addBytesSent(bytes);
          if (!work.is_same(out)) out.copy_(work);
          return std::vector<at::Tensor>{out};
        });
  }

  std::shared_ptr<Work> sendRecv(const at::Tensor& send, int dst,
                                 const std::vector<int64_t>& recvShape, int src) override {
    if (!send.defined()) throw std::invalid_argument("sendRecv: undefined tensor");
    if (send.device().is_cpu()) return mpi_->sendRecv(send, dst, recvShape, src);
    requireDevice(send, "sendRecv");
    const int n = size(), me = rank();
    if (dst < 0 || dst >= n || src < 0 || src >= n || (dst == me) != (src == me))
      throw std::invalid_argument(
          "sendRecv on " + mpi_->describeGroup() + ": rank " + std::to_string(me) + " uses dst " +
          std::to_string(dst) + " / src " + std::to_string(src) +
          " (both inside the group, and a rank that sends to itself receives from itself)");
    if (dst == me) {
      if (send.numel() != numelOf(recvShape))
        throw CollectiveMismatchError("collective mismatch on " + mpi_->describeGroup() +
                                      ": rank " + std::to_string(me) + " sends " +
                                      std::to_string(send.numel()) +
                                      " elements to itself but expects " + shapeString(recvShape));
      return Work::completed({send.contiguous().view(recvShape).clone()});
    }
    at::Tensor x = send.contiguous();
    at::Tensor recv = at::empty(recvShape, x.options());
    const uint64_t bytes = static_cast<uint64_t>(x.nbytes());
    return enqueue(
        describeCall(sendRecvCall(send, dst, recvShape, src)), {x, recv},
        [&](cudaStream_t s) {
          check(ncclGroupStart(), "ncclGroupStart");
          if (x.numel() > 0)
            check(ncclSend(x.data_ptr(), x.nbytes(), ncclInt8, dst, comm_, s), "ncclSend");
          if (recv.numel() > 0)
            check(ncclRecv(recv.data_ptr(), recv.nbytes(), ncclInt8, src, comm_, s), "ncclRecv");
          check(ncclGroupEnd(), "ncclGroupEnd");
        },
        [this, recv, bytes]() {
          mpi_->addBytesSent(bytes);
          return std::vector<at::Tensor>{recv};
        });
  }

  std::shared_ptr<Work> send(const at::Tensor& t, int dst, int tag) override {
    if (!t.defined()) throw std::invalid_argument("send: undefined tensor");
    if (t.device().is_cpu()) return mpi_->send(t, dst, tag);
    requireDevice(t, "send");
    requirePeer(dst, "send");
    at::Tensor x = t.contiguous();
    const uint64_t bytes = static_cast<uint64_t>(x.nbytes());
    return enqueue(
        describeCall(sendCall(t, dst, tag)), {x},
        [&](cudaStream_t s) {
          if (x.numel() > 0)
            check(ncclSend(x.data_ptr(), x.nbytes(), ncclInt8, dst, comm_, s), "ncclSend");
        },
        [this, bytes]() {
          mpi_->addBytesSent(bytes);
          return std::vector<at::Tensor>{};
        });
  }

  std::shared_ptr<Work> recv(at::Tensor& t, int src, int tag) override {
    if (!t.defined()) throw std::invalid_argument("recv: undefined tensor");
    if (t.device().is_cpu()) return mpi_->recv(t, src, tag);
    requireDevice(t, "recv");
    requirePeer(src, "recv");
    at::Tensor work = t.contiguous();
    at::Tensor out = t;
    return enqueue(
        describeCall(recvCall(t, src, tag)), {work},
        [&](cudaStream_t s) {
          if (work.numel() > 0)
            check(ncclRecv(work.data_ptr(), work.nbytes(), ncclInt8, src, comm_, s), "ncclRecv");
        },
        [work, out]() mutable {
          if (!work.is_same(out)) out.copy_(work);
          return std::vector<at::Tensor>{out};
        });
  }

  std::shared_ptr<Work> barrier() override {
    // c10d: a 1-element all-reduce after everything on the current stream; wait() blocks the host.
    if (aborted_)
      throw std::runtime_error("barrier on " + mpi_->describeGroup() +
                               ": the NCCL communicator was aborted after an earlier failure");
    c10::cuda::CUDAGuard guard(device_);
    at::Tensor one =
        at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
    return enqueue(
        describeCall(barrierCall()), {one},
        [&](cudaStream_t s) {
          check(ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm_, s),
                "ncclAllReduce");
        },
        nullptr, /*hostBlock=*/true);
  }

  // Blocks the host until `ev` is reached, with the group deadline; aborts the communicator on
  // timeout or on an asynchronous NCCL error.
  void hostWait(at::cuda::CUDAEvent& ev, const std::string& what) {
    const auto start = std::chrono::steady_clock::now();
    const double limit = mpi_->timeoutSeconds();
    for (;;) {
      if (ev.query()) return;  // throws on a CUDA error
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess) {
        ncclCommAbort(comm_);
        aborted_ = true;
        throw std::runtime_error(what + " on " + mpi_->describeGroup() +
                                 ": NCCL asynchronous error: " + ncclGetErrorString(async));
      }
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (limit > 0 && elapsed >= limit) {
        ncclCommAbort(comm_);
        aborted_ = true;
        throw CollectiveTimeoutError("collective timeout: " + what + " on " +
                                     mpi_->describeGroup() + " did not finish on the GPU within " +
                                     std::to_string(limit) + " s on rank " +
                                     std::to_string(rank()) + " (NCCL communicator aborted)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(elapsed < 0.01 ? 20 : 500));
    }
  }

  bool blockingWait() const { return blockingWait_; }

 private:
  // Enqueues `launch` on the communication stream after the caller's current stream reached this
  // point; `used` are the device tensors the operation reads or writes.
  std::shared_ptr<Work> enqueue(std::string what, std::vector<at::Tensor> used,
                                const std::function<void(cudaStream_t)>& launch,
                                std::function<std::vector<at::Tensor>()> fin,
                                bool hostBlock = false) {
    c10::cuda::CUDAGuard guard(device_);
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_);
    at::cuda::CUDAEvent ready(cudaEventDisableTiming);
    ready.record(current);
    ready.block(commStream_);
    launch(commStream_.stream());
    for (const auto& t : used)
      if (t.defined() && t.numel() > 0)
        c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), commStream_);
    auto end = std::make_unique<at::cuda::CUDAEvent>(cudaEventDisableTiming);
    end->record(commStream_);
    return std::make_shared<NCCLWork>(this, std::move(what), device_, std::move(end),
                                      std::move(used), std::move(fin), hostBlock);
  }

  void check(ncclResult_t r, const char* fn) {
    if (r == ncclSuccess) return;
    std::string msg =
        std::string(fn) + " failed on " + mpi_->describeGroup() + ": " + ncclGetErrorString(r);
    if (comm_) {
      const char* last = ncclGetLastError(comm_);
      if (last && *last) msg += std::string(" (") + last + ")";
    }
    throw std::runtime_error(msg);
  }

  void requireDevice(const at::Tensor& t, const char* op) const {
    if (aborted_)
      throw std::runtime_error(std::string(op) + " on " + mpi_->describeGroup() +
                               ": the NCCL communicator was aborted after an earlier failure");
    if (!t.is_cuda() || t.device().index() != device_)
      throw std::invalid_argument(std::string(op) + " on " + mpi_->describeGroup() +
                                  ": tensor on " + t.device().str() +
                                  " but this NCCL group runs on cuda:" + std::to_string(device_));
  }

  void requirePeer(int peer, const char* op) const {
    if (peer < 0 || peer >= size() || peer == rank())
      throw std::invalid_argument(std::string(op) + " on " + mpi_->describeGroup() +
                                  ": peer rank " + std::to_string(peer) + " is invalid for rank " +
                                  std::to_string(rank()));
  }

  std::shared_ptr<ProcessGroupMPI> mpi_;
  c10::DeviceIndex device_ = 0;
  c10::cuda::CUDAStream commStream_;
  bool blockingWait_ = false;
  bool aborted_ = false;
  ncclComm_t comm_ = nullptr;
};

void NCCLWork::block() {
  if (hostBlock_ || g_->blockingWait()) g_->hostWait(*end_, what_);
}

}  // namespace

std::shared_ptr<ProcessGroup> makeNCCLProcessGroup(std::shared_ptr<ProcessGroupMPI> mpi,
                                                   int device) {
  return std::make_shared<ProcessGroupNCCL>(std::move(mpi), device);
}

void setCurrentCudaDevice(int device) {
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
}

}  // namespace dit
