// ProcessGroupMPI collectives (asynchronous Work), ProcessGroupChecked agreement checks, timeouts,
// DeviceMesh and runtime helpers.
// Run under mpirun with 2 or 4 ranks: every rank runs every test and asserts; only rank 0 prints
// the gtest report, other ranks print their failures prefixed with "[rank r]". The exit status is
// non-zero on every rank when any rank failed.
//
// Expected values are closed forms of the rank and the group size n.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "app/protocol/protocol.h"
#include "parallel/device_mesh.h"
#include "parallel/process_group.h"
#include "parallel/process_group_checked.h"
#include "parallel/process_group_mpi.h"
#include "parallel/runtime.h"
#include "strategy_util.h"

using dit::CollectiveMismatchError;
using dit::CollectiveTimeoutError;
using dit::ProcessGroupMPI;
using dit::ReduceOp;

namespace {

// The world group as DeviceMesh builds it for MPI: ProcessGroupMPI wrapped in ProcessGroupChecked.
std::shared_ptr<dit::ProcessGroup> g_world;
// The same ranks without the checks (the payload path alone).
std::shared_ptr<ProcessGroupMPI> g_raw;

dit::ProcessGroup& W() { return *g_world; }
ProcessGroupMPI& Raw() { return *g_raw; }
std::shared_ptr<dit::ProcessGroup> checked(std::shared_ptr<dit::ProcessGroup> g) {
  return dit::makeCheckedProcessGroup(std::move(g), MPI_COMM_WORLD);
}
int R() { return g_world->rank(); }
int N() { return g_world->size(); }

// gtest's what() check helper.
template <class E, class F>
std::string messageOf(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<wrong exception type: ") + e.what() + ">";
  }
  return "<no exception>";
}

bool contains(const std::string& s, const std::string& sub) {
  return s.find(sub) != std::string::npos;
}

double sumTo(int n) { return n * (n + 1) / 2.0; }

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stdout, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
    std::fflush(stdout);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stdout, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
      std::fflush(stdout);
    }
  }

 private:
  int rank_;
};

}  // namespace

// ---------------------------------------------------------------- local group

TEST(LocalGroup, NoCommunication) {
  auto g = dit::makeLocalProcessGroup();
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->size(), 1);
  EXPECT_EQ(g->backend(), "local");
  at::Tensor t = at::arange(6, at::kFloat).view({2, 3});
  at::Tensor before = t.clone();
  g->allreduce(t)->wait();
  EXPECT_TRUE(at::equal(t, before));
  EXPECT_TRUE(at::equal(g->allgather(t, 1, {3})->result(), before));
  EXPECT_TRUE(at::equal(g->reduceScatter(t)->result(), before));
  auto outs = g->allToAll({t}, {{3, 2}})->results();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_TRUE(at::equal(outs[0], before.view({3, 2})));
  g->broadcast(t, 0)->wait();
  EXPECT_TRUE(at::equal(g->sendRecv(t, 0, {6}, 0)->result(), before.view({6})));
  g->barrier()->wait();
  EXPECT_THROW(g->send(t, 0)->wait(), std::invalid_argument);
  EXPECT_THROW(g->allgather(t, 0, {5})->result(), CollectiveMismatchError);
  EXPECT_EQ(g->bytesSent(), 0u);
}

// ---------------------------------------------------------------- allreduce

TEST(Allreduce, SumFloat32) {
  at::Tensor t = at::full({3, 5}, R() + 1.0, at::kFloat);
  W().allreduce(t)->wait();
  EXPECT_TRUE(at::allclose(t, at::full({3, 5}, sumTo(N()), at::kFloat))) << t;
}

TEST(Allreduce, MaxMinInt64) {
  at::Tensor mx = at::full({4}, int64_t(R()) * 1000 + 7, at::kLong);
  at::Tensor mn = mx.clone();
  W().allreduce(mx, ReduceOp::Max)->wait();
  W().allreduce(mn, ReduceOp::Min)->wait();
  EXPECT_EQ(mx.dtype(), at::kLong);
  EXPECT_EQ(mx[0].item<int64_t>(), int64_t(N() - 1) * 1000 + 7);
  EXPECT_EQ(mn[3].item<int64_t>(), 7);
  at::Tensor big = at::full({2}, (int64_t(1) << 40) * (R() + 1), at::kLong);
  W().allreduce(big)->wait();
  EXPECT_EQ(big[1].item<int64_t>(), (int64_t(1) << 40) * int64_t(sumTo(N())));
}

TEST(Allreduce, BFloat16AndFloat16StageThroughFloat32) {
  for (auto dt : {at::kBFloat16, at::kHalf}) {
    at::Tensor t = at::full({1000}, R() + 1.0, at::TensorOptions().dtype(dt));
    W().allreduce(t)->wait();
    EXPECT_EQ(t.scalar_type(), dt);
    EXPECT_TRUE(at::equal(t, at::full({1000}, sumTo(N()), at::TensorOptions().dtype(dt))));
    // Many small addends: the float32 accumulation keeps 0.25*(1+...+n) exact.
    at::Tensor q = at::full({8}, 0.25 * (R() + 1), at::TensorOptions().dtype(dt));
    W().allreduce(q, ReduceOp::Max)->wait();
    EXPECT_FLOAT_EQ(q[0].item<float>(), 0.25f * N());
  }
}

