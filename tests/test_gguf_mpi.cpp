// GGUF checkpoints under the parallel strategies (mpirun -np 2, issue 33) on
// ../shared/fixtures/tiny-flux-gguf-A: the Q4_K_S and Q8_0 transformers loaded with tp 2 and with
// ulysses 2 equal the one-rank load within 1e-4; under tp each rank keeps only its slice of the
// quantized blocks (about half the one-rank bytes; rowwise slices that do not fall on a 256-value
// K-quant block boundary keep the covering blocks and say so); a diffusers + kohya LoRA on the
// Q8_0 file under tp 2 equals the LoRAs merged into the dequantized weights (one rank) within
// 1e-4, and switching LoRAs reads no weight again.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "backend/io/model_folder.h"
#include "backend/io/weight_source.h"
#include "backend/models/checkpoint_layouts.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/nn/lora_loader.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"
#include "gguf_test_util.h"
#include "parallel/context_parallel.h"
#include "parallel/device_mesh.h"
#include "parallel/strategy.h"
#include "single_file_test_util.h"
#include "tp_test_util.h"

using namespace dit;
namespace fs = std::filesystem;

namespace {

int g_rank = 0, g_world = 1;

const SafetensorsCollection& ggoldens() {
  static SafetensorsCollection g(test::ggufFixture("gguf/gguf_golden.safetensors"));
  return g;
}
at::Tensor ggolden(const std::string& n) { return loadTensor(ggoldens(), n, at::kFloat); }

const FluxTransformerConfig& ggufConfig() {
  static const FluxTransformerConfig c =
      fluxConfig(ModelFolder::open(test::ggufFixture("."))).transformer;
  return c;
}

using FileModel = test::SingleFileTransformer;

FileModel load(const std::string& file, FluxParallelism par) {
  return test::loadSingleFileTransformer(file, &ggufConfig(), std::move(par));
}

at::Tensor run(const FluxTransformer2DModel& m, int k) {
  return test::runGoldenCase(m, k, ggolden);
}

double report(const std::string& what, const at::Tensor& a, const at::Tensor& b) {
  const double d = test::maxOverRanks(test::maxAbsDiff(a, b));
  if (g_rank == 0) std::printf("  max |diff| %-46s %.3g\n", what.c_str(), d);
  return d;
}

}  // namespace

TEST(GgufMpi, TensorParallelEqualsOneRankAndKeepsOnlyItsBlocks) {
  const test::TpOverWorld group;
  for (const std::string type : {"Q4_K_S", "Q8_0"}) {
    FileModel tp = load(test::ggufFile(type), group.par);
    FileModel one = load(test::ggufFile(type), {});
    for (int k = 0; k < 3; ++k) {
      const at::Tensor ref = run(*one.model, k);
      EXPECT_LT(report("tp " + std::to_string(g_world) + " vs 1 rank, " + type + " dit." +
                           std::to_string(k),
                       run(*tp.model, k), ref),
                1e-4);
      // ... and the one-rank run is the golden of its type.
      EXPECT_LT(test::maxAbsDiff(ref, ggolden("dit." + std::to_string(k) + ".out." + type)), 1e-4);
    }
    // Expected from the plan: every kept weight's one-rank bytes, divided by tp when sharded.
    std::map<std::string, int64_t> oneBytes;
    for (const auto& p : one.model->parameters()) oneBytes[p.info.name] = p.heldBytes;
    int64_t expected = 0, held = 0, whole = 0;
    int notes = 0;
    for (const auto& p : tp.model->parameters()) {
      if (p.heldBytes == 0) continue;
      held += p.heldBytes;
      whole += oneBytes.at(p.info.name);
      expected += oneBytes.at(p.info.name) / (p.spec.replicated() ? 1 : p.spec.parts);
      if (!p.note.empty()) {
        ++notes;
        if (g_rank == 0) std::printf("    note %s: %s\n", p.info.name.c_str(), p.note.c_str());
      }
    }
    if (g_rank == 0)
      std::printf(
          "  %s: rank 0 keeps %lld quantized bytes (plan's slice %lld, one rank %lld); "
          "%d weights noted\n",
          type.c_str(), static_cast<long long>(held), static_cast<long long>(expected),
          static_cast<long long>(whole), notes);
    EXPECT_LT(held, whole);
    if (type == "Q8_0") {
      EXPECT_EQ(held, expected);  // 32-value blocks: every slice is aligned
      EXPECT_EQ(notes, 0);
    } else {
      // Rowwise slices cut at 128 (to_out / to_add_out, the attention part of the single
      // block's proj_out) fall inside 256-value blocks: those keep the covering blocks.
      EXPECT_GT(held, expected);
      EXPECT_LT(held, expected * 1.2);
      EXPECT_EQ(notes, 3);
    }
  }
}

TEST(GgufMpi, UlyssesEqualsOneRank) {
  Strategy s;
  s.world = g_world;
  s.ulysses_degree = g_world;
  DeviceMesh mesh(s);
  FluxParallelism par;
  par.cp =
      std::make_shared<ContextParallel>(mesh.group("ring"), mesh.group("ulysses"), mesh.group("cp"),
                                        ContextParallelOptions{1, g_world, false, false});
  for (const std::string type : {"Q4_K_S", "Q8_0"}) {
    FileModel cp = load(test::ggufFile(type), par);
    FileModel one = load(test::ggufFile(type), {});
    // Case 0: 64 image + 48 text tokens, divisible by the ulysses degree.
    EXPECT_LT(report("ulysses " + std::to_string(g_world) + " vs 1 rank, " + type + " dit.0",
                     run(*cp.model, 0), run(*one.model, 0)),
              1e-4);
  }
}

