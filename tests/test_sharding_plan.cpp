// ShardingPlan (parallel/tensor_parallel/sharding_plan.h): glob matching, shard specs, validation
// messages, stale rules and per-rank byte counts. Torch-free.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "parallel/tensor_parallel/sharding_plan.h"

using dit::ParallelStyle;
using dit::ParameterTable;
using dit::ShardingPlan;
using dit::ShardSpec;
using dit::StrategyIssue;
using ::testing::HasSubstr;

namespace {

// Two double-stream-like blocks and one single-stream block with a packed proj_out.
ParameterTable table(int64_t C, int64_t M, int doubles = 2) {
  ParameterTable t;
  auto lin = [&](const std::string& p, int64_t in, int64_t out) {
    t.add({p + ".weight", {out, in}, "BF16", 2});
    t.add({p + ".bias", {out}, "BF16", 2});
  };
  lin("embed", 8, C);
  for (int i = 0; i < doubles; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    lin(p + "attn.to_q", C, C);
    lin(p + "attn.to_out.0", C, C);
    lin(p + "ff.net.0.proj", C, M);
    lin(p + "ff.net.2", M, C);
    t.add({p + "attn.norm_q.weight", {C / 4}, "BF16", 2});
  }
  lin("single.0.proj_out", C + M, C);
  return t;
}

ShardingPlan plan(int64_t C, int64_t M) {
  ShardingPlan p({{"blocks.*.attn.to_q", ParallelStyle::Colwise, {}},
                  {"blocks.*.attn.to_out.0", ParallelStyle::Rowwise, {}},
                  {"blocks.*.ff.net.0.proj", ParallelStyle::Colwise, {}},
                  {"blocks.*.ff.net.2", ParallelStyle::Rowwise, {}},
                  {"single.*.proj_out", ParallelStyle::PackedRowwise, {C, M}}});
  p.requireDivisible("num_attention_heads", 4,
                     "each tensor-parallel rank owns a whole number of heads", "tp_heads");
  return p;
}

std::string messageOf(const std::vector<StrategyIssue>& v, const std::string& rule) {
  for (const auto& i : v)
    if (i.rule == rule) return i.message;
  return "<no issue " + rule + ">";
}
int count(const std::vector<StrategyIssue>& v, const std::string& rule) {
  int n = 0;
  for (const auto& i : v) n += i.rule == rule;
  return n;
}

}  // namespace

TEST(ShardingPlan, GlobMatchesWholeSegments) {
  EXPECT_TRUE(ShardingPlan::globMatch("blocks.*.attn.to_q", "blocks.12.attn.to_q"));
  EXPECT_FALSE(
      ShardingPlan::globMatch("blocks.*.attn.to_q", "blocks.1.2.attn.to_q"));  // * is one segment
  EXPECT_FALSE(ShardingPlan::globMatch("blocks.*.attn.to_q", "blocks.1.attn.to_qk"));
  EXPECT_FALSE(ShardingPlan::globMatch("blocks.*.attn.to_q", "xblocks.1.attn.to_q"));
  EXPECT_FALSE(ShardingPlan::globMatch("proj_out", "single.0.proj_out"));
  EXPECT_TRUE(ShardingPlan::globMatch("*.*", "a.b"));
  EXPECT_FALSE(ShardingPlan::globMatch("*", "a.b"));
  const ShardingPlan p = plan(16, 64);
  ASSERT_NE(p.match("blocks.0.ff.net.2"), nullptr);
  EXPECT_EQ(p.match("blocks.0.ff.net.2")->style, ParallelStyle::Rowwise);
  EXPECT_EQ(p.match("blocks.0.ff.net.2.weight"), nullptr);  // a module path, not a parameter name
  EXPECT_EQ(p.match("embed"), nullptr);
}

TEST(ShardingPlan, FirstMatchingRuleWins) {
  ShardingPlan p({{"a.*.x", ParallelStyle::Rowwise, {}}, {"a.0.x", ParallelStyle::Colwise, {}}});
  EXPECT_EQ(p.match("a.0.x")->style, ParallelStyle::Rowwise);
}

