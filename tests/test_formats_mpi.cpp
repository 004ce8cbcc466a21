// Single-file checkpoints under the parallel strategies (mpirun -np 2): the BFL transformer file
// (fused qkv / linear1 rows, swapped final-layer halves) loaded with tp 2 and with ulysses 2
// equals the one-rank load (1e-4), ComfyUI scaled fp8 kept in 8 bits under tp 2 equals its
// golden, and the per-rank peak host memory while loading a ~110 MB BFL file stays within the
// shard-on-load bound of test_load_memory (1.1 x shard + replicated + largest tensor + 16 MiB).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "backend/io/weight_source.h"
#include "backend/models/checkpoint_layouts.h"
#include "backend/models/flux/flux_bfl_config.h"
#include "backend/models/flux/flux_plan.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"
#include "parallel/context_parallel.h"
#include "parallel/device_mesh.h"
#include "parallel/runtime.h"
#include "parallel/strategy.h"
#include "single_file_test_util.h"
#include "tp_test_util.h"

using namespace dit;
namespace fs = std::filesystem;

namespace {

int g_rank = 0, g_world = 1;

std::string formats(const std::string& f) {
  return std::string(DITSTUDIO_FORMATS_FIXTURE) + "/" + f;
}
const SafetensorsCollection& fgoldens() {
  static SafetensorsCollection g(formats("formats_golden.safetensors"));
  return g;
}
at::Tensor fgolden(const std::string& name) { return loadTensor(fgoldens(), name, at::kFloat); }

using FileModel = test::SingleFileTransformer;

FileModel load(const std::string& file, FluxParallelism par) {
  return test::loadSingleFileTransformer(file, &test::fixtureTransformerConfig(), std::move(par));
}

at::Tensor run(const FluxTransformer2DModel& m, int k) {
  return test::runGoldenCase(m, k, fgolden);
}

double report(const std::string& what, const at::Tensor& a, const at::Tensor& b) {
  const double d = test::maxAbsDiff(a, b);
  if (g_rank == 0) std::printf("  max |diff| %-44s %.3g\n", what.c_str(), d);
  return d;
}

// Golden cases dit.0 .. dit.<cases-1>: `m`'s output against `reference(k)` within `tol`, each
// difference printed by rank 0 as "<what> dit.<k>".
void expectCases(const std::string& what, const FluxTransformer2DModel& m, int cases, double tol,
                 const std::function<at::Tensor(int)>& reference) {
  for (int k = 0; k < cases; ++k)
    EXPECT_LT(report(what + " dit." + std::to_string(k), run(m, k), reference(k)), tol) << k;
}

}  // namespace

TEST(FormatsMpi, BflTensorParallelEqualsOneRank) {
  const test::TpOverWorld group;
  const FluxParallelism& par = group.par;
  const std::string f = formats("transformer-bfl.safetensors");
  FileModel tp = load(f, par);
  FileModel one = load(f, {});
  expectCases("tp " + std::to_string(g_world) + " vs 1 rank, bfl", *tp.model, 3, 1e-4,
              [&](int k) { return run(*one.model, k); });
  // The rank really holds half the fused qkv rows: bytes loaded < the one-rank load.
  EXPECT_LT(tp.w->bytesLoaded(), one.w->bytesLoaded());
}

TEST(FormatsMpi, BflUlyssesEqualsOneRank) {
  Strategy s;
  s.world = g_world;
  s.ulysses_degree = g_world;
  DeviceMesh mesh(s);
  FluxParallelism par;
  par.cp =
      std::make_shared<ContextParallel>(mesh.group("ring"), mesh.group("ulysses"), mesh.group("cp"),
                                        ContextParallelOptions{1, g_world, false, false});
  const std::string f = formats("transformer-bfl.safetensors");
  FileModel cp = load(f, par);
  FileModel one = load(f, {});
  // Case 0: 64 image + 48 text tokens, divisible by the ulysses degree.
  expectCases("ulysses " + std::to_string(g_world) + " vs 1 rank, bfl", *cp.model, 1, 1e-4,
              [&](int k) { return run(*one.model, k); });
}

TEST(FormatsMpi, ScaledFp8TensorParallelKeeps8BitsAndMatchesGolden) {
  const test::TpOverWorld group;
  const FluxParallelism& par = group.par;
  FileModel tp = load(formats("transformer-fp8-scaled.safetensors"), par);
  expectCases("tp fp8scaled", *tp.model, 3, 1e-5,
              [](int k) { return fgolden("fp8scaled.dit." + std::to_string(k) + ".out"); });
  int f8 = 0;
  for (const auto& p : tp.model->parameters())
    if (p.info.dtype == "F8_E4M3") ++f8;
  // The file's 36 F8 tensors are 50 diffusers parameters (fused qkv -> 3, linear1 -> 4 parts).
  EXPECT_EQ(f8, 50);
}

