#include "parallel/process_group_mpi.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "parallel/collective_call.h"
#include "parallel/profile_scope.h"

namespace dit {

namespace {

// Tag of sendRecv on the second communicator (user send/recv tags live on the first).
constexpr int kTagSendRecv = 4;

std::vector<int64_t> toVec(at::IntArrayRef s) { return std::vector<int64_t>(s.begin(), s.end()); }

MPI_Datatype reduceType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kLong:
      return MPI_INT64_T;
    case at::kInt:
      return MPI_INT32_T;
    case at::kShort:
      return MPI_INT16_T;
    case at::kChar:
      return MPI_INT8_T;
    case at::kByte:
      return MPI_UINT8_T;
    default:
      return MPI_DATATYPE_NULL;
  }
}

bool reducedInFloat(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

MPI_Op mpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

// Element-moving unit for byte-exact transfers: MPI datatype and units per element.
struct Unit {
  MPI_Datatype type;
  int64_t per;
};
Unit unitFor(at::ScalarType t) {
  switch (c10::elementSize(t)) {
    case 1:
      return {MPI_BYTE, 1};
    case 2:
      return {MPI_UINT16_T, 1};
    case 4:
      return {MPI_UINT32_T, 1};
    case 8:
      return {MPI_UINT64_T, 1};
    default:
      return {MPI_BYTE, static_cast<int64_t>(c10::elementSize(t))};
  }
}

int toCount(int64_t n, const char* op) {
  if (n < 0 || n > INT_MAX)
    throw std::invalid_argument(
        std::string(op) + ": " + std::to_string(n) +
        " elements exceed one MPI call's count limit (2^31-1); split the tensor");
  return static_cast<int>(n);
}

// Host, contiguous view/copy of t (no copy when t already is).
at::Tensor hostContiguous(const at::Tensor& t) {
  return t.device().is_cpu() ? t.contiguous() : t.cpu().contiguous();
}

// Buffer in which a reduction runs: float32 for half types, host, contiguous. May alias t.
at::Tensor reductionBuffer(const at::Tensor& t) {
  at::Tensor h = hostContiguous(t);
  if (reducedInFloat(t.scalar_type())) return h.to(at::kFloat);
  return h;
}

at::Tensor onDeviceOf(const at::Tensor& r, const at::Tensor& like, at::ScalarType dtype) {
  if (r.scalar_type() == dtype && r.device() == like.device()) return r;
  return r.to(like.device(), dtype);
}

void requireDefined(const at::Tensor& t, const char* op) {
  if (!t.defined()) throw std::invalid_argument(std::string(op) + ": undefined tensor");
}

void requireReducible(const at::Tensor& t, const char* op) {
  const auto st = t.scalar_type();
  if (!reducedInFloat(st) && reduceType(st) == MPI_DATATYPE_NULL)
    throw std::invalid_argument(
        std::string(op) + ": dtype " + dtypeName(static_cast<int64_t>(st)) +
        " cannot be reduced (float32/float16/bfloat16/float64/int64/int32/int16/int8/uint8)");
}

}  // namespace

// The Work of one started MPI operation.
class MPIWork final : public Work {
 public:
  MPIWork(ProcessGroupMPI* g, std::string what, std::vector<MPI_Request> reqs,
          std::vector<int> kinds, std::vector<at::Tensor> keep,
          std::function<std::vector<at::Tensor>()> fin)
      : g_(g),
        what_(std::move(what)),
        reqs_(std::move(reqs)),
        kinds_(std::move(kinds)),
        keep_(std::move(keep)),
        finish_(std::move(fin)) {}
  ~MPIWork() override {
    if (!done()) waitQuietly();  // MPI still uses keep_: never free it under a running operation
  }

 protected:
  bool test() override {
    bool all = true;
    for (auto& r : reqs_) {
      if (r == MPI_REQUEST_NULL) continue;
      int flag = 0;
      g_->check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), "MPI_Test");
      if (!flag) all = false;
    }
    return all;
  }
  void block() override {
    if (pollRequests(reqs_, g_->timeout_)) return;
    g_->timeout(
        what_,
        "the transfer did not finish (a peer died, hangs, or issued a different collective; "
        "DITSTUDIO_CHECK_COLLECTIVES=1 names the ranks)",
        reqs_, kinds_, std::move(keep_));
  }
  void finish() override {
    keep_.clear();
    if (finish_) setOutputs(finish_());
  }

 private:
  ProcessGroupMPI* g_;
  std::string what_;
  std::vector<MPI_Request> reqs_;
  std::vector<int> kinds_;
  std::vector<at::Tensor> keep_;
  std::function<std::vector<at::Tensor>()> finish_;
};