TEST(Allreduce, NonContiguousInPlace) {
  at::Tensor base = at::arange(12, at::kFloat).view({3, 4}) * (R() + 1);
  at::Tensor view = base.t();  // non-contiguous view into base
  ASSERT_FALSE(view.is_contiguous());
  W().allreduce(view)->wait();
  at::Tensor expected = at::arange(12, at::kFloat).view({3, 4}) * sumTo(N());
  EXPECT_TRUE(at::allclose(base, expected)) << base;
  EXPECT_TRUE(at::allclose(view, expected.t()));
}

// ---------------------------------------------------------------- allgather

TEST(Allgather, EvenDim0AndDim1) {
  at::Tensor t = at::full({2, 3}, double(R()), at::kFloat);
  at::Tensor g0 = W().allgather(t, 0)->result();
  ASSERT_EQ(g0.sizes(), (std::vector<int64_t>{2 * N(), 3}));
  at::Tensor g1 = W().allgather(t, -1)->result();
  ASSERT_EQ(g1.sizes(), (std::vector<int64_t>{2, 3 * N()}));
  for (int r = 0; r < N(); ++r) {
    EXPECT_TRUE(at::equal(g0.narrow(0, 2 * r, 2), at::full({2, 3}, double(r), at::kFloat)));
    EXPECT_TRUE(at::equal(g1.narrow(1, 3 * r, 3), at::full({2, 3}, double(r), at::kFloat)));
  }
  EXPECT_TRUE(g1.is_contiguous());
}

TEST(Allgather, UnevenSizesDependingOnRank) {
  // Rank r contributes r+1 rows [10r + i, 10r + i + 0.5].
  const int rows = R() + 1;
  at::Tensor t = at::empty({rows, 2}, at::kFloat);
  for (int i = 0; i < rows; ++i) {
    t[i][0] = 10.0 * R() + i;
    t[i][1] = 10.0 * R() + i + 0.5;
  }
  std::vector<int64_t> sizes;
  for (int r = 0; r < N(); ++r) sizes.push_back(r + 1);
  at::Tensor g = W().allgather(t, 0, sizes)->result();
  ASSERT_EQ(g.size(0), int64_t(sumTo(N())));
  int64_t row = 0;
  for (int r = 0; r < N(); ++r)
    for (int i = 0; i <= r; ++i, ++row) {
      EXPECT_FLOAT_EQ(g[row][0].item<float>(), 10.0f * r + i);
      EXPECT_FLOAT_EQ(g[row][1].item<float>(), 10.0f * r + i + 0.5f);
    }
  // Uneven along dim 1 (bfloat16, 3-d): rank r has 2 - r % 2 columns of value r.
  at::Tensor u =
      at::full({2, 2 - R() % 2, 3}, double(R()), at::TensorOptions().dtype(at::kBFloat16));
  std::vector<int64_t> cols;
  for (int r = 0; r < N(); ++r) cols.push_back(2 - r % 2);
  at::Tensor gu = W().allgather(u, 1, cols)->result();
  EXPECT_EQ(gu.scalar_type(), at::kBFloat16);
  int64_t c = 0;
  for (int r = 0; r < N(); ++r)
    for (int k = 0; k < cols[r]; ++k, ++c)
      EXPECT_TRUE(at::equal(gu.select(1, c),
                            at::full({2, 3}, double(r), at::TensorOptions().dtype(at::kBFloat16))));
  EXPECT_EQ(c, gu.size(1));
}

TEST(Allgather, Int64) {
  at::Tensor t = at::arange(3, at::kLong) + int64_t(100) * R();
  at::Tensor g = W().allgather(t, 0)->result();
  for (int r = 0; r < N(); ++r)
    for (int i = 0; i < 3; ++i) EXPECT_EQ(g[3 * r + i].item<int64_t>(), 100 * r + i);
}

// ---------------------------------------------------------------- reduce-scatter

TEST(ReduceScatter, SumRowsPerRank) {
  // Row i holds (rank+1)*(i+1); rank r receives rows [2r, 2r+2) summed: (i+1)*n(n+1)/2.
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    at::Tensor t = (at::arange(2 * N(), at::kFloat) + 1).unsqueeze(1).repeat({1, 3}) * (R() + 1);
    t = t.to(dt);
    at::Tensor out = W().reduceScatter(t)->result();
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(out.scalar_type(), dt);
    for (int i = 0; i < 2; ++i)
      EXPECT_FLOAT_EQ(out[i][2].item<float>(), float((2 * R() + i + 1) * sumTo(N())));
  }
  at::Tensor m = at::full({N()}, double(R()), at::kFloat);
  EXPECT_FLOAT_EQ(W().reduceScatter(m, ReduceOp::Max)->result()[0].item<float>(), float(N() - 1));
}

TEST(ReduceScatter, RowsNotDivisibleIsInvalidOnEveryRank) {
  at::Tensor t = at::ones({N() + 1, 2}, at::kFloat);
  const auto msg = messageOf<std::invalid_argument>([&] { W().reduceScatter(t)->result(); });
  EXPECT_TRUE(contains(msg, "dim 0 size " + std::to_string(N() + 1) +
                                " is not divisible by the group size " + std::to_string(N())))
      << msg;
}

// ---------------------------------------------------------------- all-to-all

TEST(AllToAll, UnevenShapesFromCaller) {
  // Rank i sends to j: (i + j + 1) values 1000 i + 10 j + k; so rank i receives from j shape
  // {j+i+1}.
  std::vector<at::Tensor> in;
  std::vector<std::vector<int64_t>> shapes;
  for (int j = 0; j < N(); ++j) {
    in.push_back(at::arange(R() + j + 1, at::kFloat) + 1000.0 * R() + 10.0 * j);
    shapes.push_back({j + R() + 1});
  }
  auto out = W().allToAll(in, shapes)->results();
  ASSERT_EQ(out.size(), size_t(N()));
  for (int j = 0; j < N(); ++j) {
    ASSERT_EQ(out[j].numel(), j + R() + 1);
    EXPECT_TRUE(at::equal(out[j], at::arange(j + R() + 1, at::kFloat) + 1000.0 * j + 10.0 * R()))
        << out[j];
  }
}

