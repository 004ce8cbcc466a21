// ditstudio-vae-bench (issue 47, "big images"): the peak memory and time of one VAE decode per
// rank, untiled, tiled on one rank, or tiled with the tiles shared out over the ranks of mpirun
// (AutoencoderKL::decode(z, group): each rank decodes its share, rank 0 blends the tiles as they
// come and broadcasts the image).
//
//   ditstudio-vae-bench --width 1024 --height 1024 --tile 256
//   mpirun -np 4 ditstudio-vae-bench --width 1024 --height 1024 --tile 256
//   ditstudio-vae-bench --config FOLDER/vae/config.json --block-out-channels 32,64,128,128 ...
//
// The VAE: FLUX.2's AutoencoderKLFlux2 sizes by default (diffusers' constructor defaults:
// block_out_channels 128, 256, 512, 512, layers_per_block 2, latent_channels 32, 32 norm groups,
// mid-block attention), or a vae/config.json (--config), with random weights (WeightSource::random:
// the memory and the work do not depend on the values); --block-out-channels replaces the widths
// (a narrower VAE for a quick run: every decode buffer scales with them). The latent is random,
// seeded, the same on every rank: [1, latent_channels, height / vsf, width / vsf].
//
// Per rank: the VAE's weights and the latent are made, free heap is trimmed, VmHWM is reset
// (/proc/self/clear_refs), then one decode runs; "decode_peak_bytes" is VmHWM after the decode
// minus VmRSS before it (the decode's own peak: its feature maps, the tiles this rank holds, the
// image; OMP_NUM_THREADS=1 and MALLOC_ARENA_MAX=1 keep thread-local buffers out). Rank 0 prints
// one JSON object (and writes it to --json-out): the configuration, the tile grid, and per rank
// the tiles it decoded, its decode peak and its time. With tests/memory_live_peak.c preloaded
// (LD_PRELOAD), also "decode_held_bytes": the peak of the bytes held from malloc during the
// decode above what was held before (the tensors and oneDNN's buffers, without glibc's
// fragmentation, MPI's shared-memory segments or code pages, which VmHWM also counts).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <malloc.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/common/blas_kernel.h"
#include "app/common/generation.h"
#include "backend/io/config_json.h"
#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl.h"
#include "backend/models/autoencoders/autoencoder_kl_config.h"
#include "parallel/process_group_mpi.h"
#include "parallel/runtime.h"

using namespace dit;
using nlohmann::ordered_json;

// tests/memory_live_peak.c, when preloaded (LD_PRELOAD): the bytes held from malloc at once.
extern "C" {
void dit_live_peak_reset() __attribute__((weak));
long dit_live_peak_bytes() __attribute__((weak));
long dit_live_bytes() __attribute__((weak));
}

namespace {

// FLUX.2's VAE (diffusers AutoencoderKLFlux2's constructor defaults, as in FLUX.2 [dev]'s and
// [klein]'s vae/config.json): 84 M parameters.
nlohmann::json flux2VaeConfig() {
  return nlohmann::json{{"_class_name", "AutoencoderKLFlux2"},
                        {"in_channels", 3},
                        {"out_channels", 3},
                        {"latent_channels", 32},
                        {"block_out_channels", {128, 256, 512, 512}},
                        {"layers_per_block", 2},
                        {"norm_num_groups", 32},
                        {"act_fn", "silu"},
                        {"sample_size", 1024},
                        {"mid_block_add_attention", true},
                        {"use_quant_conv", true},
                        {"use_post_quant_conv", true}};
}

int run(int argc, char** argv) {
  std::string config, dtypeName = "float32", jsonOut;
  std::vector<int> widths;
  int width = 1024, height = 1024, tile = 256;
  uint64_t seed = 0;
  CLI::App app{"Peak memory and time of one VAE decode per rank (tiled over the ranks of mpirun)",
               "ditstudio-vae-bench"};
  app.add_option("--config", config, "vae/config.json (default: FLUX.2's AutoencoderKLFlux2)");
  app.add_option("--block-out-channels", widths,
                 "replace block_out_channels (same count), e.g. 32,64,128,128")
      ->delimiter(',');
  app.add_option("--width", width, "image width in pixels (a multiple of the VAE's scale)");
  app.add_option("--height", height, "image height in pixels");
  app.add_option("--tile", tile,
                 "tile_sample_min_size in pixels (overlap 0.25, diffusers' tiled_decode); 0: "
                 "one untiled decode on every rank")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--dtype", dtypeName, "float32 | bfloat16");
  app.add_option("--seed", seed, "seed of the random weights and latent");
  app.add_option("--json-out", jsonOut, "also write the JSON here");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (worldRank() == 0) app.exit(e);
    return 2;
  }
  if (dtypeName != "float32" && dtypeName != "bfloat16")
    throw std::invalid_argument("--dtype must be float32 or bfloat16, got " + dtypeName);
  const at::ScalarType dtype = dtypeName == "bfloat16" ? at::kBFloat16 : at::kFloat;
  const nlohmann::json cj = config.empty() ? flux2VaeConfig() : readConfigJson(config);
  AutoencoderKLConfig cfg =
      parseAutoencoderKLConfig(cj, config.empty() ? "<FLUX.2 VAE defaults>" : config);
  if (!widths.empty()) {
    if (widths.size() != cfg.block_out_channels.size())
      throw std::invalid_argument("--block-out-channels needs " +
                                  std::to_string(cfg.block_out_channels.size()) + " widths");
    for (int w : widths)
      if (w < 1 || w % cfg.norm_num_groups != 0)
        throw std::invalid_argument(
            "--block-out-channels: each width must be a positive "
            "multiple of norm_num_groups " +
            std::to_string(cfg.norm_num_groups));
    cfg.block_out_channels = widths;
  }
  const int vsf = cfg.vaeScaleFactor();
  if (width < vsf || height < vsf || width % vsf != 0 || height % vsf != 0)
    throw std::invalid_argument("--width and --height must be positive multiples of " +
                                std::to_string(vsf));

