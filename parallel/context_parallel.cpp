// Context-parallel attention: RingAttention, UlyssesAttention, unified (USP) and the anything
// variants (see context_parallel.h).
#include "parallel/context_parallel.h"

#include <ATen/ATen.h>

#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>

#include "parallel/attention.h"

namespace dit {
namespace {

std::string listStr(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
  return os.str();
}

std::vector<int64_t> offsetsOf(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> off(sizes.size(), 0);
  for (size_t i = 1; i < sizes.size(); ++i) off[i] = off[i - 1] + sizes[i - 1];
  return off;
}

}  // namespace

std::vector<int64_t> tensorSplitSizes(int64_t total, int64_t parts) {
  if (parts < 1 || total < 0)
    throw std::invalid_argument("tensorSplitSizes: cannot split length " + std::to_string(total) +
                                " into " + std::to_string(parts) + " parts");
  std::vector<int64_t> sizes(static_cast<size_t>(parts), total / parts);
  for (int64_t i = 0; i < total % parts; ++i) sizes[static_cast<size_t>(i)] += 1;
  return sizes;
}

ContextParallel::ContextParallel(std::shared_ptr<ProcessGroup> ring,
                                 std::shared_ptr<ProcessGroup> ulysses,
                                 std::shared_ptr<ProcessGroup> cp, ContextParallelOptions opts)
    : ring_(std::move(ring)), ulysses_(std::move(ulysses)), cp_(std::move(cp)), opts_(opts) {
  if (!ring_ || !ulysses_ || !cp_)
    throw std::invalid_argument("ContextParallel: ring, ulysses and cp groups must not be null");
  if (opts_.ring_degree < 1 || opts_.ulysses_degree < 1)
    throw std::invalid_argument("ContextParallel: ring_degree " +
                                std::to_string(opts_.ring_degree) + " and ulysses_degree " +
                                std::to_string(opts_.ulysses_degree) + " must be >= 1");
  ringDegree_ = opts_.ring_degree;
  ulyssesDegree_ = opts_.ulysses_degree;
  if (ring_->size() != ringDegree_ || ulysses_->size() != ulyssesDegree_ ||
      cp_->size() != ringDegree_ * ulyssesDegree_)
    throw std::invalid_argument(
        "ContextParallel: group sizes (ring " + std::to_string(ring_->size()) + ", ulysses " +
        std::to_string(ulysses_->size()) + ", cp " + std::to_string(cp_->size()) +
        ") do not match ring_degree " + std::to_string(ringDegree_) + " x ulysses_degree " +
        std::to_string(ulyssesDegree_));
  ringRank_ = ring_->rank();
  ulyssesRank_ = ulysses_->rank();
  cpRank_ = cp_->rank();
  if (cpRank_ != ringRank_ * ulyssesDegree_ + ulyssesRank_)
    throw std::invalid_argument("ContextParallel: cp rank " + std::to_string(cpRank_) +
                                " != ring rank " + std::to_string(ringRank_) + " * ulysses " +
                                std::to_string(ulyssesDegree_) + " + ulysses rank " +
                                std::to_string(ulyssesRank_));
  if (opts_.ulysses_anything && ringDegree_ > 1)
    throw std::invalid_argument("ContextParallel: ulysses_anything requires ring_degree 1 (got " +
                                std::to_string(ringDegree_) + ")");
  if (opts_.ring_anything && ulyssesDegree_ > 1)
    throw std::invalid_argument("ContextParallel: ring_anything requires ulysses_degree 1 (got " +
                                std::to_string(ulyssesDegree_) + ")");
}

std::vector<int64_t> ContextParallel::partition(int64_t total) const {
  const int n = degree();
  if (total < 0)
    throw std::invalid_argument("ContextParallel: negative sequence length " +
                                std::to_string(total));
  if (n > 1 && !unevenAllowed() && total % n != 0)
    throw std::invalid_argument("context parallel: sequence length " + std::to_string(total) +
                                " is not divisible by the context-parallel degree " +
                                std::to_string(n) + " (ring " + std::to_string(ringDegree_) +
                                " x ulysses " + std::to_string(ulyssesDegree_) +
                                "); use ulysses_anything (ring 1) or ring_anything (ulysses 1)");
  return tensorSplitSizes(total, n);
}

std::pair<int64_t, int64_t> ContextParallel::localRange(int64_t total) const {
  const auto sizes = partition(total);
  int64_t start = 0;
  for (int r = 0; r < cpRank_; ++r) start += sizes[static_cast<size_t>(r)];
  return {start, sizes[static_cast<size_t>(cpRank_)]};
}

void ContextParallel::validate(int64_t heads, int64_t localLen,
                               const std::vector<int64_t>& localLens) const {
  const int n = degree();
  if (static_cast<int>(localLens.size()) != n)
    throw std::invalid_argument("ContextParallel::attention: localLens has " +
                                std::to_string(localLens.size()) + " entries, expected " +
                                std::to_string(n) + " (one per cp rank)");
  int64_t total = 0;
  for (int64_t l : localLens) {
    if (l < 0)
      throw std::invalid_argument("ContextParallel::attention: negative length in localLens " +
                                  listStr(localLens));
    total += l;
  }
  if (localLens[static_cast<size_t>(cpRank_)] != localLen)
    throw std::invalid_argument("ContextParallel::attention: cp rank " + std::to_string(cpRank_) +
                                " has " + std::to_string(localLen) +
                                " local tokens but localLens " + listStr(localLens) + " says " +
                                std::to_string(localLens[static_cast<size_t>(cpRank_)]));
  if (!unevenAllowed()) {
    for (int64_t l : localLens)
      if (l != localLens[0])
        throw std::invalid_argument(
            "context parallel: sequence length " + std::to_string(total) + " is split unevenly " +
            listStr(localLens) + " over the context-parallel degree " + std::to_string(n) +
            " (ring " + std::to_string(ringDegree_) + " x ulysses " +
            std::to_string(ulyssesDegree_) +
            "); strict ring/Ulysses need a length divisible by the degree; use ulysses_anything "
            "(ring 1) or ring_anything (ulysses 1)");
  }
  if (ulyssesDegree_ > 1 && !opts_.ulysses_anything && heads % ulyssesDegree_ != 0)
    throw std::invalid_argument("context parallel: head count " + std::to_string(heads) +
                                " is not divisible by ulysses_degree " +
                                std::to_string(ulyssesDegree_) + "; use ulysses_anything");
}

at::Tensor ContextParallel::attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const std::vector<int64_t>& localLens) {
  if (!q.defined() || !k.defined() || !v.defined() || q.dim() != 4 || k.dim() != 4 ||
      v.dim() != 4 || k.sizes() != q.sizes() || v.size(2) != q.size(2) ||
      v.sizes().slice(0, 2) != q.sizes().slice(0, 2) || q.scalar_type() != k.scalar_type() ||
      q.scalar_type() != v.scalar_type())
    throw std::invalid_argument(
        "ContextParallel::attention: q, k, v must be [B, H, S_local, D] with one dtype");
  validate(q.size(1), q.size(2), localLens);
  if (degree() == 1) return localAttention(q, k, v);
  if (ulyssesDegree_ == 1) return ringAttention(q, k, v, localLens);

  // Ulysses (possibly inside a ring): lengths within this ulysses group, and, for the ring, the
  // token count of each ring rank's whole ulysses group.
  std::vector<int64_t> groupLens(static_cast<size_t>(ulyssesDegree_));
  for (int u = 0; u < ulyssesDegree_; ++u)
    groupLens[static_cast<size_t>(u)] =
        localLens[static_cast<size_t>(ringRank_ * ulyssesDegree_ + u)];
  std::vector<int64_t> ringBlockLens(static_cast<size_t>(ringDegree_), 0);
  for (int j = 0; j < ringDegree_; ++j)
    for (int u = 0; u < ulyssesDegree_; ++u)
      ringBlockLens[static_cast<size_t>(j)] +=
          localLens[static_cast<size_t>(j * ulyssesDegree_ + u)];
  return ulyssesAttention(q, k, v, groupLens, ringBlockLens);
}

