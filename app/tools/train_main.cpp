// ditstudio-train: trains the embedded default model on the CPU with LibTorch autograd.
//
// Data: the synthetic captioned shapes (app/demo/shapes_dataset.h), drawn on the fly with
// QPainter; held-out combinations are never drawn. Phases, as latent diffusion models are
// trained:
//  1. AutoencoderKL (the FLUX VAE architecture at a tiny size): reconstruction MSE in [-1, 1]
//     (optionally weighted towards the objects' outlines, --vae-edge-weight; or L1) plus a small
//     KL term on the posterior (diffusers DiagonalGaussianDistribution.kl); then scaling_factor /
//     shift_factor are measured on the latents (1 / std, mean) as the FLUX VAE's are defined.
//  2. FluxTransformer2DModel with the rectified-flow objective of diffusers'
//     train_dreambooth_flux.py: x_t = (1 - sigma) x_0 + sigma noise, target = noise - x_0,
//     sigma ~ sigmoid(N(0, 1)) (logit-normal), the latents packed 2x2 as FluxPipeline packs them,
//     conditioning from the template's CLIP and T5 encoders (frozen, through
//     FluxPipeline::encodePrompt), no guidance embedder; optionally caption dropout.
//     Optionally an exponential moving average of the transformer's weights (--ema-decay, diffusers
//     EMAModel with its warm-up), which is then what the folder holds.
//  3. Optionally the VAE decoder alone (encoder frozen: the latent space is unchanged).
// Phase 1 may be replaced by a VAE this tool trained before (--vae-from); since phase 3 does not
// change the encoder, phases 2 and 3 commute: a transformer trained on a finished model's VAE
// is the one the whole command would have trained. --position-jitter sets how far the
// transformer's training scenes move from their cell's centre (the VAE phases keep 3 px).
// --mixed-precision bf16 runs the transformer's matrix products in bfloat16 (LibTorch CPU
// autocast, as accelerate's mixed_precision="bf16"; the weights, AdamW and the loss stay float32).
// With every scene at its cell's centre (--position-jitter 0) there are finitely many drawings:
// each one's VAE posterior is encoded once (one image at a time, so the numbers do not depend on
// the batch it came in) and kept. Jittered scenes are encoded per step, batched.
// Then a report: validation loss by noise level, and how the analyser of eval-demo reads the
// VAE's reconstructions of held-out drawings (the ceiling for any transformer).
//
// One process, or data parallel under `mpirun -np N` (DataParallel below): the same result up to
// the order of floating-point sums, in about 1/N of the time on N cores.
//
// Training runs through the inference modules themselves: the parameters are leaf tensors with
// requires_grad, handed to the model through WeightSource::fromTensors each step (the model is
// rebuilt per step; its load-time ops such as the fused q/k/v concatenation are part of the
// graph), so the saved folder run through the normal pipeline computes the trainer's numbers.
// AdamW is applied by hand (its state is checkpointed with the parameters). Every random draw of
// step k comes from generators seeded with (seed, phase, k): training is deterministic for a
//
// Files: train_main.cpp (the options, the Trainer's steps, main), train_state.* (parameters,
// AdamW, checkpoints), train_data.* (data parallel, drawn batches, JSON files).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "app/common/blas_kernel.h"
#include "app/common/generation.h"
#include "app/demo/shapes_dataset.h"
#include "app/demo/shapes_draw.h"
#include "app/tools/train_data.h"
#include "app/tools/train_state.h"
#include "backend/io/config_json.h"
#include "backend/io/model_folder.h"
#include "backend/io/png_io.h"
#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl.h"
#include "backend/models/family_registry.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/pipelines/flux/pipeline_flux.h"
#include "parallel/process_group_mpi.h"
#include "parallel/runtime.h"
#include "parallel/torch_compat.h"

using namespace dit;
using namespace dit::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

/// The command line (CLI11 fills it; see addOptions for each option's meaning).
struct TrainOptions {
  std::string templ, out, checkpoint, probe, vaeLoss = "mse", vaeGrid, vaeFrom,
                                             mixedPrecision = "no";
  uint64_t seed = 0;
  int size = 64, threads = 2, batch = 16, vaeBatch = 8, logEvery = 25, ckptEvery = 200;
  int64_t vaeSteps = 400, steps = 2000;
  double lr = 1e-3, vaeLr = 2e-3, klWeight = 1e-4, wd = 0.01, uniformFraction = 0.3,
         captionDropout = 0.0, decoderLr = 1e-3, edgeWeight = 1.0, emaDecay = 0.0, defaultCfg = 5.0,
         jitter = demo::kDefaultPositionJitter;
  int64_t decoderSteps = 0;
  int layers = 2, singleLayers = 2, heads = 4, headDim = 16, t5Len = 32, latentChannels = 4,
      vaeLayersPerBlock = 1;
  std::vector<int> vaeChannels{16, 32, 32}, axes{4, 6, 6};
  int64_t stopAt = -1;
};