// A ~110 MB BFL file made from the fixture's key list with the width scaled 64 -> 512 (32 heads
// of 16), random values; rank 0 writes it.
std::string writeLargeBfl(const fs::path& dir) {
  SafetensorsReader r(formats("transformer-bfl.safetensors"));
  const int64_t D = 512;
  std::map<std::string, RawTensor> out;
  uint32_t state = 12345;
  for (const auto& k : r.names()) {
    const TensorInfo& i = r.info(k);
    std::vector<int64_t> shape = i.shape;
    for (size_t d = 0; d < shape.size(); ++d) {
      if ((k == "time_in.in_layer.weight" || k == "guidance_in.in_layer.weight") && d == 1)
        continue;  // 256 sinusoidal channels
      const int64_t v = shape[d];
      if (v % 64 == 0 && v >= 64 && v <= 448) shape[d] = v / 64 * D;
    }
    int64_t n = 1;
    for (int64_t v : shape) n *= v;
    RawTensor t{DType::F32, shape, std::vector<uint8_t>(static_cast<size_t>(n) * 4)};
    float* f = reinterpret_cast<float*>(t.bytes.data());
    const bool norm = k.find("norm") != std::string::npos;
    for (int64_t j = 0; j < n; ++j) {
      state = state * 1664525u + 1013904223u;
      f[j] = norm ? 1.0f : (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.04f;
    }
    out.emplace(k, std::move(t));
  }
  const std::string file = (dir / "large-bfl.safetensors").string();
  writeSafetensors(file, out);
  return file;
}

TEST(FormatsMpi, BflShardOnLoadPeakMemory) {
  char path[4096] = {0};
  fs::path dir;
  if (g_rank == 0) {
    std::string templ = (fs::temp_directory_path() / "ditstudio_formats_mem_XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir = templ;
    std::snprintf(path, sizeof path, "%s", writeLargeBfl(dir).c_str());
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
  const std::string file = path;
  SafetensorsReader r(file);
  const FluxTransformerConfig cfg = fluxConfigFromBfl(r, "", &test::fixtureTransformerConfig());
  ASSERT_EQ(cfg.num_attention_heads, 32);
  const ShardingPlan plan = fluxShardingPlan(cfg);
  const ParameterTable table = fluxParameterTable(cfg);
  const int64_t total = static_cast<int64_t>(plan.bytesPerRank(table, 1, 4));
  const int64_t perRank = static_cast<int64_t>(plan.bytesPerRank(table, g_world, 4));
  const int64_t sharded = (total - perRank) * g_world / (g_world - 1);
  const int64_t replicated = total - sharded, shard = sharded / g_world;
  int64_t largest = 0;
  for (const auto& k : r.names()) largest = std::max<int64_t>(largest, r.info(k).nbytes());
  const int64_t bound =
      static_cast<int64_t>(1.1 * shard) + replicated + largest + (int64_t(16) << 20);

  const test::TpOverWorld group;
  const FluxParallelism& par = group.par;
  MPI_Barrier(MPI_COMM_WORLD);
  ::malloc_trim(0);
  ASSERT_TRUE(resetPeakResidentSet());
  const int64_t before = static_cast<int64_t>(residentSetBytes());
  int64_t bytes = 0, growth = 0;
  {
    const CheckpointInfo info = inspectCheckpoint(file);
    auto w = WeightSource::fromLayout(componentLayout(r, info.require("transformer", "--model")),
                                      at::kFloat, at::kCPU);
    FluxTransformer2DModel m(cfg, *w, par);
    bytes = static_cast<int64_t>(w->bytesLoaded());
    growth = static_cast<int64_t>(peakResidentSetBytes()) - before;
  }
  std::printf(
      "[rank %d] BFL %.1f MiB: weight %.2f MiB per rank (expected %.2f), peak growth %.2f MiB, "
      "bound %.2f MiB (1.1 x shard %.2f + replicated %.2f + largest %.2f + 16)\n",
      g_rank, total / 1048576.0, bytes / 1048576.0, perRank / 1048576.0, growth / 1048576.0,
      bound / 1048576.0, shard / 1048576.0, replicated / 1048576.0, largest / 1048576.0);
  std::fflush(stdout);
  EXPECT_EQ(bytes, perRank);
  EXPECT_LE(growth, bound);
  EXPECT_GE(growth, perRank * 9 / 10);
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) fs::remove_all(dir);
}

int main(int argc, char** argv) {
  initRuntime(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  g_rank = worldRank();
  g_world = worldSize();
  if (g_rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  finalizeRuntime();
  return any;
}
