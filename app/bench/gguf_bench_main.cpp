// ditstudio-gguf-bench (issue 33): in one run, step time and resident weight bytes per rank of a
// FLUX.1 transformer from its BF16 diffusers safetensors folder and from GGUF files of the same
// transformer (kept quantized), under tensor parallelism over every rank of mpirun (tp_degree =
// world size; 1 without mpirun), float32 compute on the CPU.
//
//   mpirun -np 2 ditstudio-gguf-bench --folder FIXTURE/transformer
//       --gguf FIXTURE/gguf/transformer-Q8_0.gguf --gguf FIXTURE/gguf/transformer-Q4_K_S.gguf
//
// Per variant and rank it prints: the file's bytes for the rank's shard (quantized weights: the
// blocks the rank holds; the rest: stored bytes of its slice), the resident weight bytes (what the
// weight loader holds: blocks, 16-bit values or float32), their ratio, and the median step time
// (one transformer forward on random inputs of --image-tokens / --text-tokens) with its ratio to
// the first variant (the safetensors folder). Also OpenBLAS's core name. --check makes the exit
// status 1 unless every GGUF variant's resident bytes are within 10% of its file bytes per rank
// and (with --check-time) the first GGUF variant's step is at most 1.5x the folder's.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "app/common/blas_kernel.h"
#include "backend/io/config_json.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_loader.h"
#include "backend/io/weight_source.h"
#include "backend/models/checkpoint_layouts.h"
#include "backend/models/flux/flux_config.h"
#include "backend/models/flux/transformer_flux.h"
#include "parallel/device_mesh.h"
#include "parallel/strategy.h"

using namespace dit;
using Clock = std::chrono::steady_clock;

namespace {

struct Result {
  std::string name;
  std::vector<double> fileBytes, residentBytes;  // per rank
  double stepMs = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<double> gatherAll(double v) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::vector<double> all(static_cast<size_t>(world));
  MPI_Allgather(&v, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  const BlasInfo blas = ensureBlasKernel(argc, argv);
  std::string folder;
  std::vector<std::string> ggufs;
  int imageTokens = 1024, textTokens = 256, steps = 5, warmup = 1;
  bool check = false, checkTime = false;
  CLI::App app{"GGUF vs BF16 safetensors: step time and resident weight bytes per rank"};
  app.add_option("--folder", folder, "diffusers transformer folder (BF16 safetensors + config)")
      ->required();
  app.add_option("--gguf", ggufs, "GGUF file of the same transformer (repeatable)")->required();
  app.add_option("--image-tokens", imageTokens, "image tokens per step (default 1024)");
  app.add_option("--text-tokens", textTokens, "text tokens per step (default 256)");
  app.add_option("--steps", steps, "timed steps (median reported, default 5)");
  app.add_option("--warmup", warmup, "untimed steps first (default 1)");
  app.add_flag("--check", check, "exit 1 unless resident bytes are within 10% of file bytes");
  app.add_flag("--check-time", checkTime, "with --check: first GGUF step <= 1.5x the folder's");
  CLI11_PARSE(app, argc, argv);

  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int rc = 0;
  try {
    Strategy s;
    s.world = s.tp_degree = world;
    DeviceMesh mesh(s, MPI_COMM_WORLD);
    FluxParallelism par;
    if (world > 1) par.tp = mesh.group("tp");
    const std::string cfgFile = folder + "/config.json";
    const FluxTransformerConfig cfg = parseFluxTransformerConfig(readConfigJson(cfgFile), cfgFile);

    auto gen = at::detail::createCPUGenerator(7);
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    const at::Tensor hs = at::randn({1, imageTokens, cfg.in_channels}, gen, f32);
    const at::Tensor enc = at::randn({1, textTokens, cfg.joint_attention_dim}, gen, f32);
    const at::Tensor pooled = at::randn({1, cfg.pooled_projection_dim}, gen, f32);
    const at::Tensor t = at::full({1}, 0.5, f32), guidance = at::full({1}, 3.5, f32);
    const at::Tensor imgIds = at::zeros({imageTokens, 3}, f32),
                     txtIds = at::zeros({textTokens, 3}, f32);

    std::vector<Result> results;
    auto bench = [&](const std::string& name, WeightSource& w) {
      FluxTransformer2DModel model(cfg, w, par);
      double file = 0, resident = 0;
      for (const auto& p : model.parameters()) {
        int64_t local = 1;
        for (int64_t v : p.info.shape) local *= v;
        if (!p.spec.replicated()) local /= p.spec.parts;
        file += p.heldBytes > 0
                    ? static_cast<double>(p.heldBytes)
                    : static_cast<double>(local) * static_cast<double>(p.info.elementBytes);
      }
      for (const auto& [storage, b] : heldBytesByStorage(model.parameters(), 4, "float32"))
        resident += static_cast<double>(b);
      at::NoGradGuard ng;
      std::vector<double> ms;
      for (int i = 0; i < warmup + steps; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = Clock::now();
        (void)model.forward(hs, enc, pooled, t, imgIds, txtIds, guidance);
        MPI_Barrier(MPI_COMM_WORLD);
        if (i >= warmup)
          ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      results.push_back({name, gatherAll(file), gatherAll(resident), median(ms)});
    };
    {
      auto w = WeightSource::fromFolder(folder, "diffusion_pytorch_model", at::kFloat, at::kCPU);
      bench("safetensors " + std::string("(folder)"), *w);
    }
    for (const auto& f : ggufs) {
      SafetensorsReader r(f);
      auto w = WeightSource::fromLayout(
          componentLayout(r, inspectCheckpoint(f).require("transformer", "--model")), at::kFloat,
          at::kCPU);
      bench(f.substr(f.find_last_of('/') + 1), *w);
    }
    if (rank == 0) {
      std::printf(
          "ditstudio-gguf-bench: tp_degree %d, float32 compute, %d image + %d text tokens, "
          "median of %d steps; OpenBLAS core %s (%s, %d threads), intra-op threads %d\n",
          world, imageTokens, textTokens, steps, blas.core.c_str(), blas.library.c_str(),
          blas.threads, at::get_num_threads());
      std::printf("%-32s %4s %14s %14s %8s %10s %8s\n", "variant", "rank", "file_bytes",
                  "resident_bytes", "res/file", "step_ms", "vs_first");
      for (const auto& res : results) {
        for (int k = 0; k < world; ++k) {
          const double ratio = res.residentBytes[k] / res.fileBytes[k];
          std::printf("%-32s %4d %14.0f %14.0f %8.3f %10.2f %8.3f\n", res.name.c_str(), k,
                      res.fileBytes[k], res.residentBytes[k], ratio, res.stepMs,
                      res.stepMs / results[0].stepMs);
          if (check && &res != &results[0] && std::abs(ratio - 1) > 0.10) rc = 1;
        }
      }
      std::printf("resident vs the folder (rank 0):");
      for (size_t i = 1; i < results.size(); ++i)
        std::printf(" %s %.3f", results[i].name.c_str(),
                    results[i].residentBytes[0] / results[0].residentBytes[0]);
      std::printf("\n");
      if (check && checkTime && results.size() > 1 && results[1].stepMs > 1.5 * results[0].stepMs)
        rc = 1;
      if (check) std::printf("check: %s\n", rc ? "FAILED" : "passed");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ditstudio-gguf-bench (rank %d): %s\n", rank, e.what());
    rc = 2;
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}