void addOptions(CLI::App& app, TrainOptions& o) {
  app.add_option("--template", o.templ,
                 "diffusers FLUX.1 folder whose tokenizers, CLIP/T5 encoders (kept frozen) and "
                 "scheduler config are used and copied")
      ->required();
  app.add_option("--out", o.out, "output diffusers folder")->required();
  app.add_option("--seed", o.seed, "seed of the data, the initial weights and every draw");
  app.add_option("--size", o.size, "image side in pixels (multiple of 2 * vae_scale_factor)");
  app.add_option("--vae-steps", o.vaeSteps, "AutoencoderKL optimisation steps");
  app.add_option("--steps", o.steps, "transformer optimisation steps");
  app.add_option("--batch", o.batch, "transformer batch size");
  app.add_option("--vae-batch", o.vaeBatch, "AutoencoderKL batch size");
  app.add_option("--lr", o.lr, "transformer peak learning rate (AdamW)");
  app.add_option("--vae-lr", o.vaeLr, "AutoencoderKL peak learning rate (AdamW)");
  app.add_option("--vae-loss", o.vaeLoss,
                 "AutoencoderKL (and decoder) reconstruction loss: mse, or l1 (sharper edges)")
      ->check(CLI::IsMember({"mse", "l1"}));
  app.add_option("--uniform-sigma-fraction", o.uniformFraction,
                 "fraction of the transformer's noise levels drawn uniformly from [0, 1] instead "
                 "of logit-normal (default 0.3)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--caption-dropout", o.captionDropout,
                 "fraction of training captions replaced by the empty prompt (for true CFG with "
                 "--negative-prompt \"\" at generation; default 0)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--default-cfg-scale", o.defaultCfg,
                 "with --caption-dropout: the CFG scale (the pipeline's true CFG against the empty "
                 "prompt: the field its guider reads) the GUI "
                 "starts the model with, model_index.json \"_dit_studio_default_settings\" "
                 "(default 5; 1: none)")
      ->check(CLI::Range(1.0, 100.0));
  app.add_option("--decoder-steps", o.decoderSteps,
                 "after the transformer: steps fine-tuning the VAE decoder alone (encoder frozen, "
                 "latent space unchanged; default 0)");
  app.add_option("--decoder-lr", o.decoderLr, "decoder fine-tuning peak learning rate (AdamW)");
  app.add_option("--ema-decay", o.emaDecay,
                 "keep an exponential moving average of the transformer's weights with this decay "
                 "(diffusers EMAModel, e.g. 0.999) and write it instead of the last weights "
                 "(default 0: off)")
      ->check(CLI::Range(0.0, 0.99999));
  app.add_option("--vae-edge-weight", o.edgeWeight,
                 "AutoencoderKL / decoder MSE weight of pixels on the objects' outlines against "
                 "1 for the rest (default 1: plain MSE)")
      ->check(CLI::Range(1.0, 1000.0));
  app.add_option("--vae-grid", o.vaeGrid,
                 "write a PNG of the first 16 held-out drawings (top rows) above their VAE "
                 "reconstructions");
  app.add_option("--position-jitter", o.jitter,
                 "the transformer's training scenes: offset from their cell's centre, uniform "
                 "within +-PX pixels at 64x64 (0: where eval-demo draws its held-out scenes); "
                 "the VAE phases always use the default 3, so their result does not depend on it")
      ->check(CLI::Range(0.0, 16.0));
  app.add_option("--vae-from", o.vaeFrom,
                 "take the AutoencoderKL (config, weights, shift/scale) of a folder this tool "
                 "wrote and skip phase 1; the transformer's in_channels follow its latents")
      ->check(CLI::ExistingDirectory);
  app.add_option("--mixed-precision", o.mixedPrecision,
                 "the transformer phase's matrix products: no (float32), or bf16 (bfloat16 "
                 "autocast; weights, AdamW and loss in float32). bf16 needs a CPU with bf16 "
                 "instructions (avx512_bf16 / amx_bf16): elsewhere LibTorch emulates it, tens of "
                 "times slower, so it falls back to float32 and says so")
      ->check(CLI::IsMember({"no", "bf16"}));
  app.add_option("--kl-weight", o.klWeight, "weight of the KL term (per latent element)");
  app.add_option("--num-layers", o.layers, "double-stream blocks");
  app.add_option("--num-single-layers", o.singleLayers, "single-stream blocks");
  app.add_option("--num-attention-heads", o.heads);
  app.add_option("--attention-head-dim", o.headDim);
  app.add_option("--axes-dims-rope", o.axes, "must sum to attention_head_dim");
  app.add_option("--vae-block-out-channels", o.vaeChannels);
  app.add_option(
         "--vae-latent-channels", o.latentChannels,
         "AutoencoderKL latent channels (the transformer's in_channels are 4x: 2x2 packing)")
      ->check(CLI::Range(1, 64));
  app.add_option("--vae-layers-per-block", o.vaeLayersPerBlock, "AutoencoderKL resnets per block")
      ->check(CLI::Range(1, 4));
  app.add_option("--max-sequence-length", o.t5Len, "T5 tokens (tokenizer_2 model_max_length)");
  app.add_option("--threads", o.threads, "intra-op threads");
  app.add_option("--log-every", o.logEvery, "print the mean loss every N steps");
  app.add_option("--checkpoint", o.checkpoint,
                 "resume from this file when it exists; written every --checkpoint-every steps "
                 "and at the end of each phase");
  app.add_option("--checkpoint-every", o.ckptEvery);
  app.add_option("--stop-at-step", o.stopAt,
                 "write the checkpoint at this transformer step and exit (tests of resuming)");
  app.add_option("--probe", o.probe,
                 "write fixed transformer inputs and the trainer's own prediction for them "
                 "(tests compare it with the saved folder run through the normal loader)");
}

/// One training run: the options (members, as the command line named them), the data-parallel
/// group, the folder being written, the models' state, and the phases as steps of run().
class Trainer : private TrainOptions {
 public:
  Trainer(const TrainOptions& o, DataParallel dp, BlasInfo blas)
      : TrainOptions(o), dp(std::move(dp)), writer(this->dp.rank == 0), blas(std::move(blas)) {}

  /// The whole run; returns the exit code (1: an error, reported; the partial folder removed).
  int run() {
    try {
      start();
      prepareFolder();
      // Frozen text encoders: the template's, through the normal pipeline.
      textPipe = std::make_unique<FluxPipeline>(ModelFolder::open(templ), PipelineOptions{});
      initModels();
      resume();
      printSizes();
      trainVae();
      freezeVae();
      if (trainTransformer()) {
        finish();
        return 0;
      }
      trainDecoder();
      // Rank 0 alone from here: the reports and the folder.
      if (!writer) {
        finish();
        return 0;
      }
      reportVae();
      // What the folder holds: the moving average with --ema-decay, else the last weights.
      const Params trFinal = emaDecay > 0 ? trEma : detached(tr);
      validate(trFinal);
      writeFolder(trFinal);
      finish();
      return 0;
    } catch (const std::exception& e) {
      // One failing rank ends the whole group at once (no rank left waiting in a collective).
      if (dp.size > 1) abortGroup(dp.rank, e.what());
      std::cerr << "error: " << e.what() << std::endl;
      if (writer) {
        std::error_code ec;  // nothing half-written is left behind
        fs::remove_all(out + ".partial", ec);
      }
      return 1;
    }
  }

