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

namespace dit {

namespace {

// Control-communicator tags.
constexpr int kTagHeader = 1;
constexpr int kTagP2P = 2;
constexpr int kTagP2PAck = 3;
constexpr int kTagSendRecv = 4;

// Header slots.
constexpr int64_t kMagic = 0x4469545331LL;  // "DiTS1"
constexpr int kMaxDims = 8;
enum Slot : int {
  sMagic = 0,
  sOp,
  sSeq,
  sDtype,
  sA,
  sB,
  sC,
  sNdim,
  sShape,                       // kMaxDims slots
  sHash = sShape + kMaxDims,
  sNdim2,
  sShape2,                      // kMaxDims slots
  sHash2 = sShape2 + kMaxDims,
  sNumel,
  sNumel2,
  kFixedSlots,                  // per-rank values follow
};

int64_t shapeHash(const std::vector<int64_t>& s) {
  uint64_t h = 1469598103934665603ULL ^ s.size();
  for (int64_t v : s) {
    h ^= static_cast<uint64_t>(v);
    h *= 1099511628211ULL;
  }
  return static_cast<int64_t>(h & 0x7fffffffffffffffULL);
}

int64_t numelOf(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

std::string shapeStr(const std::vector<int64_t>& s, int64_t ndim = -1) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < s.size(); ++i) o << (i ? "," : "") << s[i];
  if (ndim > static_cast<int64_t>(s.size())) o << ",...";
  o << ']';
  return o.str();
}

const char* dtypeStr(int64_t d) {
  if (d < 0) return "none";
  switch (static_cast<at::ScalarType>(d)) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kDouble: return "float64";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return at::toString(static_cast<at::ScalarType>(d));
  }
}

int64_t elemSize(int64_t dtype) {
  if (dtype < 0) return 0;
  return static_cast<int64_t>(c10::elementSize(static_cast<at::ScalarType>(dtype)));
}

const char* reduceStr(int64_t op) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

const char* opName(CallOp op) {
  switch (op) {
    case CallOp::AllReduce: return "allreduce";
    case CallOp::AllGather: return "allgather";
    case CallOp::ReduceScatter: return "reduceScatter";
    case CallOp::AllToAll: return "allToAll";
    case CallOp::Broadcast: return "broadcast";
    case CallOp::SendRecv: return "sendRecv";
    case CallOp::Barrier: return "barrier";
    case CallOp::Send: return "send";
    case CallOp::Recv: return "recv";
  }
  return "unknown-op";
}

std::string bytesStr(int64_t numel, int64_t dtype) {
  return std::to_string(numel * elemSize(dtype)) + " B";
}

std::vector<int64_t> toVec(at::IntArrayRef s) { return std::vector<int64_t>(s.begin(), s.end()); }

MPI_Datatype reduceType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    case at::kShort: return MPI_INT16_T;
    case at::kChar: return MPI_INT8_T;
    case at::kByte: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

bool reducedInFloat(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

MPI_Op mpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
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
    case 1: return {MPI_BYTE, 1};
    case 2: return {MPI_UINT16_T, 1};
    case 4: return {MPI_UINT32_T, 1};
    case 8: return {MPI_UINT64_T, 1};
    default: return {MPI_BYTE, static_cast<int64_t>(c10::elementSize(t))};
  }
}

int toCount(int64_t n, const char* op) {
  if (n < 0 || n > INT_MAX)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(n) +
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
    throw std::invalid_argument(std::string(op) + ": dtype " + dtypeStr(static_cast<int64_t>(st)) +
                                " cannot be reduced (float32/float16/bfloat16/float64/int64/int32/int16/int8/uint8)");
}

// Verdict of an agreement check.
struct Verdict {
  enum Kind { Ok, Mismatch, Invalid } kind = Ok;
  std::string msg;
};

struct Hdr {
  CallInfo c;
  int64_t seq = 0;
  int64_t ndim = 0, ndim2 = 0, hash = 0, hash2 = 0, numel = 0, numel2 = 0;
  bool ok = true;
};

std::string callAt(const Hdr& h) {
  return describeCall(h.c) + " (call #" + std::to_string(h.seq + 1) + ")";
}

Verdict mismatch(const std::string& why, const std::vector<Hdr>& h, std::initializer_list<int> ranks) {
  std::ostringstream o;
  o << why << "; calls:";
  bool first = true;
  for (int r : ranks) {
    o << (first ? " " : ", ") << "rank " << r << " " << callAt(h[static_cast<size_t>(r)]);
    first = false;
  }
  return {Verdict::Mismatch, o.str()};
}

Verdict invalid(const std::string& why, const std::vector<Hdr>& h, int r) {
  return {Verdict::Invalid, why + "; call: rank " + std::to_string(r) + " " + callAt(h[static_cast<size_t>(r)])};
}