TEST(ShardingPlan, RulesAreCheckedWhenAdded) {
  ShardingPlan p;
  EXPECT_THROW(p.add({"", ParallelStyle::Colwise, {}}), std::invalid_argument);
  EXPECT_THROW(p.add({"a..b", ParallelStyle::Colwise, {}}), std::invalid_argument);
  EXPECT_THROW(p.add({"a", ParallelStyle::PackedRowwise, {}}), std::invalid_argument);
  EXPECT_THROW(p.add({"a", ParallelStyle::PackedRowwise, {4, 0}}), std::invalid_argument);
  EXPECT_THROW(p.add({"a", ParallelStyle::Colwise, {4}}), std::invalid_argument);
  // Only colwise styles split outputs, so only they can gather them.
  EXPECT_THROW(p.add({"a", ParallelStyle::Rowwise, {}, 0, true}), std::invalid_argument);
  EXPECT_THROW(p.add({"a", ParallelStyle::PackedRowwise, {4, 4}, 0, true}), std::invalid_argument);
  EXPECT_NO_THROW(p.add({"a", ParallelStyle::Colwise, {}, 0, true}));
  EXPECT_NO_THROW(p.add({"b", ParallelStyle::PackedColwise, {4, 4}, 0, true}));
  EXPECT_THAT(p.describe(), HasSubstr("a: ColwiseParallel (output gathered)"));
  // A gathered rule shards its weight like any colwise rule.
  const ShardSpec s = p.shardSpec("a.weight", {8, 3}, 1, 2);
  EXPECT_EQ(s.dim, 0);
  EXPECT_EQ(s.localShape({8, 3}), (std::vector<int64_t>{4, 3}));
}