 private:
  void finish() {
    dp.group.reset();
    if (runtimeActive()) finalizeRuntime();
  }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Only rank 0 writes files (writeFile); every rank builds the same configs in memory.
  void writeFile(const fs::path& p, const json& j) const {
    if (writer) writeJson(p, j);
  }
  const PromptEmbeds& embed(const std::string& prompt) {
    auto it = embedCache.find(prompt);
    if (it != embedCache.end()) return it->second;
    return embedCache.emplace(prompt, textPipe->encodePrompt(prompt, t5Len)).first->second;
  }
  void save() {
    if (writer && !checkpoint.empty())
      saveCheckpoint(checkpoint, ck, vae, vaeOpt, tr, trOpt, trEma);
  }

  // Threads, BLAS, the clock.
  void start() {
    at::set_num_threads(threads);
    setBlasThreads(threads);
    std::cout << "BLAS: " << blas.library << ", core " << blas.core << " (" << blas.selection
              << "), " << threads << " thread(s)";
    if (dp.size > 1) std::cout << " per rank, " << dp.size << " data-parallel ranks";
    std::cout << std::endl;
    t0 = std::chrono::steady_clock::now();
  }

  // The folder's configs (the template's, resized) and its copied components, in `tmp`.
  void prepareFolder() {
    T = templ, O = out, tmp = out + ".partial";
    // --vae-from: that folder's VAE config, checked under its own path before anything is
    // written (weights and shapes are checked against it once the model is built).
    vaeFromConfigPath = fs::path(vaeFrom) / "vae/config.json";
    if (!vaeFrom.empty()) {
      vaeFromConfig = readJson(vaeFromConfigPath);
      const AutoencoderKLConfig c =
          parseAutoencoderKLConfig(vaeFromConfig, vaeFromConfigPath.string());
      if (c.in_channels != 3 || c.out_channels != 3)
        throw std::invalid_argument(vaeFromConfigPath.string() +
                                    ": in_channels and out_channels must be 3 (RGB)");
      for (const char* k : {"shift_factor", "scaling_factor"})
        if (!vaeFromConfig.contains(k) || !vaeFromConfig[k].is_number())
          throw std::invalid_argument(vaeFromConfigPath.string() + ": no numeric " + k +
                                      " (not a trained VAE)");
      latentChannels = c.latent_channels;
    }
    if (writer) {
      fs::remove_all(tmp);
      fs::create_directories(tmp / "transformer");
      fs::create_directories(tmp / "vae");
      for (const char* d :
           {"tokenizer", "tokenizer_2", "scheduler", "text_encoder", "text_encoder_2"})
        fs::copy(T / d, tmp / d, fs::copy_options::recursive);
    }
    json mi = readJson(T / "model_index.json");
    // The settings the GUI starts this model with (ModelFolder::default_settings): its trained
    // size, 28 steps, and with caption dropout true CFG against the empty prompt.
    json settings{{"width", size}, {"height", size}, {"steps", 28}};
    if (captionDropout > 0 && defaultCfg > 1)
      settings["negative_prompt"] = "",
      settings[requestSpecOf(ModelFolder::open(T.string())).guider.scale_field] = defaultCfg;
    mi["_dit_studio_default_settings"] = settings;
    writeFile(tmp / "model_index.json", mi);
    json tok2 = readJson(T / "tokenizer_2/tokenizer_config.json");
    tok2["model_max_length"] = t5Len;
    writeFile(tmp / "tokenizer_2/tokenizer_config.json", tok2);
    tc = readJson(T / "transformer/config.json");
    tc["num_layers"] = layers;
    tc["num_single_layers"] = singleLayers;
    tc["num_attention_heads"] = heads;
    tc["attention_head_dim"] = headDim;
    tc["axes_dims_rope"] = axes;
    tc["guidance_embeds"] = false;
    tc["in_channels"] = 4 * latentChannels;
    if (!tc["out_channels"].is_null()) tc["out_channels"] = 4 * latentChannels;
    writeFile(tmp / "transformer/config.json", tc);
    vc = readJson(T / "vae/config.json");
    vc["block_out_channels"] = vaeChannels;
    vc["down_block_types"] = std::vector<std::string>(vaeChannels.size(), "DownEncoderBlock2D");
    vc["up_block_types"] = std::vector<std::string>(vaeChannels.size(), "UpDecoderBlock2D");
    vc["norm_num_groups"] = 8;
    vc["latent_channels"] = latentChannels;
    vc["layers_per_block"] = vaeLayersPerBlock;
    vc["sample_size"] = size;
    if (!vaeFrom.empty()) {
      // --vae-from: that folder's VAE as it is. Its architecture flags (--vae-latent-channels,
      // --vae-block-out-channels, --vae-layers-per-block) do not apply; the loss flags
      // (--vae-edge-weight, --vae-loss, --vae-batch, --decoder-lr) still drive the decoder phase.
      vc = vaeFromConfig;
      tc["in_channels"] = 4 * latentChannels;
      if (!tc["out_channels"].is_null()) tc["out_channels"] = 4 * latentChannels;
    }
    writeFile(tmp / "vae/config.json", vc);

    vcfg = parseAutoencoderKLConfig(vc, (tmp / "vae/config.json").string());
    vsf = vcfg.vaeScaleFactor();
    // The trained size becomes the model's default image size (ModelDims::default_sample_size).
    tc["sample_size"] = size / vsf;
    writeFile(tmp / "transformer/config.json", tc);
    tcfg = parseFluxTransformerConfig(tc, (tmp / "transformer/config.json").string());
    if (size % (2 * vsf) != 0)
      throw std::invalid_argument("--size " + std::to_string(size) + " is not a multiple of " +
                                  std::to_string(2 * vsf));
  }