Verdict verifyAll(const std::vector<Hdr>& h) {
  const int n = static_cast<int>(h.size());
  for (int r = 0; r < n; ++r)
    if (!h[r].ok) return {Verdict::Mismatch, "rank " + std::to_string(r) + " sent a corrupt call header"};
  const Hdr& h0 = h[0];
  for (int r = 1; r < n; ++r) {
    if (h[r].c.op != h0.c.op)
      return mismatch(std::string("rank 0 called ") + opName(h0.c.op) + " but rank " + std::to_string(r) +
                          " called " + opName(h[r].c.op),
                      h, {0, r});
    if (h[r].seq != h0.seq)
      return mismatch("rank 0 is at call #" + std::to_string(h0.seq + 1) + " of this group but rank " +
                          std::to_string(r) + " at call #" + std::to_string(h[r].seq + 1) +
                          " (a rank skipped or repeated a collective)",
                      h, {0, r});
    if (h[r].c.dtype != h0.c.dtype)
      return mismatch(std::string("dtypes differ: rank 0 ") + dtypeStr(h0.c.dtype) + ", rank " + std::to_string(r) +
                          " " + dtypeStr(h[r].c.dtype),
                      h, {0, r});
  }
  const CallOp op = h0.c.op;
  switch (op) {
    case CallOp::AllReduce:
    case CallOp::ReduceScatter:
      for (int r = 1; r < n; ++r) {
        if (h[r].c.a != h0.c.a)
          return mismatch(std::string("reduce ops differ: rank 0 ") + reduceStr(h0.c.a) + ", rank " +
                              std::to_string(r) + " " + reduceStr(h[r].c.a),
                          h, {0, r});
        if (h[r].hash != h0.hash)
          return mismatch("shapes differ: rank 0 " + shapeStr(h0.c.shape, h0.ndim) + " (" +
                              bytesStr(h0.numel, h0.c.dtype) + "), rank " + std::to_string(r) + " " +
                              shapeStr(h[r].c.shape, h[r].ndim) + " (" + bytesStr(h[r].numel, h[r].c.dtype) + ")",
                          h, {0, r});
      }
      if (op == CallOp::ReduceScatter) {
        if (h0.ndim < 1) return invalid("reduceScatter needs a tensor with at least 1 dimension", h, 0);
        if (h0.c.shape[0] % n != 0)
          return invalid("reduceScatter: dim 0 size " + std::to_string(h0.c.shape[0]) +
                             " is not divisible by the group size " + std::to_string(n),
                         h, 0);
      }
      break;
    case CallOp::AllGather: {
      const int64_t d = h0.c.a;
      for (int r = 1; r < n; ++r) {
        if (h[r].c.a != d)
          return mismatch("gather dims differ: rank 0 dim " + std::to_string(d) + ", rank " + std::to_string(r) +
                              " dim " + std::to_string(h[r].c.a),
                          h, {0, r});
        if (h[r].ndim != h0.ndim)
          return mismatch("tensor ranks differ: rank 0 has " + std::to_string(h0.ndim) + " dims, rank " +
                              std::to_string(r) + " " + std::to_string(h[r].ndim),
                          h, {0, r});
        if (h[r].c.b != h0.c.b)
          return mismatch("rank 0 gives " + std::to_string(h0.c.b) + " per-rank sizes but rank " +
                              std::to_string(r) + " gives " + std::to_string(h[r].c.b),
                          h, {0, r});
      }
      const bool hasSizes = h0.c.b != 0;
      if (hasSizes && h0.c.b != n)
        return invalid("allgather: " + std::to_string(h0.c.b) + " per-rank sizes given for a group of " +
                           std::to_string(n) + " ranks",
                       h, 0);
      for (int r = 0; r < n; ++r) {
        if (hasSizes && r > 0) {
          for (int k = 0; k < n; ++k)
            if (h[r].c.perRank[k] != h0.c.perRank[k])
              return mismatch("the per-rank sizes differ: rank 0 says rank " + std::to_string(k) + " has " +
                                  std::to_string(h0.c.perRank[k]) + ", rank " + std::to_string(r) + " says " +
                                  std::to_string(h[r].c.perRank[k]),
                              h, {0, r});
        }
        const size_t shown = std::min<size_t>(h[r].c.shape.size(), h0.c.shape.size());
        for (size_t k = 0; k < shown; ++k) {
          if (static_cast<int64_t>(k) == d) continue;
          if (h[r].c.shape[k] != h0.c.shape[k])
            return mismatch("shapes differ outside the gather dim " + std::to_string(d) + ": rank 0 " +
                                shapeStr(h0.c.shape, h0.ndim) + ", rank " + std::to_string(r) + " " +
                                shapeStr(h[r].c.shape, h[r].ndim),
                            h, {0, r});
        }
        if (d < static_cast<int64_t>(h[r].c.shape.size())) {
          const int64_t got = h[r].c.shape[d];
          if (hasSizes && got != h0.c.perRank[r])
            return mismatch("rank " + std::to_string(r) + " contributes " + std::to_string(got) + " along dim " +
                                std::to_string(d) + " but the per-rank sizes say " + std::to_string(h0.c.perRank[r]),
                            h, {r});
          if (!hasSizes && got != h0.c.shape[d])
            return mismatch("sizes along the gather dim " + std::to_string(d) + " differ (rank 0: " +
                                std::to_string(h0.c.shape[d]) + ", rank " + std::to_string(r) + ": " +
                                std::to_string(got) + ") and no per-rank sizes were given",
                            h, {0, r});
        }
      }
      break;
    }
    case CallOp::AllToAll: {
      for (int r = 0; r < n; ++r)
        if (h[r].c.b != n || h[r].c.c != n)
          return invalid("allToAll: rank " + std::to_string(r) + " passes " + std::to_string(h[r].c.b) +
                             " inputs and " + std::to_string(h[r].c.c) + " output shapes for a group of " +
                             std::to_string(n) + " ranks",
                         h, r);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          const int64_t sent = h[i].c.perRank[j];
          const int64_t expected = h[j].c.perRank[n + i];
          if (sent != expected)
            return mismatch("rank " + std::to_string(i) + " sends " + std::to_string(sent) + " elements (" +
                                bytesStr(sent, h[i].c.dtype) + ") to rank " + std::to_string(j) + " but rank " +
                                std::to_string(j) + " expects " + std::to_string(expected) + " elements (" +
                                bytesStr(expected, h[j].c.dtype) + ") from rank " + std::to_string(i),
                            h, {i, j});
        }
      break;
    }
    case CallOp::Broadcast:
      for (int r = 1; r < n; ++r) {
        if (h[r].c.a != h0.c.a)
          return mismatch("roots differ: rank 0 uses root " + std::to_string(h0.c.a) + ", rank " +
                              std::to_string(r) + " root " + std::to_string(h[r].c.a),
                          h, {0, r});
        if (h[r].hash != h0.hash)
          return mismatch("shapes differ: rank 0 " + shapeStr(h0.c.shape, h0.ndim) + " (" +
                              bytesStr(h0.numel, h0.c.dtype) + "), rank " + std::to_string(r) + " " +
                              shapeStr(h[r].c.shape, h[r].ndim) + " (" + bytesStr(h[r].numel, h[r].c.dtype) + ")",
                          h, {0, r});
      }
      if (h0.c.a < 0 || h0.c.a >= n)
        return invalid("broadcast root " + std::to_string(h0.c.a) + " outside the group of " + std::to_string(n) +
                           " ranks",
                       h, 0);
      break;
    case CallOp::SendRecv:
      for (int r = 0; r < n; ++r) {
        const int64_t d = h[r].c.a, s = h[r].c.b;
        if (d < 0 || d >= n || s < 0 || s >= n)
          return invalid("sendRecv: rank " + std::to_string(r) + " uses dst " + std::to_string(d) + " / src " +
                             std::to_string(s) + " outside the group of " + std::to_string(n) + " ranks",
                         h, r);
      }
      for (int r = 0; r < n; ++r) {
        const int d = static_cast<int>(h[r].c.a);
        if (h[d].c.b != r)
          return mismatch("rank " + std::to_string(r) + " sends to rank " + std::to_string(d) + " but rank " +
                              std::to_string(d) + " receives from rank " + std::to_string(h[d].c.b),
                          h, {r, d});
        if (h[d].hash2 != h[r].hash)
          return mismatch("rank " + std::to_string(r) + " sends " + dtypeStr(h[r].c.dtype) + " " +
                              shapeStr(h[r].c.shape, h[r].ndim) + " (" + bytesStr(h[r].numel, h[r].c.dtype) +
                              ") to rank " + std::to_string(d) + " but rank " + std::to_string(d) + " expects " +
                              shapeStr(h[d].c.shape2, h[d].ndim2) + " (" + bytesStr(h[d].numel2, h[d].c.dtype) +
                              ") from it",
                          h, {r, d});
      }
      break;
    case CallOp::Barrier:
      break;
    case CallOp::Send:
    case CallOp::Recv:
      return {Verdict::Invalid, "internal error: point-to-point call in a group-wide agreement"};
  }
  return {};
}

