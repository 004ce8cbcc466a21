// Strategy validation rules and messages (parallel/strategy.h, DESIGN.md section 3).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "app/protocol/protocol.h"
#include "parallel/strategy.h"
#include "parallel/tensor_parallel/sharding_plan.h"
#include "strategy_util.h"

using dit::ModelDims;
using dit::RequestDims;
using dit::Strategy;
using dit::StrategyIssue;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

// A FLUX.1-shaped test model (one double and one single block, diffusers names) with its
// tensor-parallel plan, built here: parallel/ itself knows no model.
ModelDims model(int heads, int headDim, int64_t mlp) {
  ModelDims m;
  m.num_attention_heads = heads;
  m.attention_head_dim = headDim;
  m.vae_scale_factor = 8;
  const int64_t C = int64_t{heads} * headDim;
  auto t = std::make_shared<dit::ParameterTable>();
  auto lin = [&](const std::string& p, int64_t in, int64_t out) {
    t->add({p + ".weight", {out, in}, "BF16", 2});
    t->add({p + ".bias", {out}, "BF16", 2});
  };
  lin("context_embedder", 4096, C);
  for (const char* n : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0"})
    lin(std::string("transformer_blocks.0.") + n, C, C);
  lin("transformer_blocks.0.ff.net.0.proj", C, mlp);
  lin("transformer_blocks.0.ff.net.2", mlp, C);
  lin("single_transformer_blocks.0.proj_mlp", C, mlp);
  lin("single_transformer_blocks.0.proj_out", C + mlp, C);
  using S = dit::ParallelStyle;
  auto plan = std::make_shared<dit::ShardingPlan>(std::vector<dit::ShardRule>{
      {"transformer_blocks.*.attn.to_q", S::Colwise, {}},
      {"transformer_blocks.*.attn.to_k", S::Colwise, {}},
      {"transformer_blocks.*.attn.to_v", S::Colwise, {}},
      {"transformer_blocks.*.ff.net.0.proj", S::Colwise, {}},
      {"transformer_blocks.*.attn.to_out.0", S::Rowwise, {}},
      {"transformer_blocks.*.ff.net.2", S::Rowwise, {}},
      {"single_transformer_blocks.*.proj_mlp", S::Colwise, {}},
      {"single_transformer_blocks.*.proj_out", S::PackedRowwise, {C, mlp}}});
  plan->requireDivisible("num_attention_heads", heads,
                         "each tensor-parallel rank owns a whole number of heads", "tp_heads");
  m.tensor_parallel_plan = plan;
  m.parameters = t;
  return m;
}

ModelDims flux1() { return model(24, 128, 4 * 3072); }  // FLUX.1-dev transformer/config.json

RequestDims request(int w, int h, int textLen = 512, bool trueCfg = false) {
  RequestDims r;
  r.width = w;
  r.height = h;
  r.text_len = textLen;
  r.true_cfg = trueCfg;
  return r;
}

using dit::test::strat;

bool hasRule(const std::vector<StrategyIssue>& v, const std::string& rule) {
  for (const auto& i : v)
    if (i.rule == rule) return true;
  return false;
}

std::string messageOf(const std::vector<StrategyIssue>& v, const std::string& rule) {
  for (const auto& i : v)
    if (i.rule == rule) return i.message;
  return "<no issue with rule " + rule + ": " + dit::joinIssues(v) + ">";
}

// Every message of `rule`, joined with " | ".
std::string messagesOf(const std::vector<StrategyIssue>& v, const std::string& rule) {
  std::string out;
  for (const auto& i : v)
    if (i.rule == rule) out += (out.empty() ? "" : " | ") + i.message;
  return out;
}

}  // namespace

TEST(Strategy, ValidStrategiesHaveNoIssues) {
  const auto m = flux1();
  const auto r = request(1024, 1024);
  for (const Strategy& s :
       {strat(1), strat(2, 2), strat(4, 2, 1, 2), strat(4, 1, 2, 2), strat(4, 1, 4),
        strat(4, 1, 1, 4), strat(8, 2, 2, 2), strat(2, 1, 1, 1, 1, 2)}) {
    EXPECT_TRUE(dit::validateForRequest(s, m, r).empty())
        << s.describe() << ": " << dit::joinIssues(dit::validateForRequest(s, m, r));
  }
  auto cfg = strat(2, 1, 1, 1, 2);
  EXPECT_TRUE(dit::validateForRequest(cfg, m, request(1024, 1024, 512, true)).empty());
}