double defaultCollectiveTimeoutSeconds() {
  const char* v = std::getenv("DITSTUDIO_COLLECTIVE_TIMEOUT_S");
  if (v && *v) {
    char* end = nullptr;
    const double d = std::strtod(v, &end);
    if (end != v && std::isfinite(d) && d >= 0) return d;
  }
  return 300.0;
}

bool pollRequests(std::vector<MPI_Request>& reqs, double timeoutSeconds) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const bool hasDeadline = timeoutSeconds > 0;
  const auto limit = std::chrono::duration<double>(std::min(timeoutSeconds, 1e9));
  for (;;) {
    bool all = true;
    for (auto& r : reqs) {
      if (r == MPI_REQUEST_NULL) continue;
      int flag = 0;
      const int rc = MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        throw std::runtime_error("MPI_Test failed (error code " + std::to_string(rc) + ")");
      if (!flag) all = false;
    }
    if (all) return true;
    const auto elapsed = clock::now() - start;
    if (hasDeadline && elapsed >= limit) return false;
    // Spin briefly (latency), then yield, then sleep (an idle rank must not burn a core that an
    // oversubscribed peer needs).
    if (elapsed < std::chrono::microseconds(50)) continue;
    if (elapsed < std::chrono::milliseconds(2)) {
      std::this_thread::yield();
    } else if (elapsed < std::chrono::milliseconds(200)) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

void checkStartupArrival(MPI_Comm comm, const std::string& what, double timeoutSeconds) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (size == 1) return;
  constexpr int kArriveTag = 31001, kVerdictTag = 31002;  // below MPI's minimum MPI_TAG_UB
  const std::vector<int> world = worldRanksOf(comm);
  auto fail = [&](const std::string& who) {
    throw std::runtime_error("collective timeout: " + what + " did not complete within " +
                             secondsStr(timeoutSeconds) + " s on rank " +
                             std::to_string(world[static_cast<size_t>(rank)]) + ": " + who +
                             " (stopped, crashed, or MPI traffic between the hosts does not get "
                             "through)");
  };
  if (rank == 0) {
    std::vector<char> got(static_cast<size_t>(size), 0);
    std::vector<MPI_Request> reqs(static_cast<size_t>(size - 1), MPI_REQUEST_NULL);
    for (int r = 1; r < size; ++r)
      MPI_Irecv(&got[static_cast<size_t>(r)], 1, MPI_CHAR, r, kArriveTag, comm,
                &reqs[static_cast<size_t>(r - 1)]);
    const bool all = pollRequests(reqs, timeoutSeconds);
    // Verdict to every rank that arrived: the missing world ranks (none = go on).
    std::vector<int> missing;
    for (int r = 1; r < size; ++r)
      if (reqs[static_cast<size_t>(r - 1)] != MPI_REQUEST_NULL) {
        missing.push_back(world[static_cast<size_t>(r)]);
        MPI_Cancel(&reqs[static_cast<size_t>(r - 1)]);
        MPI_Request_free(&reqs[static_cast<size_t>(r - 1)]);
      }
    // The verdict: [number of missing ranks, their world ranks...] ([0]: go on).
    std::vector<int> message{static_cast<int>(missing.size())};
    message.insert(message.end(), missing.begin(), missing.end());
    std::vector<MPI_Request> sends;
    sends.reserve(static_cast<size_t>(size));
    for (int r = 1; r < size; ++r)
      if (got[static_cast<size_t>(r)]) {
        sends.emplace_back(MPI_REQUEST_NULL);
        MPI_Isend(message.data(), static_cast<int>(message.size()), MPI_INT, r, kVerdictTag, comm,
                  &sends.back());
      }
    if (all) {
      pollRequests(sends, timeoutSeconds);
      return;
    }
    // The ranks that arrived get the verdict within a short bound; then the error.
    if (!pollRequests(sends, std::min(5.0, timeoutSeconds)))
      for (auto& s : sends)
        if (s != MPI_REQUEST_NULL) MPI_Request_free(&s);
    fail(std::string(missing.size() == 1 ? "rank " : "ranks ") + rankList(missing) +
         " never arrived");
  }
  static const char kOne = 1;
  std::vector<int> verdict(static_cast<size_t>(size), 0);
  std::vector<MPI_Request> reqs(2, MPI_REQUEST_NULL);
  MPI_Isend(&kOne, 1, MPI_CHAR, 0, kArriveTag, comm, &reqs[0]);
  MPI_Irecv(verdict.data(), size, MPI_INT, 0, kVerdictTag, comm, &reqs[1]);
  const double wait = timeoutSeconds > 0 ? timeoutSeconds + std::min(timeoutSeconds, 5.0) : 0;
  if (!pollRequests(reqs, wait)) {
    for (auto& r : reqs)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
    fail("rank " + std::to_string(world[0]) + " never answered");
  }
  if (verdict[0] <= 0) return;
  const std::vector<int> missing(verdict.begin() + 1,
                                 verdict.begin() + 1 + std::min(verdict[0], size - 1));
  fail(std::string(missing.size() == 1 ? "rank " : "ranks ") + rankList(missing) +
       " never arrived");
}