TEST(ShardingPlan, ShardSpecPerStyle) {
  const int64_t C = 16, M = 64;
  const ShardingPlan p = plan(C, M);
  // Colwise: weight and bias on dim 0.
  ShardSpec s = p.shardSpec("blocks.1.attn.to_q.weight", {C, C}, 1, 4);
  EXPECT_EQ(s.dim, 0);
  EXPECT_EQ(s.part, 1);
  EXPECT_EQ(s.parts, 4);
  EXPECT_EQ(s.localShape({C, C}), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(s.ranges({C, C}), (std::vector<std::pair<int64_t, int64_t>>{{4, 4}}));
  s = p.shardSpec("blocks.1.attn.to_q.bias", {C}, 3, 4);
  EXPECT_EQ(s.dim, 0);
  EXPECT_EQ(s.ranges({C}), (std::vector<std::pair<int64_t, int64_t>>{{12, 4}}));
  // Rowwise: weight dim 1, bias replicated.
  s = p.shardSpec("blocks.0.ff.net.2.weight", {C, M}, 2, 4);
  EXPECT_EQ(s.dim, 1);
  EXPECT_EQ(s.localShape({C, M}), (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(s.ranges({C, M}), (std::vector<std::pair<int64_t, int64_t>>{{32, 16}}));
  EXPECT_TRUE(p.shardSpec("blocks.0.ff.net.2.bias", {C}, 2, 4).replicated());
  // Packed rowwise: each block split separately.
  s = p.shardSpec("single.0.proj_out.weight", {C, C + M}, 1, 2);
  EXPECT_EQ(s.dim, 1);
  EXPECT_EQ(s.blocks, (std::vector<int64_t>{C, M}));
  EXPECT_EQ(s.ranges({C, C + M}),
            (std::vector<std::pair<int64_t, int64_t>>{{8, 8}, {16 + 32, 32}}));
  EXPECT_EQ(s.localShape({C, C + M}), (std::vector<int64_t>{16, 40}));
  EXPECT_TRUE(p.shardSpec("single.0.proj_out.bias", {C}, 1, 2).replicated());
  // Packed colwise: bias follows the blocks too.
  ShardingPlan pc({{"gate_up", ParallelStyle::PackedColwise, {6, 6}}});
  s = pc.shardSpec("gate_up.bias", {12}, 1, 3);
  EXPECT_EQ(s.ranges({12}), (std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {8, 2}}));
  // Not in the plan, other leaves, tp 1: replicated.
  EXPECT_TRUE(p.shardSpec("embed.weight", {C, 8}, 1, 4).replicated());
  EXPECT_TRUE(p.shardSpec("blocks.0.attn.to_q.weight_scale", {1}, 1, 4).replicated());
  EXPECT_TRUE(p.shardSpec("blocks.0.attn.to_q.weight", {C, C}, 0, 1).replicated());
  // Errors: rank range, indivisible, wrong block sum, missing dim.
  EXPECT_THROW(p.shardSpec("blocks.0.attn.to_q.weight", {C, C}, 4, 4), std::invalid_argument);
  EXPECT_THROW(p.shardSpec("blocks.0.attn.to_q.weight", {C, C}, 0, 3), std::invalid_argument);
  EXPECT_THROW(p.shardSpec("single.0.proj_out.weight", {C, C + M + 2}, 0, 2),
               std::invalid_argument);
  EXPECT_THROW(p.shardSpec("blocks.0.ff.net.2.weight", {C}, 0, 2), std::invalid_argument);
}

TEST(ShardingPlan, ValidateGroupsFailuresAndNamesPatterns) {
  const int64_t C = 16, M = 60;  // 60 % 8 != 0, 16 % 8 == 0
  const auto issues = plan(C, M).validate(table(C, M), 8);
  // Heads: 4 % 8.
  EXPECT_THAT(messageOf(issues, "tp_heads"),
              HasSubstr("tp_degree 8 does not divide num_attention_heads 4 (each tensor-parallel "
                        "rank owns a whole number of heads)"));
  // ff.net.0.proj (colwise dim 0) and ff.net.2 (rowwise dim 1) both have 60: two groups, one per
  // style/dimension, each naming its pattern once although two blocks match; the packed block 1.
  ASSERT_EQ(count(issues, "tp_shard"), 3) << issues.size();
  std::vector<std::string> shard;
  for (const auto& i : issues)
    if (i.rule == "tp_shard") shard.push_back(i.message);
  EXPECT_EQ(shard[0],
            "tp_degree 8 does not divide 60, the size of dimension 0 (ColwiseParallel) of "
            "blocks.*.ff.net.0.proj");
  EXPECT_EQ(shard[1],
            "tp_degree 8 does not divide 60, the size of dimension 1 (RowwiseParallel) of "
            "blocks.*.ff.net.2");
  EXPECT_EQ(shard[2],
            "tp_degree 8 does not divide 60, the size of block 1 of [16, 60] on dimension 1 "
            "(PackedRowwiseParallel) of single.*.proj_out");
  // Grouping: two colwise rules with the same size make one message naming both patterns.
  ShardingPlan two({{"blocks.*.attn.to_q", ParallelStyle::Colwise, {}},
                    {"blocks.*.ff.net.0.proj", ParallelStyle::Colwise, {}}});
  const auto g = two.validate(table(12, 12), 8);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].message,
            "tp_degree 8 does not divide 12, the size of dimension 0 (ColwiseParallel) of "
            "blocks.*.attn.to_q, blocks.*.ff.net.0.proj");
  // Divisible: nothing.
  EXPECT_TRUE(plan(C, 64).validate(table(C, 64), 4).empty());
  EXPECT_TRUE(plan(C, M).validate(table(C, M), 1).empty());
}

