#include "parallel/process_group_checked.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "parallel/process_group_mpi.h"
#include "parallel/profile_scope.h"

namespace dit {

namespace {

// Control-communicator tags.
constexpr int kTagHeader = 1;
constexpr int kTagP2P = 2;
constexpr int kTagP2PAck = 3;

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
  sShape,  // kMaxDims slots
  sHash = sShape + kMaxDims,
  sNdim2,
  sShape2,  // kMaxDims slots
  sHash2 = sShape2 + kMaxDims,
  sNumel,
  sNumel2,
  kFixedSlots,  // per-rank values follow
};

int64_t shapeHash(const std::vector<int64_t>& s) {
  uint64_t h = 1469598103934665603ULL ^ s.size();
  for (int64_t v : s) {
    h ^= static_cast<uint64_t>(v);
    h *= 1099511628211ULL;
  }
  return static_cast<int64_t>(h & 0x7fffffffffffffffULL);
}

void mpiCheck(int rc, const char* fn) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(fn) +
                           " failed in the collective checker: " + std::string(msg, len));
}

void requireDefined(const at::Tensor& t, const char* op) {
  if (!t.defined()) throw std::invalid_argument(std::string(op) + ": undefined tensor");
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

Verdict mismatch(const std::string& why, const std::vector<Hdr>& h,
                 std::initializer_list<int> ranks) {
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
  return {Verdict::Invalid,
          why + "; call: rank " + std::to_string(r) + " " + callAt(h[static_cast<size_t>(r)])};
}

Verdict verifyAll(const std::vector<Hdr>& h) {
  const int n = static_cast<int>(h.size());
  for (int r = 0; r < n; ++r)
    if (!h[r].ok)
      return {Verdict::Mismatch, "rank " + std::to_string(r) + " sent a corrupt call header"};
  const Hdr& h0 = h[0];
  for (int r = 1; r < n; ++r) {
    if (h[r].c.op != h0.c.op)
      return mismatch(std::string("rank 0 called ") + callOpName(h0.c.op) + " but rank " +
                          std::to_string(r) + " called " + callOpName(h[r].c.op),
                      h, {0, r});
    if (h[r].seq != h0.seq)
      return mismatch("rank 0 is at call #" + std::to_string(h0.seq + 1) +
                          " of this group but rank " + std::to_string(r) + " at call #" +
                          std::to_string(h[r].seq + 1) +
                          " (a rank skipped or repeated a collective)",
                      h, {0, r});
    if (h[r].c.dtype != h0.c.dtype)
      return mismatch(std::string("dtypes differ: rank 0 ") + dtypeName(h0.c.dtype) + ", rank " +
                          std::to_string(r) + " " + dtypeName(h[r].c.dtype),
                      h, {0, r});
  }
  const CallOp op = h0.c.op;
  switch (op) {
    case CallOp::AllReduce:
    case CallOp::ReduceScatter:
      for (int r = 1; r < n; ++r) {
        if (h[r].c.a != h0.c.a)
          return mismatch(std::string("reduce ops differ: rank 0 ") + reduceOpName(h0.c.a) +
                              ", rank " + std::to_string(r) + " " + reduceOpName(h[r].c.a),
                          h, {0, r});
        if (h[r].hash != h0.hash)
          return mismatch("shapes differ: rank 0 " + shapeString(h0.c.shape, h0.ndim) + " (" +
                              bytesString(h0.numel, h0.c.dtype) + "), rank " + std::to_string(r) +
                              " " + shapeString(h[r].c.shape, h[r].ndim) + " (" +
                              bytesString(h[r].numel, h[r].c.dtype) + ")",
                          h, {0, r});
      }
      if (op == CallOp::ReduceScatter) {
        if (h0.ndim < 1)
          return invalid("reduceScatter needs a tensor with at least 1 dimension", h, 0);
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
          return mismatch("gather dims differ: rank 0 dim " + std::to_string(d) + ", rank " +
                              std::to_string(r) + " dim " + std::to_string(h[r].c.a),
                          h, {0, r});
        if (h[r].ndim != h0.ndim)
          return mismatch("tensor ranks differ: rank 0 has " + std::to_string(h0.ndim) +
                              " dims, rank " + std::to_string(r) + " " + std::to_string(h[r].ndim),
                          h, {0, r});
        if (h[r].c.b != h0.c.b)
          return mismatch("rank 0 gives " + std::to_string(h0.c.b) + " per-rank sizes but rank " +
                              std::to_string(r) + " gives " + std::to_string(h[r].c.b),
                          h, {0, r});
      }
      const bool hasSizes = h0.c.b != 0;
      if (hasSizes && h0.c.b != n)
        return invalid("allgather: " + std::to_string(h0.c.b) +
                           " per-rank sizes given for a group of " + std::to_string(n) + " ranks",
                       h, 0);
      for (int r = 0; r < n; ++r) {
        if (hasSizes && r > 0) {
          for (int k = 0; k < n; ++k)
            if (h[r].c.perRank[k] != h0.c.perRank[k])
              return mismatch("the per-rank sizes differ: rank 0 says rank " + std::to_string(k) +
                                  " has " + std::to_string(h0.c.perRank[k]) + ", rank " +
                                  std::to_string(r) + " says " + std::to_string(h[r].c.perRank[k]),
                              h, {0, r});
        }
        const size_t shown = std::min<size_t>(h[r].c.shape.size(), h0.c.shape.size());
        for (size_t k = 0; k < shown; ++k) {
          if (static_cast<int64_t>(k) == d) continue;
          if (h[r].c.shape[k] != h0.c.shape[k])
            return mismatch("shapes differ outside the gather dim " + std::to_string(d) +
                                ": rank 0 " + shapeString(h0.c.shape, h0.ndim) + ", rank " +
                                std::to_string(r) + " " + shapeString(h[r].c.shape, h[r].ndim),
                            h, {0, r});
        }
        if (d < static_cast<int64_t>(h[r].c.shape.size())) {
          const int64_t got = h[r].c.shape[d];
          if (hasSizes && got != h0.c.perRank[r])
            return mismatch("rank " + std::to_string(r) + " contributes " + std::to_string(got) +
                                " along dim " + std::to_string(d) + " but the per-rank sizes say " +
                                std::to_string(h0.c.perRank[r]),
                            h, {r});
          if (!hasSizes && got != h0.c.shape[d])
            return mismatch("sizes along the gather dim " + std::to_string(d) +
                                " differ (rank 0: " + std::to_string(h0.c.shape[d]) + ", rank " +
                                std::to_string(r) + ": " + std::to_string(got) +
                                ") and no per-rank sizes were given",
                            h, {0, r});
        }
      }
      break;
    }
    case CallOp::AllToAll: {
      for (int r = 0; r < n; ++r)
        if (h[r].c.b != n || h[r].c.c != n)
          return invalid("allToAll: rank " + std::to_string(r) + " passes " +
                             std::to_string(h[r].c.b) + " inputs and " + std::to_string(h[r].c.c) +
                             " output shapes for a group of " + std::to_string(n) + " ranks",
                         h, r);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          const int64_t sent = h[i].c.perRank[j];
          const int64_t expected = h[j].c.perRank[n + i];
          if (sent != expected)
            return mismatch("rank " + std::to_string(i) + " sends " + std::to_string(sent) +
                                " elements (" + bytesString(sent, h[i].c.dtype) + ") to rank " +
                                std::to_string(j) + " but rank " + std::to_string(j) + " expects " +
                                std::to_string(expected) + " elements (" +
                                bytesString(expected, h[j].c.dtype) + ") from rank " +
                                std::to_string(i),
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
          return mismatch("shapes differ: rank 0 " + shapeString(h0.c.shape, h0.ndim) + " (" +
                              bytesString(h0.numel, h0.c.dtype) + "), rank " + std::to_string(r) +
                              " " + shapeString(h[r].c.shape, h[r].ndim) + " (" +
                              bytesString(h[r].numel, h[r].c.dtype) + ")",
                          h, {0, r});
      }
      if (h0.c.a < 0 || h0.c.a >= n)
        return invalid("broadcast root " + std::to_string(h0.c.a) + " outside the group of " +
                           std::to_string(n) + " ranks",
                       h, 0);
      break;
    case CallOp::SendRecv:
      for (int r = 0; r < n; ++r) {
        const int64_t d = h[r].c.a, s = h[r].c.b;
        if (d < 0 || d >= n || s < 0 || s >= n)
          return invalid("sendRecv: rank " + std::to_string(r) + " uses dst " + std::to_string(d) +
                             " / src " + std::to_string(s) + " outside the group of " +
                             std::to_string(n) + " ranks",
                         h, r);
      }
      for (int r = 0; r < n; ++r) {
        const int d = static_cast<int>(h[r].c.a);
        if (h[d].c.b != r)
          return mismatch("rank " + std::to_string(r) + " sends to rank " + std::to_string(d) +
                              " but rank " + std::to_string(d) + " receives from rank " +
                              std::to_string(h[d].c.b),
                          h, {r, d});
        if (h[d].hash2 != h[r].hash)
          return mismatch("rank " + std::to_string(r) + " sends " + dtypeName(h[r].c.dtype) + " " +
                              shapeString(h[r].c.shape, h[r].ndim) + " (" +
                              bytesString(h[r].numel, h[r].c.dtype) + ") to rank " +
                              std::to_string(d) + " but rank " + std::to_string(d) + " expects " +
                              shapeString(h[d].c.shape2, h[d].ndim2) + " (" +
                              bytesString(h[d].numel2, h[d].c.dtype) + ") from it",
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
    return mismatch(std::string("rank ") + std::to_string(ra) + " called " + callOpName(a.c.op) +
                        " and rank " + std::to_string(rb) + " called " + callOpName(b.c.op) +
                        " (one must send and the other receive)",
                    h, {ra, rb});
  if (s.seq != r.seq)
    return mismatch("rank " + std::to_string(rs) + " is at its send #" + std::to_string(s.seq + 1) +
                        " to rank " + std::to_string(rr) + " but rank " + std::to_string(rr) +
                        " at its recv #" + std::to_string(r.seq + 1) + " from rank " +
                        std::to_string(rs),
                    h, {rs, rr});
  if (s.c.b != r.c.b)
    return mismatch("tags differ: rank " + std::to_string(rs) + " sends with tag " +
                        std::to_string(s.c.b) + ", rank " + std::to_string(rr) +
                        " receives with tag " + std::to_string(r.c.b),
                    h, {rs, rr});
  if (s.c.dtype != r.c.dtype || s.hash != r.hash)
    return mismatch("rank " + std::to_string(rs) + " sends " + dtypeName(s.c.dtype) + " " +
                        shapeString(s.c.shape, s.ndim) + " (" + bytesString(s.numel, s.c.dtype) +
                        ") but rank " + std::to_string(rr) + " receives into " +
                        dtypeName(r.c.dtype) + " " + shapeString(r.c.shape, r.ndim) + " (" +
                        bytesString(r.numel, r.c.dtype) + ")",
                    h, {rs, rr});
  return {};
}

void raise(const Verdict& v, const std::string& where) {
  if (v.kind == Verdict::Mismatch)
    throw CollectiveMismatchError("collective mismatch on " + where + ": " + v.msg);
  if (v.kind == Verdict::Invalid)
    throw std::invalid_argument("invalid collective on " + where + ": " + v.msg);
}

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
  for (int64_t i = 0; i < std::min<int64_t>(h.ndim, kMaxDims); ++i)
    h.c.shape.push_back(p[sShape + i]);
  for (int64_t i = 0; i < std::min<int64_t>(h.ndim2, kMaxDims); ++i)
    h.c.shape2.push_back(p[sShape2 + i]);
  h.hash = p[sHash];
  h.hash2 = p[sHash2];
  h.numel = p[sNumel];
  h.numel2 = p[sNumel2];
  h.c.perRank.assign(p + kFixedSlots, p + kFixedSlots + 2 * n);
  return h;
}
}  // namespace

std::vector<int64_t> ProcessGroupChecked::encode(const CallInfo& c, int64_t seq) const {
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
  for (size_t i = 0; i < c.perRank.size() && i < static_cast<size_t>(2 * size_); ++i)
    h[kFixedSlots + i] = c.perRank[i];
  return h;
}

std::vector<CallInfo> ProcessGroupChecked::agree(const CallInfo& mine) {
  // The agreement exchange before every checked collective (DITSTUDIO_CHECK_COLLECTIVES).
  DIT_PROFILE_SCOPE("dit::collective::agree");
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
      mpiCheck(MPI_Irecv(all->data() + L * r, static_cast<int>(L), MPI_INT64_T, r, kTagHeader,
                         ctrl_, &reqs.back()),
               "MPI_Irecv");
      kinds.push_back(1);
      peers.push_back(r);
    }
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      reqs.emplace_back();
      mpiCheck(MPI_Isend(out->data(), static_cast<int>(L), MPI_INT64_T, r, kTagHeader, ctrl_,
                         &reqs.back()),
               "MPI_Isend");
      kinds.push_back(2);
      peers.push_back(r);
    }
    if (!pollRequests(reqs, timeoutSeconds())) {
      std::vector<int> missing, missingWorld;
      for (size_t i = 0; i < reqs.size(); ++i)
        if (kinds[i] == 1 && reqs[i] != MPI_REQUEST_NULL) {
          missing.push_back(peers[i]);
          missingWorld.push_back(worldRanks_[peers[i]]);
        }
      graveyard_.push_back(out);
      graveyard_.push_back(all);
      const std::string detail =
          missing.empty() ? "the call headers could not be delivered (a peer died or hangs)"
                          : "rank(s) " + rankList(missing) + " (world " + rankList(missingWorld) +
                                ") never arrived at this call (they died, hang, or are blocked in "
                                "a different call)";
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

CallInfo ProcessGroupChecked::agreePair(const CallInfo& mine, int peer) {
  ensureUsable();
  if (peer < 0 || peer >= size_ || peer == rank_)
    throw std::invalid_argument(std::string(callOpName(mine.op)) + " on " + describeGroup() +
                                ": peer rank " + std::to_string(peer) + " is invalid for rank " +
                                std::to_string(rank_));
  const bool sender = mine.op == CallOp::Send;
  const int64_t seq = sender ? sendSeq_[peer]++ : recvSeq_[peer]++;
  const size_t L = static_cast<size_t>(kFixedSlots + 2 * size_);
  auto out = std::make_shared<std::vector<int64_t>>(encode(mine, seq));
  auto in = std::make_shared<std::vector<int64_t>>(L, 0);
  const std::string what =
      describeCall(mine) + " (#" + std::to_string(seq + 1) + " to/from this peer)";
  auto fail = [&](std::vector<MPI_Request>& reqs, const std::vector<int>& kinds) {
    graveyard_.push_back(out);
    graveyard_.push_back(in);
    timeout(what,
            "rank " + std::to_string(peer) + " (world " + std::to_string(worldRanks_[peer]) +
                ") never posted the matching " + (sender ? "recv" : "send") +
                " (it died, hangs, or is blocked in a different call)",
            reqs, kinds);
  };
  if (sender) {
    std::vector<MPI_Request> reqs(2);
    mpiCheck(
        MPI_Isend(out->data(), static_cast<int>(L), MPI_INT64_T, peer, kTagP2P, ctrl_, &reqs[0]),
        "MPI_Isend");
    mpiCheck(
        MPI_Irecv(in->data(), static_cast<int>(L), MPI_INT64_T, peer, kTagP2PAck, ctrl_, &reqs[1]),
        "MPI_Irecv");
    if (!pollRequests(reqs, timeoutSeconds())) fail(reqs, {2, 1});
  } else {
    std::vector<MPI_Request> r1(1);
    mpiCheck(MPI_Irecv(in->data(), static_cast<int>(L), MPI_INT64_T, peer, kTagP2P, ctrl_, &r1[0]),
             "MPI_Irecv");
    if (!pollRequests(r1, timeoutSeconds())) fail(r1, {1});
    std::vector<MPI_Request> r2(1);
    mpiCheck(
        MPI_Isend(out->data(), static_cast<int>(L), MPI_INT64_T, peer, kTagP2PAck, ctrl_, &r2[0]),
        "MPI_Isend");
    if (!pollRequests(r2, timeoutSeconds())) fail(r2, {2});
  }
  Hdr me = decodeHdr(out->data(), size_);
  Hdr other = decodeHdr(in->data(), size_);
  raise(verifyPair(me, rank_, other, peer), describeGroup());
  return other.c;
}

ProcessGroupChecked::ProcessGroupChecked(std::shared_ptr<ProcessGroup> inner, MPI_Comm comm)
    : inner_(std::move(inner)) {
  if (!inner_) throw std::invalid_argument("ProcessGroupChecked: null group to wrap");
  int r = 0, n = 1;
  MPI_Comm_rank(comm, &r);
  MPI_Comm_size(comm, &n);
  if (r != inner_->rank() || n != inner_->size())
    throw std::invalid_argument(
        "ProcessGroupChecked: the communicator (rank " + std::to_string(r) + " of " +
        std::to_string(n) + ") does not match the wrapped group '" + inner_->name() + "' (rank " +
        std::to_string(inner_->rank()) + " of " + std::to_string(inner_->size()) + ")");
  mpiCheck(MPI_Comm_dup(comm, &ctrl_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(ctrl_, MPI_ERRORS_RETURN);
  rank_ = r;
  size_ = n;
  sendSeq_.assign(static_cast<size_t>(n), 0);
  recvSeq_.assign(static_cast<size_t>(n), 0);
  worldRanks_ = worldRanksOf(ctrl_);
}

ProcessGroupChecked::~ProcessGroupChecked() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin || broken_)
    return;  // after a timeout, header exchanges may still be pending: leak
  if (ctrl_ != MPI_COMM_NULL) MPI_Comm_free(&ctrl_);
}

std::string ProcessGroupChecked::describeGroup() const {
  return dit::describeGroup(inner_->name(), worldRanks_);
}

void ProcessGroupChecked::ensureUsable() const {
  if (broken_)
    throw std::runtime_error(describeGroup() +
                             " is unusable after an earlier failure: " + brokenReason_);
}

void ProcessGroupChecked::timeout(const std::string& what, const std::string& detail,
                                  std::vector<MPI_Request>& reqs, const std::vector<int>& reqKind) {
  // reqKind: 1 = receive (cancelled), 2 = send (freed; MPI completes or drops it).
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
                          " did not complete within " + secondsStr(timeoutSeconds()) +
                          " s on rank " + std::to_string(rank_) + " (world rank " +
                          std::to_string(worldRanks_[static_cast<size_t>(rank_)]) + "): " + detail;
  broken_ = true;
  brokenReason_ = msg;
  throw CollectiveTimeoutError(msg);
}

std::shared_ptr<Work> ProcessGroupChecked::allreduce(at::Tensor& t, ReduceOp op) {
  requireDefined(t, "allreduce");
  agree(allreduceCall(t, op));
  return inner_->allreduce(t, op);
}

std::shared_ptr<Work> ProcessGroupChecked::allgather(const at::Tensor& t, int64_t dim,
                                                     const std::vector<int64_t>& sizes) {
  requireDefined(t, "allgather");
  const int64_t nd = t.dim();
  const int64_t d = dim < 0 ? dim + nd : dim;
  if (d < 0 || d >= nd)
    throw std::invalid_argument("allgather on " + describeGroup() + ": dim " + std::to_string(dim) +
                                " out of range for a " + std::to_string(nd) + "-d tensor");
  agree(allgatherCall(t, d, sizes));
  return inner_->allgather(t, dim, sizes);
}

std::shared_ptr<Work> ProcessGroupChecked::reduceScatter(const at::Tensor& t, ReduceOp op) {
  requireDefined(t, "reduceScatter");
  agree(reduceScatterCall(t, op));
  return inner_->reduceScatter(t, op);
}

std::shared_ptr<Work> ProcessGroupChecked::allToAll(
    const std::vector<at::Tensor>& inputs, const std::vector<std::vector<int64_t>>& outputShapes) {
  if (inputs.empty()) throw std::invalid_argument("allToAll on " + describeGroup() + ": no inputs");
  for (const auto& x : inputs) requireDefined(x, "allToAll");
  agree(allToAllCall(inputs, outputShapes, size_));
  return inner_->allToAll(inputs, outputShapes);
}

std::shared_ptr<Work> ProcessGroupChecked::broadcast(at::Tensor& t, int root) {
  requireDefined(t, "broadcast");
  agree(broadcastCall(t, root));
  return inner_->broadcast(t, root);
}

std::shared_ptr<Work> ProcessGroupChecked::sendRecv(const at::Tensor& send, int dst,
                                                    const std::vector<int64_t>& recvShape,
                                                    int src) {
  requireDefined(send, "sendRecv");
  agree(sendRecvCall(send, dst, recvShape, src));
  return inner_->sendRecv(send, dst, recvShape, src);
}

std::shared_ptr<Work> ProcessGroupChecked::send(const at::Tensor& t, int dst, int tag) {
  requireDefined(t, "send");
  if (tag < 0)
    throw std::invalid_argument("send on " + describeGroup() + ": negative tag " +
                                std::to_string(tag));
  agreePair(sendCall(t, dst, tag), dst);
  return inner_->send(t, dst, tag);
}

std::shared_ptr<Work> ProcessGroupChecked::recv(at::Tensor& t, int src, int tag) {
  requireDefined(t, "recv");
  if (tag < 0)
    throw std::invalid_argument("recv on " + describeGroup() + ": negative tag " +
                                std::to_string(tag));
  agreePair(recvCall(t, src, tag), src);
  return inner_->recv(t, src, tag);
}

std::shared_ptr<Work> ProcessGroupChecked::barrier() {
  agree(barrierCall());  // every rank received every other rank's header: all have arrived
  return inner_->barrier();
}

std::shared_ptr<ProcessGroup> makeCheckedProcessGroup(std::shared_ptr<ProcessGroup> inner,
                                                      MPI_Comm comm) {
  return std::make_shared<ProcessGroupChecked>(std::move(inner), comm);
}

}  // namespace dit