  // Initial weights of both models.
  void initModels() {
    vae = initParams(seed * 7 + 1, [&](WeightSource& w) { AutoencoderKL m(vcfg, w); });
    tr = initParams(seed * 7 + 2, [&](WeightSource& w) { FluxTransformer2DModel m(tcfg, w); },
                    {"norm1.linear", "norm1_context.linear", "norm.linear", "norm_out.linear",
                     "proj_out.weight"});
    // proj_out of single blocks must not start at 0 (it carries attention + MLP): re-initialise.
    for (auto& [k, t] : tr)
      if (k.rfind("single_transformer_blocks.", 0) == 0 &&
          k.find("proj_out.weight") != std::string::npos) {
        at::NoGradGuard ng;
        auto gen =
            at::detail::createCPUGenerator(seed * 7 + 3 + std::hash<std::string>{}(k) % 1000);
        t.copy_(at::randn(t.sizes(), gen, at::kFloat) / std::sqrt(static_cast<double>(t.size(1))));
      }
  }

  // Resuming from --checkpoint (and --vae-from): the state, checked against the options.
  void resume() {
    resumed = !checkpoint.empty() && loadCheckpoint(checkpoint, ck, vae, vaeOpt, tr, trOpt, trEma);
    if (resumed)
      std::cout << "resumed from " << checkpoint << ": phase " << ck.phase << ", step " << ck.step
                << std::endl;
    if (!vaeFrom.empty()) {
      if (resumed && ck.phase == "vae")
        throw std::invalid_argument(checkpoint +
                                    ": this checkpoint is training its own VAE (step " +
                                    std::to_string(ck.step) + "); resume it without --vae-from");
      const fs::path stPath = fs::path(vaeFrom) / "vae/diffusion_pytorch_model.safetensors";
      SafetensorsCollection file(stPath.string());
      auto fromFile = [&](const std::string& k, const at::Tensor& like) {
        if (!file.contains(k))
          throw std::runtime_error(stPath.string() + ": no tensor '" + k +
                                   "' (not an AutoencoderKL written by ditstudio-train?)");
        at::Tensor v = loadTensor(file, k, at::kFloat);
        if (v.sizes() != like.sizes())
          throw std::runtime_error(stPath.string() + ": '" + k + "' has another shape than " +
                                   vaeFromConfigPath.string() + " gives");
        return v;
      };
      const double shift = vaeFromConfig["shift_factor"].get<double>(),
                   scale = vaeFromConfig["scaling_factor"].get<double>();
      if (!resumed) {
        // Phase 1 replaced by the trained VAE: its weights and its latent statistics.
        for (auto& [k, t] : vae) t = fromFile(k, t).requires_grad_(true);
        ck.shift = shift, ck.scale = scale;
        ck.phase = "transformer", ck.step = 0;
        std::cout << "AutoencoderKL from " << vaeFrom << " (phase 1 skipped)" << std::endl;
      } else {
        // A checkpoint past phase 1 holds its VAE: it must be this folder's (the same encoder
        // and latent statistics; the decoder may since have been fine-tuned).
        bool same = ck.shift == shift && ck.scale == scale;
        for (const auto& [k, t] : vae)
          if (k.rfind("encoder.", 0) == 0 || k.rfind("quant_conv.", 0) == 0)
            same = same && at::equal(t.detach(), fromFile(k, t));
        if (!same)
          throw std::invalid_argument(checkpoint + ": this checkpoint's VAE is not the one in " +
                                      vaeFrom + "; resume it with the options it was started with");
      }
    }
    if (resumed && trOpt.step > 0 && ck.position_jitter != jitter) {
      char was[32];
      std::snprintf(was, sizeof was, "%g", ck.position_jitter);
      throw std::invalid_argument(checkpoint +
                                  ": this checkpoint's transformer was trained with "
                                  "--position-jitter " +
                                  was + "; resume it with the options it was started with");
    }
    ck.position_jitter = jitter;
    // --mixed-precision: what was asked, then what this CPU runs (a checkpoint records the
    // latter, so a resume is compared with it, and a bf16 checkpoint cannot go on here in float32).
    const bool trainsTransformer =
        steps > 0 && (ck.phase == "vae" || (ck.phase == "transformer" && ck.step < steps));
    if (mixedPrecision == "bf16" && !cpuHasNativeBFloat16()) {
      if (resumed && trOpt.step > 0 && ck.mixed_precision == "bf16")
        throw std::invalid_argument(checkpoint +
                                    ": this checkpoint's transformer was trained with "
                                    "--mixed-precision bf16, and this CPU has no bf16 "
                                    "instructions (no avx512_bf16 / amx_bf16) to go on with it");
      if (trainsTransformer)
        std::cout << "--mixed-precision bf16: this CPU has no bf16 instructions (no avx512_bf16 / "
                     "amx_bf16), where LibTorch emulates bfloat16 tens of times slower; training "
                     "in float32 (--mixed-precision no)"
                  << std::endl;
      mixedPrecision = "no";
    }
    if (resumed && trOpt.step > 0 && ck.mixed_precision != mixedPrecision)
      throw std::invalid_argument(checkpoint +
                                  ": this checkpoint's transformer was trained with "
                                  "--mixed-precision " +
                                  ck.mixed_precision +
                                  "; resume it with the options it was started with");
    ck.mixed_precision = mixedPrecision;
    {
      int64_t elements = 0;
      for (auto& [k, t] : vae) elements += t.numel();
      for (auto& [k, t] : tr) elements += t.numel();
      dp.requireSame({ck.phase == "vae"           ? 0
                      : ck.phase == "transformer" ? 1
                                                  : 2,
                      ck.step, vaeOpt.step, trOpt.step, elements,
                      static_cast<int64_t>(mixedPrecision == "bf16")},
                     "where training resumes (and --mixed-precision as this CPU runs it)");
    }
    if (emaDecay > 0 && trEma.empty()) {
      if (trOpt.step > 0)
        throw std::invalid_argument(checkpoint +
                                    ": this checkpoint's transformer was trained without "
                                    "--ema-decay; resume it with the options it was started with");
      for (auto& [k, t] : tr) trEma[k] = t.detach().clone();
    }
    if (emaDecay == 0 && !trEma.empty())
      throw std::invalid_argument(checkpoint +
                                  ": this checkpoint was trained with --ema-decay; resume it with "
                                  "the options it was started with");
  }