TEST(ShardingPlan, StaleRuleIsAnError) {
  ShardingPlan p = plan(16, 64);
  p.add({"blocks.*.attn.to_k", ParallelStyle::Colwise, {}});  // the model has no to_k
  for (int tp : {1, 2}) {
    const auto issues = p.validate(table(16, 64), tp);
    ASSERT_EQ(issues.size(), 1u) << tp;
    EXPECT_EQ(issues[0].rule, "tp_plan_stale");
    EXPECT_THAT(issues[0].message, HasSubstr("1 rule matching no parameter of the model"));
    EXPECT_THAT(issues[0].message, HasSubstr("blocks.*.attn.to_k"));
  }
  // Blocks that do not add up to the parameter's dimension.
  const auto bad = plan(16, 60).validate(table(16, 64), 2);
  EXPECT_THAT(messageOf(bad, "tp_plan_shape"),
              HasSubstr("rule 'single.*.proj_out' (PackedRowwiseParallel) declares blocks [16, 60] "
                        "adding up to 76, but "
                        "dimension 1 of single.0.proj_out.weight has size 80"));
}

TEST(ShardingPlan, BytesPerRankClosedForm) {
  const int64_t C = 16, M = 64;
  const ParameterTable t = table(C, M);
  const ShardingPlan p = plan(C, M);
  int64_t total = 0;
  for (const auto& i : t) total += i.numel();
  // Sharded per double block: to_q W+b, ff0 W+b (colwise), to_out W, ff2 W (rowwise); proj_out W.
  const int64_t shardedPerBlock = (C * C + C) + (M * C + M) + C * C + C * M;
  const int64_t sharded = 2 * shardedPerBlock + C * (C + M);
  for (int tp : {1, 2, 4}) {
    const uint64_t expect =
        static_cast<uint64_t>((total - sharded) + sharded / tp) * 4;  // float32 compute
    EXPECT_EQ(p.bytesPerRank(t, tp, 4), expect) << tp;
  }
  EXPECT_EQ(p.bytesPerRank(t, 1, 0), static_cast<uint64_t>(total) * 2);  // stored BF16
  EXPECT_THROW(p.bytesPerRank(t, 0, 4), std::invalid_argument);
}

TEST(ShardingPlan, ChangingOneRuleChangesShardingValidationAndBytesTogether) {
  const int64_t C = 16, M = 60;
  const ParameterTable t = table(C, M);
  ShardingPlan colwise({{"blocks.*.ff.net.0.proj", ParallelStyle::Colwise, {}}});
  ShardingPlan replicated(
      {{"blocks.*.attn.to_q", ParallelStyle::Colwise, {}}});  // ff.net.0.proj dropped
  EXPECT_EQ(colwise.shardSpec("blocks.0.ff.net.0.proj.weight", {M, C}, 0, 2).dim, 0);
  EXPECT_TRUE(replicated.shardSpec("blocks.0.ff.net.0.proj.weight", {M, C}, 0, 2).replicated());
  EXPECT_EQ(count(colwise.validate(t, 8), "tp_shard"), 1);
  EXPECT_EQ(count(replicated.validate(t, 8), "tp_shard"), 0);
  const uint64_t bc = colwise.bytesPerRank(t, 2, 4), br = replicated.bytesPerRank(t, 2, 4);
  // Each side shards a different set: ff0 (2 x (M*C + M)) versus to_q (2 x (C*C + C)), halved.
  EXPECT_EQ(static_cast<int64_t>(br) - static_cast<int64_t>(bc),
            ((M * C + M) - (C * C + C)) * 2 / 2 * 4);
}

TEST(ParameterTable, AddFindAndErrors) {
  ParameterTable t;
  t.add({"a.weight", {2, 3}, "F32", 4});
  t.add({"a.bias", {2}, "F32", 4});
  EXPECT_EQ(t.size(), 2u);
  ASSERT_NE(t.find("a.weight"), nullptr);
  EXPECT_EQ(t.find("a.weight")->numel(), 6);
  EXPECT_FALSE(t.contains("b.weight"));
  EXPECT_EQ(t.begin()->name, "a.weight");  // declaration order
  EXPECT_THROW(t.add({"a.weight", {1}, "F32", 4}), std::invalid_argument);
  EXPECT_THROW(t.add({"", {1}, "F32", 4}), std::invalid_argument);
  EXPECT_THROW(t.add({"c", {-1}, "F32", 4}), std::invalid_argument);
  EXPECT_THROW(t.add({"c", {1}, "F32", 0}), std::invalid_argument);
}