TEST(AllToAll, UlyssesStyleHeadsAndTokens) {
  // [local tokens = R()+1, heads = N(), 2] -> rank j gets head j of every rank's tokens.
  at::Tensor x = at::empty({R() + 1, N(), 2}, at::kFloat);
  for (int t = 0; t <= R(); ++t)
    for (int h = 0; h < N(); ++h) x[t][h].fill_(100.0 * R() + 10.0 * t + h);
  std::vector<at::Tensor> in;
  std::vector<std::vector<int64_t>> shapes;
  for (int j = 0; j < N(); ++j) {
    in.push_back(x.select(1, j));  // non-contiguous [R()+1, 2]
    shapes.push_back({j + 1, 2});
  }
  auto out = W().allToAll(in, shapes)->results();
  for (int j = 0; j < N(); ++j)
    for (int t = 0; t <= j; ++t)
      EXPECT_FLOAT_EQ(out[j][t][1].item<float>(), 100.0f * j + 10.0f * t + R());
}

// ---------------------------------------------------------------- broadcast

TEST(Broadcast, FromLastRank) {
  const int root = N() - 1;
  at::Tensor t = R() == root ? at::arange(6, at::kFloat) + 42 : at::zeros({6}, at::kFloat);
  W().broadcast(t, root)->wait();
  EXPECT_TRUE(at::equal(t, at::arange(6, at::kFloat) + 42));
  at::Tensor i = at::full({2, 2}, int64_t(R() == 0 ? 77 : -1), at::kLong);
  W().broadcast(i, 0)->wait();
  EXPECT_EQ(i.sum().item<int64_t>(), 4 * 77);
}

// ---------------------------------------------------------------- send/recv

TEST(SendRecv, AroundTheRing) {
  const int dst = (R() + 1) % N(), src = (R() + N() - 1) % N();
  // Sizes depend on the sender: rank r sends r+1 rows.
  at::Tensor send = at::full({R() + 1, 2}, double(R()), at::kFloat);
  at::Tensor got = W().sendRecv(send, dst, {src + 1, 2}, src)->result();
  EXPECT_TRUE(at::equal(got, at::full({src + 1, 2}, double(src), at::kFloat)));
  // A token passed around the ring n times comes back to its origin (ring-attention K/V rotation).
  at::Tensor tok = at::full({3}, double(R()), at::kFloat);
  for (int step = 0; step < N(); ++step) tok = W().sendRecv(tok, dst, {3}, src)->result();
  EXPECT_TRUE(at::equal(tok, at::full({3}, double(R()), at::kFloat)));
}

TEST(SendRecv, PointToPoint) {
  if (R() == 0) {
    W().send(at::arange(5, at::kFloat) * 7, 1)->wait();
    at::Tensor back = at::zeros({2}, at::kLong);
    W().recv(back, 1, 3)->wait();
    EXPECT_EQ(back[1].item<int64_t>(), 99);
  } else if (R() == 1) {
    at::Tensor t = at::zeros({5}, at::kFloat);
    W().recv(t, 0)->wait();
    EXPECT_TRUE(at::equal(t, at::arange(5, at::kFloat) * 7));
    W().send(at::full({2}, int64_t(99), at::kLong), 0, 3)->wait();
  }
  W().barrier()->wait();
}

TEST(SendRecv, PointToPointMismatchThrowsOnBothEnds) {
  if (R() == 0) {
    const auto msg =
        messageOf<CollectiveMismatchError>([&] { W().send(at::ones({3}, at::kFloat), 1)->wait(); });
    EXPECT_TRUE(contains(
        msg, "rank 0 sends float32 [3] (12 B) but rank 1 receives into float32 [4] (16 B)"))
        << msg;
  } else if (R() == 1) {
    at::Tensor t = at::zeros({4}, at::kFloat);
    const auto msg = messageOf<CollectiveMismatchError>([&] { W().recv(t, 0)->wait(); });
    EXPECT_TRUE(contains(
        msg, "rank 0 sends float32 [3] (12 B) but rank 1 receives into float32 [4] (16 B)"))
        << msg;
  }
  W().barrier()->wait();
}

// ---------------------------------------------------------------- agreement (mismatch) checks

TEST(Mismatch, AllreduceSizesDifferThrowsEverywhereAndGroupStaysUsable) {
  at::Tensor t = at::ones({4 + R()}, at::kFloat);
  const auto msg = messageOf<CollectiveMismatchError>([&] { W().allreduce(t)->wait(); });
  EXPECT_TRUE(contains(msg, "collective mismatch on group 'world'")) << msg;
  EXPECT_TRUE(contains(msg, "shapes differ: rank 0 [4] (16 B), rank 1 [5] (20 B)")) << msg;
  EXPECT_TRUE(contains(msg, "rank 0 allreduce(sum, float32 [4], 16 B)")) << msg;
  EXPECT_TRUE(contains(msg, "rank 1 allreduce(sum, float32 [5], 20 B)")) << msg;
  // Still in step afterwards.
  at::Tensor ok = at::full({2}, R() + 1.0, at::kFloat);
  W().allreduce(ok)->wait();
  EXPECT_FLOAT_EQ(ok[0].item<float>(), float(sumTo(N())));
}

