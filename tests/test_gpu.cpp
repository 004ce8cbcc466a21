// GPU checks (ctest -L gpu; registered only on CUDA builds, run on the GPU machine):
//  - the fixture's goldens on CUDA in float32 (TF32 off) within 1e-3, and in bfloat16 within the
//    documented bf16 tolerance (0.08 absolute on latents/images in [0,1] after 2-4 steps; bf16
//    has 8 mantissa bits, ~4e-3 relative per op, and errors compound over the layers);
//  - ProcessGroupNCCL at world size 1 (one GPU): allreduce, allgather, all-to-all, broadcast.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include "backend/pipelines/flux/pipeline_flux.h"
#include "golden_util.h"
#include "parallel/process_group_mpi.h"
#include "parallel/process_group_nccl.h"

using namespace dit;
using namespace dit::test;

namespace {
constexpr double kFp32Tol = 1e-3;
constexpr double kBf16Tol = 8e-2;

PipelineInputs runParams(int r) {
  const auto& c = goldenJson()["cases"]["runs"][r];
  PipelineInputs p;
  p.prompt = c["prompt"];
  p.negative_prompt = c.value("negative_prompt", "");
  p.options["true_cfg_scale"] = c.value("true_cfg_scale", 1.0);
  p.seed = c["seed"];
  p.height = c["height"];
  p.width = c["width"];
  p.steps = c["steps"];
  p.guidance = c["guidance"];
  p.max_sequence_length = goldenJson()["max_sequence_length"];
  return p;
}

void checkRuns(at::ScalarType dtype, double tol) {
  ASSERT_TRUE(at::hasCUDA()) << "no CUDA device: the gpu label must run on the GPU machine";
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  PipelineOptions o;
  o.dtype = dtype;
  o.device = "cuda:0";
  FluxPipeline pipe(ModelFolder::open(fixtureDir()), o);
  for (int r = 0; r < 3; ++r) {
    auto res = pipe.generate(runParams(r));
    const std::string k = "run." + std::to_string(r) + ".";
    const double dl = maxAbsDiff(res.final_latents, golden(k + "final_latents"));
    const double di = maxAbsDiff(res.image, golden(k + "image"));
    std::printf("  %s %s final_latents %.3g image %.3g\n", computeDTypeName(dtype), k.c_str(), dl,
                di);
    EXPECT_LT(dl, tol) << k;
    EXPECT_LT(di, tol) << k;
  }
  // One transformer forward per golden case.
  at::NoGradGuard ng;
  for (int c = 0; c < 3; ++c) {
    const std::string p = "dit." + std::to_string(c) + ".in.";
    at::Tensor out = pipe.transformer().forward(
        golden(p + "hidden_states"), golden(p + "encoder_hidden_states"),
        golden(p + "pooled_projections"), golden(p + "timestep"), golden(p + "img_ids"),
        golden(p + "txt_ids"), golden(p + "guidance"));
    const double d = maxAbsDiff(out, golden("dit." + std::to_string(c) + ".out"));
    std::printf("  %s dit.%d %.3g\n", computeDTypeName(dtype), c, d);
    EXPECT_LT(d, tol * 2);
  }
}
}  // namespace

TEST(Gpu, GoldensFloat32) { checkRuns(at::kFloat, kFp32Tol); }
TEST(Gpu, GoldensBFloat16) { checkRuns(at::kBFloat16, kBf16Tol); }

TEST(Gpu, NcclCollectivesWorldOne) {
  ASSERT_TRUE(kHaveNCCL) << "built without NCCL";
  ASSERT_TRUE(at::hasCUDA());
  auto mpi = std::make_shared<ProcessGroupMPI>(MPI_COMM_WORLD, "world");
  auto pg = makeNCCLProcessGroup(mpi, 0);
  ASSERT_EQ(pg->backend(), "nccl");
  auto opt = at::TensorOptions().device(at::kCUDA, 0);
  at::Tensor t = at::arange(8, opt.dtype(at::kFloat));
  pg->allreduce(t)->wait();
  EXPECT_TRUE(t.cpu().equal(at::arange(8, at::kFloat)));
  at::Tensor b = at::full({4}, 3.0, opt.dtype(at::kBFloat16));
  pg->allreduce(b)->wait();
  EXPECT_EQ(b.sum().item<float>(), 12.0f);
  at::Tensor g = pg->allgather(at::ones({2, 3}, opt), 0)->result();
  EXPECT_EQ(g.sizes(), (at::IntArrayRef{2, 3}));
  auto outs = pg->allToAll({at::full({5}, 7.0, opt)}, {{5}})->results();
  EXPECT_EQ(outs[0].sum().item<float>(), 35.0f);
  at::Tensor c = at::full({3}, 2, opt.dtype(at::kLong));
  pg->broadcast(c, 0)->wait();
  EXPECT_EQ(c.sum().item<int64_t>(), 6);
  EXPECT_GT(pg->bytesSent(), 0u);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