TEST(ShardingPlan, Describe) {
  const auto d = plan(16, 64).describe();
  EXPECT_THAT(d, HasSubstr("5 rules"));
  EXPECT_THAT(d, HasSubstr("single.*.proj_out: PackedRowwiseParallel blocks [16, 64]"));
  EXPECT_THAT(d, HasSubstr("tp_degree divides num_attention_heads 4"));
}

// shardWhenDivides: a rule (e.g. key/value projections of a grouped-query attention with fewer
// KV heads than ranks) that shards only when tp divides its count and otherwise replicates.
TEST(ShardingPlan, ShardWhenDividesReplicatesTheRuleOtherwise) {
  ParameterTable t;
  t.add({"blocks.0.kv.weight", {8, 4}, "F32", 4});  // 2 "heads" of 4 rows
  t.add({"blocks.0.q.weight", {16, 4}, "F32", 4});
  ShardingPlan p;
  p.add({"blocks.*.q", ParallelStyle::Colwise, {}});
  p.add({"blocks.*.kv", ParallelStyle::Colwise, {}, 2});
  EXPECT_TRUE(p.validate(t, 2).empty());
  EXPECT_TRUE(p.validate(t, 4).empty());  // kv replicated at 4, not an error
  EXPECT_EQ(p.shardSpec("blocks.0.kv.weight", {8, 4}, 1, 2).dim, 0);
  EXPECT_TRUE(p.shardSpec("blocks.0.kv.weight", {8, 4}, 1, 4).replicated());
  EXPECT_FALSE(p.shardSpec("blocks.0.q.weight", {16, 4}, 1, 4).replicated());
  EXPECT_EQ(p.bytesPerRank(t, 2, 4), static_cast<uint64_t>((32 / 2 + 64 / 2) * 4));
  EXPECT_EQ(p.bytesPerRank(t, 4, 4), static_cast<uint64_t>((32 + 64 / 4) * 4));
  EXPECT_THAT(p.describe(), HasSubstr("blocks.*.kv: ColwiseParallel (when tp_degree divides 2, "
                                      "else replicated)"));
}

// replicateWhenNotDivisible: a component whose plan does not divide at some tp is held whole on
// every rank instead of failing validation; resolve() says so and bytesPerRank counts it whole.
TEST(ShardingPlan, ReplicateWhenNotDivisibleFallsBackToWholeComponent) {
  const int64_t C = 16, M = 64;
  const ParameterTable t = table(C, M);
  ShardingPlan p = plan(C, M);  // requires tp | 4 (heads)
  EXPECT_EQ(count(p.validate(t, 8), "tp_heads"), 1);
  p.replicateWhenNotDivisible();
  EXPECT_TRUE(p.replicatesWhenNotDivisible());
  EXPECT_TRUE(p.validate(t, 8).empty());
  EXPECT_EQ(count(p.validateStrict(t, 8), "tp_heads"), 1);
  std::string why = "stale";
  const ShardingPlan at2 = p.resolve(t, 2, &why);
  EXPECT_TRUE(why.empty());
  EXPECT_EQ(at2.rules().size(), p.rules().size());
  const ShardingPlan at8 = p.resolve(t, 8, &why);
  EXPECT_TRUE(at8.rules().empty());
  EXPECT_THAT(why, HasSubstr("tp_degree 8 does not divide num_attention_heads 4"));
  EXPECT_THAT(why, HasSubstr("replicated on every rank of the tensor-parallel group"));
  EXPECT_EQ(p.bytesPerRank(t, 8, 4), p.bytesPerRank(t, 1, 4));
  EXPECT_LT(p.bytesPerRank(t, 2, 4), p.bytesPerRank(t, 1, 4));
  // Stale rules stay errors.
  ShardingPlan stale = p;
  stale.add({"nothing.*.here", ParallelStyle::Colwise, {}});
  EXPECT_EQ(count(stale.validate(t, 8), "tp_plan_stale"), 1);
}