namespace {

// Random LoRA factors (seeded, the same on every rank).
at::Tensor factor(int64_t rows, int64_t cols, uint64_t seed, double std) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn({rows, cols}, gen, at::TensorOptions().dtype(at::kFloat)) * std;
}

struct LoraModule {
  std::string module;  // diffusers module path
  int64_t in, out;
};

}  // namespace

// A diffusers LoRA (to_q of the fused qkv, to_out.0 rowwise, ff.net.2 rowwise, the single block's
// packed-rowwise proj_out and fused proj_mlp, the replicated norm_out.linear) at 0.6 plus a kohya
// LoRA (double_blocks_0_img_attn_qkv split into q/k/v, alpha = r/2) at 1.0 on the Q8_0 file kept
// quantized under tp 2, against the LoRAs merged into the dequantized weights on one rank.
TEST(GgufMpi, LoraOnQ8_0TensorParallelEqualsMergedIntoDequantizedWeights) {
  const int64_t D = 256, r = 4;
  const std::vector<LoraModule> mods = {{"transformer_blocks.0.attn.to_q", D, D},
                                        {"transformer_blocks.0.attn.to_out.0", D, D},
                                        {"transformer_blocks.0.ff.net.2", 4 * D, D},
                                        {"single_transformer_blocks.0.proj_out", 5 * D, D},
                                        {"single_transformer_blocks.0.proj_mlp", D, 4 * D},
                                        {"norm_out.linear", D, 2 * D}};
  std::map<std::string, at::Tensor> diffusersFile, kohyaFile;
  uint64_t seed = 100;
  for (const auto& m : mods) {
    diffusersFile["transformer." + m.module + ".lora_A.weight"] = factor(r, m.in, seed++, 0.05);
    diffusersFile["transformer." + m.module + ".lora_B.weight"] = factor(m.out, r, seed++, 0.05);
  }
  const std::string kq = "lora_unet_double_blocks_0_img_attn_qkv";
  kohyaFile[kq + ".lora_down.weight"] = factor(r, D, seed++, 0.05);
  kohyaFile[kq + ".lora_up.weight"] = factor(3 * D, r, seed++, 0.05);
  kohyaFile[kq + ".alpha"] = at::full({}, static_cast<double>(r) / 2, at::kFloat);
  const fs::path dir = fs::temp_directory_path() / "ditstudio-gguf-mpi-lora";
  const std::string fd = (dir / "lora-diffusers.safetensors").string();
  const std::string fk = (dir / "lora-kohya.safetensors").string();
  if (g_rank == 0) {
    fs::create_directories(dir);
    saveTensors(fd, diffusersFile);
    saveTensors(fk, kohyaFile);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  const std::string file = test::ggufFile("Q8_0");
  const test::TpOverWorld group;
  FileModel tp = load(file, group.par);
  const at::Tensor base0 = run(*tp.model, 0);

  // Reference: every weight dequantized (ggml's values), the LoRAs merged in, one dense rank.
  FileModel shapes = load(file, {});
  std::map<std::string, at::Tensor> merged;
  for (const auto& [name, m] : shapes.layout->tensors) merged[name] = shapes.w->get(name, m.shape);
  for (const auto& m : mods)
    merged[m.module + ".weight"] +=
        0.6 * at::mm(diffusersFile["transformer." + m.module + ".lora_B.weight"],
                     diffusersFile["transformer." + m.module + ".lora_A.weight"]);
  const at::Tensor kd =
      1.0 * (static_cast<double>(r) / 2 / r) *
      at::mm(kohyaFile[kq + ".lora_up.weight"], kohyaFile[kq + ".lora_down.weight"]);
  const char* qkv[] = {"to_q", "to_k", "to_v"};
  for (int i = 0; i < 3; ++i)
    merged[std::string("transformer_blocks.0.attn.") + qkv[i] + ".weight"] +=
        kd.narrow(0, i * D, D);
  auto refSource = WeightSource::fromTensors(merged, "merged reference");
  FluxTransformer2DModel ref(ggufConfig(), *refSource);

  auto& targets = tp.model->loraTargets();
  const auto pd = targets.prepare(loadLoraAdapter(fd, tp.model->kohyaLoraMapping()));
  const auto pk = targets.prepare(loadLoraAdapter(fk, tp.model->kohyaLoraMapping()));
  const uint64_t readsBefore = WeightSource::processReads();
  targets.apply({{pk, 1.0}, {pd, 0.6}});
  for (int k = 0; k < 3; ++k) {
    const at::Tensor want = run(ref, k);
    const at::Tensor got = run(*tp.model, k);
    const double effect = test::maxAbsDiff(want, ggolden("dit." + std::to_string(k) + ".out.Q8_0"));
    if (g_rank == 0) std::printf("  LoRA effect on dit.%d: %.3g\n", k, effect);
    EXPECT_GT(effect, 1e-2);  // the LoRAs really change the output
    EXPECT_LT(report("tp LoRA on Q8_0 vs merged dequantized, dit." + std::to_string(k), got, want),
              1e-4);
  }
  // Switching without reload: off gives the base output back bit for bit, on again the same.
  targets.clear();
  EXPECT_EQ(report("tp LoRA cleared vs base, dit.0", run(*tp.model, 0), base0), 0.0);
  targets.apply({{pd, 0.6}, {pk, 1.0}});
  EXPECT_LT(report("tp LoRA re-applied vs merged, dit.0", run(*tp.model, 0), run(ref, 0)), 1e-4);
  EXPECT_EQ(WeightSource::processReads(), readsBefore);  // no weight read again
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) fs::remove_all(dir);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  ::testing::InitGoogleTest(&argc, argv);
  if (g_rank != 0) {
    auto& l = ::testing::UnitTest::GetInstance()->listeners();
    delete l.Release(l.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
