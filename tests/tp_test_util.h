// Helpers shared by the MPI tests that compare a tensor-parallel FLUX.1 transformer with the
// one-rank one on the tiny-flux-A fixture (float32 checkpoint): test_flux_plan, test_lora_tp.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <string>

#include "backend/io/model_folder.h"
#include "backend/io/weight_source.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"
#include "golden_util.h"
#include "parallel/device_mesh.h"
#include "parallel/strategy.h"

namespace dit::test {

inline int worldSize() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The largest `v` over MPI_COMM_WORLD (collective).
inline double maxOverRanks(double v) {
  double out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

// The fixture's transformer config (from its model folder).
inline const FluxTransformerConfig& fixtureTransformerConfig() {
  static const FluxTransformerConfig c = fluxConfig(ModelFolder::open(fixtureDir())).transformer;
  return c;
}

// A fresh float32 CPU weight source over the fixture's transformer (bytesLoaded() starts at 0).
inline std::shared_ptr<WeightSource> fixtureTransformerWeights() {
  return WeightSource::fromFolder(fixtureDir() + "/transformer", "diffusion_pytorch_model",
                                  at::kFloat, c10::Device(at::kCPU));
}

// Every rank of MPI_COMM_WORLD in one tp group (world = tp_degree = size), 120 s collective
// timeout; `par` is what FluxTransformer2DModel takes. Collective to construct.
struct TpOverWorld {
  static Strategy strategy() {
    Strategy s;
    s.world = s.tp_degree = worldSize();
    return s;
  }
  static DeviceMeshOptions options() {
    DeviceMeshOptions o;
    o.timeout_s = 120;
    return o;
  }
  TpOverWorld() : mesh(strategy(), MPI_COMM_WORLD, options()) { par.tp = mesh.group("tp"); }
  DeviceMesh mesh;
  FluxParallelism par;
};

// main() of an MPI gtest program: results printed by rank 0 only, exit status the worst over ranks.
inline int mpiTestMain(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}

}  // namespace dit::test