at::Tensor ContextParallel::attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const std::vector<int64_t>& localLens, const at::Tensor& refK,
                                      const at::Tensor& refV) {
  if (!refK.defined() && !refV.defined()) return attention(q, k, v, localLens);
  if (!refK.defined() || !refV.defined() || !q.defined() || q.dim() != 4 || refK.dim() != 4 ||
      refV.dim() != 4 || refK.size(0) != q.size(0) || refK.size(3) != q.size(3) ||
      refV.sizes() != refK.sizes() || refK.scalar_type() != q.scalar_type() ||
      refV.scalar_type() != q.scalar_type() ||
      (refK.size(1) != q.size(1) &&
       (ulyssesDegree_ == 1 || refK.size(1) != ulyssesHeads(q.size(1)).second)))
    throw std::invalid_argument(
        "ContextParallel::attention: the extra reference keys and values must both be "
        "[B, H, S_ref, D] (or, under Ulysses, this rank's heads) with the queries' B, D and "
        "dtype");
  if (!k.defined() || !v.defined() || k.dim() != 4 || v.dim() != 4 || k.sizes() != q.sizes() ||
      v.sizes() != q.sizes() || q.scalar_type() != k.scalar_type() ||
      q.scalar_type() != v.scalar_type())
    throw std::invalid_argument(
        "ContextParallel::attention: q, k, v must be [B, H, S_local, D] with one dtype");
  validate(q.size(1), q.size(2), localLens);
  if (degree() == 1) return localAttention(q, at::cat({k, refK}, 2), at::cat({v, refV}, 2));
  if (ulyssesDegree_ == 1) return ringAttention(q, k, v, localLens, refK, refV);
  std::vector<int64_t> groupLens(static_cast<size_t>(ulyssesDegree_));
  for (int u = 0; u < ulyssesDegree_; ++u)
    groupLens[static_cast<size_t>(u)] =
        localLens[static_cast<size_t>(ringRank_ * ulyssesDegree_ + u)];
  std::vector<int64_t> ringBlockLens(static_cast<size_t>(ringDegree_), 0);
  for (int j = 0; j < ringDegree_; ++j)
    for (int u = 0; u < ulyssesDegree_; ++u)
      ringBlockLens[static_cast<size_t>(j)] +=
          localLens[static_cast<size_t>(j * ulyssesDegree_ + u)];
  return ulyssesAttention(q, k, v, groupLens, ringBlockLens, refK, refV);
}