// `h[0]`/`h[1]`: the two ends (any order), with their group ranks in `ranks`.
Verdict verifyPair(const Hdr& a, int ra, const Hdr& b, int rb) {
  std::vector<Hdr> h(std::max(ra, rb) + 1);
  h[ra] = a;
  h[rb] = b;
  if (!a.ok || !b.ok) return {Verdict::Mismatch, "corrupt point-to-point header"};
  const bool aSends = a.c.op == CallOp::Send;
  const Hdr& s = aSends ? a : b;
  const Hdr& r = aSends ? b : a;
  const int rs = aSends ? ra : rb, rr = aSends ? rb : ra;
  if (a.c.op == b.c.op || (a.c.op != CallOp::Send && a.c.op != CallOp::Recv) ||
      (b.c.op != CallOp::Send && b.c.op != CallOp::Recv))
    return mismatch(std::string("rank ") + std::to_string(ra) + " called " + opName(a.c.op) + " and rank " +
                        std::to_string(rb) + " called " + opName(b.c.op) + " (one must send and the other receive)",
                    h, {ra, rb});
  if (s.seq != r.seq)
    return mismatch("rank " + std::to_string(rs) + " is at its send #" + std::to_string(s.seq + 1) + " to rank " +
                        std::to_string(rr) + " but rank " + std::to_string(rr) + " at its recv #" +
                        std::to_string(r.seq + 1) + " from rank " + std::to_string(rs),
                    h, {rs, rr});
  if (s.c.b != r.c.b)
    return mismatch("tags differ: rank " + std::to_string(rs) + " sends with tag " + std::to_string(s.c.b) +
                        ", rank " + std::to_string(rr) + " receives with tag " + std::to_string(r.c.b),
                    h, {rs, rr});
  if (s.c.dtype != r.c.dtype || s.hash != r.hash)
    return mismatch("rank " + std::to_string(rs) + " sends " + dtypeStr(s.c.dtype) + " " + shapeStr(s.c.shape, s.ndim) +
                        " (" + bytesStr(s.numel, s.c.dtype) + ") but rank " + std::to_string(rr) + " receives into " +
                        dtypeStr(r.c.dtype) + " " + shapeStr(r.c.shape, r.ndim) + " (" +
                        bytesStr(r.numel, r.c.dtype) + ")",
                    h, {rs, rr});
  return {};
}

