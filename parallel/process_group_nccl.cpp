// ProcessGroupNCCL (compiled only with DITSTUDIO_HAVE_NCCL). See process_group_nccl.h.
//
// Written against APIs present in both LibTorch 1.13 and 2.x (c10::cuda::getCurrentCUDAStream,
// c10::cuda::CUDAGuard, c10::cuda::set_device) and NCCL >= 2.13 (ncclGetLastError,
// ncclCommGetAsyncError, ncclCommAbort, grouped ncclSend/ncclRecv, ncclBfloat16).
#include "parallel/process_group_nccl.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "parallel/process_group_mpi.h"

namespace dit {

namespace {

int64_t numelOf(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

std::vector<int64_t> toVec(at::IntArrayRef s) { return std::vector<int64_t>(s.begin(), s.end()); }

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

bool ncclReduceType(at::ScalarType t, ncclDataType_t* out) {
  switch (t) {
    case at::kFloat: *out = ncclFloat32; return true;
    case at::kHalf: *out = ncclFloat16; return true;
    case at::kBFloat16: *out = ncclBfloat16; return true;
    case at::kDouble: *out = ncclFloat64; return true;
    case at::kLong: *out = ncclInt64; return true;
    case at::kInt: *out = ncclInt32; return true;
    case at::kChar: *out = ncclInt8; return true;
    case at::kByte: *out = ncclUint8; return true;
    default: return false;
  }
}

bool envBlockingWait() {
  const char* v = std::getenv("DITSTUDIO_NCCL_BLOCKING_WAIT");
  return v && *v && std::strcmp(v, "0") != 0;
}

class ProcessGroupNCCL final : public ProcessGroup {
 public:
  ProcessGroupNCCL(std::shared_ptr<ProcessGroupMPI> mpi, int device)
      : mpi_(std::move(mpi)), device_(device), blockingWait_(envBlockingWait()) {
    if (!mpi_) throw std::invalid_argument("ProcessGroupNCCL: null MPI group");
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    // Bootstrap: rank 0's unique id reaches every rank through MPI (agreement + deadline).
    at::Tensor id = at::zeros({static_cast<int64_t>(sizeof(ncclUniqueId))}, at::kByte);
    if (mpi_->rank() == 0) {
      ncclUniqueId uid;
      check(ncclGetUniqueId(&uid), "ncclGetUniqueId");
      std::memcpy(id.data_ptr(), &uid, sizeof(uid));
    }
    mpi_->broadcast(id, 0);
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

  void allreduce(at::Tensor& t, ReduceOp op) override {
    if (!t.defined()) throw std::invalid_argument("allreduce: undefined tensor");
    if (t.device().is_cpu()) return mpi_->allreduce(t, op);
    requireDevice(t, "allreduce");
    ncclDataType_t type;
    if (!ncclReduceType(t.scalar_type(), &type))
      throw std::invalid_argument("allreduce on " + mpi_->describeGroup() + ": dtype " +
                                  std::string(at::toString(t.scalar_type())) + " cannot be reduced by NCCL");
    CallInfo c;
    c.op = CallOp::AllReduce;
    c.dtype = static_cast<int64_t>(t.scalar_type());
    c.shape = toVec(t.sizes());
    c.a = static_cast<int64_t>(op);
    if (size() == 1) return;
    mpi_->agree(c);
    at::Tensor work = t.contiguous();
    auto stream = streamOf(t);
    check(ncclAllReduce(work.data_ptr(), work.data_ptr(), static_cast<size_t>(work.numel()), type, ncclOp(op), comm_,
                        stream),
          "ncclAllReduce");
    finish(stream, describeCall(c));
    mpi_->addBytesSent(static_cast<uint64_t>(2 * (size() - 1) * work.nbytes() / size()));
    if (!work.is_same(t)) t.copy_(work);
  }

  at::Tensor allgather(const at::Tensor& t, int64_t dim, const std::vector<int64_t>& sizes) override {
    if (!t.defined()) throw std::invalid_argument("allgather: undefined tensor");
    if (t.device().is_cpu()) return mpi_->allgather(t, dim, sizes);
    requireDevice(t, "allgather");
    const int64_t nd = t.dim();
    const int64_t d = dim < 0 ? dim + nd : dim;
    if (d < 0 || d >= nd)
      throw std::invalid_argument("allgather on " + mpi_->describeGroup() + ": dim " + std::to_string(dim) +
                                  " out of range for a " + std::to_string(nd) + "-d tensor");
    const int n = size(), me = rank();
    CallInfo c;
    c.op = CallOp::AllGather;
    c.dtype = static_cast<int64_t>(t.scalar_type());
    c.shape = toVec(t.sizes());
    c.a = d;
    c.b = static_cast<int64_t>(sizes.size());
    c.perRank = sizes;
    if (n == 1) {
      if (!sizes.empty() && (sizes.size() != 1 || sizes[0] != t.size(d)))
        throw CollectiveMismatchError("collective mismatch on " + mpi_->describeGroup() +
                                      ": the per-rank sizes disagree with the tensor");
      return t.clone(at::MemoryFormat::Contiguous);
    }
    mpi_->agree(c);
    at::Tensor x = t.contiguous();
    int64_t inner = 1;
    for (int64_t k = 0; k < nd; ++k)
      if (k != d) inner *= t.size(k);
    std::vector<int64_t> rows(n), offs(n);
    int64_t total = 0;
    bool even = true;
    for (int r = 0; r < n; ++r) {
      rows[r] = sizes.empty() ? t.size(d) : sizes[r];
      offs[r] = total;
      total += rows[r] * inner;
      if (rows[r] != rows[0]) even = false;
    }
    at::Tensor recv = at::empty({total}, x.options());
    auto stream = streamOf(t);
    const size_t es = x.element_size();
    auto* rbase = static_cast<char*>(recv.data_ptr());
    if (even) {
      check(ncclAllGather(x.data_ptr(), recv.data_ptr(), static_cast<size_t>(x.numel()) * es, ncclInt8, comm_, stream),
            "ncclAllGather");
    } else {
      recv.narrow(0, offs[me], rows[me] * inner).copy_(x.view({-1}));
      check(ncclGroupStart(), "ncclGroupStart");
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        if (x.numel() > 0)
          check(ncclSend(x.data_ptr(), static_cast<size_t>(x.numel()) * es, ncclInt8, p, comm_, stream), "ncclSend");
        if (rows[p] * inner > 0)
          check(ncclRecv(rbase + offs[p] * es, static_cast<size_t>(rows[p] * inner) * es, ncclInt8, p, comm_, stream),
                "ncclRecv");
      }
      check(ncclGroupEnd(), "ncclGroupEnd");
    }
    finish(stream, describeCall(c));
    mpi_->addBytesSent(static_cast<uint64_t>(x.nbytes()) * static_cast<uint64_t>(n - 1));
    int64_t sumRows = 0;
    for (int64_t r : rows) sumRows += r;
    std::vector<int64_t> outShape = c.shape;
    outShape[d] = sumRows;
    if (d == 0) return recv.view(outShape);
    std::vector<at::Tensor> parts;
    for (int r = 0; r < n; ++r) {
      std::vector<int64_t> s = c.shape;
      s[d] = rows[r];
      parts.push_back(recv.narrow(0, offs[r], rows[r] * inner).view(s));
    }
    return at::cat(parts, d);
  }

  at::Tensor reduceScatter(const at::Tensor& t, ReduceOp op) override {
    if (!t.defined()) throw std::invalid_argument("reduceScatter: undefined tensor");
    if (t.device().is_cpu()) return mpi_->reduceScatter(t, op);
    requireDevice(t, "reduceScatter");
    if (t.dim() < 1) throw std::invalid_argument("reduceScatter needs a tensor with at least 1 dimension");
    ncclDataType_t type;
    if (!ncclReduceType(t.scalar_type(), &type))
      throw std::invalid_argument("reduceScatter: dtype " + std::string(at::toString(t.scalar_type())) +
                                  " cannot be reduced by NCCL");
    if (size() == 1) return t.clone(at::MemoryFormat::Contiguous);
    CallInfo c;
    c.op = CallOp::ReduceScatter;
    c.dtype = static_cast<int64_t>(t.scalar_type());
    c.shape = toVec(t.sizes());
    c.a = static_cast<int64_t>(op);
    mpi_->agree(c);  // also checks t.size(0) % size() == 0 on every rank
    at::Tensor x = t.contiguous();
    std::vector<int64_t> outShape = c.shape;
    outShape[0] /= size();
    at::Tensor recv = at::empty(outShape, x.options());
    auto stream = streamOf(t);
    check(ncclReduceScatter(x.data_ptr(), recv.data_ptr(), static_cast<size_t>(recv.numel()), type, ncclOp(op), comm_,
                            stream),
          "ncclReduceScatter");
    finish(stream, describeCall(c));
    mpi_->addBytesSent(static_cast<uint64_t>((size() - 1) * x.nbytes() / size()));
    return recv;
  }

  std::vector<at::Tensor> allToAll(const std::vector<at::Tensor>& inputs,
                                   const std::vector<std::vector<int64_t>>& outputShapes) override {
    if (inputs.empty()) throw std::invalid_argument("allToAll: no inputs");
    if (inputs[0].defined() && inputs[0].device().is_cpu()) return mpi_->allToAll(inputs, outputShapes);
    const int n = size(), me = rank();
    const at::ScalarType dt = inputs[0].scalar_type();
    for (size_t j = 0; j < inputs.size(); ++j) {
      if (!inputs[j].defined()) throw std::invalid_argument("allToAll: undefined input " + std::to_string(j));
      requireDevice(inputs[j], "allToAll");
      if (inputs[j].scalar_type() != dt)
        throw std::invalid_argument("allToAll on " + mpi_->describeGroup() + ": inputs have different dtypes");
    }
    CallInfo c;
    c.op = CallOp::AllToAll;
    c.dtype = static_cast<int64_t>(dt);
    c.b = static_cast<int64_t>(inputs.size());
    c.c = static_cast<int64_t>(outputShapes.size());
    c.perRank.assign(2 * n, -1);
    for (size_t j = 0; j < inputs.size() && j < static_cast<size_t>(n); ++j) c.perRank[j] = inputs[j].numel();
    for (size_t j = 0; j < outputShapes.size() && j < static_cast<size_t>(n); ++j)
      c.perRank[n + j] = numelOf(outputShapes[j]);
    if (n == 1) {
      if (inputs.size() != 1 || outputShapes.size() != 1 || inputs[0].numel() != numelOf(outputShapes[0]))
        throw CollectiveMismatchError("collective mismatch on " + mpi_->describeGroup() +
                                      ": allToAll in a group of 1 needs 1 input matching 1 output shape");
      return {inputs[0].contiguous().view(outputShapes[0]).clone()};
    }
    mpi_->agree(c);
    std::vector<at::Tensor> xs, outs;
    for (const auto& x : inputs) xs.push_back(x.contiguous());
    for (int j = 0; j < n; ++j) outs.push_back(at::empty(outputShapes[j], xs[0].options()));
    auto stream = streamOf(inputs[0]);
    const size_t es = xs[0].element_size();
    uint64_t sent = 0;
    if (outs[me].numel() > 0) outs[me].view({-1}).copy_(xs[me].view({-1}));
    check(ncclGroupStart(), "ncclGroupStart");
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      if (xs[j].numel() > 0) {
        check(ncclSend(xs[j].data_ptr(), static_cast<size_t>(xs[j].numel()) * es, ncclInt8, j, comm_, stream), "ncclSend");
        sent += xs[j].nbytes();
      }
      if (outs[j].numel() > 0)
        check(ncclRecv(outs[j].data_ptr(), static_cast<size_t>(outs[j].numel()) * es, ncclInt8, j, comm_, stream),
              "ncclRecv");
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    finish(stream, describeCall(c));
    mpi_->addBytesSent(sent);
    return outs;
  }

  void broadcast(at::Tensor& t, int root) override {
    if (!t.defined()) throw std::invalid_argument("broadcast: undefined tensor");
    if (t.device().is_cpu()) return mpi_->broadcast(t, root);
    requireDevice(t, "broadcast");
    if (size() == 1) {
      if (root != 0) throw std::invalid_argument("broadcast root outside the group of 1 rank");
      return;
    }
    CallInfo c;
    c.op = CallOp::Broadcast;
    c.dtype = static_cast<int64_t>(t.scalar_type());
    c.shape = toVec(t.sizes());
    c.a = root;
    mpi_->agree(c);
    at::Tensor work = t.contiguous();
    auto stream = streamOf(t);
    check(ncclBroadcast(work.data_ptr(), work.data_ptr(), static_cast<size_t>(work.nbytes()), ncclInt8, root, comm_,
                        stream),
          "ncclBroadcast");
    finish(stream, describeCall(c));
    if (rank() == root) mpi_->addBytesSent(static_cast<uint64_t>(work.nbytes()) * static_cast<uint64_t>(size() - 1));
    if (!work.is_same(t)) t.copy_(work);
  }

  at::Tensor sendRecv(const at::Tensor& send, int dst, const std::vector<int64_t>& recvShape, int src) override {
    if (!send.defined()) throw std::invalid_argument("sendRecv: undefined tensor");
    if (send.device().is_cpu()) return mpi_->sendRecv(send, dst, recvShape, src);
    requireDevice(send, "sendRecv");
    if (size() == 1) {
      if (dst != 0 || src != 0 || send.numel() != numelOf(recvShape))
        throw CollectiveMismatchError("collective mismatch on " + mpi_->describeGroup() +
                                      ": sendRecv in a group of 1 must send to and receive from rank 0 with equal sizes");
      return send.contiguous().view(recvShape).clone();
    }
    CallInfo c;
    c.op = CallOp::SendRecv;
    c.dtype = static_cast<int64_t>(send.scalar_type());
    c.shape = toVec(send.sizes());
    c.a = dst;
    c.b = src;
    c.shape2 = recvShape;
    mpi_->agree(c);
    if (dst == rank()) return send.contiguous().view(recvShape).clone();
    at::Tensor x = send.contiguous();
    at::Tensor recv = at::empty(recvShape, x.options());
    auto stream = streamOf(send);
    check(ncclGroupStart(), "ncclGroupStart");
    if (x.numel() > 0) check(ncclSend(x.data_ptr(), x.nbytes(), ncclInt8, dst, comm_, stream), "ncclSend");
    if (recv.numel() > 0) check(ncclRecv(recv.data_ptr(), recv.nbytes(), ncclInt8, src, comm_, stream), "ncclRecv");
    check(ncclGroupEnd(), "ncclGroupEnd");
    finish(stream, describeCall(c));
    mpi_->addBytesSent(x.nbytes());
    return recv;
  }

  void send(const at::Tensor& t, int dst, int tag) override {
    if (!t.defined()) throw std::invalid_argument("send: undefined tensor");
    if (t.device().is_cpu()) return mpi_->send(t, dst, tag);
    requireDevice(t, "send");
    CallInfo c;
    c.op = CallOp::Send;
    c.dtype = static_cast<int64_t>(t.scalar_type());
    c.shape = toVec(t.sizes());
    c.a = dst;
    c.b = tag;
    mpi_->agreePair(c, dst);
    at::Tensor x = t.contiguous();
    auto stream = streamOf(t);
    if (x.numel() > 0) check(ncclSend(x.data_ptr(), x.nbytes(), ncclInt8, dst, comm_, stream), "ncclSend");
    finish(stream, describeCall(c));
    mpi_->addBytesSent(x.nbytes());
  }

  void recv(at::Tensor& t, int src, int tag) override {
    if (!t.defined()) throw std::invalid_argument("recv: undefined tensor");
    if (t.device().is_cpu()) return mpi_->recv(t, src, tag);
    requireDevice(t, "recv");
    CallInfo c;
    c.op = CallOp::Recv;
    c.dtype = static_cast<int64_t>(t.scalar_type());
    c.shape = toVec(t.sizes());
    c.a = src;
    c.b = tag;
    mpi_->agreePair(c, src);
    at::Tensor work = t.contiguous();
    auto stream = streamOf(t);
    if (work.numel() > 0) check(ncclRecv(work.data_ptr(), work.nbytes(), ncclInt8, src, comm_, stream), "ncclRecv");
    finish(stream, describeCall(c));
    if (!work.is_same(t)) t.copy_(work);
  }

  void barrier() override {
    // Everything this rank enqueued on its current stream has finished, then all ranks meet.
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    cudaStream_t s = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
    cudaCheck(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    mpi_->barrier();
  }

 private:
  void check(ncclResult_t r, const char* fn) {
    if (r == ncclSuccess) return;
    std::string msg = std::string(fn) + " failed on " + mpi_->describeGroup() + ": " + ncclGetErrorString(r);
    if (comm_) {
      const char* last = ncclGetLastError(comm_);
      if (last && *last) msg += std::string(" (") + last + ")";
    }
    throw std::runtime_error(msg);
  }

  void cudaCheck(cudaError_t e, const char* fn) const {
    if (e != cudaSuccess)
      throw std::runtime_error(std::string(fn) + " failed on " + mpi_->describeGroup() + ": " + cudaGetErrorString(e));
  }

  void requireDevice(const at::Tensor& t, const char* op) const {
    if (aborted_)
      throw std::runtime_error(std::string(op) + " on " + mpi_->describeGroup() +
                               ": the NCCL communicator was aborted after an earlier failure");
    if (!t.is_cuda() || t.device().index() != device_)
      throw std::invalid_argument(std::string(op) + " on " + mpi_->describeGroup() + ": tensor on " + t.device().str() +
                                  " but this NCCL group runs on cuda:" + std::to_string(device_));
  }

  cudaStream_t streamOf(const at::Tensor& t) const {
    return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
  }

  // With DITSTUDIO_NCCL_BLOCKING_WAIT, waits for the enqueued work with the group deadline and
  // aborts the communicator on timeout or on an asynchronous NCCL error.
  void finish(cudaStream_t stream, const std::string& what) {
    if (!blockingWait_) return;
    cudaEvent_t ev;
    cudaCheck(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cudaCheck(cudaEventRecord(ev, stream), "cudaEventRecord");
    const auto start = std::chrono::steady_clock::now();
    const double limit = mpi_->timeoutSeconds();
    for (;;) {
      const cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        cudaEventDestroy(ev);
        cudaCheck(q, "cudaEventQuery");
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess) {
        cudaEventDestroy(ev);
        ncclCommAbort(comm_);
        aborted_ = true;
        throw std::runtime_error(what + " on " + mpi_->describeGroup() + ": NCCL asynchronous error: " +
                                 ncclGetErrorString(async));
      }
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (limit > 0 && elapsed >= limit) {
        cudaEventDestroy(ev);
        ncclCommAbort(comm_);
        aborted_ = true;
        throw CollectiveTimeoutError("collective timeout: " + what + " on " + mpi_->describeGroup() +
                                     " did not finish on the GPU within " + std::to_string(limit) +
                                     " s on rank " + std::to_string(rank()) + " (NCCL communicator aborted)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(elapsed < 0.01 ? 20 : 500));
    }
    cudaEventDestroy(ev);
  }

  std::shared_ptr<ProcessGroupMPI> mpi_;
  int device_ = 0;
  bool blockingWait_ = false;
  bool aborted_ = false;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::shared_ptr<ProcessGroup> makeNCCLProcessGroup(std::shared_ptr<ProcessGroupMPI> mpi, int device) {
  return std::make_shared<ProcessGroupNCCL>(std::move(mpi), device);
}

void setCurrentCudaDevice(int device) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(device)); }

}  // namespace dit
