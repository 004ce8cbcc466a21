// ditstudio-bench's parts (bench_main.cpp: arguments, the model definition, mesh, load, timed
// steps, the gather of per-rank figures; bench_report.cpp: rank 0's JSON; bench_profile.*: the
// per-operator profile). See bench_main.cpp's header for what is measured.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/common/blas_kernel.h"
#include "backend/family_runtime.h"
#include "backend/models/family_registry.h"
#include "parallel/strategy.h"

namespace dit::bench {

/// The command line.
struct Args {
  std::string model, config, dtype = "bfloat16", phase = "all", jsonOut;
  bool randomWeights = false, pretty = false, profile = false;
  int width = 1024, height = 1024, textLen = 512, steps = 10, warmup = 2, batch = 1;
  uint64_t seed = 0;
  double peakTflops = -1.0;
  Strategy s;
};

/// The transformer to benchmark, defined from configs only (no weight read).
struct BenchModel {
  const FamilySpec* family = nullptr;      ///< the config's family record
  const FamilyRuntime* runtime = nullptr;  ///< its Torch half
  int vaeScale = 8;                        ///< the usual VAE scale; a model folder gives its own
  std::string source, weightsDir;
  nlohmann::json configJson;  ///< the transformer's config.json
  std::string configFile, transformerClass;
  ModelDims md;            ///< the registered family's sizes and plans
  std::string singleFile;  ///< --model FILE: a single-file transformer / all-in-one checkpoint
};

/// Per-rank figures gathered to every rank: one row per rank, one column per RankColumn.
enum RankColumn {
  kWeightBytes,
  kRssBefore,
  kRssAfterLoad,
  kRssPeakLoad,
  kRss,
  kRssPeak,
  kDevAfterLoad,
  kDevPeakLoad,
  kDev,
  kDevPeak,
  kBytesTimed,
  kLoadMicroseconds,
  kRankColumns
};

/// What rank 0 reports, as measured.
struct BenchResults {
  at::ScalarType dtype = at::kFloat;
  std::string dtypeNote;
  c10::Device device{at::kCPU};
  std::string meshBackend;
  BenchShape shape;  ///< batch, token grid, text tokens
  int steps = 0;     ///< timed steps (0 with --phase load)
  double flopsPerForward = 0;
  std::vector<double> stepMs;        ///< per timed step, slowest rank
  std::vector<double> deviceStepMs;  ///< CUDA: per timed step, device events, slowest rank
  at::Tensor rankRows;               ///< [world, kRankColumns] int64
  std::map<std::string, int64_t> storageBytes;  ///< rank 0's transformer weights by storage
  bool hwmReset = false;                        ///< VmHWM was reset before loading
  nlohmann::ordered_json opProfile;             ///< --profile, else null
};

/// Rank 0's JSON object (key order as printed). `a.s.world` is the group's size.
nlohmann::ordered_json benchReport(const Args& a, const BenchModel& m, const BenchResults& r,
                                   const BlasInfo& blas);

}  // namespace dit::bench
