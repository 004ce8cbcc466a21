// ditstudio-cli's options (CliOptions) and what the CLI makes of them: LoRA and seed arguments,
// the protocol's checks with the CLI's option names, the overwrite refusal and the request sent to
// the worker (or run in-process). Shared by cli_main.cpp (one rank, bench, eval-demo, main) and
// cli_mpi.cpp (a group of ranks through mpirun).
#pragma once

#include <string>
#include <vector>

#include "app/protocol/protocol.h"
#include "app/protocol/run_options.h"
#include "backend/io/model_folder.h"
#include "backend/models/autoencoders/autoencoder_kl_config.h"
#include "parallel/strategy.h"

namespace dit {
struct PipelineOptions;
}

namespace dit::cli {

struct CliOptions {
  std::string model, output = "ditstudio-output.png", outputTensors, dtype = "float32",
                     device = "cpu", hostfile, seed;
  protocol::GenerationParams gen;  ///< the protocol's defaults (protocol.h), set by the options
  int np = 0, ompThreads = 0;
  Strategy strategy;
  bool jsonEvents = false;
  bool overwrite = false;  ///< replace an existing --output / --output-tensors
  /// --check: resolve the request and the strategy against the model (configs only, nothing
  /// loaded or started) and print the verdict as one JSON line.
  bool check = false;
  /// --print-request-spec: print the model's declared request (its family's fields, size rule
  /// and guider) as the documentation's Markdown table, and exit.
  bool printRequestSpec = false;
  bool allowNonFinite = false;   ///< load checkpoints holding NaN/Inf (refused by default)
  std::string networkInterface;  ///< MPI interfaces for hostfile groups
  std::string sshOptions, portRange, mpirunArgs;  ///< hostfile groups (issue 18)
  bool oversubscribe = false, noPreflight = false;
  std::vector<std::string> prompts;
  ModelSources src;  ///< --config, --vae, --text-encoder(-2), --tokenizer(-2); model = --model
  ModelSources sources() const {
    ModelSources s = src;
    s.model = model;
    return s;
  }
  std::vector<std::string> loras;   ///< --lora FILE[:STRENGTH], repeatable
  std::vector<std::string> images;  ///< --image FILE, repeatable: the reference images in order
  /// --vae-tiling, --text-encoder-placement, --prompt-cache: the group's run options, as the
  /// worker takes them (app/protocol/run_options.h).
  protocol::RunOptions run;
};

/// The pipeline's VaeTiling of --vae-tiling (vaeTiling < -1 is refused by the option's check).
VaeTiling vaeTilingOf(int pixels);

/// Sets the pipeline options' text side from --text-encoder-placement and --prompt-cache. Throws
/// std::invalid_argument naming a placement that is not one of the four.
void applyTextEncoderOptions(const CliOptions& o, PipelineOptions& po);

/// A family knob's value from the command line (--<knob> V, --set name=V): a number, or for an
/// integer knob of range 0 .. 1 also on / off / true / false / yes / no. Throws
/// std::invalid_argument naming `flag` and the text.
double parseKnobValue(const std::string& flag, const std::string& text, bool switchLike);

/// --lora FILE[:STRENGTH] -> o.gen.loras. Throws std::invalid_argument (or the LoRA file's error)
/// naming the argument or file.
void applyLoraOptions(CliOptions& o);
/// --seed -> o.gen.seed / random_seed. Throws std::invalid_argument naming the value.
void applySeed(CliOptions& o);
/// protocol::checkRequest, its messages naming the CLI's options. Throws std::invalid_argument.
void checkOptions(const protocol::GenerateRequest& r);
/// Throws std::invalid_argument when a file the request would write exists (unless --overwrite).
/// The output paths themselves: not empty, not a folder, and the PNG and the tensors file
/// distinct (the second write would replace the first). Throws std::invalid_argument in words.
void checkOutputPaths(const CliOptions& o);
void refuseOverwrite(const CliOptions& o, int count);
/// The folder of this executable (ditstudio-worker and ditstudio-isolate sit beside it).
std::string exeDir();
/// The worker protocol's generate request of these options (id "cli", absolute paths).
protocol::GenerateRequest request(const CliOptions& o);

/// Several ranks: mpirun + ditstudio-worker (cli_mpi.cpp). Returns the process exit code.
int runMpi(const CliOptions& o);

}  // namespace dit::cli
