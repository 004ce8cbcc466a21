// Context parallelism: attention over a sequence distributed across ranks.
//
// Semantics: ../shared/DESIGN.md section 3 ("Context parallel"); the algorithms follow
// diffusers' context-parallel attention (RingAttention, UlyssesAttention, unified/USP) and its
// "anything" variants (uneven tensor_split partitions, head counts not divisible by ulysses).
//
// Group layout: the cp group has ring_degree * ulysses_degree ranks with
// cp rank = ring_i * ulysses_degree + uly_i (ulysses innermost, as in DeviceMesh's
// {..., ring, ulysses, tp} order); the ulysses group holds the ulysses_degree ranks sharing ring_i
// (rank uly_i), the ring group the ring_degree ranks sharing uly_i (rank ring_i).
//
// Every member function that communicates is collective: all ranks of the cp group call it in the
// same order with agreeing arguments (localLens / sizes identical on every rank).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "parallel/process_group.h"

namespace dit {

struct ContextParallelOptions {
  int ring_degree = 1;
  int ulysses_degree = 1;
  /// Uneven token partitions and head counts not divisible by ulysses (requires ring == 1).
  bool ulysses_anything = false;
  /// Uneven token partitions across the ring (requires ulysses == 1; inference only, no mask).
  bool ring_anything = false;
};

/// tensor_split sizes of `total` over `parts` (the first total % parts parts get one more).
/// Throws std::invalid_argument when parts < 1 or total < 0.
std::vector<int64_t> tensorSplitSizes(int64_t total, int64_t parts);

class ContextParallel {
 public:
  /// ring: group of the ring dimension (size ring_degree); ulysses: group of the ulysses
  /// dimension (size ulysses_degree); cp: the combined group (size ring*ulysses, rank
  /// ring_i*ulysses + uly_i) used for sequence gathers. Groups of size 1 are allowed (e.g.
  /// makeLocalProcessGroup()). Throws std::invalid_argument when a group is null, a group's size
  /// differs from its degree, the ranks are inconsistent with that layout, or an anything mode is
  /// combined with the other dimension (ulysses_anything needs ring 1, ring_anything ulysses 1).
  /// Not collective (no communication).
  ContextParallel(std::shared_ptr<ProcessGroup> ring, std::shared_ptr<ProcessGroup> ulysses,
                  std::shared_ptr<ProcessGroup> cp, ContextParallelOptions opts);

  /// ring_degree * ulysses_degree.
  int degree() const { return ringDegree_ * ulyssesDegree_; }
  /// The combined cp group (for reductions over the whole sequence, e.g. a step-cache decision).
  const std::shared_ptr<ProcessGroup>& group() const { return cp_; }
  /// This rank's index in the cp group (ring_i * ulysses_degree + uly_i).
  int cpRank() const { return cpRank_; }
  int ringRank() const { return ringRank_; }
  int ulyssesRank() const { return ulyssesRank_; }
  const ContextParallelOptions& options() const { return opts_; }
  /// True when uneven token partitions are allowed (ulysses_anything or ring_anything).
  bool unevenAllowed() const { return opts_.ulysses_anything || opts_.ring_anything; }

  /// tensor_split partition of a sequence length over the cp group: the size for every cp rank
  /// (the first total % degree ranks get one more). In strict modes (neither anything flag) a
  /// length not divisible by degree() throws std::invalid_argument naming the length and the
  /// degrees. Local; no communication.
  std::vector<int64_t> partition(int64_t total) const;
  /// [start, length) of this rank's part of partition(total).
  std::pair<int64_t, int64_t> localRange(int64_t total) const;

  /// Checks, without communicating, that attention() accepts these inputs: localLens has
  /// degree() entries, localLens[cpRank()] == S_local, strict modes need equal lengths and
  /// (ulysses > 1, no ulysses_anything) heads divisible by ulysses. Throws std::invalid_argument.
  void validate(int64_t heads, int64_t localLen, const std::vector<int64_t>& localLens) const;

