#include "app/protocol/run_options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <stdexcept>

namespace dit::protocol {

const std::vector<std::string>& textEncoderPlacementChoices() {
  static const std::vector<std::string> names{"sharded", "own-rank", "host-streamed", "once"};
  return names;
}

std::string runOptionsIssue(const RunOptions& o) {
  if (o.vae_tiling < -1 || o.vae_tiling > kMaxVaeTilePixels)
    return "vae tiling " + std::to_string(o.vae_tiling) + " is out of range (-1: off, 0: the " +
           "VAE's sample_size, else tile pixels up to " + std::to_string(kMaxVaeTilePixels) + ")";
  const auto& names = textEncoderPlacementChoices();
  if (std::find(names.begin(), names.end(), o.text_encoder_placement) == names.end())
    return "unknown text-encoder placement '" + o.text_encoder_placement +
           "' (expected sharded, own-rank, host-streamed or once)";
  if (o.prompt_cache < 0 || o.prompt_cache > kMaxPromptCacheEntries)
    return "prompt cache " + std::to_string(o.prompt_cache) + " is out of range (0 .. " +
           std::to_string(kMaxPromptCacheEntries) + " entries)";
  return "";
}

void addRunOptions(CLI::App& app, RunOptions& o) {
  app.add_option("--vae-tiling", o.vae_tiling,
                 "decode the image in tiles of PIXELS (diffusers' enable_tiling(), overlap "
                 "0.25; 0: the VAE's sample_size; FLUX.1 and FLUX.2 VAEs); with several ranks "
                 "the tiles are shared over the tp / cp / cfg group (default -1: off)")
      ->check(CLI::Range(-1, kMaxVaeTilePixels));
  app.add_option("--text-encoder-placement", o.text_encoder_placement,
                 "where the text encoder lives: sharded (under the tp group, the default), "
                 "own-rank (one rank of each tp x cp group encodes and broadcasts; the others "
                 "never load it), host-streamed (weights in host memory, one layer at a time on "
                 "the device), once (loaded per request, freed before the steps)")
      ->check(CLI::IsMember(textEncoderPlacementChoices()));
  app.add_option("--prompt-cache", o.prompt_cache,
                 "keep the prompt embeddings of the last N distinct prompt texts, so a queue of "
                 "variations encodes each prompt once (default 0: off)")
      ->check(CLI::Range(0, kMaxPromptCacheEntries));
}

std::vector<std::string> runOptionArgs(const RunOptions& o) {
  if (const std::string issue = runOptionsIssue(o); !issue.empty())
    throw std::invalid_argument(issue);
  std::vector<std::string> a;
  if (o.vae_tiling >= 0) a.insert(a.end(), {"--vae-tiling", std::to_string(o.vae_tiling)});
  if (o.text_encoder_placement != "sharded")
    a.insert(a.end(), {"--text-encoder-placement", o.text_encoder_placement});
  if (o.prompt_cache > 0) a.insert(a.end(), {"--prompt-cache", std::to_string(o.prompt_cache)});
  return a;
}

}  // namespace dit::protocol