void raise(const Verdict& v, const std::string& where) {
  if (v.kind == Verdict::Mismatch) throw CollectiveMismatchError("collective mismatch on " + where + ": " + v.msg);
  if (v.kind == Verdict::Invalid) throw std::invalid_argument("invalid collective on " + where + ": " + v.msg);
}

std::string rankList(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

std::string secondsStr(double s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

}  // namespace

std::string describeCall(const CallInfo& c) {
  std::ostringstream o;
  const int64_t n = numelOf(c.shape);
  const std::string ts = std::string(dtypeStr(c.dtype)) + " " + shapeStr(c.shape);
  o << opName(c.op) << '(';
  switch (c.op) {
    case CallOp::AllReduce:
    case CallOp::ReduceScatter:
      o << reduceStr(c.a) << ", " << ts << ", " << bytesStr(n, c.dtype);
      break;
    case CallOp::AllGather: {
      o << ts << ", " << bytesStr(n, c.dtype) << ", dim " << c.a;
      if (c.b > 0) {
        std::vector<int64_t> s(c.perRank.begin(), c.perRank.begin() + std::min<int64_t>(c.b, c.perRank.size()));
        o << ", sizes " << shapeStr(s);
      }
      break;
    }
    case CallOp::AllToAll: {
      const size_t half = c.perRank.size() / 2;
      std::vector<int64_t> snd(c.perRank.begin(), c.perRank.begin() + std::min<int64_t>(c.b, half));
      std::vector<int64_t> rcv(c.perRank.begin() + half, c.perRank.begin() + half + std::min<int64_t>(c.c, half));
      o << dtypeStr(c.dtype) << ", sends " << shapeStr(snd) << " elements, expects " << shapeStr(rcv) << " elements";
      break;
    }
    case CallOp::Broadcast:
      o << ts << ", " << bytesStr(n, c.dtype) << ", root " << c.a;
      break;
    case CallOp::SendRecv:
      o << ts << " to rank " << c.a << ", " << shapeStr(c.shape2) << " from rank " << c.b;
      break;
    case CallOp::Barrier:
      break;
    case CallOp::Send:
      o << ts << ", " << bytesStr(n, c.dtype) << " to rank " << c.a << ", tag " << c.b;
      break;
    case CallOp::Recv:
      o << ts << ", " << bytesStr(n, c.dtype) << " from rank " << c.a << ", tag " << c.b;
      break;
  }
  o << ')';
  return o.str();
}

double defaultCollectiveTimeoutSeconds() {
  const char* v = std::getenv("DITSTUDIO_COLLECTIVE_TIMEOUT_S");
  if (v && *v) {
    char* end = nullptr;
    const double d = std::strtod(v, &end);
    if (end != v && std::isfinite(d) && d >= 0) return d;
  }
  return 300.0;
}

ProcessGroupMPI::ProcessGroupMPI(MPI_Comm comm, std::string name, double timeoutSeconds)
    : name_(std::move(name)), timeout_(timeoutSeconds) {
  check(MPI_Comm_dup(comm, &data_), "MPI_Comm_dup");
  check(MPI_Comm_dup(comm, &ctrl_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(ctrl_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(data_, &rank_);
  MPI_Comm_size(data_, &size_);
  sendSeq_.assign(size_, 0);
  recvSeq_.assign(size_, 0);
  MPI_Group g, wg;
  MPI_Comm_group(data_, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  std::vector<int> mine(size_);
  for (int i = 0; i < size_; ++i) mine[i] = i;
  worldRanks_.assign(size_, -1);
  MPI_Group_translate_ranks(g, size_, mine.data(), wg, worldRanks_.data());
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
}

ProcessGroupMPI::~ProcessGroupMPI() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin || broken_) return;  // after a timeout, operations may still be pending: leak
  if (data_ != MPI_COMM_NULL) MPI_Comm_free(&data_);
  if (ctrl_ != MPI_COMM_NULL) MPI_Comm_free(&ctrl_);
}

std::string ProcessGroupMPI::describeGroup() const {
  std::string s = "group '" + name_ + "' (" + std::to_string(size_) + (size_ == 1 ? " rank" : " ranks") + ": world ";
  s += rankList(worldRanks_);
  return s + ")";
}

void ProcessGroupMPI::check(int rc, const char* fn) const {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(fn) + " failed on group '" + name_ + "': " + std::string(msg, len));
}

void ProcessGroupMPI::ensureUsable() const {
  if (broken_)
    throw std::runtime_error(describeGroup() + " is unusable after an earlier failure: " + brokenReason_);
}

std::vector<int64_t> ProcessGroupMPI::encode(const CallInfo& c, int64_t seq) const {
  std::vector<int64_t> h(static_cast<size_t>(kFixedSlots + 2 * size_), 0);
  h[sMagic] = kMagic;
  h[sOp] = static_cast<int64_t>(c.op);
  h[sSeq] = seq;
  h[sDtype] = c.dtype;
  h[sA] = c.a;
  h[sB] = c.b;
  h[sC] = c.c;
  h[sNdim] = static_cast<int64_t>(c.shape.size());
  for (size_t i = 0; i < c.shape.size() && i < kMaxDims; ++i) h[sShape + i] = c.shape[i];
  h[sHash] = shapeHash(c.shape);
  h[sNdim2] = static_cast<int64_t>(c.shape2.size());
  for (size_t i = 0; i < c.shape2.size() && i < kMaxDims; ++i) h[sShape2 + i] = c.shape2[i];
  h[sHash2] = shapeHash(c.shape2);
  h[sNumel] = numelOf(c.shape);
  h[sNumel2] = numelOf(c.shape2);
  for (size_t i = 0; i < c.perRank.size() && i < static_cast<size_t>(2 * size_); ++i) h[kFixedSlots + i] = c.perRank[i];
  return h;
}

namespace {
Hdr decodeHdr(const int64_t* p, int n) {
  Hdr h;
  h.ok = p[sMagic] == kMagic && p[sNdim] >= 0 && p[sNdim2] >= 0;
  h.c.op = static_cast<CallOp>(p[sOp]);
  h.seq = p[sSeq];
  h.c.dtype = p[sDtype];
  h.c.a = p[sA];
  h.c.b = p[sB];
  h.c.c = p[sC];
  h.ndim = p[sNdim];
  h.ndim2 = p[sNdim2];
  for (int64_t i = 0; i < std::min<int64_t>(h.ndim, kMaxDims); ++i) h.c.shape.push_back(p[sShape + i]);
  for (int64_t i = 0; i < std::min<int64_t>(h.ndim2, kMaxDims); ++i) h.c.shape2.push_back(p[sShape2 + i]);
  h.hash = p[sHash];
  h.hash2 = p[sHash2];
  h.numel = p[sNumel];
  h.numel2 = p[sNumel2];
  h.c.perRank.assign(p + kFixedSlots, p + kFixedSlots + 2 * n);
  return h;
}
}  // namespace

bool ProcessGroupMPI::poll(std::vector<MPI_Request>& reqs) const {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const bool hasDeadline = timeout_ > 0;
  const auto limit = std::chrono::duration<double>(std::min(timeout_, 1e9));
  for (;;) {
    bool all = true;
    for (auto& r : reqs) {
      if (r == MPI_REQUEST_NULL) continue;
      int flag = 0;
      check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), "MPI_Test");
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

void ProcessGroupMPI::timeout(const std::string& what, const std::string& detail, std::vector<MPI_Request>& reqs,
                              const std::vector<int>& reqKind) {
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
  const std::string msg = "collective timeout: " + what + " on " + describeGroup() + " did not complete within " +
                          secondsStr(timeout_) + " s on rank " + std::to_string(rank_) + " (world rank " +
                          std::to_string(worldRanks_[rank_]) + "): " + detail;
  broken_ = true;
  brokenReason_ = msg;
  throw CollectiveTimeoutError(msg);
}

void ProcessGroupMPI::wait(std::vector<MPI_Request>& reqs, const std::string& what, std::vector<at::Tensor> keep) {
  if (poll(reqs)) return;
  for (auto& t : keep) graveyard_.push_back(std::move(t));
  std::vector<int> kinds(reqs.size(), 0);
  timeout(what, "every rank agreed on the call but the data transfer did not finish (a peer died or hangs)", reqs,
          kinds);
}

std::vector<CallInfo> ProcessGroupMPI::agree(const CallInfo& mine) {
  ensureUsable();
  const int64_t seq = seq_++;
  const size_t L = static_cast<size_t>(kFixedSlots + 2 * size_);
  auto out = std::make_shared<std::vector<int64_t>>(encode(mine, seq));
  auto all = std::make_shared<std::vector<int64_t>>(L * size_, 0);
  std::copy(out->begin(), out->end(), all->begin() + L * rank_);
  if (size_ > 1) {
    std::vector<MPI_Request> reqs;
    std::vector<int> kinds, peers;
    reqs.reserve(2 * size_);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      reqs.emplace_back();
      check(MPI_Irecv(all->data() + L * r, static_cast<int>(L), MPI_INT64_T, r, kTagHeader, ctrl_, &reqs.back()),
            "MPI_Irecv");
      kinds.push_back(1);
      peers.push_back(r);
    }
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      reqs.emplace_back();
      check(MPI_Isend(out->data(), static_cast<int>(L), MPI_INT64_T, r, kTagHeader, ctrl_, &reqs.back()),
            "MPI_Isend");
      kinds.push_back(2);
      peers.push_back(r);
    }
    if (!poll(reqs)) {
      std::vector<int> missing, missingWorld;
      for (size_t i = 0; i < reqs.size(); ++i)
        if (kinds[i] == 1 && reqs[i] != MPI_REQUEST_NULL) {
          missing.push_back(peers[i]);
          missingWorld.push_back(worldRanks_[peers[i]]);
        }
      graveyardHeaders_.push_back(out);
      graveyardHeaders_.push_back(all);
      const std::string detail =
          missing.empty() ? "the call headers could not be delivered (a peer died or hangs)"
                          : "rank(s) " + rankList(missing) + " (world " + rankList(missingWorld) +
                                ") never arrived at this call (they died, hang, or are blocked in a different call)";
      timeout(describeCall(mine) + " (call #" + std::to_string(seq + 1) + ")", detail, reqs, kinds);
    }
  }
  std::vector<Hdr> hs;
  hs.reserve(size_);
  for (int r = 0; r < size_; ++r) hs.push_back(decodeHdr(all->data() + L * r, size_));
  raise(verifyAll(hs), describeGroup());
  std::vector<CallInfo> calls;
  calls.reserve(size_);
  for (auto& h : hs) calls.push_back(std::move(h.c));
  return calls;
}

CallInfo ProcessGroupMPI::agreePair(const CallInfo& mine, int peer) {
  ensureUsable();
  if (peer < 0 || peer >= size_ || peer == rank_)
    throw std::invalid_argument(std::string(opName(mine.op)) + " on " + describeGroup() + ": peer rank " +
                                std::to_string(peer) + " is invalid for rank " + std::to_string(rank_));
  const bool sender = mine.op == CallOp::Send;
  const int64_t seq = sender ? sendSeq_[peer]++ : recvSeq_[peer]++;
  const size_t L = static_cast<size_t>(kFixedSlots + 2 * size_);
  auto out = std::make_shared<std::vector<int64_t>>(encode(mine, seq));
  auto in = std::make_shared<std::vector<int64_t>>(L, 0);
  const std::string what = describeCall(mine) + " (#" + std::to_string(seq + 1) + " to/from this peer)";
  auto fail = [&](std::vector<MPI_Request>& reqs, const std::vector<int>& kinds) {
    graveyardHeaders_.push_back(out);
    graveyardHeaders_.push_back(in);
    timeout(what,
            "rank " + std::to_string(peer) + " (world " + std::to_string(worldRanks_[peer]) + ") never posted the matching " +
                (sender ? "recv" : "send") + " (it died, hangs, or is blocked in a different call)",
            reqs, kinds);
  };
  if (sender) {
    std::vector<MPI_Request> reqs(2);
    check(MPI_Isend(out->data(), static_cast<int>(L), MPI_INT64_T, peer, kTagP2P, ctrl_, &reqs[0]), "MPI_Isend");
    check(MPI_Irecv(in->data(), static_cast<int>(L), MPI_INT64_T, peer, kTagP2PAck, ctrl_, &reqs[1]), "MPI_Irecv");
    if (!poll(reqs)) fail(reqs, {2, 1});
  } else {
    std::vector<MPI_Request> r1(1);
    check(MPI_Irecv(in->data(), static_cast<int>(L), MPI_INT64_T, peer, kTagP2P, ctrl_, &r1[0]), "MPI_Irecv");
    if (!poll(r1)) fail(r1, {1});
    std::vector<MPI_Request> r2(1);
    check(MPI_Isend(out->data(), static_cast<int>(L), MPI_INT64_T, peer, kTagP2PAck, ctrl_, &r2[0]), "MPI_Isend");
    if (!poll(r2)) fail(r2, {2});
  }
  Hdr me = decodeHdr(out->data(), size_);
  Hdr other = decodeHdr(in->data(), size_);
  raise(verifyPair(me, rank_, other, peer), describeGroup());
  return other.c;
}

void ProcessGroupMPI::allreduce(at::Tensor& t, ReduceOp op) {
  requireDefined(t, "allreduce");
  requireReducible(t, "allreduce");
  ensureUsable();
  if (size_ == 1) return;
  CallInfo c;
  c.op = CallOp::AllReduce;
  c.dtype = static_cast<int64_t>(t.scalar_type());
  c.shape = toVec(t.sizes());
  c.a = static_cast<int64_t>(op);
  agree(c);
  at::Tensor work = reductionBuffer(t);
  const int count = toCount(work.numel(), "allreduce");
  std::vector<MPI_Request> reqs(1);
  check(MPI_Iallreduce(MPI_IN_PLACE, work.data_ptr(), count, reduceType(work.scalar_type()), mpiOp(op), data_, &reqs[0]),
        "MPI_Iallreduce");
  wait(reqs, describeCall(c), {work});
  bytes_ += static_cast<uint64_t>(2 * (size_ - 1) * work.nbytes() / size_);
  if (!work.is_same(t)) t.copy_(work);
}

at::Tensor ProcessGroupMPI::allgather(const at::Tensor& t, int64_t dim, const std::vector<int64_t>& sizes) {
  requireDefined(t, "allgather");
  ensureUsable();
  const int64_t nd = t.dim();
  const int64_t d = dim < 0 ? dim + nd : dim;
  if (d < 0 || d >= nd)
    throw std::invalid_argument("allgather on " + describeGroup() + ": dim " + std::to_string(dim) +
                                " out of range for a " + std::to_string(nd) + "-d tensor");
  CallInfo c;
  c.op = CallOp::AllGather;
  c.dtype = static_cast<int64_t>(t.scalar_type());
  c.shape = toVec(t.sizes());
  c.a = d;
  c.b = static_cast<int64_t>(sizes.size());
  c.perRank = sizes;
  if (size_ == 1) {
    if (!sizes.empty() && (sizes.size() != 1 || sizes[0] != t.size(d)))
      throw CollectiveMismatchError("collective mismatch on " + describeGroup() + ": rank 0 contributes " +
                                    std::to_string(t.size(d)) + " along dim " + std::to_string(d) +
                                    " but the per-rank sizes are " + shapeStr(sizes));
    return t.clone(at::MemoryFormat::Contiguous);
  }
  agree(c);
  at::Tensor x = hostContiguous(t);
  int64_t inner = 1;
  for (int64_t k = 0; k < nd; ++k)
    if (k != d) inner *= t.size(k);
  std::vector<int64_t> rows(size_);
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
  check(MPI_Iallgatherv(x.data_ptr(), counts[rank_], u.type, recv.data_ptr(), counts.data(), displs.data(), u.type,
                        data_, &reqs[0]),
        "MPI_Iallgatherv");
  wait(reqs, describeCall(c), {x, recv});
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
    parts.reserve(size_);
    int64_t off = 0;
    for (int r = 0; r < size_; ++r) {
      std::vector<int64_t> s = c.shape;
      s[d] = rows[r];
      parts.push_back(recv.narrow(0, off, rows[r] * inner).view(s));
      off += rows[r] * inner;
    }
    out = at::cat(parts, d);
  }
  return onDeviceOf(out, t, t.scalar_type());
}