  void printSizes() const {
    int64_t vaeParams = 0, trParams = 0;
    for (auto& [k, t] : vae) vaeParams += t.numel();
    for (auto& [k, t] : tr) trParams += t.numel();
    std::cout << "AutoencoderKL " << vaeParams << " parameters, FluxTransformer2DModel " << trParams
              << " parameters, images " << size << "x" << size << ", latents " << size / vsf << "x"
              << size / vsf << "x" << vcfg.latent_channels << ", "
              << (size / vsf / 2) * (size / vsf / 2) << " image tokens, " << t5Len << " text tokens"
              << std::endl;
  }

  // The VAE's and the decoder's training loss (`mse`: the plain MSE of rec against x).
  at::Tensor reconstructionLoss(const at::Tensor& rec, const at::Tensor& x,
                                const at::Tensor& mse) const {
    if (vaeLoss == "l1") return (rec - x).abs().mean();
    if (edgeWeight == 1.0) return mse;
    return ((rec - x).pow(2) * edgeWeights(x, edgeWeight)).mean();
  }
  // This rank's part of a batch of scenes, drawn: [n / ranks, 3, size, size].
  at::Tensor drawPart(const std::vector<demo::ShapeScene>& all) const {
    const auto [lo, hi] = dp.part(static_cast<int>(all.size()));
    return drawBatch({all.begin() + lo, all.begin() + hi}, size);
  }
  // The shape of `part` with the whole batch's rows (random draws are made for the whole batch
  // and sliced, so that every rank count draws the same numbers).
  static std::vector<int64_t> wholeBatch(const at::Tensor& part, int n) {
    std::vector<int64_t> s = part.sizes().vec();
    s[0] = n;
    return s;
  }
  // Phases 1, 2 and 6 draw the VAE's scenes (default jitter), 3-5 the transformer's.
  std::vector<demo::ShapeScene> scenes(uint64_t phase, int64_t step, int n) const {
    const float phaseJitter =
        phase >= 3 && phase <= 5 ? static_cast<float>(jitter) : demo::kDefaultPositionJitter;
    std::vector<demo::ShapeScene> s;
    for (int i = 0; i < n; ++i)
      s.push_back(demo::trainingScene(seed + phase * 1000003, static_cast<uint64_t>(step) * n + i,
                                      phaseJitter));
    return s;
  }

  // Phase 1: AutoencoderKL.
  void trainVae() {
    if (ck.phase == "vae") {
      double acc = 0;
      int accN = 0;
      for (int64_t step = ck.step; step < vaeSteps; ++step) {
        const at::Tensor x = drawPart(scenes(1, step, vaeBatch));
        auto gen = at::detail::createCPUGenerator(seed * 1000 + 17 + step * 2);
        auto w = WeightSource::fromTensors(vae, "<training AutoencoderKL>");
        AutoencoderKL model(vcfg, *w);
        const DiagonalGaussianDistribution post = model.encode(x);
        const at::Tensor eps =
            dp.slice(at::randn(wholeBatch(post.mean, vaeBatch), gen, at::kFloat));
        const at::Tensor rec = model.decode(post.mean + post.std * eps);
        const at::Tensor mse = (rec - x).pow(2).mean();
        const at::Tensor recLoss = reconstructionLoss(rec, x, mse);
        const at::Tensor kl =
            0.5 * (post.mean.pow(2) + post.logvar.exp() - 1.0 - post.logvar).mean();
        const at::Tensor loss = recLoss + klWeight * kl;
        loss.backward();
        double klMean = kl.item<double>();
        acc += dp.averageGradients(vae, mse.item<double>(), &klMean), ++accN;
        vaeOpt.update(vae, schedule(vaeLr, step, 50, vaeSteps), 0.0);
        if ((step + 1) % logEvery == 0 || step + 1 == vaeSteps) {
          vaeLast = acc / accN;
          if (vaeFirst < 0) vaeFirst = vaeLast;
          std::printf("vae step %lld/%lld  mse %.5f  kl %.3f  %.0f s\n",
                      static_cast<long long>(step + 1), static_cast<long long>(vaeSteps),
                      acc / accN, klMean, elapsed());
          std::fflush(stdout);
          acc = 0, accN = 0;
        }
        if (!checkpoint.empty() && (step + 1) % ckptEvery == 0 && step + 1 < vaeSteps) {
          ck.step = step + 1;
          save();
        }
      }
      // Latent statistics (FLUX's shift_factor / scaling_factor: mean and 1 / std).
      {
        at::NoGradGuard ng;
        auto w = WeightSource::fromTensors(detached(vae));
        AutoencoderKL model(vcfg, *w);
        std::vector<at::Tensor> zs;
        for (int b = 0; b < 8; ++b)
          zs.push_back(model.encode(drawBatch(scenes(2, b, 32), size)).mean);
        const at::Tensor z = at::cat(zs);
        ck.shift = z.mean().item<double>();
        ck.scale = 1.0 / z.std().item<double>();
      }
      ck.phase = "transformer";
      ck.step = 0;
      if (!checkpoint.empty()) save();
    }
  }

  // The VAE frozen with its latent statistics, for the transformer's phase.
  void freezeVae() {
    vcfg.shift_factor = ck.shift;
    vcfg.scaling_factor = ck.scale;
    std::printf("latents: shift_factor %.5f scaling_factor %.5f\n", ck.shift, ck.scale);
    vaeFinal = detached(vae);
    vaeW = WeightSource::fromTensors(vaeFinal);
    frozenVae = std::make_unique<const AutoencoderKL>(vcfg, *vaeW);

    const int64_t hl = size / vsf;
    imgIds = FluxPipeline::latentImageIds(static_cast<int>(hl / 2), static_cast<int>(hl / 2));
  }