TEST(Strategy, WorldMustEqualProductOfDegrees) {
  auto issues = dit::validateDegrees(strat(4, 2));
  ASSERT_TRUE(hasRule(issues, "world"));
  const auto msg = messageOf(issues, "world");
  EXPECT_THAT(msg, HasSubstr("tp_degree 2"));
  EXPECT_THAT(msg, HasSubstr("= 2 does not equal the world size 4"));
}

TEST(Strategy, DegreesAtLeastOne) {
  auto issues = dit::validateDegrees(strat(1, 0));
  ASSERT_TRUE(hasRule(issues, "degree_range"));
  EXPECT_THAT(messageOf(issues, "degree_range"), HasSubstr("tp_degree 0 must be at least 1"));
  EXPECT_FALSE(hasRule(issues, "world"));  // no product check with a zero degree
  issues = dit::validateDegrees(strat(2, 1, -1));
  EXPECT_THAT(messageOf(issues, "degree_range"), HasSubstr("ring_degree -1 must be at least 1"));
}

TEST(Strategy, CfgDegreeOneOrTwo) {
  auto issues = dit::validateDegrees(strat(3, 1, 1, 1, 3));
  ASSERT_TRUE(hasRule(issues, "cfg_degree"));
  EXPECT_THAT(messageOf(issues, "cfg_degree"), HasSubstr("cfg_degree 3"));
  EXPECT_THAT(messageOf(issues, "cfg_degree"), HasSubstr("must be 1 or 2"));
}

TEST(Strategy, UlyssesAnythingNeedsUlyssesAndNoRing) {
  auto s = strat(2, 2);
  s.ulysses_anything = true;
  auto issues = dit::validateDegrees(s);
  EXPECT_THAT(messageOf(issues, "ulysses_anything"),
              HasSubstr("ulysses_anything needs ulysses_degree > 1 (got ulysses_degree 1)"));

  s = strat(4, 1, 2, 2);
  s.ulysses_anything = true;
  issues = dit::validateDegrees(s);
  EXPECT_THAT(messageOf(issues, "ulysses_anything"),
              HasSubstr("ulysses_anything needs ring_degree 1 (got ring_degree 2"));

  s = strat(4, 1, 1, 4);
  s.ulysses_anything = true;
  EXPECT_TRUE(dit::validateDegrees(s).empty());
}

TEST(Strategy, RingAnythingNeedsRingAndNoUlysses) {
  auto s = strat(1);
  s.ring_anything = true;
  EXPECT_THAT(messageOf(dit::validateDegrees(s), "ring_anything"),
              HasSubstr("ring_anything needs ring_degree > 1 (got ring_degree 1)"));
  s = strat(4, 1, 2, 2);
  s.ring_anything = true;
  EXPECT_THAT(messageOf(dit::validateDegrees(s), "ring_anything"),
              HasSubstr("ring_anything needs ulysses_degree 1 (got ulysses_degree 2"));
  s = strat(4, 1, 4);
  s.ring_anything = true;
  EXPECT_TRUE(dit::validateDegrees(s).empty());
}

TEST(Strategy, BothAnythingModesIsAnError) {
  auto s = strat(4, 1, 1, 4);
  s.ulysses_anything = true;
  s.ring_anything = true;
  auto issues = dit::validateDegrees(s);
  EXPECT_THAT(messageOf(issues, "anything_both"),
              HasSubstr("ulysses_anything and ring_anything cannot be combined"));
}

TEST(Strategy, UnifiedNeedsFourRanks) {
  auto s = strat(2, 1, 2, 2);  // product 4 != world 2 as well
  auto issues = dit::validateDegrees(s);
  EXPECT_THAT(
      messageOf(issues, "unified"),
      HasSubstr("ring_degree 2 x ulysses_degree 2) needs at least 4 ranks, world size is 2"));
  EXPECT_FALSE(hasRule(dit::validateDegrees(strat(4, 1, 2, 2)), "unified"));
}