std::vector<int> worldRanksOf(MPI_Comm comm) {
  int n = 1;
  MPI_Comm_size(comm, &n);
  MPI_Group g, wg;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  std::vector<int> mine(static_cast<size_t>(n)), world(static_cast<size_t>(n), -1);
  for (int i = 0; i < n; ++i) mine[static_cast<size_t>(i)] = i;
  MPI_Group_translate_ranks(g, n, mine.data(), wg, world.data());
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  return world;
}

std::string describeGroup(const std::string& name, const std::vector<int>& worldRanks) {
  const size_t n = worldRanks.size();
  return "group '" + name + "' (" + std::to_string(n) + (n == 1 ? " rank" : " ranks") + ": world " +
         rankList(worldRanks) + ")";
}

ProcessGroupMPI::ProcessGroupMPI(MPI_Comm comm, std::string name, double timeoutSeconds)
    : name_(std::move(name)), timeout_(timeoutSeconds) {
  check(MPI_Comm_dup(comm, &data_), "MPI_Comm_dup");
  check(MPI_Comm_dup(comm, &ring_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(ring_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(data_, &rank_);
  MPI_Comm_size(data_, &size_);
  worldRanks_ = worldRanksOf(data_);
}

ProcessGroupMPI::~ProcessGroupMPI() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin || broken_) return;  // after a timeout, operations may still be pending: leak
  if (data_ != MPI_COMM_NULL) MPI_Comm_free(&data_);
  if (ring_ != MPI_COMM_NULL) MPI_Comm_free(&ring_);
}

std::string ProcessGroupMPI::describeGroup() const {
  return dit::describeGroup(name_, worldRanks_);
}

void ProcessGroupMPI::check(int rc, const char* fn) const {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(fn) + " failed on group '" + name_ +
                           "': " + std::string(msg, len));
}

void ProcessGroupMPI::ensureUsable() const {
  if (broken_)
    throw std::runtime_error(describeGroup() +
                             " is unusable after an earlier failure: " + brokenReason_);
}

std::shared_ptr<Work> ProcessGroupMPI::makeWork(std::string what, std::vector<MPI_Request> reqs,
                                                std::vector<int> kinds,
                                                std::vector<at::Tensor> keep,
                                                std::function<std::vector<at::Tensor>()> finish) {
  return std::make_shared<MPIWork>(this, std::move(what), std::move(reqs), std::move(kinds),
                                   std::move(keep), std::move(finish));
}

void ProcessGroupMPI::timeout(const std::string& what, const std::string& detail,
                              std::vector<MPI_Request>& reqs, const std::vector<int>& reqKind,
                              std::vector<at::Tensor> keep) {
  for (auto& t : keep) graveyard_.push_back(std::move(t));
  // reqKind: 0 = collective (cannot be cancelled or freed), 1 = p2p receive, 2 = p2p send.
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    if (reqKind[i] == 1) {
      MPI_Cancel(&reqs[i]);
      MPI_Request_free(&reqs[i]);
    } else if (reqKind[i] == 2) {
      MPI_Request_free(&reqs[i]);
    }
  }
  const std::string msg = "collective timeout: " + what + " on " + describeGroup() +
                          " did not complete within " + secondsStr(timeout_) + " s on rank " +
                          std::to_string(rank_) + " (world rank " +
                          std::to_string(worldRanks_[static_cast<size_t>(rank_)]) + "): " + detail;
  broken_ = true;
  brokenReason_ = msg;
  throw CollectiveTimeoutError(msg);
}

