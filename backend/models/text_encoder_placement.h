// Where a pipeline's text encoders live and how long they stay (issue 47: "the text encoder
// placed, not just loaded"). Torch-free: the CLI and the worker parse it, the placement planner
// sizes it (placement_planner.h), the pipelines run it (pipelines/prompt_encoding.h).
//
//  * sharded       (default) every rank of the transformer's tensor-parallel group loads its
//                  shard of the encoder under that group (the encoder's own plan: Qwen3 / Mistral
//                  q/k/v/gate/up column-parallel, o/down row-parallel; CLIP and T5 whole) and
//                  the group encodes together; the other groups (cp, cfg, dp) hold copies.
//  * own-rank      one rank of each image's group holds the whole encoder: the rank at
//                  coordinate 0 of the tp and cp groups (with cfg 2 one per CFG half, each
//                  encoding its own branch's prompt). It encodes alone and broadcasts the prompt
//                  conditioning over the cp group and then the tp group; every other rank never
//                  loads the encoder (its memory holds the transformer shard and the VAE only).
//  * host-streamed the encoder's weights stay in host memory (pinned on CUDA) and each decoder
//                  layer is copied to the device right before its forward and dropped after, so
//                  the device holds one layer (the largest: its per-rank share at tp) at a time;
//                  the embedding lookup runs on the host. Qwen3 / Mistral / Qwen2.5-VL encoders
//                  (FLUX.2, Z-Image, Qwen-Image); FLUX.1's CLIP and T5 are refused.
//  * once          the encoder is loaded for each request's prompts and freed before the
//                  denoising loop (diffusers' enable_model_cpu_offload idea without the copy back).
#pragma once

#include <string>
#include <vector>

namespace dit {

enum class TextEncoderPlacement { Sharded, OwnRank, HostStreamed, Once };

/// "sharded", "own-rank", "host-streamed", "once".
const char* textEncoderPlacementName(TextEncoderPlacement p);
/// Every placement name, in the enum's order.
std::vector<std::string> textEncoderPlacementNames();
/// The placement named `name` (exact). Throws std::invalid_argument naming the text and the
/// choices.
TextEncoderPlacement parseTextEncoderPlacement(const std::string& name);

}  // namespace dit