at::Tensor ContextParallel::ringAttention(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v,
                                          const std::vector<int64_t>& blockLens,
                                          const at::Tensor& refK, const at::Tensor& refV) {
  const int R = ringDegree_;
  const int r = ringRank_;
  const bool extra = refK.defined();
  if (R == 1)
    return extra ? localAttention(q, at::cat({k, refK}, 2), at::cat({v, refV}, 2))
                 : localAttention(q, k, v);
  const int64_t B = k.size(0), H = k.size(1), D = k.size(3), Dv = v.size(3);
  if (Dv != D)
    throw std::invalid_argument("RingAttention: k and v head dims must agree (packed rotation)");
  // K and V travel together as one [2, B, H, S_block, D] message.
  at::Tensor cur = at::stack({k, v}).contiguous();
  at::Tensor out, lse;
  const int next = (r + 1) % R, prev = (r - 1 + R) % R;
  for (int step = 0; step < R; ++step) {
    // The rotation runs while this block's attention is computed (cur is only read meanwhile).
    std::shared_ptr<Work> incoming;
    if (step + 1 < R) {
      const int nextOwner = ((r - step - 1) % R + R) % R;
      incoming =
          ring_->sendRecv(cur, next, {2, B, H, blockLens[static_cast<size_t>(nextOwner)], D}, prev);
    }
    auto [blockOut, blockLse] = attentionWithLse(q, cur[0], cur[1]);
    if (step == 0) {
      out = blockOut.to(at::kFloat).contiguous();
      lse = blockLse.contiguous();
    } else {
      mergeAttention(out, lse, blockOut, blockLse);
    }
    if (incoming) cur = incoming->result();
  }
  if (extra) {
    // The replicated extra keys: one more block, no communication.
    auto [blockOut, blockLse] = attentionWithLse(q, refK, refV);
    mergeAttention(out, lse, blockOut, blockLse);
  }
  return out.to(q.scalar_type());
}