  /// Attention over the distributed joint sequence.
  ///
  /// q, k, v: [B, H, S_local, D] (float32/bf16/fp16, one dtype), this rank's local tokens (its
  /// text slice followed by its image slice), RoPE already applied. localLens[r] = number of
  /// local tokens on cp rank r (identical on all ranks). H is the same on every rank (possibly
  /// TP-local). Returns [B, H, S_local, D] in q's dtype equal (up to float32 rounding) to
  /// full attention (scale 1/sqrt(D), no mask) over the concatenation of all ranks' tokens,
  /// restricted to this rank's queries.
  ///  - ring only: RingAttention; K/V blocks rotate around the ring with sendRecv, partial
  ///    outputs are merged with the log-sum-exp in float32. Uneven blocks with ring_anything.
  ///  - ulysses only: UlyssesAttention; all-to-all (local tokens, all heads) -> (all tokens,
  ///    local heads), local attention, reverse all-to-all. With ulysses_anything: uneven tokens
  ///    and heads split with tensor_split when not divisible by ulysses.
  ///  - both (unified/USP): all-to-all inside the ulysses group, ring attention across the ring
  ///    group on the local heads, reverse all-to-all.
  /// Errors: std::invalid_argument (see validate) before any collective; the group's
  /// CollectiveMismatchError / CollectiveTimeoutError from the collectives.
  /// Collective over the cp group.
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::vector<int64_t>& localLens);

  /// attention() with extra keys that every query also attends to (FLUX.2 [klein] KV's cached
  /// reference K/V, diffusers' _flux2_kv_causal_attention "cached" form): refK, refV
  /// [B, H, S_ref, D] with q's B, H, D and dtype, the SAME tensors on every rank of the cp group
  /// (replicated, not split). Returns [B, H, S_local, D]: softmax over the keys of the
  /// distributed joint sequence and the S_ref extra keys, restricted to this rank's queries.
  ///  - no cp: one local attention over cat(k, refK);
  ///  - ring (and ring_anything): the ring's blocks, then refK/refV as one more block merged by
  ///    the log-sum-exp (no extra communication);
  ///  - ulysses (and ulysses_anything): after the all-to-all, this rank's head slice of refK/refV
  ///    appended to the gathered keys (no extra communication);
  ///  - unified: this rank's head slice as one more ring block.
  /// Under Ulysses refK/refV may also hold only this rank's heads (ulyssesHeads(H): what a
  /// cache of them needs to keep). refK/refV undefined = attention(q, k, v, localLens). Throws
  /// std::invalid_argument as attention() and when refK/refV do not match q's B, D and dtype or
  /// hold neither H nor (Ulysses) this rank's heads. Collective over the cp group.
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::vector<int64_t>& localLens, const at::Tensor& refK,
                       const at::Tensor& refV);

  /// The heads [offset, count) of `heads` this rank attends over after the Ulysses all-to-all
  /// (tensor_split over the ulysses group; all of them without Ulysses). Local.
  std::pair<int64_t, int64_t> ulyssesHeads(int64_t heads) const;

  /// Gathers [B, S_local, C] pieces along dim 1 into [B, sum(sizes), C] in cp-rank order
  /// (sizes = every rank's S_local; uneven allowed). Throws std::invalid_argument when sizes has
  /// the wrong length or sizes[cpRank()] != local.size(1). Collective over the cp group.
  at::Tensor gatherSequence(const at::Tensor& local, const std::vector<int64_t>& sizes);

  /// Bytes this rank sent through its groups (payload; sum over the distinct ring, ulysses and cp
  /// groups, so it includes traffic of other users of those groups), for reporting.
  uint64_t bytesSent() const;

 private:
  // refK/refV: extra replicated keys (undefined = none), see the six-argument attention().
  at::Tensor ringAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& blockLens, const at::Tensor& refK = {},
                           const at::Tensor& refV = {});
  at::Tensor ulyssesAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::vector<int64_t>& groupLens,
                              const std::vector<int64_t>& ringBlockLens,
                              const at::Tensor& refK = {}, const at::Tensor& refV = {});

  std::shared_ptr<ProcessGroup> ring_, ulysses_, cp_;
  ContextParallelOptions opts_;
  int ringDegree_ = 1, ulyssesDegree_ = 1;
  int ringRank_ = 0, ulyssesRank_ = 0, cpRank_ = 0;
};

}  // namespace dit