  // The VAE posteriors (mean, std: [n, C, h, w]) of scenes. Without jitter each is encoded alone
  // (its numbers independent of the batch and the rank count) and kept: finitely many such
  // drawings, about 11,000, 90 MB per rank at 64x64.
  std::pair<at::Tensor, at::Tensor> posteriors(const std::vector<demo::ShapeScene>& sc) {
    // Jittered scenes (each drawing new): one batched encode, as without the cache.
    for (const auto& s : sc)
      if (s.jitter_x != 0 || s.jitter_y != 0) {
        const DiagonalGaussianDistribution post = frozenVae->encode(drawBatch(sc, size));
        return std::make_pair(post.mean, post.std);
      }
    std::vector<at::Tensor> means, stdevs;
    for (const auto& s : sc) {
      const auto key =
          std::make_tuple(s.shape, s.colour, s.background, s.position, s.size, s.count);
      auto it = posteriorCache.find(key);
      if (it == posteriorCache.end()) {
        const DiagonalGaussianDistribution post = frozenVae->encode(drawBatch({s}, size));
        it = posteriorCache.emplace(key, std::make_pair(post.mean[0].clone(), post.std[0].clone()))
                 .first;
      }
      means.push_back(it->second.first), stdevs.push_back(it->second.second);
    }
    return std::make_pair(at::stack(means), at::stack(stdevs));
  }
  // The inputs of a batch of n scenes, rows [lo, hi) of it (the random draws are the whole
  // batch's, sliced).
  void batchInputs(uint64_t phase, int64_t step, int n, int lo, int hi, at::Tensor& x0,
                   at::Tensor& enc, at::Tensor& pooled, at::Tensor& txtIds) {
    at::NoGradGuard ng;
    const auto sc = scenes(phase, step, n);
    auto gen = at::detail::createCPUGenerator(seed * 1000 + 29 + step * 2 + phase * 7919);
    const auto [mean, stdev] = posteriors({sc.begin() + lo, sc.begin() + hi});
    const at::Tensor eps = at::randn(wholeBatch(mean, n), gen, at::kFloat).slice(0, lo, hi);
    const at::Tensor z = mean + stdev * eps;
    x0 = packLatents((z - ck.shift) * ck.scale);
    // Caption dropout (training batches only): the empty prompt instead of the caption, so
    // that the model also learns the unconditional prediction true CFG subtracts.
    at::Tensor drop = at::zeros({n}, at::kBool);
    if (phase == 3 && captionDropout > 0) {
      auto dgen = at::detail::createCPUGenerator(seed * 1000 + 37 + step * 2);
      drop = at::rand({n}, dgen, at::kFloat) < captionDropout;
    }
    std::vector<at::Tensor> e, p;
    for (int i = lo; i < hi; ++i) {
      const auto& s = sc[i];
      const PromptEmbeds& pe = embed(drop[i].item<bool>() ? std::string() : demo::caption(s));
      e.push_back(pe.prompt_embeds[0]);
      p.push_back(pe.pooled[0]);
      txtIds = pe.text_ids;
    }
    enc = at::stack(e);
    pooled = at::stack(p);
  }

  // Phase 2: the transformer. True when --stop-at-step stopped the run.
  bool trainTransformer() {
    double acc = 0;
    int accN = 0;
    for (int64_t step = ck.phase == "transformer" ? ck.step : steps; step < steps; ++step) {
      at::Tensor x0, enc, pooled, txtIds;
      const auto [lo, hi] = dp.part(batch);
      batchInputs(3, step, batch, lo, hi, x0, enc, pooled, txtIds);
      auto gen = at::detail::createCPUGenerator(seed * 1000 + 31 + step * 2);
      // Logit-normal sigma (FLUX / SD3), with a fraction drawn uniformly from [0, 1]: a model
      // this small never learns the ends of the schedule from logit-normal draws alone (sigma
      // > 0.95 has probability 0.2%), yet sampling starts at sigma = 1 (measured: validation
      // loss 1.39 at sigma 1 against 0.25 at 0.5 after 2000 steps, and black images).
      const at::Tensor logitNormal = at::sigmoid(at::randn({batch}, gen, at::kFloat));
      const at::Tensor uniform = at::rand({batch}, gen, at::kFloat);
      const at::Tensor pickUniform = at::rand({batch}, gen, at::kFloat) < uniformFraction;
      const at::Tensor sigma = at::where(pickUniform, uniform, logitNormal).slice(0, lo, hi);
      const at::Tensor noise = at::randn(wholeBatch(x0, batch), gen, at::kFloat).slice(0, lo, hi);
      const at::Tensor s3 = sigma.view({hi - lo, 1, 1});
      const at::Tensor xt = (1.0 - s3) * x0 + s3 * noise;
      const at::Tensor target = noise - x0;
      auto w = WeightSource::fromTensors(tr, "<training FluxTransformer2DModel>");
      FluxTransformer2DModel model(tcfg, *w);
      at::Tensor pred;
      {
        const torch_compat::CpuAutocast autocast(mixedPrecision == "bf16");
        pred = model.forward(xt, enc, pooled, sigma, imgIds, txtIds, at::Tensor()).to(at::kFloat);
      }
      const at::Tensor loss = (pred - target).pow(2).mean();
      loss.backward();
      acc += dp.averageGradients(tr, loss.item<double>()), ++accN;
      trOpt.update(tr, schedule(lr, step, 100, steps), wd);
      if (emaDecay > 0) updateEma(trEma, tr, emaDecay, step);
      if ((step + 1) % logEvery == 0 || step + 1 == steps) {
        lastLoss = acc / accN;
        if (firstLoss < 0) firstLoss = lastLoss;
        std::printf("transformer step %lld/%lld  loss %.5f  %.0f s\n",
                    static_cast<long long>(step + 1), static_cast<long long>(steps), lastLoss,
                    elapsed());
        std::fflush(stdout);
        acc = 0, accN = 0;
      }
      if (!checkpoint.empty() && (step + 1) % ckptEvery == 0 && step + 1 < steps) {
        ck.step = step + 1;
        save();
      }
      if (step + 1 == stopAt) {
        if (checkpoint.empty()) throw std::invalid_argument("--stop-at-step needs --checkpoint");
        ck.step = step + 1;
        save();
        if (writer) fs::remove_all(tmp);
        std::printf("stopped at transformer step %lld (checkpoint %s)\n",
                    static_cast<long long>(stopAt), checkpoint.c_str());
        return true;
      }
    }
    if (!checkpoint.empty() && ck.phase == "transformer") {
      ck.step = steps;
      save();
    }
    return false;
  }