at::Tensor ContextParallel::ulyssesAttention(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v,
                                             const std::vector<int64_t>& groupLens,
                                             const std::vector<int64_t>& ringBlockLens,
                                             const at::Tensor& refK, const at::Tensor& refV) {
  const int U = ulyssesDegree_;
  const int me = ulyssesRank_;
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), D = q.size(3);
  if (v.size(3) != D)
    throw std::invalid_argument("UlyssesAttention: q, k and v head dims must agree");
  const std::vector<int64_t> heads = tensorSplitSizes(H, U);
  const std::vector<int64_t> headOff = offsetsOf(heads);
  const int64_t myHeads = heads[static_cast<size_t>(me)];

  // (local tokens, all heads) -> (all tokens of the group, my heads); q, k, v in one message.
  std::vector<at::Tensor> send;
  std::vector<std::vector<int64_t>> recvShapes;
  send.reserve(U);
  recvShapes.reserve(U);
  for (int j = 0; j < U; ++j) {
    const int64_t h0 = headOff[static_cast<size_t>(j)], hn = heads[static_cast<size_t>(j)];
    send.push_back(
        at::stack({q.narrow(1, h0, hn), k.narrow(1, h0, hn), v.narrow(1, h0, hn)}).contiguous());
    recvShapes.push_back({3, B, myHeads, groupLens[static_cast<size_t>(j)], D});
  }
  std::vector<at::Tensor> recv = ulysses_->allToAll(send, recvShapes)->results();
  send.clear();
  at::Tensor qkv = at::cat(recv, 3);  // [3, B, myHeads, S_group, D]
  recv.clear();

  at::Tensor out;
  if (refK.defined()) {
    // Replicated extra keys: only this rank's heads are needed after the all-to-all (the
    // caller may hold only those).
    const int64_t h0 = headOff[static_cast<size_t>(me)];
    const bool all = refK.size(1) == H;
    const at::Tensor rk = all ? refK.narrow(1, h0, myHeads) : refK,
                     rv = all ? refV.narrow(1, h0, myHeads) : refV;
    out = ringDegree_ > 1
              ? ringAttention(qkv[0], qkv[1], qkv[2], ringBlockLens, rk, rv)
              : localAttention(qkv[0], at::cat({qkv[1], rk}, 2), at::cat({qkv[2], rv}, 2));
  } else {
    out = ringDegree_ > 1 ? ringAttention(qkv[0], qkv[1], qkv[2], ringBlockLens)
                          : localAttention(qkv[0], qkv[1], qkv[2]);
  }
  qkv.reset();

  // Reverse: (all tokens of the group, my heads) -> (local tokens, all heads).
  const std::vector<int64_t> tokOff = offsetsOf(groupLens);
  for (int j = 0; j < U; ++j) {
    send.push_back(out.narrow(2, tokOff[static_cast<size_t>(j)], groupLens[static_cast<size_t>(j)])
                       .contiguous());
    recvShapes[static_cast<size_t>(j)] = {B, heads[static_cast<size_t>(j)], S, D};
  }
  recv = ulysses_->allToAll(send, recvShapes)->results();
  return at::cat(recv, 1);
}

std::pair<int64_t, int64_t> ContextParallel::ulyssesHeads(int64_t heads) const {
  if (ulyssesDegree_ == 1) return {0, heads};
  const std::vector<int64_t> h = tensorSplitSizes(heads, ulyssesDegree_);
  return {offsetsOf(h)[static_cast<size_t>(ulyssesRank_)], h[static_cast<size_t>(ulyssesRank_)]};
}

at::Tensor ContextParallel::gatherSequence(const at::Tensor& local,
                                           const std::vector<int64_t>& sizes) {
  if (!local.defined() || local.dim() < 2)
    throw std::invalid_argument("ContextParallel::gatherSequence: expected [B, S_local, ...]");
  if (static_cast<int>(sizes.size()) != degree())
    throw std::invalid_argument("ContextParallel::gatherSequence: sizes has " +
                                std::to_string(sizes.size()) + " entries, expected " +
                                std::to_string(degree()));
  if (sizes[static_cast<size_t>(cpRank_)] != local.size(1))
    throw std::invalid_argument(
        "ContextParallel::gatherSequence: cp rank " + std::to_string(cpRank_) + " holds " +
        std::to_string(local.size(1)) + " tokens but sizes " + listStr(sizes) + " says " +
        std::to_string(sizes[static_cast<size_t>(cpRank_)]));
  if (degree() == 1) return local.contiguous();
  bool even = true;
  for (int64_t s : sizes) even = even && s == sizes[0];
  return cp_->allgather(local, 1, even ? std::vector<int64_t>{} : sizes)->result();
}

uint64_t ContextParallel::bytesSent() const {
  uint64_t total = ring_->bytesSent();
  if (ulysses_ != ring_) total += ulysses_->bytesSent();
  if (cp_ != ring_ && cp_ != ulysses_) total += cp_->bytesSent();
  return total;
}

}  // namespace dit