TEST(Strategy, TpMustDivideHeads) {
  auto issues = dit::validateForModel(strat(3, 3), flux1());
  // 24 % 3 == 0: fine. 5 does not divide 24 (nor inner_dim 3072 nor the mlp hidden 12288).
  EXPECT_FALSE(hasRule(issues, "tp_heads"));
  issues = dit::validateForModel(strat(5, 5), flux1());
  EXPECT_THAT(messageOf(issues, "tp_heads"),
              HasSubstr("tp_degree 5 does not divide num_attention_heads 24"));
  const std::string shard = messagesOf(issues, "tp_shard");
  EXPECT_THAT(
      shard,
      HasSubstr("tp_degree 5 does not divide 3072, the size of dimension 0 (ColwiseParallel) of "
                "transformer_blocks.*.attn.to_q, transformer_blocks.*.attn.to_k, "
                "transformer_blocks.*.attn.to_v"));
  EXPECT_THAT(
      shard,
      HasSubstr("tp_degree 5 does not divide 3072, the size of dimension 1 (RowwiseParallel) of "
                "transformer_blocks.*.attn.to_out.0"));
  EXPECT_THAT(
      shard,
      HasSubstr("tp_degree 5 does not divide 12288, the size of dimension 0 (ColwiseParallel) of "
                "transformer_blocks.*.ff.net.0.proj, single_transformer_blocks.*.proj_mlp"));
  EXPECT_THAT(shard, HasSubstr("block 1 of [3072, 12288] on dimension 1 (PackedRowwiseParallel) of "
                               "single_transformer_blocks.*.proj_out"));

  issues = dit::validateForModel(strat(3, 3), flux1());
  EXPECT_TRUE(issues.empty()) << dit::joinIssues(issues);
  // The exact example of the brief.
  issues = dit::validateForModel(strat(16, 16),
                                 model(24, 4, 4 * 96));  // inner 96, mlp 384: divisible by 16
  EXPECT_THAT(messageOf(issues, "tp_heads"),
              HasSubstr("tp_degree 16 does not divide num_attention_heads 24"));
  EXPECT_FALSE(hasRule(issues, "tp_shard"));  // 96 % 16 == 0, 384 % 16 == 0
}

TEST(Strategy, TpChecksEveryPackedBlockSeparately) {
  auto issues = dit::validateForModel(
      strat(3, 3), model(24, 128, 12290));  // block 1 of single proj_out not divisible by 3
  EXPECT_FALSE(hasRule(issues, "tp_heads"));
  const std::string shard = messagesOf(issues, "tp_shard");
  EXPECT_THAT(shard, Not(HasSubstr("does not divide 3072")));  // block 0 (inner_dim) is fine
  EXPECT_THAT(
      shard,
      HasSubstr(
          "tp_degree 3 does not divide 12290, the size of block 1 of [3072, 12290] on dimension 1 "
          "(PackedRowwiseParallel) of single_transformer_blocks.*.proj_out"));
}

TEST(Strategy, TensorParallelNeedsAPlan) {
  auto m = flux1();
  m.tensor_parallel_plan.reset();
  auto issues = dit::validateForModel(strat(2, 2), m);
  EXPECT_THAT(
      messageOf(issues, "tp_plan"),
      HasSubstr("tp_degree 2 is not possible: this model declares no tensor-parallel plan"));
  EXPECT_TRUE(dit::validateForModel(strat(2, 1, 1, 2), m).empty());  // no tp: no plan needed
  m = flux1();
  m.parameters.reset();
  EXPECT_THAT(messageOf(dit::validateForModel(strat(2, 2), m), "tp_plan"),
              HasSubstr("parameters are unknown"));
}