std::shared_ptr<Work> ProcessGroupMPI::allreduce(at::Tensor& t, ReduceOp op) {
  DIT_PROFILE_SCOPE("dit::collective::allreduce");
  requireDefined(t, "allreduce");
  requireReducible(t, "allreduce");
  ensureUsable();
  if (size_ == 1) return Work::completed({t});
  at::Tensor work = reductionBuffer(t);
  const int count = toCount(work.numel(), "allreduce");
  std::vector<MPI_Request> reqs(1);
  check(MPI_Iallreduce(MPI_IN_PLACE, work.data_ptr(), count, reduceType(work.scalar_type()),
                       mpiOp(op), data_, &reqs[0]),
        "MPI_Iallreduce");
  at::Tensor out = t;  // shares t's storage: the caller's tensor is written in finish()
  return makeWork(describeCall(allreduceCall(t, op)), std::move(reqs), {0}, {work},
                  [this, work, out]() mutable {
                    bytes_ += static_cast<uint64_t>(2 * (size_ - 1) * work.nbytes() / size_);
                    if (!work.is_same(out)) out.copy_(work);
                    return std::vector<at::Tensor>{out};
                  });
}

std::shared_ptr<Work> ProcessGroupMPI::allgather(const at::Tensor& t, int64_t dim,
                                                 const std::vector<int64_t>& sizes) {
  DIT_PROFILE_SCOPE("dit::collective::allgather");
  requireDefined(t, "allgather");
  ensureUsable();
  const int64_t nd = t.dim();
  const int64_t d = dim < 0 ? dim + nd : dim;
  if (d < 0 || d >= nd)
    throw std::invalid_argument("allgather on " + describeGroup() + ": dim " + std::to_string(dim) +
                                " out of range for a " + std::to_string(nd) + "-d tensor");
  if (!sizes.empty() && sizes.size() != static_cast<size_t>(size_))
    throw std::invalid_argument(
        "allgather on " + describeGroup() + ": " + std::to_string(sizes.size()) +
        " per-rank sizes given for a group of " + std::to_string(size_) + " ranks");
  if (!sizes.empty() && sizes[static_cast<size_t>(rank_)] != t.size(d))
    throw CollectiveMismatchError("collective mismatch on " + describeGroup() + ": rank " +
                                  std::to_string(rank_) + " contributes " +
                                  std::to_string(t.size(d)) + " along dim " + std::to_string(d) +
                                  " but the per-rank sizes are " + shapeString(sizes));
  if (size_ == 1) return Work::completed({t.clone(at::MemoryFormat::Contiguous)});
  const CallInfo c = allgatherCall(t, d, sizes);
  at::Tensor x = hostContiguous(t);
  int64_t inner = 1;
  for (int64_t k = 0; k < nd; ++k)
    if (k != d) inner *= t.size(k);
  std::vector<int64_t> rows(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) rows[r] = sizes.empty() ? t.size(d) : sizes[r];
  const Unit u = unitFor(t.scalar_type());
  std::vector<int> counts(size_), displs(size_);
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    counts[r] = toCount(rows[r] * inner * u.per, "allgather");
    displs[r] = toCount(total * u.per, "allgather");
    total += rows[r] * inner;
  }
  toCount(total * u.per, "allgather");
  at::Tensor recv = at::empty({total}, x.options());
  std::vector<MPI_Request> reqs(1);
  check(MPI_Iallgatherv(x.data_ptr(), counts[rank_], u.type, recv.data_ptr(), counts.data(),
                        displs.data(), u.type, data_, &reqs[0]),
        "MPI_Iallgatherv");
  at::Tensor like = t;
  return makeWork(describeCall(c), std::move(reqs), {0}, {x, recv},
                  [this, c, d, x, recv, rows, inner, like]() {
                    bytes_ += static_cast<uint64_t>(x.nbytes()) * static_cast<uint64_t>(size_ - 1);
                    int64_t sumRows = 0;
                    for (int64_t r : rows) sumRows += r;
                    std::vector<int64_t> outShape = c.shape;
                    outShape[d] = sumRows;
                    at::Tensor out;
                    if (d == 0) {
                      out = recv.view(outShape);
                    } else {
                      std::vector<at::Tensor> parts;
                      parts.reserve(static_cast<size_t>(size_));
                      int64_t off = 0;
                      for (int r = 0; r < size_; ++r) {
                        std::vector<int64_t> s = c.shape;
                        s[d] = rows[r];
                        parts.push_back(recv.narrow(0, off, rows[r] * inner).view(s));
                        off += rows[r] * inner;
                      }
                      out = at::cat(parts, d);
                    }
                    return std::vector<at::Tensor>{onDeviceOf(out, like, like.scalar_type())};
                  });
}