  void trainDecoder() {
    // Phase 3 (optional): the VAE decoder alone, the encoder frozen, on reconstruction MSE, as
    // Stability's ft-MSE decoders were made: the latent space the transformer learned is
    // unchanged (same encoder, same shift_factor / scaling_factor), the decoded images sharper.
    // It reads only the VAE's weights, so it gives the same decoder whichever transformer ran.
    if (decoderSteps > 0) {
      if (ck.phase == "transformer") {
        ck.phase = "decoder", ck.step = 0;
        vaeOpt = AdamW{};  // a fresh optimiser for the decoder
      }
      double dacc = 0;
      int daccN = 0;
      for (int64_t step = ck.step; step < decoderSteps; ++step) {
        const at::Tensor x = drawPart(scenes(6, step, vaeBatch));
        auto gen = at::detail::createCPUGenerator(seed * 1000 + 41 + step * 2);
        auto w = WeightSource::fromTensors(vae, "<training AutoencoderKL decoder>");
        AutoencoderKL model(vcfg, *w);
        at::Tensor z;
        {
          at::NoGradGuard ng;  // no graph through the encoder: it gets no gradient
          const DiagonalGaussianDistribution post = model.encode(x);
          z = post.mean +
              post.std * dp.slice(at::randn(wholeBatch(post.mean, vaeBatch), gen, at::kFloat));
        }
        const at::Tensor rec = model.decode(z);
        const at::Tensor mse = (rec - x).pow(2).mean();
        reconstructionLoss(rec, x, mse).backward();
        dacc += dp.averageGradients(vae, mse.item<double>()), ++daccN;
        vaeOpt.update(vae, schedule(decoderLr, step, 50, decoderSteps), 0.0);
        if ((step + 1) % logEvery == 0 || step + 1 == decoderSteps) {
          std::printf("decoder step %lld/%lld  mse %.5f  %.0f s\n",
                      static_cast<long long>(step + 1), static_cast<long long>(decoderSteps),
                      dacc / daccN, elapsed());
          std::fflush(stdout);
          dacc = 0, daccN = 0;
        }
        if (!checkpoint.empty() && (step + 1) % ckptEvery == 0 && step + 1 < decoderSteps) {
          ck.step = step + 1;
          save();
        }
      }
      if (!checkpoint.empty() && ck.step < decoderSteps) {
        ck.step = decoderSteps;
        save();
      }
    }
  }

  void reportVae() {
    // The VAE's ceiling: the held-out scenes drawn, encoded (posterior mean), decoded and read by
    // eval-demo's analyser. No transformer can score above what its decoder reproduces. A failure
    // here (e.g. an unwritable --vae-grid) is reported and does not cost the trained model.
    try {
      at::NoGradGuard ng;
      auto w = WeightSource::fromTensors(detached(vae));
      const AutoencoderKL model(vcfg, *w);
      const auto held = demo::heldOutScenes(96);
      int ok[4] = {0, 0, 0, 0}, confusion[demo::kShapes][demo::kShapes + 1] = {};
      for (size_t i = 0; i < held.size(); i += 16) {
        const std::vector<demo::ShapeScene> part(held.begin() + i,
                                                 held.begin() + std::min(held.size(), i + 16));
        const at::Tensor x = drawBatch(part, size);
        const at::Tensor rec = model.decode(model.encode(x).mean);
        if (i == 0 && !vaeGrid.empty()) {
          // [2 x 16 images] -> rows of 8: drawings, then reconstructions.
          const at::Tensor both = at::cat({x, rec.clamp(-1, 1)});
          const at::Tensor g = ((both + 1) * 127.5)
                                   .round()
                                   .to(at::kByte)
                                   .view({4, 8, 3, size, size})
                                   .permute({0, 3, 1, 4, 2})
                                   .reshape({4 * size, 8 * size, 3})
                                   .contiguous();
          writePng(vaeGrid, g.data_ptr<uint8_t>(), 8 * size, 4 * size);
        }
        const at::Tensor u8 = ((rec.clamp(-1, 1) + 1) * 127.5)
                                  .round()
                                  .to(at::kByte)
                                  .permute({0, 2, 3, 1})
                                  .contiguous();
        for (size_t j = 0; j < part.size(); ++j) {
          const at::Tensor one = u8[static_cast<int64_t>(j)];
          const std::vector<uint8_t> rgb(one.data_ptr<uint8_t>(),
                                         one.data_ptr<uint8_t>() + one.numel());
          const demo::SceneReading r = demo::analyse(rgb, size, size);
          ok[0] += r.colour == part[j].colour, ok[1] += r.background == part[j].background;
          ok[2] += r.position == part[j].position, ok[3] += r.shape == part[j].shape;
          ++confusion[part[j].shape][r.shape + 1];
        }
      }
      std::printf(
          "VAE reconstructions of %zu held-out drawings, read by the analyser: foreground %.1f%%, "
          "background %.1f%%, position %.1f%%, shape %.1f%%\n",
          held.size(), 100.0 * ok[0] / held.size(), 100.0 * ok[1] / held.size(),
          100.0 * ok[2] / held.size(), 100.0 * ok[3] / held.size());
      for (int a = 0; a < demo::kShapes; ++a) {
        std::printf("  drawn %-8s read as: ?%d", demo::shapeName(a), confusion[a][0]);
        for (int b = 0; b < demo::kShapes; ++b)
          std::printf("  %s %d", demo::shapeName(b), confusion[a][b + 1]);
        std::printf("\n");
      }
      std::fflush(stdout);
    } catch (const std::exception& e) {
      std::printf("VAE reconstruction report skipped: %s\n", e.what());
    }
  }