TEST(Strategy, StalePlanIsRefused) {
  auto m = flux1();
  auto plan = std::make_shared<dit::ShardingPlan>(*m.tensor_parallel_plan);
  plan->add({"transformer_blocks.*.attn.add_q_proj",
             dit::ParallelStyle::Colwise,
             {}});  // not in this model
  m.tensor_parallel_plan = plan;
  const auto issues = dit::validateForModel(strat(2, 2), m);
  EXPECT_THAT(messageOf(issues, "tp_plan_stale"),
              HasSubstr("transformer_blocks.*.attn.add_q_proj"));
}

TEST(Strategy, UlyssesMustDivideHeadsPerTpRank) {
  auto issues = dit::validateForModel(strat(5, 1, 1, 5), flux1());
  EXPECT_THAT(
      messageOf(issues, "ulysses_heads"),
      HasSubstr("ulysses_degree 5 does not divide the 24 attention heads per tensor-parallel rank "
                "(num_attention_heads 24 / tp_degree 1)"));
  issues = dit::validateForModel(strat(8, 2, 1, 4), flux1());  // 24 / 2 = 12 heads, 12 % 4 == 0
  EXPECT_FALSE(hasRule(issues, "ulysses_heads"));
  issues = dit::validateForModel(strat(16, 2, 1, 8), flux1());  // 12 % 8 != 0
  EXPECT_THAT(messageOf(issues, "ulysses_heads"),
              HasSubstr("the 12 attention heads per tensor-parallel rank"));
  auto s = strat(5, 1, 1, 5);
  s.ulysses_anything = true;
  EXPECT_FALSE(hasRule(dit::validateForModel(s, flux1()), "ulysses_heads"));
}

TEST(Strategy, StrictContextParallelNeedsDivisibleTokens) {
  // The published case: 1008x1008 gives 63x63 = 3969 image tokens.
  auto issues = dit::validateForRequest(strat(4, 1, 1, 4), flux1(), request(1008, 1008));
  const auto msg = messageOf(issues, "ulysses_tokens");
  EXPECT_THAT(msg, HasSubstr("ulysses_degree 4"));
  EXPECT_THAT(msg, HasSubstr("text_len 512"));
  EXPECT_THAT(msg, HasSubstr("image tokens 3969"));
  EXPECT_THAT(msg, HasSubstr("1008x1008 px = 63x63 tokens"));
  EXPECT_THAT(msg, HasSubstr("divisible by 4"));
  EXPECT_THAT(msg, HasSubstr("use --ulysses-anything / --ring-anything"));

  issues = dit::validateForRequest(strat(4, 1, 4), flux1(), request(1008, 1008));
  EXPECT_THAT(messageOf(issues, "ring_tokens"),
              HasSubstr("ring_degree 4 needs text_len 512 and image tokens 3969"));

  issues = dit::validateForRequest(strat(4, 1, 2, 2), flux1(), request(1008, 1008));
  EXPECT_THAT(messageOf(issues, "cp_tokens"),
              HasSubstr("ring_degree 2 x ulysses_degree 2 (context-parallel degree 4)"));

  issues =
      dit::validateForRequest(strat(4, 1, 1, 4), flux1(), request(1024, 1024, 77));  // text 77 odd
  EXPECT_THAT(messageOf(issues, "ulysses_tokens"), HasSubstr("text_len 77"));
  EXPECT_THAT(messageOf(issues, "ulysses_tokens"), HasSubstr("text_len is not divisible by 4"));

  // The anything modes accept it.
  auto s = strat(4, 1, 1, 4);
  s.ulysses_anything = true;
  EXPECT_TRUE(dit::validateForRequest(s, flux1(), request(1008, 1008)).empty());
  s = strat(4, 1, 4);
  s.ring_anything = true;
  EXPECT_TRUE(dit::validateForRequest(s, flux1(), request(1008, 1008)).empty());
}

TEST(Strategy, CfgParallelNeedsTrueCfg) {
  auto issues =
      dit::validateForRequest(strat(2, 1, 1, 1, 2), flux1(), request(1024, 1024, 512, false));
  const auto msg = messageOf(issues, "cfg_true_cfg");
  EXPECT_THAT(msg, HasSubstr("cfg_degree 2 needs true CFG"));
  EXPECT_THAT(msg, HasSubstr("this request runs none, so one half of the ranks would idle"));
}