at::Tensor ProcessGroupMPI::reduceScatter(const at::Tensor& t, ReduceOp op) {
  requireDefined(t, "reduceScatter");
  requireReducible(t, "reduceScatter");
  ensureUsable();
  if (t.dim() < 1)
    throw std::invalid_argument("reduceScatter on " + describeGroup() + ": needs a tensor with at least 1 dimension");
  if (size_ == 1) return t.clone(at::MemoryFormat::Contiguous);
  CallInfo c;
  c.op = CallOp::ReduceScatter;
  c.dtype = static_cast<int64_t>(t.scalar_type());
  c.shape = toVec(t.sizes());
  c.a = static_cast<int64_t>(op);
  agree(c);
  at::Tensor work = reductionBuffer(t);
  std::vector<int64_t> outShape = c.shape;
  outShape[0] /= size_;
  at::Tensor recv = at::empty(outShape, work.options());
  const int count = toCount(recv.numel(), "reduceScatter");
  toCount(work.numel(), "reduceScatter");
  std::vector<MPI_Request> reqs(1);
  check(MPI_Ireduce_scatter_block(work.data_ptr(), recv.data_ptr(), count, reduceType(work.scalar_type()), mpiOp(op),
                                  data_, &reqs[0]),
        "MPI_Ireduce_scatter_block");
  wait(reqs, describeCall(c), {work, recv});
  bytes_ += static_cast<uint64_t>((size_ - 1) * work.nbytes() / size_);
  return onDeviceOf(recv, t, t.scalar_type());
}