TEST(Mismatch, DifferentOps) {
  at::Tensor t = at::zeros({2}, at::kFloat);
  const auto msg = messageOf<CollectiveMismatchError>([&] {
    if (R() == 0)
      W().barrier()->wait();
    else
      W().broadcast(t, 0)->wait();
  });
  EXPECT_TRUE(contains(msg, "rank 0 called barrier but rank 1 called broadcast")) << msg;
}

TEST(Mismatch, DtypesDiffer) {
  at::Tensor t = at::ones({2}, R() == 0 ? at::kFloat : at::kBFloat16);
  const auto msg = messageOf<CollectiveMismatchError>([&] { W().allgather(t, 0)->result(); });
  EXPECT_TRUE(contains(msg, "dtypes differ: rank 0 float32, rank 1 bfloat16")) << msg;
}

TEST(Mismatch, AllgatherSizesWithoutPerRankSizes) {
  at::Tensor t = at::ones({4 + R()}, at::kFloat);
  const auto msg = messageOf<CollectiveMismatchError>([&] { W().allgather(t, 0)->result(); });
  EXPECT_TRUE(contains(msg, "(rank 0: 4, rank 1: 5) and no per-rank sizes were given")) << msg;
  std::vector<int64_t> wrong(N(), 4);  // rank 1 really has 5
  const auto msg2 =
      messageOf<CollectiveMismatchError>([&] { W().allgather(t, 0, wrong)->result(); });
  EXPECT_TRUE(contains(msg2, "rank 1 contributes 5 along dim 0 but the per-rank sizes say 4"))
      << msg2;
}

TEST(Mismatch, AllToAllPairwiseSizes) {
  std::vector<at::Tensor> in;
  std::vector<std::vector<int64_t>> shapes;
  for (int j = 0; j < N(); ++j) {
    in.push_back(at::ones({1}, at::kFloat));
    shapes.push_back({(R() == 1 && j == 0) ? 2 : 1});  // rank 1 expects 2 elements from rank 0
  }
  const auto msg = messageOf<CollectiveMismatchError>([&] { W().allToAll(in, shapes)->results(); });
  EXPECT_TRUE(contains(
      msg,
      "rank 0 sends 1 elements (4 B) to rank 1 but rank 1 expects 2 elements (8 B) from rank 0"))
      << msg;
}

TEST(Mismatch, SendRecvPermutation) {
  // Everyone sends to rank 0's right neighbour but rank 1 claims to receive from itself.
  const int dst = (R() + 1) % N();
  const int src = R() == 1 ? 1 : (R() + N() - 1) % N();
  const auto msg = messageOf<CollectiveMismatchError>(
      [&] { W().sendRecv(at::ones({2}, at::kFloat), dst, {2}, src)->result(); });
  EXPECT_TRUE(contains(msg, "rank 0 sends to rank 1 but rank 1 receives from rank 1")) << msg;
}

// ---------------------------------------------------------------- timeouts

TEST(Timeout, MissingRankIsNamed) {
  // A private group with a short deadline; only rank 0 calls it.
  auto g = checked(std::make_shared<ProcessGroupMPI>(MPI_COMM_WORLD, "timeout-test", 0.5));
  EXPECT_DOUBLE_EQ(g->timeoutSeconds(), 0.5);
  if (R() == 0) {
    at::Tensor t = at::ones({3}, at::kFloat);
    const auto msg = messageOf<CollectiveTimeoutError>([&] { g->allreduce(t)->wait(); });
    EXPECT_TRUE(contains(
        msg,
        "collective timeout: allreduce(sum, float32 [3], 12 B) (call #1) on group 'timeout-test'"))
        << msg;
    EXPECT_TRUE(contains(msg, "within 0.5 s on rank 0")) << msg;
    std::string missing = "rank(s) 1";
    for (int r = 2; r < N(); ++r) missing += "," + std::to_string(r);
    EXPECT_TRUE(contains(msg, missing + " (world " + missing.substr(8) + ") never arrived")) << msg;
    // The group is unusable afterwards.
    EXPECT_THROW(g->barrier()->wait(), std::runtime_error);
  }
  W().barrier()->wait();
  // Point-to-point: rank 1 waits for a send from rank 0 that never comes.
  auto p = checked(std::make_shared<ProcessGroupMPI>(MPI_COMM_WORLD, "p2p-timeout", 0.3));
  if (R() == 1) {
    at::Tensor t = at::zeros({2}, at::kFloat);
    const auto msg = messageOf<CollectiveTimeoutError>([&] { p->recv(t, 0)->wait(); });
    EXPECT_TRUE(contains(msg, "rank 0 (world 0) never posted the matching send")) << msg;
  }
  W().barrier()->wait();
  // Keep both groups alive until exit: their abandoned requests must not be freed collectively.
  static std::vector<std::shared_ptr<dit::ProcessGroup>> keep;
  keep.push_back(g);
  keep.push_back(p);
}

TEST(Timeout, DefaultFromEnvironment) {
  // The launcher does not set DITSTUDIO_COLLECTIVE_TIMEOUT_S for this test.
  EXPECT_DOUBLE_EQ(dit::defaultCollectiveTimeoutSeconds(), 300.0);
}

// ---------------------------------------------------------------- bytes sent