std::shared_ptr<Work> ProcessGroupMPI::reduceScatter(const at::Tensor& t, ReduceOp op) {
  DIT_PROFILE_SCOPE("dit::collective::reduceScatter");
  requireDefined(t, "reduceScatter");
  requireReducible(t, "reduceScatter");
  ensureUsable();
  if (t.dim() < 1)
    throw std::invalid_argument("reduceScatter on " + describeGroup() +
                                ": needs a tensor with at least 1 dimension");
  if (t.size(0) % size_ != 0)
    throw std::invalid_argument("reduceScatter on " + describeGroup() + ": dim 0 size " +
                                std::to_string(t.size(0)) + " is not divisible by the group size " +
                                std::to_string(size_));
  if (size_ == 1) return Work::completed({t.clone(at::MemoryFormat::Contiguous)});
  at::Tensor work = reductionBuffer(t);
  std::vector<int64_t> outShape = toVec(t.sizes());
  outShape[0] /= size_;
  at::Tensor recv = at::empty(outShape, work.options());
  const int count = toCount(recv.numel(), "reduceScatter");
  toCount(work.numel(), "reduceScatter");
  std::vector<MPI_Request> reqs(1);
  check(MPI_Ireduce_scatter_block(work.data_ptr(), recv.data_ptr(), count,
                                  reduceType(work.scalar_type()), mpiOp(op), data_, &reqs[0]),
        "MPI_Ireduce_scatter_block");
  at::Tensor like = t;
  return makeWork(describeCall(reduceScatterCall(t, op)), std::move(reqs), {0}, {work, recv},
                  [this, work, recv, like]() {
                    bytes_ += static_cast<uint64_t>((size_ - 1) * work.nbytes() / size_);
                    return std::vector<at::Tensor>{onDeviceOf(recv, like, like.scalar_type())};
                  });
}