std::vector<at::Tensor> ProcessGroupMPI::allToAll(const std::vector<at::Tensor>& inputs,
                                                  const std::vector<std::vector<int64_t>>& outputShapes) {
  ensureUsable();
  if (inputs.empty()) throw std::invalid_argument("allToAll on " + describeGroup() + ": no inputs");
  for (const auto& x : inputs) requireDefined(x, "allToAll");
  const at::ScalarType dt = inputs[0].scalar_type();
  for (size_t j = 1; j < inputs.size(); ++j)
    if (inputs[j].scalar_type() != dt)
      throw std::invalid_argument("allToAll on " + describeGroup() + ": inputs[" + std::to_string(j) + "] is " +
                                  dtypeStr(static_cast<int64_t>(inputs[j].scalar_type())) + " but inputs[0] is " +
                                  dtypeStr(static_cast<int64_t>(dt)));
  CallInfo c;
  c.op = CallOp::AllToAll;
  c.dtype = static_cast<int64_t>(dt);
  c.b = static_cast<int64_t>(inputs.size());
  c.c = static_cast<int64_t>(outputShapes.size());
  c.perRank.assign(2 * size_, -1);
  for (size_t j = 0; j < inputs.size() && j < static_cast<size_t>(size_); ++j) c.perRank[j] = inputs[j].numel();
  for (size_t j = 0; j < outputShapes.size() && j < static_cast<size_t>(size_); ++j)
    c.perRank[size_ + j] = numelOf(outputShapes[j]);
  if (size_ == 1) {
    if (inputs.size() != 1 || outputShapes.size() != 1)
      throw std::invalid_argument("allToAll on " + describeGroup() + ": needs 1 input and 1 output shape");
    if (inputs[0].numel() != numelOf(outputShapes[0]))
      throw CollectiveMismatchError("collective mismatch on " + describeGroup() + ": rank 0 sends " +
                                    std::to_string(inputs[0].numel()) + " elements to itself but expects " +
                                    shapeStr(outputShapes[0]));
    return {inputs[0].contiguous().view(outputShapes[0]).clone()};
  }
  agree(c);
  const Unit u = unitFor(dt);
  std::vector<at::Tensor> flat;
  flat.reserve(size_);
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
  check(MPI_Ialltoallv(sendBuf.data_ptr(), sc.data(), sd.data(), u.type, recv.data_ptr(), rc.data(), rd.data(), u.type,
                       data_, &reqs[0]),
        "MPI_Ialltoallv");
  wait(reqs, describeCall(c), {sendBuf, recv});
  bytes_ += sentBytes;
  std::vector<at::Tensor> outs;
  outs.reserve(size_);
  int64_t off = 0;
  const bool cpu = inputs[0].device().is_cpu();
  for (int j = 0; j < size_; ++j) {
    const int64_t rn = numelOf(outputShapes[j]);
    at::Tensor o = recv.narrow(0, off, rn).view(outputShapes[j]);
    outs.push_back(cpu ? o : o.to(inputs[0].device(), dt));
    off += rn;
  }
  return outs;
}