TEST(BytesSent, CountsPayload) {
  auto g = std::make_shared<ProcessGroupMPI>(MPI_COMM_WORLD, "bytes");
  EXPECT_EQ(g->bytesSent(), 0u);
  at::Tensor t = at::zeros({100}, at::kFloat);
  g->broadcast(t, 0)->wait();
  EXPECT_EQ(g->bytesSent(), R() == 0 ? 400u * (N() - 1) : 0u);
  const uint64_t before = g->bytesSent();
  std::vector<at::Tensor> in(N(), at::zeros({10}, at::kFloat));
  std::vector<std::vector<int64_t>> shapes(N(), std::vector<int64_t>{10});
  g->allToAll(in, shapes)->results();
  EXPECT_EQ(g->bytesSent() - before, 40u * (N() - 1));
  g->barrier()->wait();  // no payload
  EXPECT_EQ(g->bytesSent() - before, 40u * (N() - 1));
}

// ---------------------------------------------------------------- asynchronous Work

TEST(Work, BackToBackWaitedOutOfOrder) {
  // Four collectives in flight at once on the unchecked group, waited in reverse order.
  at::Tensor a = at::full({3}, R() + 1.0, at::kFloat);
  at::Tensor b = at::full({2}, double(R()), at::kFloat);
  at::Tensor c = at::full({4}, double(R()), at::kFloat);
  at::Tensor d = R() == 0 ? at::arange(5, at::kLong) + 10 : at::zeros({5}, at::kLong);
  const int dst = (R() + 1) % N(), src = (R() + N() - 1) % N();
  auto wa = Raw().allreduce(a);
  auto wb = Raw().allgather(b, 0);
  auto wc = Raw().sendRecv(c, dst, {4}, src);
  auto wd = Raw().broadcast(d, 0);
  wd->wait();
  EXPECT_TRUE(at::equal(d, at::arange(5, at::kLong) + 10));
  EXPECT_TRUE(at::equal(wc->result(), at::full({4}, double(src), at::kFloat)));
  at::Tensor gb = wb->result();
  ASSERT_EQ(gb.numel(), 2 * N());
  for (int r = 0; r < N(); ++r)
    EXPECT_TRUE(at::equal(gb.narrow(0, 2 * r, 2), at::full({2}, double(r), at::kFloat)));
  wa->wait();
  EXPECT_TRUE(at::equal(a, at::full({3}, sumTo(N()), at::kFloat)));
  EXPECT_TRUE(at::equal(wa->result(), a));
  for (const auto& w : {wa, wb, wc, wd}) {
    EXPECT_TRUE(w->isCompleted());
    EXPECT_TRUE(w->isSuccess());
    EXPECT_EQ(w->exception(), nullptr);
  }
  EXPECT_EQ(wd->results().size(), 1u);
}

TEST(Work, IsCompletedTurnsTrueWithoutWait) {
  at::Tensor t = at::full({8}, R() + 1.0, at::kFloat);
  auto w = Raw().allreduce(t);
  // Polling isCompleted() progresses the operation; every rank polls, so it finishes.
  const auto start = std::chrono::steady_clock::now();
  while (!w->isCompleted() && std::chrono::steady_clock::now() - start < std::chrono::seconds(30))
    std::this_thread::yield();
  ASSERT_TRUE(w->isCompleted());
  EXPECT_TRUE(
      at::equal(t, at::full({8}, sumTo(N()), at::kFloat)));  // outputs valid after isCompleted
  w->wait();                                                 // idempotent
  at::Tensor x = at::full({1}, double(R()), at::kFloat);
  auto all =
      Raw().allToAll(std::vector<at::Tensor>(N(), x), std::vector<std::vector<int64_t>>(N(), {1}));
  const auto& outs = all->results();
  ASSERT_EQ(outs.size(), size_t(N()));
  for (int j = 0; j < N(); ++j) EXPECT_FLOAT_EQ(outs[j].item<float>(), float(j));
  EXPECT_THROW(all->result(), std::logic_error);  // several outputs: results() only
  auto b = Raw().barrier();
  b->wait();
  EXPECT_TRUE(b->results().empty());
}

TEST(Work, TimedOutWorkThrowsFromWait) {
  // Unchecked private group with a short deadline: only rank 0 issues; its wait() times out.
  auto g = std::make_shared<ProcessGroupMPI>(MPI_COMM_WORLD, "work-timeout", 0.4);
  if (R() == 0) {
    at::Tensor t = at::ones({3}, at::kFloat);
    auto w = g->allreduce(t);  // issued: nothing thrown yet
    const auto msg = messageOf<CollectiveTimeoutError>([&] { w->wait(); });
    EXPECT_TRUE(contains(
        msg, "collective timeout: allreduce(sum, float32 [3], 12 B) on group 'work-timeout'"))
        << msg;
    EXPECT_TRUE(contains(msg, "within 0.4 s on rank 0")) << msg;
    EXPECT_TRUE(w->isCompleted());
    EXPECT_FALSE(w->isSuccess());
    EXPECT_NE(w->exception(), nullptr);
    EXPECT_THROW(w->wait(), CollectiveTimeoutError);  // again on every wait
    EXPECT_THROW(g->barrier(), std::runtime_error);   // the group is unusable afterwards
    W().barrier()->wait();
    W().barrier()->wait();  // polling here progresses the abandoned allreduce for the late ranks
  } else {
    W().barrier()->wait();  // only after rank 0 timed out: join the allreduce late
    g->setTimeoutSeconds(60);
    at::Tensor t = at::ones({3}, at::kFloat);
    g->allreduce(t)->wait();
    EXPECT_TRUE(at::equal(t, at::full({3}, double(N()), at::kFloat)));  // rank 0's buffer took part
    W().barrier()->wait();
  }
  static std::vector<std::shared_ptr<ProcessGroupMPI>>
      keep;  // rank 0 marked it broken: never freed
  keep.push_back(g);
}