std::shared_ptr<Work> ProcessGroupMPI::allToAll(
    const std::vector<at::Tensor>& inputs, const std::vector<std::vector<int64_t>>& outputShapes) {
  DIT_PROFILE_SCOPE("dit::collective::allToAll");
  ensureUsable();
  if (inputs.empty()) throw std::invalid_argument("allToAll on " + describeGroup() + ": no inputs");
  for (const auto& x : inputs) requireDefined(x, "allToAll");
  const at::ScalarType dt = inputs[0].scalar_type();
  for (size_t j = 1; j < inputs.size(); ++j)
    if (inputs[j].scalar_type() != dt)
      throw std::invalid_argument("allToAll on " + describeGroup() + ": inputs[" +
                                  std::to_string(j) + "] is " +
                                  dtypeName(static_cast<int64_t>(inputs[j].scalar_type())) +
                                  " but inputs[0] is " + dtypeName(static_cast<int64_t>(dt)));
  if (inputs.size() != static_cast<size_t>(size_) ||
      outputShapes.size() != static_cast<size_t>(size_))
    throw std::invalid_argument(
        "allToAll on " + describeGroup() + ": rank " + std::to_string(rank_) + " passes " +
        std::to_string(inputs.size()) + " inputs and " + std::to_string(outputShapes.size()) +
        " output shapes for a group of " + std::to_string(size_) + " ranks");
  if (inputs[static_cast<size_t>(rank_)].numel() !=
      numelOf(outputShapes[static_cast<size_t>(rank_)]))
    throw CollectiveMismatchError(
        "collective mismatch on " + describeGroup() + ": rank " + std::to_string(rank_) +
        " sends " + std::to_string(inputs[static_cast<size_t>(rank_)].numel()) +
        " elements to itself but expects " + shapeString(outputShapes[static_cast<size_t>(rank_)]));
  if (size_ == 1) return Work::completed({inputs[0].contiguous().view(outputShapes[0]).clone()});
  const Unit u = unitFor(dt);
  std::vector<at::Tensor> flat;
  flat.reserve(static_cast<size_t>(size_));
  for (const auto& x : inputs) flat.push_back(hostContiguous(x).view({-1}));
  at::Tensor sendBuf = at::cat(flat, 0);
  std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
  int64_t so = 0, ro = 0;
  uint64_t sentBytes = 0;
  for (int j = 0; j < size_; ++j) {
    const int64_t sn = inputs[j].numel(), rn = numelOf(outputShapes[j]);
    sc[j] = toCount(sn * u.per, "allToAll");
    sd[j] = toCount(so * u.per, "allToAll");
    rc[j] = toCount(rn * u.per, "allToAll");
    rd[j] = toCount(ro * u.per, "allToAll");
    so += sn;
    ro += rn;
    if (j != rank_) sentBytes += static_cast<uint64_t>(sn) * c10::elementSize(dt);
  }
  toCount(so * u.per, "allToAll");
  toCount(ro * u.per, "allToAll");
  at::Tensor recv = at::empty({ro}, sendBuf.options());
  std::vector<MPI_Request> reqs(1);
  check(MPI_Ialltoallv(sendBuf.data_ptr(), sc.data(), sd.data(), u.type, recv.data_ptr(), rc.data(),
                       rd.data(), u.type, data_, &reqs[0]),
        "MPI_Ialltoallv");
  const at::Device device = inputs[0].device();
  return makeWork(describeCall(allToAllCall(inputs, outputShapes, size_)), std::move(reqs), {0},
                  {sendBuf, recv}, [this, recv, outputShapes, sentBytes, device, dt]() {
                    bytes_ += sentBytes;
                    std::vector<at::Tensor> outs;
                    outs.reserve(static_cast<size_t>(size_));
                    int64_t off = 0;
                    for (int j = 0; j < size_; ++j) {
                      const int64_t rn = numelOf(outputShapes[j]);
                      at::Tensor o = recv.narrow(0, off, rn).view(outputShapes[j]);
                      outs.push_back(device.is_cpu() ? o : o.to(device, dt));
                      off += rn;
                    }
                    return outs;
                  });
}

std::shared_ptr<Work> ProcessGroupMPI::broadcast(at::Tensor& t, int root) {
  DIT_PROFILE_SCOPE("dit::collective::broadcast");
  requireDefined(t, "broadcast");
  ensureUsable();
  if (root < 0 || root >= size_)
    throw std::invalid_argument("broadcast on " + describeGroup() + ": root " +
                                std::to_string(root) + " outside the group of " +
                                std::to_string(size_) + " ranks");
  if (size_ == 1) return Work::completed({t});
  at::Tensor work = hostContiguous(t);
  const Unit u = unitFor(t.scalar_type());
  std::vector<MPI_Request> reqs(1);
  check(MPI_Ibcast(work.data_ptr(), toCount(work.numel() * u.per, "broadcast"), u.type, root, data_,
                   &reqs[0]),
        "MPI_Ibcast");
  at::Tensor out = t;
  return makeWork(describeCall(broadcastCall(t, root)), std::move(reqs), {0}, {work},
                  [this, work, out, root]() mutable {
                    if (rank_ == root)
                      bytes_ +=
                          static_cast<uint64_t>(work.nbytes()) * static_cast<uint64_t>(size_ - 1);
                    if (!work.is_same(out)) out.copy_(work);
                    return std::vector<at::Tensor>{out};
                  });
}