void ProcessGroupMPI::broadcast(at::Tensor& t, int root) {
  requireDefined(t, "broadcast");
  ensureUsable();
  if (size_ == 1) {
    if (root != 0)
      throw std::invalid_argument("broadcast on " + describeGroup() + ": root " + std::to_string(root) +
                                  " outside the group");
    return;
  }
  CallInfo c;
  c.op = CallOp::Broadcast;
  c.dtype = static_cast<int64_t>(t.scalar_type());
  c.shape = toVec(t.sizes());
  c.a = root;
  agree(c);
  at::Tensor work = hostContiguous(t);
  const Unit u = unitFor(t.scalar_type());
  std::vector<MPI_Request> reqs(1);
  check(MPI_Ibcast(work.data_ptr(), toCount(work.numel() * u.per, "broadcast"), u.type, root, data_, &reqs[0]),
        "MPI_Ibcast");
  wait(reqs, describeCall(c), {work});
  if (rank_ == root) bytes_ += static_cast<uint64_t>(work.nbytes()) * static_cast<uint64_t>(size_ - 1);
  if (!work.is_same(t)) t.copy_(work);
}

at::Tensor ProcessGroupMPI::sendRecv(const at::Tensor& send, int dst, const std::vector<int64_t>& recvShape, int src) {
  requireDefined(send, "sendRecv");
  ensureUsable();
  CallInfo c;
  c.op = CallOp::SendRecv;
  c.dtype = static_cast<int64_t>(send.scalar_type());
  c.shape = toVec(send.sizes());
  c.a = dst;
  c.b = src;
  c.shape2 = recvShape;
  if (size_ == 1 || (dst == rank_ && src == rank_ && size_ == 1)) {
    if (dst != 0 || src != 0)
      throw std::invalid_argument("sendRecv on " + describeGroup() + ": dst/src must be 0 in a group of 1");
    if (send.numel() != numelOf(recvShape))
      throw CollectiveMismatchError("collective mismatch on " + describeGroup() + ": rank 0 sends " +
                                    shapeStr(c.shape) + " to itself but expects " + shapeStr(recvShape));
    return send.contiguous().view(recvShape).clone();
  }
  agree(c);
  if (dst == rank_) {  // verified: then src == rank_ too
    return send.contiguous().view(recvShape).clone();
  }
  at::Tensor x = hostContiguous(send);
  at::Tensor recv = at::empty(recvShape, x.options());
  const Unit u = unitFor(send.scalar_type());
  std::vector<MPI_Request> reqs(2);
  check(MPI_Irecv(recv.data_ptr(), toCount(recv.numel() * u.per, "sendRecv"), u.type, src, kTagSendRecv, ctrl_, &reqs[0]),
        "MPI_Irecv");
  check(MPI_Isend(x.data_ptr(), toCount(x.numel() * u.per, "sendRecv"), u.type, dst, kTagSendRecv, ctrl_, &reqs[1]),
        "MPI_Isend");
  if (!poll(reqs)) {
    graveyard_.push_back(x);
    graveyard_.push_back(recv);
    timeout(describeCall(c), "every rank agreed on the call but the data transfer did not finish (a peer died or hangs)",
            reqs, {1, 2});
  }
  bytes_ += static_cast<uint64_t>(x.nbytes());
  return onDeviceOf(recv, send, send.scalar_type());
}