TEST(Strategy, WidthHeightMultiplesOfTwiceVaeScale) {
  auto issues = dit::validateForRequest(strat(1), flux1(), request(1000, 1024));
  ASSERT_EQ(issues.size(), 1u) << dit::joinIssues(issues);
  EXPECT_EQ(issues[0].rule, "size_multiple");
  EXPECT_THAT(issues[0].message,
              HasSubstr("width 1000 is not a positive multiple of 16 (2 x vae_scale_factor 8)"));
  issues = dit::validateForRequest(strat(1), flux1(), request(1024, 1000));
  EXPECT_THAT(messageOf(issues, "size_multiple"), HasSubstr("height 1000"));
}

TEST(Strategy, DataParallelIsFine) {
  EXPECT_TRUE(
      dit::validateForRequest(strat(4, 1, 1, 1, 1, 4), flux1(), request(1008, 1008)).empty());
}

TEST(Strategy, JoinIssues) {
  EXPECT_EQ(dit::joinIssues({}), "");
  EXPECT_EQ(dit::joinIssues({{"a", "first"}, {"b", "second"}}), "first; second");
}

TEST(Strategy, MeshCoordsTpInnermost) {
  auto s = strat(8, 2, 1, 2, 1, 2);
  for (int r = 0; r < 8; ++r) {
    auto c = dit::meshCoords(s, r);
    EXPECT_EQ(c[4], r % 2);
    EXPECT_EQ(c[3], (r / 2) % 2);
    EXPECT_EQ(c[2], 0);
    EXPECT_EQ(c[1], 0);
    EXPECT_EQ(c[0], r / 4);
    const int back =
        ((((c[0] * s.cfg_degree + c[1]) * s.ring_degree + c[2]) * s.ulysses_degree + c[3]) *
             s.tp_degree +
         c[4]);
    EXPECT_EQ(back, r);
  }
  auto u = strat(16, 2, 2, 2, 2);   // cfg 2, ring 2, ulysses 2, tp 2
  auto c = dit::meshCoords(u, 13);  // 13 = (((1*2+1)*2+0)*2+1)... check each digit
  EXPECT_EQ(c, (std::array<int, 5>{0, 1, 1, 0, 1}));
  EXPECT_THROW(dit::meshCoords(s, 8), std::invalid_argument);
}

TEST(Strategy, EvenSplit) {
  EXPECT_EQ(dit::evenSplit(10, 4), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(dit::evenSplit(3969, 4), (std::vector<int>{993, 992, 992, 992}));
  EXPECT_EQ(dit::evenSplit(2, 4), (std::vector<int>{1, 1, 0, 0}));
  EXPECT_THROW(dit::evenSplit(4, 0), std::invalid_argument);
}

TEST(Strategy, DescribeAndJson) {
  auto s = strat(4, 2, 1, 2);
  EXPECT_EQ(s.describe(), "4 ranks: tp 2 x ulysses 2");
  EXPECT_EQ(strat(1).describe(), "1 rank: no parallelism");
  auto a = strat(4, 1, 1, 4);
  a.ulysses_anything = true;
  a.device = "cuda";
  EXPECT_EQ(a.describe(), "4 ranks: ulysses 4 (anything) on cuda");

  nlohmann::json j = a;
  EXPECT_EQ(j["ulysses_degree"], 4);
  EXPECT_EQ(j["ulysses_anything"], true);
  EXPECT_EQ(j["world"], 4);
  Strategy b = j.get<Strategy>();
  EXPECT_EQ(b.world, 4);
  EXPECT_EQ(b.ulysses_degree, 4);
  EXPECT_TRUE(b.ulysses_anything);
  EXPECT_EQ(b.device, "cuda");

  // Without "world" the strategy fills the product of its degrees (one rule for the worker,
  // the CLI and the GUI: app/protocol/protocol.h).
  Strategy partial = nlohmann::json{{"tp_degree", 2}}.get<Strategy>();
  EXPECT_EQ(partial.tp_degree, 2);
  EXPECT_EQ(partial.world, 2);
  EXPECT_EQ(partial.device, "cpu");
}
