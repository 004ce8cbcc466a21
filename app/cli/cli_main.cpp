// ditstudio-cli: headless generation. One rank runs in-process; --np N (or any degree > 1)
// launches `mpirun -np N ditstudio-worker` and drives it with the worker protocol
// (app/PROTOCOL.md). `ditstudio-cli bench` prints per-stage timings and peak memory as JSON.
// This file: the pre-start refusals, one rank in-process, bench, eval-demo and main; the options:
// cli_options.*; several ranks: cli_mpi.cpp.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include "app/cli/cli_options.h"
#include "app/cli/cli_plan.h"
#include "app/common/blas_kernel.h"
#include "app/common/device_stats.h"
#include "app/common/generation.h"
#include "app/common/lora_cache.h"
#include "app/common/model_source_options.h"
#include "app/common/request_values.h"
#include "app/demo/shapes_dataset.h"
#include "app/protocol/events.h"
#include "app/protocol/protocol.h"
#include "app/protocol/strategy_args.h"
#include "backend/family_runtime.h"
#include "backend/io/image_io.h"
#include "backend/io/model_folder.h"
#include "backend/io/png_io.h"
#include "backend/io/safe_write.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_source.h"
#include "backend/models/family_registry.h"
#include "backend/models/memory_estimate.h"
#include "parallel/runtime.h"
#include "parallel/strategy.h"

using namespace dit;
using namespace dit::cli;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The memory estimate before anything is loaded: `ranks` ranks on this host, each holding its
// weights (the text encoders as --text-encoder-placement places them) plus the resolved
// request's text encoding, activations, attention and VAE decode.
void refuseMemory(const CliOptions& o, const ModelFolder& model, const ResolvedRequest& r,
                  int ranks) {
  const RequestDims rd = r.dims();
  const bool cuda = o.device == "cuda";
  const TextEncoderPlacement pl = parseTextEncoderPlacement(o.run.text_encoder_placement);
  const int64_t eb = o.dtype == "float32" ? 4 : 2;
  const MemoryEstimate est = estimateRequestMemory(model, o.strategy, rd, eb, !cuda, pl);
  std::string refusal;
  if (cuda) {
    if (auto avail = deviceMemoryAvailable(c10::Device("cuda:0")); avail && ranks == 1)
      refusal = memoryRefusal(est, est.peak(), 1, *avail, rd, "free device memory on cuda:0");
  } else if (auto avail = hostMemoryAvailable()) {
    // own-rank: one rank of each tp x cp group holds the whole encoder, the others none. Their
    // sum is checked; the refusal names the encoding rank's figure, the largest.
    uint64_t need = 0;
    if (pl == TextEncoderPlacement::OwnRank && ranks > 1) {
      const Strategy& s = o.strategy;
      const int encoders =
          std::max(1, ranks / std::max(1, s.tp_degree * s.ring_degree * s.ulysses_degree));
      MemoryEstimate other = est;
      other.weights -= other.text_encoder_weights;
      other.text_encoder_weights = 0;
      need = static_cast<uint64_t>(encoders) * est.peak() +
             static_cast<uint64_t>(ranks - encoders) * other.peak();
    }
    if (need == 0 || need > *avail)
      refusal = memoryRefusal(est, est.peak(), ranks, *avail, rd, "host memory (MemAvailable)");
  }
  if (!refusal.empty()) throw std::invalid_argument(refusal);
  spdlog::debug("memory estimate per rank: {}", est.describe());
}

// The request fields given on the command line (their flags), for the family's warnings about
// fields the model does not read.
std::set<std::string> givenFields(const CLI::App& app) {
  std::set<std::string> given;
  for (const char* field :
       {"guidance", "negative_prompt", "strength", "steps", "max_sequence_length"}) {
    std::string flag = std::string("--") + field;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (app.count(flag) > 0) given.insert(field);
  }
  if (app.count("--image") > 0) given.insert("reference_images");
  return given;
}

// The compute dtype of an in-process run (resolveComputeDType: bfloat16 on a CPU without bf16
// hardware computes in float32), with its note logged.
at::ScalarType cpuComputeDType(const CliOptions& o) {
  const ComputeDType cd = resolveComputeDType(o.dtype, o.device);
  if (!cd.note.empty()) spdlog::warn("{}", cd.note);
  return cd.dtype;
}