TEST(Checked, DisabledGroupStillComputes) {
  // Without the wrapper, the same collectives give the same values (only the checks are gone).
  at::Tensor t = at::full({3, 5}, R() + 1.0, at::kFloat);
  Raw().allreduce(t)->wait();
  EXPECT_TRUE(at::allclose(t, at::full({3, 5}, sumTo(N()), at::kFloat)));
  std::vector<int64_t> sizes;
  for (int r = 0; r < N(); ++r) sizes.push_back(r + 1);
  at::Tensor g =
      Raw().allgather(at::full({R() + 1, 2}, double(R()), at::kFloat), 0, sizes)->result();
  ASSERT_EQ(g.size(0), int64_t(sumTo(N())));
  EXPECT_FLOAT_EQ(g[g.size(0) - 1][1].item<float>(), float(N() - 1));
  at::Tensor rs = Raw().reduceScatter(at::ones({2 * N()}, at::kFloat))->result();
  EXPECT_TRUE(at::equal(rs, at::full({2}, double(N()), at::kFloat)));
  // Local argument errors are still caught on the unchecked group.
  EXPECT_THROW(Raw().reduceScatter(at::ones({N() + 1}, at::kFloat)), std::invalid_argument);
  EXPECT_THROW(Raw().allToAll({at::ones({1}, at::kFloat)}, {{1}}), std::invalid_argument);
}

TEST(Checked, WrapperReportsTheWrappedGroup) {
  auto& c = dynamic_cast<dit::ProcessGroupChecked&>(W());
  EXPECT_EQ(c.backend(), "mpi");
  EXPECT_EQ(c.name(), "world");
  EXPECT_EQ(c.size(), N());
  EXPECT_EQ(c.rank(), R());
  EXPECT_DOUBLE_EQ(c.timeoutSeconds(), 60.0);
  EXPECT_EQ(c.bytesSent(), c.wrapped()->bytesSent());
  EXPECT_EQ(
      c.describeGroup().rfind("group 'world' (" + std::to_string(N()) + " ranks: world 0,1", 0),
      0u);
}

TEST(Checked, MeshWrapsByDefaultForMpiAndHonoursTheSwitch) {
  ::unsetenv("DITSTUDIO_CHECK_COLLECTIVES");
  EXPECT_TRUE(dit::collectiveChecksEnabled("mpi"));
  EXPECT_FALSE(dit::collectiveChecksEnabled("nccl"));
  EXPECT_FALSE(dit::collectiveChecksEnabled("mpi", 0));
  EXPECT_TRUE(dit::collectiveChecksEnabled("nccl", 1));
  ::setenv("DITSTUDIO_CHECK_COLLECTIVES", "1", 1);
  EXPECT_TRUE(dit::collectiveChecksEnabled("nccl"));
  ::setenv("DITSTUDIO_CHECK_COLLECTIVES", "0", 1);
  EXPECT_FALSE(dit::collectiveChecksEnabled("mpi"));
  ::setenv("DITSTUDIO_CHECK_COLLECTIVES", "yes", 1);
  EXPECT_THROW(dit::collectiveChecksEnabled("mpi"), std::invalid_argument);
  ::unsetenv("DITSTUDIO_CHECK_COLLECTIVES");

  dit::Strategy s;
  s.world = N();
  s.tp_degree = N();
  {
    dit::DeviceMesh mesh(s);
    EXPECT_TRUE(mesh.checksCollectives());
    EXPECT_NE(dynamic_cast<dit::ProcessGroupChecked*>(mesh.group("tp").get()), nullptr);
    EXPECT_NE(dynamic_cast<dit::ProcessGroupChecked*>(mesh.world().get()), nullptr);
    at::Tensor t = at::ones({4 + R()}, at::kFloat);
    const auto msg =
        messageOf<CollectiveMismatchError>([&] { mesh.group("tp")->allreduce(t)->wait(); });
    EXPECT_TRUE(contains(msg, "collective mismatch on group 'tp'")) << msg;
  }
  dit::DeviceMeshOptions off;
  off.check_collectives = 0;
  dit::DeviceMesh mesh(s, MPI_COMM_WORLD, off);
  EXPECT_FALSE(mesh.checksCollectives());
  EXPECT_NE(dynamic_cast<ProcessGroupMPI*>(mesh.group("tp").get()), nullptr);
  at::Tensor t = at::full({2}, double(R()), at::kFloat);
  mesh.group("tp")->allreduce(t)->wait();
  EXPECT_TRUE(at::equal(t, at::full({2}, double(N() * (N() - 1) / 2), at::kFloat)));
}

TEST(Device, LocalDeviceIndexRule) {
  EXPECT_EQ(dit::localDeviceIndex(0, 1), 0);
  EXPECT_EQ(dit::localDeviceIndex(3, 8), 3);
  EXPECT_EQ(dit::localDeviceIndex(9, 8), 1);  // more ranks than GPUs: round-robin
  EXPECT_EQ(dit::localDeviceIndex(5, 2), 1);
  EXPECT_THROW(dit::localDeviceIndex(0, 0), std::invalid_argument);
  EXPECT_THROW(dit::localDeviceIndex(-1, 4), std::invalid_argument);
  // Under OpenMPI's mpirun the local rank comes from OMPI_COMM_WORLD_LOCAL_RANK; all ranks of
  // these tests run on one host, so it equals the world rank.
  EXPECT_EQ(dit::localRank(), R());
}

// ---------------------------------------------------------------- device mesh