std::shared_ptr<Work> ProcessGroupMPI::sendRecv(const at::Tensor& send, int dst,
                                                const std::vector<int64_t>& recvShape, int src) {
  DIT_PROFILE_SCOPE("dit::collective::sendRecv");
  requireDefined(send, "sendRecv");
  ensureUsable();
  if (dst < 0 || dst >= size_ || src < 0 || src >= size_)
    throw std::invalid_argument("sendRecv on " + describeGroup() + ": dst " + std::to_string(dst) +
                                " / src " + std::to_string(src) + " outside the group of " +
                                std::to_string(size_) + " ranks");
  if ((dst == rank_) != (src == rank_))
    throw std::invalid_argument("sendRecv on " + describeGroup() + ": rank " +
                                std::to_string(rank_) + " sends to rank " + std::to_string(dst) +
                                " but receives from rank " + std::to_string(src) +
                                " (a rank that sends to itself must receive from itself)");
  if (dst == rank_) {
    if (send.numel() != numelOf(recvShape))
      throw CollectiveMismatchError("collective mismatch on " + describeGroup() + ": rank " +
                                    std::to_string(rank_) + " sends " +
                                    shapeString(toVec(send.sizes())) + " to itself but expects " +
                                    shapeString(recvShape));
    return Work::completed({send.contiguous().view(recvShape).clone()});
  }
  at::Tensor x = hostContiguous(send);
  at::Tensor recv = at::empty(recvShape, x.options());
  const Unit u = unitFor(send.scalar_type());
  std::vector<MPI_Request> reqs(2);
  check(MPI_Irecv(recv.data_ptr(), toCount(recv.numel() * u.per, "sendRecv"), u.type, src,
                  kTagSendRecv, ring_, &reqs[0]),
        "MPI_Irecv");
  check(MPI_Isend(x.data_ptr(), toCount(x.numel() * u.per, "sendRecv"), u.type, dst, kTagSendRecv,
                  ring_, &reqs[1]),
        "MPI_Isend");
  at::Tensor like = send;
  return makeWork(describeCall(sendRecvCall(send, dst, recvShape, src)), std::move(reqs), {1, 2},
                  {x, recv}, [this, x, recv, like]() {
                    bytes_ += static_cast<uint64_t>(x.nbytes());
                    return std::vector<at::Tensor>{onDeviceOf(recv, like, like.scalar_type())};
                  });
}

std::shared_ptr<Work> ProcessGroupMPI::send(const at::Tensor& t, int dst, int tag) {
  DIT_PROFILE_SCOPE("dit::collective::send");
  requireDefined(t, "send");
  ensureUsable();
  if (tag < 0)
    throw std::invalid_argument("send on " + describeGroup() + ": negative tag " +
                                std::to_string(tag));
  if (dst < 0 || dst >= size_ || dst == rank_)
    throw std::invalid_argument("send on " + describeGroup() + ": peer rank " +
                                std::to_string(dst) + " is invalid for rank " +
                                std::to_string(rank_));
  at::Tensor x = hostContiguous(t);
  const Unit u = unitFor(t.scalar_type());
  std::vector<MPI_Request> reqs(1);
  check(MPI_Isend(x.data_ptr(), toCount(x.numel() * u.per, "send"), u.type, dst, tag, data_,
                  &reqs[0]),
        "MPI_Isend");
  return makeWork(describeCall(sendCall(t, dst, tag)), std::move(reqs), {2}, {x}, [this, x]() {
    bytes_ += static_cast<uint64_t>(x.nbytes());
    return std::vector<at::Tensor>{};
  });
}

std::shared_ptr<Work> ProcessGroupMPI::recv(at::Tensor& t, int src, int tag) {
  DIT_PROFILE_SCOPE("dit::collective::recv");
  requireDefined(t, "recv");
  ensureUsable();
  if (tag < 0)
    throw std::invalid_argument("recv on " + describeGroup() + ": negative tag " +
                                std::to_string(tag));
  if (src < 0 || src >= size_ || src == rank_)
    throw std::invalid_argument("recv on " + describeGroup() + ": peer rank " +
                                std::to_string(src) + " is invalid for rank " +
                                std::to_string(rank_));
  at::Tensor work = hostContiguous(t);
  const Unit u = unitFor(t.scalar_type());
  std::vector<MPI_Request> reqs(1);
  check(MPI_Irecv(work.data_ptr(), toCount(work.numel() * u.per, "recv"), u.type, src, tag, data_,
                  &reqs[0]),
        "MPI_Irecv");
  at::Tensor out = t;
  return makeWork(describeCall(recvCall(t, src, tag)), std::move(reqs), {1}, {work},
                  [work, out]() mutable {
                    if (!work.is_same(out)) out.copy_(work);
                    return std::vector<at::Tensor>{out};
                  });
}

std::shared_ptr<Work> ProcessGroupMPI::barrier() {
  DIT_PROFILE_SCOPE("dit::collective::barrier");
  ensureUsable();
  if (size_ == 1) return Work::completed();
  std::vector<MPI_Request> reqs(1);
  check(MPI_Ibarrier(data_, &reqs[0]), "MPI_Ibarrier");
  return makeWork(describeCall(barrierCall()), std::move(reqs), {0}, {}, nullptr);
}

}  // namespace dit