  at::NoGradGuard noGrad;
  auto group = std::make_shared<ProcessGroupMPI>(MPI_COMM_WORLD, "world");
  const int rank = group->rank(), size = group->size();
  auto w = WeightSource::random(seed + 1, dtype, at::kCPU);
  AutoencoderKL vae(cfg, *w);
  w.reset();
  VaeTiling t;
  t.enabled = tile > 0;
  t.tile_sample_min_size = tile;
  if (t.enabled) vae.setTiling(t);
  at::Generator gen = at::detail::createCPUGenerator(seed + 2);
  const at::Tensor z =
      at::randn({1, cfg.latent_channels, height / vsf, width / vsf}, gen, at::kFloat).to(dtype);
  const VaeTileGrid grid = vae.tileGrid(z.size(2), z.size(3));
  const bool tiled = t.enabled && (z.size(2) > grid.tile_latent || z.size(3) > grid.tile_latent);
  const int64_t tiles = tiled ? grid.count() : 0;
  const int64_t mine = tiled ? (static_cast<int64_t>(rank) + 1) * tiles / size -
                                   static_cast<int64_t>(rank) * tiles / size
                             : 0;

  ::malloc_trim(0);
  const bool hwmReset = resetPeakResidentSet();
  const uint64_t before = residentSetBytes();
  const bool counted = dit_live_peak_reset && dit_live_peak_bytes && dit_live_bytes;
  const int64_t heldBefore = counted ? dit_live_bytes() : 0;
  if (counted) dit_live_peak_reset();
  group->barrier()->wait();
  const auto t0 = std::chrono::steady_clock::now();
  at::Tensor image = vae.decode(z, size > 1 ? group.get() : nullptr);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t peak = peakResidentSetBytes();
  const int64_t held = counted ? dit_live_peak_bytes() - heldBefore : -1;
  const std::vector<int64_t> row{rank,
                                 mine,
                                 static_cast<int64_t>(peak - before),
                                 static_cast<int64_t>(before),
                                 static_cast<int64_t>(ms * 1000),
                                 held};
  const at::Tensor all = group->allgather(at::tensor(row, at::kLong).unsqueeze(0), 0)->result();
  if (rank != 0) return 0;

  ordered_json j;
  j["vae"] = {{"block_out_channels", cfg.block_out_channels},
              {"layers_per_block", cfg.layers_per_block},
              {"latent_channels", cfg.latent_channels},
              {"vae_scale_factor", vsf},
              {"config", config.empty() ? "FLUX.2 AutoencoderKLFlux2 defaults" : config},
              {"weights", "random"}};
  j["width"] = width;
  j["height"] = height;
  j["dtype"] = dtypeName;
  j["ranks"] = size;
  j["threads"] = at::get_num_threads();
  j["tiled"] = tiled;
  if (tiled)
    j["tiles"] = {{"tile_sample", grid.tile_sample},
                  {"tile_latent", grid.tile_latent},
                  {"stride_latent", grid.stride},
                  {"blend_extent", grid.blend_extent},
                  {"rows", grid.rows()},
                  {"cols", grid.cols()},
                  {"count", grid.count()}};
  j["image_bytes"] = image.numel() * static_cast<int64_t>(image.element_size());
  j["hwm_reset"] = hwmReset;
  ordered_json per = ordered_json::array();
  int64_t maxPeak = 0, maxHeld = -1;
  for (int r = 0; r < size; ++r) {
    const auto v = [&](int i) { return all[r][i].item<int64_t>(); };
    per.push_back({{"rank", v(0)},
                   {"tiles", v(1)},
                   {"decode_peak_bytes", v(2)},
                   {"rss_before_bytes", v(3)},
                   {"decode_ms", static_cast<double>(v(4)) / 1000.0}});
    if (v(5) >= 0) per.back()["decode_held_bytes"] = v(5);
    maxPeak = std::max(maxPeak, v(2));
    maxHeld = std::max(maxHeld, v(5));
  }
  j["per_rank"] = per;
  j["max_decode_peak_bytes"] = maxPeak;
  if (maxHeld >= 0) j["max_decode_held_bytes"] = maxHeld;
  std::cout << j.dump(2) << std::endl;
  if (!jsonOut.empty()) std::ofstream(jsonOut) << j.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  (void)ensureBlasKernel(argc, argv);
  tuneHostAllocator();
  initRuntime(argc, argv);
  const int rc = runOrAbort([&] { return run(argc, argv); });
  finalizeRuntime();
  return rc;
}