namespace {
// The strategy whose world is the product of its degrees.
dit::Strategy strat(int tp, int ring, int uly, int cfg, int dp) {
  return dit::test::strat(tp * ring * uly * cfg * dp, tp, ring, uly, cfg, dp);
}
// Sum over the group of the world ranks.
int64_t groupSumOfWorldRanks(dit::ProcessGroup& g) {
  at::Tensor t = at::full({1}, int64_t(R()), at::kLong);
  g.allreduce(t)->wait();
  return t.item<int64_t>();
}
}  // namespace

TEST(DeviceMesh, EverySingleDimOverTheWholeWorld) {
  for (const char* dim : {"tp", "ring", "ulysses", "dp"}) {
    const std::string d = dim;
    dit::Strategy s = strat(d == "tp" ? N() : 1, d == "ring" ? N() : 1, d == "ulysses" ? N() : 1, 1,
                            d == "dp" ? N() : 1);
    dit::DeviceMesh mesh(s);
    EXPECT_EQ(mesh.backend(), "mpi");
    EXPECT_EQ(mesh.size(d), N());
    EXPECT_EQ(mesh.coord(d), R());
    EXPECT_EQ(mesh.group(d)->size(), N());
    EXPECT_EQ(mesh.group(d)->rank(), R());
    EXPECT_EQ(groupSumOfWorldRanks(*mesh.group(d)), int64_t(N() * (N() - 1) / 2));
    for (const char* other : {"tp", "ring", "ulysses", "dp", "cfg"})
      if (d != other) {
        EXPECT_EQ(mesh.group(other)->backend(), "local") << other;
      }
    if (d == "ring" || d == "ulysses") {
      EXPECT_EQ(mesh.group("cp").get(), mesh.group(d).get());
      EXPECT_EQ(mesh.coord("cp"), R());
    } else {
      EXPECT_EQ(mesh.size("cp"), 1);
    }
    EXPECT_EQ(mesh.world()->size(), N());
  }
  if (N() == 2) {
    dit::DeviceMesh mesh(strat(1, 1, 1, 2, 1));
    EXPECT_EQ(mesh.coord("cfg"), R());
    EXPECT_EQ(groupSumOfWorldRanks(*mesh.group("cfg")), 1);
  }
}

TEST(DeviceMesh, World4TpTimesUlysses) {
  if (N() != 4) GTEST_SKIP() << "needs 4 ranks";
  dit::DeviceMesh mesh(strat(2, 1, 2, 1, 1));
  const int tp = R() % 2, uly = R() / 2;
  EXPECT_EQ(mesh.coord("tp"), tp);
  EXPECT_EQ(mesh.coord("ulysses"), uly);
  EXPECT_EQ(mesh.size("tp"), 2);
  EXPECT_EQ(mesh.size("ulysses"), 2);
  EXPECT_EQ(mesh.group("tp")->rank(), tp);
  EXPECT_EQ(mesh.group("ulysses")->rank(), uly);
  EXPECT_EQ(mesh.size("cp"), 2);
  EXPECT_EQ(mesh.coord("cp"), uly);
  EXPECT_EQ(mesh.group("dp")->size(), 1);
  EXPECT_EQ(mesh.group("ring")->size(), 1);
  // tp group = {2u, 2u+1}; ulysses group = {t, t+2}.
  EXPECT_EQ(groupSumOfWorldRanks(*mesh.group("tp")), 4 * uly + 1);
  EXPECT_EQ(groupSumOfWorldRanks(*mesh.group("ulysses")), 2 * tp + 2);
  EXPECT_EQ(mesh.rankOf({0, 0, 0, uly, tp}), R());
}

TEST(DeviceMesh, World4DpTimesCfg) {
  if (N() != 4) GTEST_SKIP() << "needs 4 ranks";
  dit::DeviceMesh mesh(strat(1, 1, 1, 2, 2));
  const int cfg = R() % 2, dp = R() / 2;
  EXPECT_EQ(mesh.coord("cfg"), cfg);
  EXPECT_EQ(mesh.coord("dp"), dp);
  EXPECT_EQ(mesh.group("cfg")->rank(), cfg);
  EXPECT_EQ(mesh.group("dp")->rank(), dp);
  EXPECT_EQ(groupSumOfWorldRanks(*mesh.group("cfg")), 4 * dp + 1);  // {2d, 2d+1}
  EXPECT_EQ(groupSumOfWorldRanks(*mesh.group("dp")), 2 * cfg + 2);  // {c, c+2}
  EXPECT_EQ(mesh.size("cp"), 1);
}

TEST(DeviceMesh, World4UnifiedRingTimesUlysses) {
  if (N() != 4) GTEST_SKIP() << "needs 4 ranks";
  dit::DeviceMesh mesh(strat(1, 2, 2, 1, 1));
  const int uly = R() % 2, ring = R() / 2;
  EXPECT_EQ(mesh.coord("ring"), ring);
  EXPECT_EQ(mesh.coord("ulysses"), uly);
  EXPECT_EQ(mesh.size("cp"), 4);
  EXPECT_EQ(mesh.coord("cp"), ring * 2 + uly);
  EXPECT_EQ(mesh.group("cp")->rank(), ring * 2 + uly);
  EXPECT_NE(mesh.group("cp").get(), mesh.group("ring").get());
  at::Tensor mine = at::full({1}, int64_t(R()), at::kLong);
  at::Tensor all = mesh.group("cp")->allgather(mine, 0)->result();
  EXPECT_TRUE(at::equal(all, at::arange(4, at::kLong)));
  EXPECT_EQ(groupSumOfWorldRanks(*mesh.group("ring")), 2 * uly + 2);      // {u, u+2}
  EXPECT_EQ(groupSumOfWorldRanks(*mesh.group("ulysses")), 4 * ring + 1);  // {2r, 2r+1}
  EXPECT_GE(mesh.bytesSent(), 8u);
}

