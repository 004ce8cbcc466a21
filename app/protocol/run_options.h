// The worker's run options (app/PROTOCOL.md, first paragraph): what a group is started with
// beside its strategy and model, the same for every front end. A launcher writes them after the
// strategy flags (runOptionArgs: ditstudio-cli, ditstudio-server's pool, the GUI's group
// settings); the programs that take them parse them back with CLI11 (addRunOptions:
// ditstudio-worker, ditstudio-cli). Both ends of that argv live here so that they name and
// check each flag once. Part of dit_protocol (app/protocol/): no Torch, no Qt.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace dit::protocol {

/// The largest --vae-tiling tile (pixels) and --prompt-cache size (entries) the options take.
constexpr int kMaxVaeTilePixels = 1 << 20;
constexpr int kMaxPromptCacheEntries = 100000;

/// The text-encoder placements, as backend/models/text_encoder_placement.h names them (a test
/// keeps the two lists equal): sharded, own-rank, host-streamed, once.
const std::vector<std::string>& textEncoderPlacementChoices();

/// A group's run options.
struct RunOptions {
  /// --vae-tiling PIXELS: decode in tiles of PIXELS (diffusers' AutoencoderKL.enable_tiling(),
  /// overlap 0.25); 0: the VAE's sample_size; -1 (default): off.
  int vae_tiling = -1;
  /// --text-encoder-placement: where the text encoders live (text_encoder_placement.h);
  /// "sharded" (default), "own-rank", "host-streamed" or "once".
  std::string text_encoder_placement = "sharded";
  /// --prompt-cache N: prompt embeddings kept for the last N distinct prompts (0, default: off).
  int prompt_cache = 0;

  bool operator==(const RunOptions&) const = default;
};

/// "" when `o` is valid, else what is wrong, naming the option and its range: vae_tiling in
/// -1 .. 1048576, text_encoder_placement one of textEncoderPlacementChoices(), prompt_cache in
/// 0 .. 100000.
std::string runOptionsIssue(const RunOptions& o);

/// Registers --vae-tiling, --text-encoder-placement and --prompt-cache on `app`, bound to `o`,
/// with the ranges of runOptionsIssue (CLI11 refuses a value outside them). Throws
/// CLI::OptionAlreadyAdded when one of the flags is already registered.
void addRunOptions(CLI::App& app, RunOptions& o);

/// The worker arguments for `o`, each option left out at its default, in this order:
/// [--vae-tiling N] [--text-encoder-placement P] [--prompt-cache N]. Parsed back by
/// addRunOptions. Throws std::invalid_argument with runOptionsIssue's words when `o` is invalid.
std::vector<std::string> runOptionArgs(const RunOptions& o);

}  // namespace dit::protocol
