// ditstudio-worker's main: `--model-fingerprint` (no MPI), the protocol's event and fatal lines,
// the BLAS kernel, MPI, the arguments, then one Worker per rank (app/worker/worker.h).
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "app/common/blas_kernel.h"
#include "app/common/generation.h"
#include "app/common/model_source_options.h"
#include "app/protocol/events.h"
#include "app/protocol/file_fingerprint.h"
#include "app/protocol/port_probe.h"
#include "app/protocol/protocol.h"
#include "app/protocol/run_options.h"
#include "app/protocol/strategy_args.h"
#include "app/worker/worker.h"
#include "backend/io/model_folder.h"
#include "backend/io/weight_source.h"
#include "backend/models/text_encoder_placement.h"
#include "parallel/event_lines.h"
#include "parallel/runtime.h"
#include "parallel/strategy.h"

using namespace dit;
using nlohmann::json;

int main(int argc, char** argv) {
  // `ditstudio-worker --probe-listen MIN-MAX[,MIN-MAX] SECONDS`: the pre-flight's port probe
  // (app/protocol/port_probe.h), no MPI.
  if (argc == 4 && std::string(argv[1]) == "--probe-listen")
    return protocol::runProbeListener(argv[2], std::atof(argv[3]));
  // `ditstudio-worker --model-fingerprint PATH...`: prints one `file SIZE DIGEST PATH` line per
  // file, then `fingerprint HEX`, and exits without MPI (the launcher's pre-flight runs it on
  // every host over ssh and names the files that differ, issue 18). Exit 3 when a path is
  // missing or unreadable (the cause on stderr).
  if (argc >= 2 && std::string(argv[1]) == "--model-fingerprint") {
    try {
      const std::vector<std::string> paths(argv + 2, argv + argc);
      for (const protocol::FileFingerprint& f : protocol::modelFileFingerprints(paths))
        std::printf("file %llu %s %s\n", static_cast<unsigned long long>(f.size), f.digest.c_str(),
                    f.path.c_str());
      std::printf("fingerprint %s\n", protocol::modelFingerprint(paths).c_str());
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 3;
    }
  }
  // Every event line and abortGroup's fatal line are the protocol's (parallel/ knows none).
  setEventLineFormatter([](const json& e) { return protocol::eventLine(e); });
  setFatalLineFormatter(
      [](const FatalError& f) { return protocol::fatalErrorLine(f.rank, f.message); });
  // Before MPI_Init and any thread: may re-execute this rank with a better OpenBLAS kernel.
  const BlasInfo blas = dit::ensureBlasKernel(argc, argv);
  tuneHostAllocator();
  initRuntime(argc, argv);
  const int rank = worldRank();
  auto logger = spdlog::stderr_logger_mt("worker");
  logger->set_pattern("[%H:%M:%S] [rank " + std::to_string(rank) + "/" +
                      std::to_string(worldSize()) + "] %v");
  spdlog::set_default_logger(logger);
  CLI::App app{"DiT Studio rank program (start with mpirun)", "ditstudio-worker"};
  Strategy s;
  std::string model, dtype = "float32";
  ModelSources src;
  app.add_option("--model", model,
                 "diffusers FLUX.1 or FLUX.2 [klein] folder, FLUX.1 single transformer file or "
                 "all-in-one checkpoint "
                 "(default: embedded tiny model)");
  addModelSourceOptions(app, src);
  app.add_option("--dtype", dtype, "float32 | bfloat16 | float16");
  app.add_option("--device", s.device, "cpu | cuda");
  protocol::addStrategyOptions(app, s);
  protocol::RunOptions run;
  protocol::addRunOptions(app, run);
  bool allowNonFinite = false;
  app.add_flag("--allow-nonfinite-weights", allowNonFinite,
               "load checkpoints that hold NaN or Inf (refused by default)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (rank == 0)
      worker::emitTyped(protocol::ErrorEvent{
          std::nullopt, rank, std::string("bad worker arguments: ") + e.what(), true});
    finalizeRuntime();
    return 2;
  }
  if (model.empty()) model = defaultModelDir();
  if (allowNonFinite) setAllowNonFiniteWeights(true);
  s.world = worldSize();
  src.model = model;
  int rc = runOrAbort([&] {
    worker::Worker w(s, src, dtype, blas);
    VaeTiling t;
    t.enabled = run.vae_tiling >= 0;
    t.tile_sample_min_size = run.vae_tiling > 0 ? run.vae_tiling : 0;
    w.setVaeTiling(t);
    w.setTextEncoder(parseTextEncoderPlacement(run.text_encoder_placement), run.prompt_cache);
    return w.run();
  });
  finalizeRuntime();
  return rc;
}