TEST(DeviceMesh, InvalidStrategyThrowsOnEveryRankBeforeCommunicating) {
  dit::Strategy s = strat(N(), 1, 1, 1, 1);
  s.world = N() + 1;
  s.tp_degree = N() + 1;
  const auto msg = messageOf<std::invalid_argument>([&] { dit::DeviceMesh mesh(s); });
  EXPECT_TRUE(contains(msg, "but the process group has " + std::to_string(N()) + " ranks")) << msg;
  dit::Strategy bad = strat(N(), 1, 1, 1, 1);
  bad.ring_anything = true;
  const auto msg2 = messageOf<std::invalid_argument>([&] { dit::DeviceMesh mesh(bad); });
  EXPECT_TRUE(contains(msg2, "ring_anything needs ring_degree > 1")) << msg2;
  dit::DeviceMesh ok(strat(N(), 1, 1, 1, 1));
  EXPECT_THROW(ok.group("pp"), std::invalid_argument);
}

// ---------------------------------------------------------------- runtime helpers

TEST(Runtime, RanksMemoryAndEvents) {
  EXPECT_EQ(dit::worldRank(), R());
  EXPECT_EQ(dit::worldSize(), N());
  EXPECT_TRUE(dit::runtimeActive());
  const uint64_t rss = dit::residentSetBytes(), peak = dit::peakResidentSetBytes();
  EXPECT_GT(rss, 1u << 20);
  EXPECT_GE(peak, rss);
  nlohmann::ordered_json ev;
  ev["event"] = "hello";
  ev["rank"] = R();
  EXPECT_EQ(dit::protocol::eventLine(ev),
            "@@DIT {\"event\":\"hello\",\"rank\":" + std::to_string(R()) + "}");
  EXPECT_GE(dit::localRank(), 0);
}

TEST(Cuda, StagedThroughHost) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA";
  at::Tensor t = at::full({4}, R() + 1.0, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  W().allreduce(t)->wait();
  EXPECT_TRUE(t.is_cuda());
  EXPECT_FLOAT_EQ(t.cpu()[0].item<float>(), float(sumTo(N())));
  at::Tensor g = W().allgather(t, 0)->result();
  EXPECT_TRUE(g.is_cuda());
  EXPECT_EQ(g.numel(), 4 * N());
}

// Issue 35: a rank stopped (SIGSTOP) at a start-up step is named within the collective timeout
// by every rank that arrived, instead of the group hanging in a blocking MPI_Comm_split/dup: once
// for a stopped non-root rank (rank 0 and the others name it), once for a stopped rank 0 (the
// others name it after the timeout plus the grace). Each case on a fresh communicator.
TEST(StartupArrival, StoppedRankNamedWithinTheTimeout) {
  const int rank = dit::worldRank(), n = dit::worldSize();
  int mine = static_cast<int>(::getpid());
  std::vector<int> pids(static_cast<size_t>(n));
  MPI_Allgather(&mine, 1, MPI_INT, pids.data(), 1, MPI_INT, MPI_COMM_WORLD);
  const double T = 1.5;
  for (const int stopped : {1, 0}) {
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    // The ranks that are not stopped, so that they all finish their check before the stopped
    // one is woken: woken earlier (a busy machine delays one rank's timeout), it would answer the
    // late rank, which would then see no error.
    MPI_Comm others;
    MPI_Comm_split(MPI_COMM_WORLD, rank == stopped ? MPI_UNDEFINED : 0, rank, &others);
    MPI_Barrier(MPI_COMM_WORLD);
    std::string error;
    const auto t0 = std::chrono::steady_clock::now();
    if (rank == stopped) ::raise(SIGSTOP);  // continued by another rank below
    try {
      dit::checkStartupArrival(comm, "creating the process groups", T);
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank != stopped) {
      const std::string who = stopped == 0 ? "rank 0 never answered" : "rank 1 never arrived";
      EXPECT_NE(error.find("collective timeout: creating the process groups did not complete "
                           "within 1.5 s on rank " +
                           std::to_string(rank) + ": " + who),
                std::string::npos)
          << "stopped " << stopped << ": " << error;
      EXPECT_LT(s, T + std::min(T, 5.0) + 3.0) << error;
      EXPECT_GE(s, T * 0.9) << error;
      // The stopped rank goes on (the lowest other rank wakes it, once every other one is done).
      MPI_Barrier(others);
      MPI_Comm_free(&others);
      if (rank == (stopped == 0 ? 1 : 0)) ::kill(pids[static_cast<size_t>(stopped)], SIGCONT);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Comm_free(&comm);
  }
  // Everyone present: no error, on a fresh communicator.
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  EXPECT_NO_THROW(dit::checkStartupArrival(comm, "creating the process groups", 30.0));
  MPI_Comm_free(&comm);
}

int main(int argc, char** argv) {
  dit::initRuntime(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = dit::worldRank();
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  // Short deadline: a broken test fails in a minute instead of hanging ctest.
  g_raw = std::make_shared<ProcessGroupMPI>(MPI_COMM_WORLD, "world", 60.0);
  g_world = checked(std::make_shared<ProcessGroupMPI>(MPI_COMM_WORLD, "world", 60.0));
  if (g_world->size() < 2) {
    std::fprintf(stderr, "test_collectives needs at least 2 ranks (mpirun -np 2)\n");
    return 2;
  }
  int rc = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any != 0 && rc == 0)
    std::printf("FAILED on another rank (see the [rank r] lines above)\n");
  g_world.reset();
  g_raw.reset();
  dit::finalizeRuntime();
  return any;
}