void ProcessGroupMPI::send(const at::Tensor& t, int dst, int tag) {
  requireDefined(t, "send");
  ensureUsable();
  if (tag < 0) throw std::invalid_argument("send on " + describeGroup() + ": negative tag " + std::to_string(tag));
  CallInfo c;
  c.op = CallOp::Send;
  c.dtype = static_cast<int64_t>(t.scalar_type());
  c.shape = toVec(t.sizes());
  c.a = dst;
  c.b = tag;
  agreePair(c, dst);
  at::Tensor x = hostContiguous(t);
  const Unit u = unitFor(t.scalar_type());
  std::vector<MPI_Request> reqs(1);
  check(MPI_Isend(x.data_ptr(), toCount(x.numel() * u.per, "send"), u.type, dst, tag, data_, &reqs[0]), "MPI_Isend");
  if (!poll(reqs)) {
    graveyard_.push_back(x);
    timeout(describeCall(c), "rank " + std::to_string(dst) + " agreed but never received the data", reqs, {2});
  }
  bytes_ += static_cast<uint64_t>(x.nbytes());
}

void ProcessGroupMPI::recv(at::Tensor& t, int src, int tag) {
  requireDefined(t, "recv");
  ensureUsable();
  if (tag < 0) throw std::invalid_argument("recv on " + describeGroup() + ": negative tag " + std::to_string(tag));
  CallInfo c;
  c.op = CallOp::Recv;
  c.dtype = static_cast<int64_t>(t.scalar_type());
  c.shape = toVec(t.sizes());
  c.a = src;
  c.b = tag;
  agreePair(c, src);
  at::Tensor work = hostContiguous(t);
  const Unit u = unitFor(t.scalar_type());
  std::vector<MPI_Request> reqs(1);
  check(MPI_Irecv(work.data_ptr(), toCount(work.numel() * u.per, "recv"), u.type, src, tag, data_, &reqs[0]),
        "MPI_Irecv");
  if (!poll(reqs)) {
    graveyard_.push_back(work);
    timeout(describeCall(c), "rank " + std::to_string(src) + " agreed but its data never arrived", reqs, {1});
  }
  if (!work.is_same(t)) t.copy_(work);
}

void ProcessGroupMPI::barrier() {
  ensureUsable();
  if (size_ == 1) return;
  CallInfo c;
  c.op = CallOp::Barrier;
  agree(c);  // every rank received every other rank's header: all have arrived
}

}  // namespace dit
