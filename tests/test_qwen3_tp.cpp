// Qwen3 text encoder (FLUX.2 [klein]) under tensor parallel, run with mpirun -np 2 and -np 4 over
// the whole world: tp 2 shards q/o/gate/up/down (the single KV head keeps k/v replicated) and must
// equal one rank within 1e-4 while holding the plan's bytesPerRank; tp 4 does not divide the 2
// query heads, so the whole encoder is replicated on every rank (and says so), same output.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <memory>
#include <string>

#include "backend/io/weight_source.h"
#include "backend/models/text_encoders/modeling_qwen3.h"
#include "backend/models/text_encoders/qwen3_plan.h"
#include "backend/tokenizers/qwen2_tokenizer.h"
#include "golden_util.h"
#include "parallel/process_group_mpi.h"

using namespace dit;
using dit::test::fixtureDir;
using dit::test::golden;
using dit::test::goldenJson;

namespace {

int worldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

TEST(Qwen3TensorParallel, MatchesOneRankAndHoldsItsShare) {
  const auto cfg = loadQwen3Config(fixtureDir() + "/text_encoder/config.json");
  const auto tok = Qwen2Tokenizer::fromFolder(fixtureDir() + "/tokenizer");
  auto group = std::make_shared<ProcessGroupMPI>(MPI_COMM_WORLD, "tp");
  const int tp = group->size();
  auto w1 = WeightSource::fromFolder(fixtureDir() + "/text_encoder", "model", at::kFloat,
                                     c10::Device(c10::kCPU));
  const Qwen3Model single(cfg, *w1, nullptr, 27);
  auto w = WeightSource::fromFolder(fixtureDir() + "/text_encoder", "model", at::kFloat,
                                    c10::Device(c10::kCPU));
  const uint64_t readBefore = w->bytesLoaded();
  const Qwen3Model sharded(cfg, *w, group, 27);
  const auto table = qwen3ParameterTable(cfg, 27, false);
  const auto plan = qwen3ShardingPlan(cfg);
  const uint64_t expected = plan.bytesPerRank(table, tp, 4);
  const double ratio =
      static_cast<double>(sharded.weightBytes()) / static_cast<double>(single.weightBytes());
  if (worldRank() == 0)
    std::printf(
        "tp %d: %llu of %llu weight bytes per rank (ratio %.4f), read %llu; %s\n", tp,
        static_cast<unsigned long long>(sharded.weightBytes()),
        static_cast<unsigned long long>(single.weightBytes()), ratio,
        static_cast<unsigned long long>(w->bytesLoaded() - readBefore),
        sharded.replicatedReason().empty() ? "sharded" : sharded.replicatedReason().c_str());
  EXPECT_EQ(sharded.weightBytes(), expected);
  if (tp == 2) {
    EXPECT_TRUE(sharded.replicatedReason().empty()) << sharded.replicatedReason();
    // q/o/gate/up/down halve; embeddings, k/v (1 KV head) and norms stay whole.
    EXPECT_GT(ratio, 0.5);
    EXPECT_LT(ratio, 0.7);
    EXPECT_LT(w->bytesLoaded() - readBefore, single.weightBytes());  // shard-on-load
  } else if (tp == 4) {
    EXPECT_EQ(sharded.weightBytes(), single.weightBytes());
    EXPECT_NE(sharded.replicatedReason().find("does not divide num_attention_heads 2"),
              std::string::npos)
        << sharded.replicatedReason();
    EXPECT_NE(sharded.replicatedReason().find("replicated on every rank"), std::string::npos);
  }
  const auto& prompts = goldenJson()["tokenization"]["prompts"];
  for (int i : {0, 5, 12}) {
    const std::string p = prompts[i]["prompt"].get<std::string>();
    const auto a = qwen3PromptEmbeds(tok, sharded, p);
    const auto b = qwen3PromptEmbeds(tok, single, p);
    const double d = (a - b).abs().max().item<double>();
    const double g =
        (a[0] - golden("enc.prompt_embeds." + std::to_string(i))).abs().max().item<double>();
    if (worldRank() == 0)
      std::printf("prompt %d: tp %d vs one rank max abs diff %.3g, vs golden %.3g\n", i, tp, d, g);
    EXPECT_LE(d, 1e-4) << "prompt " << i;
    EXPECT_LE(g, 1e-4 + 1e-5 * 11.3) << "prompt " << i;
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (worldRank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