// One rank, in this process.
int runLocal(const CliOptions& o) {
  auto model = ModelFolder::open(o.sources());
  PipelineOptions po;
  po.dtype = cpuComputeDType(o);
  po.device = o.device;
  po.vae_tiling = vaeTilingOf(o.run.vae_tiling);
  applyTextEncoderOptions(o, po);
  spdlog::info("loading {} ({}, {})", o.model, computeDTypeName(po.dtype), o.device);
  auto t0 = std::chrono::steady_clock::now();
  const std::unique_ptr<DiffusionPipeline> pipeline = loadPipeline(model, po);
  DiffusionPipeline& pipe = *pipeline;
  spdlog::info("loaded in {:.2f} s",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  protocol::GenerateRequest req = request(o);
  if (!req.params.loras.empty()) {
    LoraCache loras(0);
    for (const auto& e : loras.apply(req.params.loras, pipe.transformer()))
      spdlog::info("LoRA {}: {}", e->file, e->info.summary());
  }
  const int n = req.imageCount();
  const uint64_t seed0 = req.params.random_seed ? randomSeed() : req.params.seed;
  // Only the outputs there now may be replaced (with --overwrite); a file appearing while the
  // image computes is never replaced (OutputReplacePolicy).
  std::vector<std::string> replaceable;
  if (o.overwrite)
    for (int i = 0; i < n; ++i)
      for (const std::string* f : {&o.output, &o.outputTensors})
        if (!f->empty() && fs::exists(indexedPath(*f, i, n)))
          replaceable.push_back(indexedPath(*f, i, n));
  const OutputReplacePolicy policy(replaceable);
  for (int i = 0; i < n; ++i) {
    PipelineInputs q = pipelineParams(req.params);
    if (!req.prompts.empty()) q.prompt = req.prompts[i];
    for (const auto& w : pipe.requestWarnings(q))
      std::cerr << "warning: "
                << (req.prompts.empty() ? "" : "prompts[" + std::to_string(i) + "]: ") << w
                << std::endl;
  }
  for (int i = 0; i < n; ++i) {
    PipelineInputs p = pipelineParams(req.params);
    if (!req.prompts.empty()) p.prompt = req.prompts[i];
    // seed + image index (mod 2^64), as the worker does; one seed for a prompt list.
    p.seed = req.prompts.empty() ? seed0 + static_cast<uint64_t>(i) : seed0;
    PipelineCallbacks cb;
    cb.onStep = [&](int step, int steps, const at::Tensor&, const at::Tensor&, double ms) {
      spdlog::info("image {}/{} step {}/{} ({:.1f} ms)", i + 1, n, step, steps, ms);
      return true;
    };
    auto res = pipe.generate(p, cb);
    if (const json c = cacheReport(res); !c.is_null())
      spdlog::info("cache {}: computed steps {} of {}, reused {}, about {:.0f} ms saved",
                   c["mode"].get<std::string>(), c["computed_steps"].dump(), c["steps"].get<int>(),
                   c["reused_steps"].dump(), c["saved_ms"].get<double>());
    const protocol::GenerationParams made = imageParams(req.params, res.params);
    const std::string out = indexedPath(o.output, i, n);
    writeImagePng(out, res, made,
                  json{{"model", o.model}, {"strategy", "1 rank"}, {"dtype", o.dtype}});
    if (!o.outputTensors.empty()) writeResultTensors(indexedPath(o.outputTensors, i, n), res, made);
    std::cout << "wrote " << out << " (seed " << made.seed << ", " << res.params.width << "x"
              << res.params.height << ", " << res.params.steps << " steps)" << std::endl;
  }
  return 0;
}

// Benchmark of the whole pipeline on one rank: JSON with each stage's time and peak RSS.
int runBench(const CliOptions& o, int warmup) {
  auto model = ModelFolder::open(o.sources());
  PipelineOptions po;
  po.dtype = cpuComputeDType(o);
  po.device = o.device;
  po.vae_tiling = vaeTilingOf(o.run.vae_tiling);
  applyTextEncoderOptions(o, po);
  auto t0 = std::chrono::steady_clock::now();
  const std::unique_ptr<DiffusionPipeline> pipeline = loadPipeline(model, po);
  DiffusionPipeline& pipe = *pipeline;
  const double loadS = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  PipelineInputs p = pipelineParams(request(o).params);
  if (o.gen.random_seed) p.seed = randomSeed();
  for (int i = 0; i < warmup; ++i) pipe.generate(p);
  auto res = pipe.generate(p);
  // With --cache: the same request uncached, for the speed-up and the image's PSNR.
  json cacheBench = nullptr;
  if (p.cache.enabled()) {
    PipelineInputs u = p;
    u.cache = StepCacheConfig{};
    auto ref = pipe.generate(u);
    const double mse = (res.image - ref.image).pow(2).mean().item<double>();
    const double psnr = mse > 0 ? 10 * std::log10(1 / mse) : INFINITY;
    const json rep = cacheReport(res);
    const double cached = res.timings_ms["denoise"], uncached = ref.timings_ms["denoise"];
    cacheBench = json{{"mode", p.cache.toString()},
                      {"computed_steps", rep["computed_steps"]},
                      {"steps_computed", rep["computed_steps"].size()},
                      {"steps", res.steps_done},
                      {"denoise_ms_cached", cached},
                      {"denoise_ms_uncached", uncached},
                      {"speedup", cached > 0 ? uncached / cached : 0.0},
                      {"psnr_db_vs_uncached", std::isfinite(psnr) ? json(psnr) : json("inf")}};
    std::cerr << "cache " << p.cache.toString() << ": " << rep["computed_steps"].size() << " of "
              << res.steps_done << " steps computed " << rep["computed_steps"].dump()
              << ", denoise " << cached << " ms vs " << uncached << " ms uncached ("
              << (cached > 0 ? uncached / cached : 0.0) << "x), PSNR " << psnr
              << " dB vs the uncached image" << std::endl;
  }
  json steps = json::array();
  for (int i = 1; i <= res.steps_done; ++i)
    steps.push_back(res.timings_ms["step." + std::to_string(i)]);
  json wb = json::object();
  for (auto& [k, v] : pipe.weightBytes()) wb[k] = v;
  json out{{"model", o.model},
           {"width", res.params.width},
           {"height", res.params.height},
           {"steps", res.params.steps},
           {"dtype", o.dtype},
           {"device", o.device},
           {"threads", static_cast<int>(at::get_num_threads())},
           {"load_s", loadS},
           {"tokenize_ms", res.timings_ms["tokenize"]},
           {"encode_ms", res.timings_ms["encode"]},
           {"step_ms", steps},
           {"denoise_ms", res.timings_ms["denoise"]},
           {"decode_ms", res.timings_ms["decode"]},
           {"weight_bytes", wb},
           {"peak_rss_bytes", static_cast<uint64_t>(peakResidentSetBytes())}};
  if (!cacheBench.is_null()) out["cache"] = cacheBench;
  std::cout << out.dump(2) << std::endl;
  return 0;
}

// eval-demo: the held-out prompts of the synthetic shapes data set (app/demo/shapes_dataset.h)
// generated on one rank with the model (or read from images made elsewhere, e.g. under a
// parallel strategy), each image scored by the analyser; prints per-attribute accuracy.
struct EvalDemoOptions {
  int count = 48, size = 64, columns = 8;
  std::string images, grid;
  bool listPrompts = false;
};

int runEvalDemo(const CliOptions& o, const EvalDemoOptions& e) {
  using namespace dit::demo;
  if (e.count < 1 || e.count > 1000)
    throw std::invalid_argument("--count must be in 1 .. 1000, got " + std::to_string(e.count));
  const std::vector<ShapeScene> scenes = heldOutScenes(e.count);
  if (e.listPrompts) {
    for (const auto& s : scenes) std::cout << caption(s) << "\n";
    return 0;
  }
  std::unique_ptr<DiffusionPipeline> pipeline;
  if (e.images.empty()) {
    PipelineOptions po;
    po.dtype = cpuComputeDType(o);
    po.device = o.device;
    po.vae_tiling = vaeTilingOf(o.run.vae_tiling);
    applyTextEncoderOptions(o, po);
    pipeline = loadPipeline(ModelFolder::open(o.sources()), po);
  }
  int W = e.size, H = e.size;
  std::vector<std::vector<uint8_t>> pics;
  int ok[6] = {0, 0, 0, 0, 0, 0};  // colour, background, position, shape, count, all four
  for (int i = 0; i < e.count; ++i) {
    const ShapeScene& s = scenes[i];
    std::vector<uint8_t> rgb;
    if (pipeline) {
      PipelineInputs p = pipelineParams(request(o).params);
      p.prompt = caption(s);
      p.width = p.height = e.size;
      const GenerationResult r = pipeline->generate(p);
      const at::Tensor u8 =
          (r.image * 255).round().clamp(0, 255).to(at::kByte).permute({1, 2, 0}).contiguous();
      rgb.assign(u8.data_ptr<uint8_t>(), u8.data_ptr<uint8_t>() + u8.numel());
    } else {
      const std::string file = indexedPath(e.images, i, e.count);
      const Image8 img = toRGB(readImage(file));
      if (img.width != W || img.height != H)
        throw std::invalid_argument(file + " is " + std::to_string(img.width) + "x" +
                                    std::to_string(img.height) + ", expected " + std::to_string(W) +
                                    "x" + std::to_string(H) + " (--size)");
      rgb = img.pixels;
    }
    const SceneReading r = analyse(rgb, W, H);
    const bool c = r.colour == s.colour, b = r.background == s.background,
               pos = r.position == s.position, sh = r.shape == s.shape, n = r.count == s.count;
    ok[0] += c, ok[1] += b, ok[2] += pos, ok[3] += sh, ok[4] += n, ok[5] += c && b && pos && sh;
    std::cout << (c && b && pos && sh ? "ok   " : "miss ") << caption(s) << "  ->  "
              << (r.colour >= 0 ? colourName(r.colour) : "?") << " "
              << (r.shape >= 0 ? shapeName(r.shape) : "?") << " x" << r.count << " on "
              << colourName(r.background) << ", "
              << (r.position >= 0 ? positionName(r.position) : "?") << "\n";
    pics.push_back(std::move(rgb));
  }
  const char* names[6] = {"foreground colour",
                          "background colour",
                          "position",
                          "shape",
                          "count",
                          "all four (colour, background, position, shape)"};
  std::cout << "held-out prompts: " << e.count << "\n";
  for (int k = 0; k < 6; ++k)
    std::printf("%-48s %3d/%d  %5.1f%%\n", names[k], ok[k], e.count, 100.0 * ok[k] / e.count);
  std::fflush(stdout);
  if (!e.grid.empty()) {
    const int cols = std::min(e.columns, e.count), rows = (e.count + cols - 1) / cols, gap = 2;
    const int GW = cols * (W + gap) + gap, GH = rows * (H + gap) + gap;
    std::vector<uint8_t> g(static_cast<size_t>(GW) * GH * 3, 255);
    for (int i = 0; i < e.count; ++i) {
      const int x0 = gap + (i % cols) * (W + gap), y0 = gap + (i / cols) * (H + gap);
      for (int y = 0; y < H; ++y)
        std::copy_n(pics[i].data() + static_cast<size_t>(y) * W * 3, W * 3,
                    g.data() + (static_cast<size_t>(y0 + y) * GW + x0) * 3);
    }
    writePng(e.grid, g.data(), GW, GH);
    std::cout << "wrote " << e.grid << " (" << cols << " x " << rows << " images)" << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // First: may re-execute the CLI with a better OpenBLAS kernel (workers it starts inherit it).
  const dit::BlasInfo blas = dit::ensureBlasKernel(argc, argv);
  tuneHostAllocator();
  spdlog::set_default_logger(spdlog::stderr_color_mt("cli"));
  spdlog::set_pattern("[%H:%M:%S] [cli] %v");
  if (blas.selection == "auto" || blas.selection == "fallback")
    spdlog::warn("BLAS: {}", blas.note);
  else
    spdlog::debug("BLAS: {} core {} ({})", blas.library, blas.core, blas.selection);
  CLI::App app{"DiT Studio headless generation (FLUX.1, one or many ranks)", "ditstudio-cli"};
  CliOptions o;
  int warmup = 0;
  auto addGen = [&](CLI::App* a) {
    a->add_option("--model", o.model,
                  "diffusers FLUX.1 or FLUX.2 [klein] folder, FLUX.1 single transformer file (BFL "
                  "/ fp8 / ComfyUI scaled "
                  "fp8) or ComfyUI all-in-one checkpoint (default: the embedded tiny model)");
    addModelSourceOptions(*a, o.src);
    a->add_option("--prompt", o.gen.prompt, "prompt")->capture_default_str();
    a->add_option("--negative-prompt", o.gen.negative_prompt,
                  "negative prompt; given (even as \"\"), the unconditional branch of the "
                  "model's CFG when its CFG scale turns CFG on (--print-request-spec shows which "
                  "field that is), as diffusers");
    a->add_option(
        "--width", o.gen.width,
        "width in pixels (multiple of 2 x vae_scale_factor; default 128 x vae_scale_factor)");
    a->add_option("--height", o.gen.height, "height in pixels");
    a->add_option("--steps", o.gen.steps, "denoising steps (default 28)");
    a->add_option("--guidance", o.gen.guidance,
                  "the pipeline's guidance_scale, 0 .. 100: FLUX.1 the distilled guidance "
                  "embedding; FLUX.2 [klein] CFG when > 1; Z-Image real CFG when > 0");
    // The model families' own knobs, one flag each from their declarations (FamilySpec::knobs),
    // and --set name=value for any of them.
    auto switchLike = [](const FieldSpec& k) {
      return k.type == FieldType::Int && k.min == 0 && k.max == 1;
    };
    for (const FieldSpec& k : allFamilyKnobs())
      a->add_option_function<std::string>(
          k.cliFlag(),
          [&o, name = k.name, flag = k.cliFlag(), sw = switchLike(k)](const std::string& v) {
            try {
              o.gen.options[name] = parseKnobValue(flag, v, sw);
            } catch (const std::invalid_argument& e) {
              throw CLI::ValidationError(flag, e.what());
            }
          },
          k.help + " (" + (switchLike(k) ? std::string("on | off") : k.rangeText()) + ", default " +
              (switchLike(k) ? std::string(k.default_value != 0 ? "on" : "off")
                             : protocol::numberText(k.default_value)) +
              "; the families that declare it)");
    a->add_option_function<std::vector<std::string>>(
        "--set",
        [&o, switchLike](const std::vector<std::string>& items) {
          for (const std::string& item : items) {
            const auto eq = item.find('=');
            if (eq == std::string::npos || eq == 0)
              throw CLI::ValidationError("--set", "expects name=value, got '" + item + "'");
            const std::string name = item.substr(0, eq), value = item.substr(eq + 1);
            bool sw = false;
            for (const FieldSpec& k : allFamilyKnobs())
              if (k.name == name) sw = switchLike(k);
            try {
              o.gen.options[name] = parseKnobValue("--set " + name, value, sw);
            } catch (const std::invalid_argument& e) {
              throw CLI::ValidationError("--set", e.what());
            }
          }
        },
        "a model option as name=value (repeatable); the model's family declares which it takes "
        "(each is also a flag of its own, listed above)");
    a->add_option("--seed", o.seed,
                  "seed of the CPU noise generator, 0 .. 2^64-1 (default 42; -1: random)");
    a->add_option("--max-sequence-length", o.gen.max_sequence_length,
                  "text tokens (default: the pipeline's; FLUX.1 at most 512 T5 tokens, "
                  "Qwen-Image 1024, FLUX.2 [klein] its text encoder's positions)");
    a->add_option("--dtype", o.dtype, "float32 | bfloat16 | float16");
    a->add_option("--device", o.device, "cpu | cuda");
    protocol::addRunOptions(*a, o.run);
    a->add_option("--output", o.output,
                  "output PNG (with data parallel / several images: FILE-i.png); an existing file "
                  "is refused unless --overwrite");
    a->add_flag("--overwrite", o.overwrite, "replace existing --output / --output-tensors files");
    a->add_flag("--print-request-spec", o.printRequestSpec,
                "print the model's declared request (every field with its default, range and "
                "meaning for this family, the size rule, the CFG rule) as Markdown, and exit");
    a->add_flag("--check", o.check,
                "resolve the request and the strategy against the model's declared request "
                "(configs only: nothing loads, no group starts) and print the verdict as one JSON "
                "line: {\"ok\", \"width\", \"height\", \"steps\", \"cfg\", \"notes\"} or "
                "{\"ok\": false, \"problems\": [{\"field\", \"rule\", \"message\"}]}; exit 0 / 2");
    a->add_option("--output-tensors", o.outputTensors,
                  "safetensors with image, initial_latents, final_latents");
    a->add_option("--num-images", o.gen.num_images, "images per request, 1 .. 10000");
    a->add_option("--prompts", o.prompts, "several prompts (split across data-parallel replicas)");
    a->add_option("--omp-threads", o.ompThreads, "OpenMP threads per rank (mpirun; default 1)");
    a->add_option("--init-image", o.gen.init_image,
                  "image-to-image: start from this picture (PNG, JPEG, ...; default size: its "
                  "own, rounded down)");
    a->add_option("--image", o.images,
                  "editing: a reference image (repeat for several, in order; how many the model "
                  "takes and how each is fitted: --print-request-spec)")
        ->allow_extra_args(false);
    a->add_option("--strength", o.gen.strength,
                  "image-to-image strength in (0, 1]: how much of the schedule runs (default 0.6)");
    a->add_option(
        "--mask", o.gen.mask_image,
        "inpainting mask for --init-image (white = repaint; resized if its size differs)");
    a->add_option("--cache", o.gen.cache,
                  "step caching: none | first-block:THRESHOLD | "
                  "taylorseer:ORDER[,INTERVAL,WARMUP][,lite]");
    a->add_flag("--allow-nonfinite-weights", o.allowNonFinite,
                "load checkpoints that hold NaN or Inf (refused by default, naming the tensor; "
                "also DITSTUDIO_ALLOW_NONFINITE_WEIGHTS=1)");
    a->add_option("--lora", o.loras,
                  "LoRA file (diffusers/PEFT or kohya safetensors) with an optional strength, "
                  "FILE[:STRENGTH] (default 1.0, -10 .. 10); repeat for several LoRAs")
        ->allow_extra_args(false);
  };
  addGen(&app);
  app.add_option("--np", o.np, "number of ranks (mpirun -np); default: product of the degrees");
  protocol::addStrategyOptions(app, o.strategy);
  app.add_option("--hostfile", o.hostfile, "mpirun hostfile for several machines");
  app.add_option("--network-interface", o.networkInterface,
                 "with --hostfile: the network interfaces (or CIDR subnets, comma-separated) the "
                 "group's MPI traffic may use, e.g. eth1 or 10.0.0.0/24; without --hostfile every "
                 "channel is bound to loopback");
  app.add_option("--ssh-options", o.sshOptions,
                 "with --hostfile: options for ssh, after -o BatchMode=yes -o ConnectTimeout=10, "
                 "e.g. '-i ~/.ssh/cluster -p 2222'");
  app.add_option("--port-range", o.portRange,
                 "with --hostfile: TCP ports MIN-MAX for everything the group listens on "
                 "(mpirun's channel: the first quarter; the ranks: the rest; at least 4 ports), "
                 "for firewalls");
  app.add_option("--mpirun-args", o.mpirunArgs,
                 "with --hostfile: extra mpirun arguments (whitespace-separated)");
  app.add_flag("--oversubscribe", o.oversubscribe,
               "with --hostfile: allow more ranks than the hostfile's slots");
  app.add_flag("--no-preflight", o.noPreflight,
               "with --hostfile: skip the ssh check of every host (the ranks still compare model "
               "fingerprints before loading)");
  app.add_flag("--json", o.jsonEvents, "print the worker's events as JSON lines");
  auto* bench = app.add_subcommand(
      "bench",
      "time each stage (tokenize, encode, each step, decode) and peak memory; prints JSON");
  addGen(bench);
  bench->add_option("--warmup", warmup, "untimed runs first");
  EvalDemoOptions evalOpts;
  auto* evalDemo = app.add_subcommand(
      "eval-demo",
      "generate the held-out prompts of the synthetic shapes data set (ditstudio-train) on one "
      "rank and score each image (colour, background, position, shape, count)");
  addGen(evalDemo);
  evalDemo->add_option("--count", evalOpts.count, "held-out prompts, 1 .. 1000 (default 48)");
  evalDemo->add_option("--size", evalOpts.size, "image side in pixels (default 64)");
  evalDemo->add_option("--images", evalOpts.images,
                       "score these images instead of generating: FILE.png as written by "
                       "`ditstudio-cli --prompts ... --output FILE.png` (FILE-i.png)");
  evalDemo->add_option("--grid", evalOpts.grid, "write the images as one PNG grid");
  evalDemo->add_option("--columns", evalOpts.columns, "grid columns (default 8)");
  evalDemo->add_flag("--list-prompts", evalOpts.listPrompts,
                     "print the held-out prompts, one per line, and exit");
  PlanOptions planOpts;
  auto* plan = addPlanCommand(app, planOpts);
  CLI11_PARSE(app, argc, argv);
  if (*plan) return runPlan(planOpts);
  try {
    if (o.model.empty()) o.model = defaultModelDir();
    if (o.allowNonFinite) setAllowNonFiniteWeights(true);
    applySeed(o);
    applyLoraOptions(o);
    // `--negative-prompt ""` is a given (empty) negative prompt, as diffusers' negative_prompt="".
    o.gen.negative_prompt_given = app.count("--negative-prompt") > 0 ||
                                  bench->count("--negative-prompt") > 0 ||
                                  evalDemo->count("--negative-prompt") > 0;
    if (*evalDemo) return runEvalDemo(o, evalOpts);
    if (!o.prompts.empty())
      o.gen.num_images =
          static_cast<int>(std::min<size_t>(o.prompts.size(), protocol::kMaxImages + 1));
    if (!*bench) checkOutputPaths(o);  // before request(o) makes the paths absolute
    checkOptions(request(o));
    checkInputImages(request(o).params);
    if (*bench) return runBench(o, warmup);
    auto& s = o.strategy;
    const int product = s.tp_degree * s.ring_degree * s.ulysses_degree * s.cfg_degree * s.dp_degree;
    if (o.np == 0) o.np = product;
    s.world = o.np;
    s.device = o.device;
    auto issues = validateDegrees(s);
    if (!issues.empty()) throw std::invalid_argument(joinIssues(issues));
    // Refuse what every rank would refuse, before any process starts.
    const at::ScalarType dtype = parseComputeDType(o.dtype);
    if (o.device != "cpu" && o.device != "cuda")
      throw std::invalid_argument("unknown device '" + o.device + "' (use cpu or cuda)");
    if (o.device == "cpu" && dtype == at::kHalf)
      throw std::invalid_argument(
          "float16 is not supported on the CPU; use float32 or bfloat16 (float16 on GPUs)");
    refuseOverwrite(o, request(o).imageCount());
    // Refuse an impossible strategy or size before anything starts (configs and safetensors
    // headers only, no weights read).
    const auto model = ModelFolder::open(o.sources());
    if (o.printRequestSpec) {
      std::cout << requestSpecMarkdown(requestSpecOf(model));
      return 0;
    }
    // The family's declared request, resolved once: what the worker will resolve the same way.
    protocol::GenerationParams gen = request(o).params;
    gen.num_images = request(o).imageCount();
    const ResolvedRequest resolved =
        resolveRequest(requestSpecOf(model), requestValues(gen, givenFields(app)));
    for (const std::string& note : resolved.notes) spdlog::warn("{}", note);
    if (o.check) {
      // The verdict every front end gives for this request (the strategy's too).
      std::vector<RequestProblem> problems = resolved.problems;
      if (resolved.ok() && (o.np > 1 || !o.hostfile.empty()))
        for (const RequestProblem& p : strategyProblems(s, modelDims(model), resolved))
          problems.push_back(p);
      json v{{"ok", problems.empty()}};
      if (problems.empty()) {
        v["width"] = resolved.values.width;
        v["height"] = resolved.values.height;
        v["steps"] = resolved.values.steps;
        v["max_sequence_length"] = resolved.values.max_sequence_length;
        v["cfg"] = resolved.cfg;
        v["options"] = resolved.values.options;
        v["notes"] = resolved.notes;
      } else {
        v["problems"] = json::array();
        for (const RequestProblem& p : problems)
          v["problems"].push_back({{"field", p.field}, {"rule", p.rule}, {"message", p.message}});
      }
      std::cout << v.dump() << std::endl;
      return problems.empty() ? 0 : 2;
    }
    throwIfProblems(resolved);
    if (!model.components.empty() && model.components.at("transformer").single_file)
      spdlog::info("model sources:\n{}", model.describeSources());
    if (o.np > 1 || !o.hostfile.empty())
      if (auto issues = validateForRequest(s, modelDims(model), resolved.dims()); !issues.empty())
        throw std::invalid_argument("strategy refused: " + joinIssues(issues));
    if (o.hostfile.empty()) refuseMemory(o, model, resolved, o.np);
    if (o.np == 1 && o.hostfile.empty()) return runLocal(o);
    return runMpi(o);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 2;
  }
}