  void validate(const Params& trFinal) {
    // Validation: the rectified-flow loss by noise level on a fixed batch of training scenes
    // never drawn for training (phase 5), and the one-step estimate of x_0 from pure noise.
    {
      at::NoGradGuard ng;
      at::Tensor x0, enc, pooled, txtIds;
      batchInputs(5, 0, 16, 0, 16, x0, enc, pooled, txtIds);
      auto w = WeightSource::fromTensors(trFinal);
      FluxTransformer2DModel model(tcfg, *w);
      auto gen = at::detail::createCPUGenerator(seed * 1000 + 97);
      const at::Tensor noise = at::randn(x0.sizes(), gen, at::kFloat);
      std::printf("validation loss by sigma:");
      for (double sg : {0.05, 0.25, 0.5, 0.75, 0.95, 1.0}) {
        const at::Tensor sig = at::full({x0.size(0)}, sg, at::kFloat);
        const at::Tensor xt = (1.0 - sg) * x0 + sg * noise;
        const at::Tensor pred = model.forward(xt, enc, pooled, sig, imgIds, txtIds, at::Tensor());
        std::printf("  %.2f: %.4f", sg, (pred - (noise - x0)).pow(2).mean().item<double>());
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }

  void writeFolder(const Params& trFinal) {
    // The folder: diffusers names, float32.
    vc["scaling_factor"] = ck.scale;
    vc["shift_factor"] = ck.shift;
    writeFile(tmp / "vae/config.json", vc);
    saveTensors((tmp / "vae/diffusion_pytorch_model.safetensors").string(), detached(vae),
                {{"format", "pt"}});
    saveTensors((tmp / "transformer/diffusion_pytorch_model.safetensors").string(), trFinal,
                {{"format", "pt"}});
    if (!probe.empty()) {
      auto full = [](double v) {
        char b[32];
        std::snprintf(b, sizeof b, "%.9g", v);
        return std::string(b);
      };
      at::NoGradGuard ng;
      at::Tensor x0, enc, pooled, txtIds;
      batchInputs(4, 0, 2, 0, 2, x0, enc, pooled, txtIds);
      auto gen = at::detail::createCPUGenerator(seed + 99);
      const at::Tensor sigma = at::full({2}, 0.6, at::kFloat);
      const at::Tensor xt = 0.4 * x0 + 0.6 * at::randn(x0.sizes(), gen, at::kFloat);
      auto w = WeightSource::fromTensors(trFinal);
      FluxTransformer2DModel model(tcfg, *w);
      const at::Tensor pred = model.forward(xt, enc, pooled, sigma, imgIds, txtIds, at::Tensor());
      saveTensors(probe,
                  {{"hidden_states", xt.contiguous()},
                   {"encoder_hidden_states", enc.contiguous()},
                   {"pooled_projections", pooled.contiguous()},
                   {"timestep", sigma},
                   {"img_ids", imgIds.contiguous()},
                   {"txt_ids", txtIds.contiguous()},
                   {"prediction", pred.contiguous()}},
                  {{"first_loss", full(firstLoss)},
                   {"last_loss", full(lastLoss)},
                   {"vae_first_mse", full(vaeFirst)},
                   {"vae_last_mse", full(vaeLast)}});
    }
    fs::remove_all(O);
    fs::rename(tmp, O);
    std::printf("wrote %s in %.0f s (first logged loss %.5f, last %.5f)\n", out.c_str(), elapsed(),
                firstLoss, lastLoss);
  }

  DataParallel dp;
  const bool writer;
  const BlasInfo blas;
  std::chrono::steady_clock::time_point t0;
  fs::path T, O, tmp;  ///< the template, the output folder, the folder being written
  json vaeFromConfig;  ///< --vae-from: that folder's VAE config
  fs::path vaeFromConfigPath;
  json tc, vc;  ///< the transformer's and the VAE's config.json
  AutoencoderKLConfig vcfg;
  int vsf = 8;
  FluxTransformerConfig tcfg;
  std::unique_ptr<FluxPipeline> textPipe;  ///< frozen text encoders
  std::map<std::string, PromptEmbeds> embedCache;
  Params vae, tr;
  AdamW vaeOpt, trOpt;
  Params trEma;  // --ema-decay: the transformer's moving average (empty until its first step)
  Checkpoint ck{"vae", 0, 0, 1};
  bool resumed = false;
  double vaeFirst = -1, vaeLast = -1;
  double firstLoss = -1, lastLoss = -1;
  Params vaeFinal;
  std::shared_ptr<WeightSource> vaeW;
  std::unique_ptr<const AutoencoderKL> frozenVae;
  at::Tensor imgIds;
  std::map<std::tuple<int, int, int, int, int, int>, std::pair<at::Tensor, at::Tensor>>
      posteriorCache;
};

}  // namespace

int main(int argc, char** argv) {
  // As every DiT Studio program: may re-execute itself with a better OpenBLAS kernel (issue 10).
  const BlasInfo blas = ensureBlasKernel(argc, argv);
  tuneHostAllocator();
  CLI::App app{"Train the embedded default model (a tiny FLUX.1) on synthetic captioned shapes",
               "ditstudio-train"};
  TrainOptions o;
  addOptions(app, o);
  CLI11_PARSE(app, argc, argv);
  if (o.vaeLoss == "l1" && o.edgeWeight != 1.0) {
    std::cerr << "error: --vae-edge-weight weights the MSE; it does not apply to --vae-loss l1\n";
    return 2;
  }
  // Under mpirun with more than one rank: data parallel (DataParallel above).
  DataParallel dp;
  const char* worldSizeEnv = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (worldSizeEnv && std::atoi(worldSizeEnv) > 1) {
    try {
      initRuntime(argc, argv);
      dp.group = std::make_unique<ProcessGroupMPI>(MPI_COMM_WORLD, "data parallel");
      dp.rank = dp.group->rank(), dp.size = dp.group->size();
      // Before any file is touched: batches the ranks do not divide.
      dp.part(o.batch), dp.part(o.vaeBatch);
    } catch (const std::exception& e) {
      abortGroup(worldRank(), e.what());
    }
  }
  // Rank 0 speaks for the group; the others' stdout is dropped (errors still go to stderr).
  if (dp.rank != 0 && !std::freopen("/dev/null", "w", stdout))
    abortGroup(dp.rank, "cannot redirect stdout to /dev/null");
  return Trainer(o, std::move(dp), blas).run();
}
