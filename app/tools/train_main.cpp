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
// seed and a resumed run continues exactly as an uninterrupted one.
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
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "app/common/blas_kernel.h"
#include "app/demo/shapes_dataset.h"
#include "app/demo/shapes_draw.h"
#include "app/common/generation.h"
#include "backend/io/config_json.h"
#include "backend/io/model_folder.h"
#include "backend/io/png_io.h"
#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/pipelines/flux/pipeline_flux.h"
#include "parallel/process_group_mpi.h"
#include "parallel/runtime.h"
#include "parallel/torch_compat.h"

using namespace dit;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

json readJson(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw std::runtime_error(p.string() + ": not valid JSON (" + e.what() + ")");
  }
}
void writeJson(const fs::path& p, const json& j) {
  std::ofstream o(p);
  o << j.dump(2) << "\n";
  if (!o) throw std::runtime_error("cannot write " + p.string());
}

using Params = std::map<std::string, at::Tensor>;

/// AdamW state of one phase (PyTorch torch.optim.AdamW, weight decay on matrices only).
struct AdamW {
  Params m, v;
  int64_t step = 0;
  void update(Params& p, double lr, double wd, double b1 = 0.9, double b2 = 0.999,
              double eps = 1e-8) {
    at::NoGradGuard ng;
    ++step;
    const double c1 = 1 - std::pow(b1, step), c2 = 1 - std::pow(b2, step);
    for (auto& [k, t] : p) {
      const at::Tensor g = t.grad();
      if (!g.defined()) continue;
      if (!m.count(k)) m[k] = at::zeros_like(t), v[k] = at::zeros_like(t);
      m[k].mul_(b1).add_(g, 1 - b1);
      v[k].mul_(b2).addcmul_(g, g, 1 - b2);
      if (wd > 0 && t.dim() >= 2) t.mul_(1 - lr * wd);
      t.addcdiv_(m[k] / c1, (v[k] / c2).sqrt_().add_(eps), -lr);
      t.mutable_grad().reset();
    }
  }
};

/// Initial parameters: the names and shapes the model asks for (a recording random source),
/// then matrices / conv kernels ~ N(0, 1 / fan_in), norms 1, biases 0; `zero` names (AdaLN-Zero
/// modulation, the final projection) start at 0 as in DiT.
template <class Build>
Params initParams(uint64_t seed, Build build, const std::vector<std::string>& zero = {}) {
  auto w = WeightSource::random(seed, at::kFloat, at::kCPU, 1.0);
  w->setRecording(true);
  build(*w);
  Params p;
  for (const auto& [k, t0] : w->recorded()) {
    at::Tensor t = t0.clone();
    if (t.dim() >= 2) t.div_(std::sqrt(static_cast<double>(t[0].numel())));
    for (const auto& z : zero)
      if (k.find(z) != std::string::npos) t.zero_();
    p[k] = t.requires_grad_(true);
  }
  return p;
}

Params detached(const Params& p) {
  Params o;
  for (const auto& [k, t] : p) o[k] = t.detach().clone().contiguous();
  return o;
}

/// Data-parallel training over the ranks of `mpirun -np N ditstudio-train ...` (torch
/// DistributedDataParallel's semantics): every rank makes the same random draws for the whole
/// batch and computes the loss on its own contiguous 1/N of it; after backward the gradients are
/// averaged over the ranks with one allreduce of all of them (ProcessGroupMPI), so every rank
/// applies the same AdamW update and the parameters stay equal. The result equals the one-process
/// run's up to the order of floating-point sums. Rank 0 writes the folder, the checkpoints and
/// the log. One process (no mpirun): size 1, no MPI.
struct DataParallel {
  std::unique_ptr<ProcessGroupMPI> group;
  int rank = 0, size = 1;

  /// Rows [lo, hi) of a batch of n that this rank computes. Throws std::invalid_argument when
  /// the ranks do not divide n.
  std::pair<int, int> part(int n) const {
    if (n % size != 0)
      throw std::invalid_argument("batch " + std::to_string(n) + " is not divisible by the " +
                                  std::to_string(size) + " data-parallel ranks");
    return {rank * n / size, (rank + 1) * n / size};
  }
  /// This rank's rows of a whole-batch tensor (dim 0 = n).
  at::Tensor slice(const at::Tensor& t) const {
    const auto [lo, hi] = part(static_cast<int>(t.size(0)));
    return t.slice(0, lo, hi);
  }
  /// Averages the gradients of `p` (and this rank's loss) over the ranks; returns the mean loss.
  /// `extra` (e.g. the KL term for the log) is averaged too, in place. Collective: every rank
  /// calls it once per step, with the same parameters.
  double averageGradients(Params& p, double localLoss, double* extra = nullptr) const {
    if (size == 1) return localLoss;
    std::vector<at::Tensor> grads, flat;
    for (auto& [k, t] : p)
      if (t.grad().defined())
        grads.push_back(t.mutable_grad()), flat.push_back(grads.back().reshape(-1));
    flat.push_back(at::full({1}, localLoss, at::kFloat));
    flat.push_back(at::full({1}, extra ? *extra : 0.0, at::kFloat));
    at::Tensor buf = at::cat(flat);
    group->allreduce(buf)->wait();
    buf.div_(size);
    int64_t off = 0;
    for (auto& g : grads) {
      g.copy_(buf.slice(0, off, off + g.numel()).view(g.sizes()));
      off += g.numel();
    }
    if (extra) *extra = buf[off + 1].item<double>();
    return buf[off].item<double>();
  }
  /// Throws std::runtime_error unless every rank holds the same `values` (e.g. the phase and step
  /// each resumed at: ranks resuming from different checkpoints would issue different
  /// collectives). Collective.
  void requireSame(const std::vector<int64_t>& values, const std::string& what) const {
    if (size == 1) return;
    at::Tensor hi = at::tensor(values, at::kLong), lo = hi.clone();
    group->allreduce(hi, ReduceOp::Max)->wait();
    group->allreduce(lo, ReduceOp::Min)->wait();
    if (!at::equal(hi, lo))
      throw std::runtime_error("the data-parallel ranks disagree on " + what + " (rank " +
                               std::to_string(rank) +
                               " has its own; is the checkpoint on a file system all ranks see?)");
  }
};

/// Per-pixel weights of the reconstruction loss, [B, 1, H, W]: `edgeWeight` on pixels whose 3x3
/// neighbourhood holds a colour change (the objects' outlines, 10-15% of the pixels), 1
/// elsewhere, normalised to mean 1 per image. Plain MSE spends its gradient on the flat areas and
/// learns outlines last; shapes are told apart by their outlines. edgeWeight 1: plain MSE.
at::Tensor edgeWeights(const at::Tensor& x, double edgeWeight) {
  at::NoGradGuard ng;
  const at::Tensor hi = at::max_pool2d(x, {3, 3}, {1, 1}, {1, 1});
  const at::Tensor lo = -at::max_pool2d(-x, {3, 3}, {1, 1}, {1, 1});
  const at::Tensor edge = ((hi - lo).abs().sum(1, true) > 0.1).to(at::kFloat);
  const at::Tensor w = 1.0 + (edgeWeight - 1.0) * edge;
  return w / w.mean({1, 2, 3}, true);  // per image: the same loss whichever ranks split the batch
}

/// Images of the scenes: [B, 3, H, W] float32 in [-1, 1].
at::Tensor drawBatch(const std::vector<demo::ShapeScene>& scenes, int size) {
  std::vector<at::Tensor> xs;
  for (const auto& s : scenes) {
    auto rgb = demo::drawScene(s, size, size);
    at::Tensor t = at::from_blob(rgb.data(), {size, size, 3}, at::kByte).clone();
    xs.push_back(t.permute({2, 0, 1}).to(at::kFloat) / 127.5 - 1.0);
  }
  return at::stack(xs);
}

/// diffusers FluxPipeline._pack_latents: [B, C, h, w] -> [B, (h/2)(w/2), 4C].
at::Tensor packLatents(const at::Tensor& z) {
  const int64_t B = z.size(0), C = z.size(1), h = z.size(2), w = z.size(3);
  return z.view({B, C, h / 2, 2, w / 2, 2})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({B, (h / 2) * (w / 2), C * 4});
}

struct Checkpoint {
  std::string phase;  // "vae", "transformer", "decoder"
  int64_t step = 0;
  double shift = 0, scale = 1;
  /// --position-jitter of the transformer's scenes (checkpoints written before the option: 3).
  double position_jitter = demo::kDefaultPositionJitter;
  /// --mixed-precision of the transformer phase (checkpoints written before the option: "no").
  std::string mixed_precision = "no";
};

void saveCheckpoint(const fs::path& file, const Checkpoint& c, const Params& vae,
                    const AdamW& vaeOpt, const Params& tr, const AdamW& trOpt, const Params& ema) {
  std::map<std::string, at::Tensor> all;
  for (auto& [k, t] : ema) all["transformer_ema/" + k] = t.contiguous();
  for (auto& [k, t] : vae) all["vae/" + k] = t.detach().contiguous();
  for (auto& [k, t] : vaeOpt.m) all["vae_m/" + k] = t.contiguous();
  for (auto& [k, t] : vaeOpt.v) all["vae_v/" + k] = t.contiguous();
  for (auto& [k, t] : tr) all["transformer/" + k] = t.detach().contiguous();
  for (auto& [k, t] : trOpt.m) all["transformer_m/" + k] = t.contiguous();
  for (auto& [k, t] : trOpt.v) all["transformer_v/" + k] = t.contiguous();
  char buf[64];
  std::map<std::string, std::string> meta{{"phase", c.phase},
                                          {"step", std::to_string(c.step)},
                                          {"vae_opt_step", std::to_string(vaeOpt.step)},
                                          {"transformer_opt_step", std::to_string(trOpt.step)}};
  std::snprintf(buf, sizeof buf, "%.17g", c.shift);
  meta["shift_factor"] = buf;
  std::snprintf(buf, sizeof buf, "%.17g", c.scale);
  meta["scaling_factor"] = buf;
  std::snprintf(buf, sizeof buf, "%.17g", c.position_jitter);
  meta["position_jitter"] = buf;
  meta["mixed_precision"] = c.mixed_precision;
  saveTensors(file.string(), all, meta);
}

bool loadCheckpoint(const fs::path& file, Checkpoint& c, Params& vae, AdamW& vaeOpt, Params& tr,
                    AdamW& trOpt, Params& ema) {
  if (!fs::exists(file)) return false;
  SafetensorsCollection st(file.string());
  const auto names = st.names();
  if (names.empty()) throw std::runtime_error(file.string() + ": empty checkpoint");
  const auto& meta = st.reader(names.front()).metadata();
  c.phase = meta.at("phase");
  c.step = std::stoll(meta.at("step"));
  c.shift = std::stod(meta.at("shift_factor"));
  c.scale = std::stod(meta.at("scaling_factor"));
  vaeOpt.step = std::stoll(meta.at("vae_opt_step"));
  trOpt.step = std::stoll(meta.at("transformer_opt_step"));
  if (meta.count("position_jitter")) c.position_jitter = std::stod(meta.at("position_jitter"));
  if (meta.count("mixed_precision")) c.mixed_precision = meta.at("mixed_precision");
  // Every parameter of both models must come from the file (another architecture would leave
  // some at their random initial values).
  for (const auto& [group, p] : {std::pair<const char*, const Params*>{"vae", &vae},
                                 std::pair<const char*, const Params*>{"transformer", &tr}})
    for (const auto& [k, t] : *p)
      if (!st.contains(std::string(group) + "/" + k))
        throw std::runtime_error(file.string() + ": no '" + group + "/" + k +
                                 "' (a checkpoint of other model sizes?)");
  for (const auto& n : names) {
    const auto slash = n.find('/');
    const std::string group = n.substr(0, slash), key = n.substr(slash + 1);
    at::Tensor t = loadTensor(st, n, at::kFloat);
    auto put = [&](Params& p, bool param) {
      if (param && (!p.count(key) || p[key].sizes() != t.sizes()))
        throw std::runtime_error(file.string() + ": '" + n +
                                 "' does not match the model (other sizes?)");
      p[key] = param ? t.requires_grad_(true) : t;
    };
    if (group == "vae") put(vae, true);
    if (group == "vae_m") put(vaeOpt.m, false);
    if (group == "vae_v") put(vaeOpt.v, false);
    if (group == "transformer") put(tr, true);
    if (group == "transformer_m") put(trOpt.m, false);
    if (group == "transformer_v") put(trOpt.v, false);
    if (group == "transformer_ema") put(ema, false);
  }
  return true;
}

/// Exponential moving average of `p` in `ema` after optimiser step `step` (0-based), as diffusers
/// EMAModel.step with its default warm-up: decay min(`decay`, (1 + step) / (10 + step)) at each
/// update (step 0 is the first: 0.1). `ema` starts as a copy of the initial weights.
void updateEma(Params& ema, const Params& p, double decay, int64_t step) {
  at::NoGradGuard ng;
  const double n = static_cast<double>(step);
  const double d = std::min(decay, (1.0 + n) / (10.0 + n));
  for (auto& [k, t] : p) ema.at(k).mul_(d).add_(t.detach(), 1.0 - d);
}

/// Linear warm-up over `warm` steps, then linear decay to 10% at `total`.
double schedule(double lr, int64_t step, int64_t warm, int64_t total) {
  if (step < warm) return lr * (step + 1) / warm;
  const double f = static_cast<double>(step - warm) / std::max<int64_t>(1, total - warm);
  return lr * (1.0 - 0.9 * std::min(1.0, f));
}

}  // namespace

int main(int argc, char** argv) {
  // As every DiT Studio program: may re-execute itself with a better OpenBLAS kernel (issue 10).
  const BlasInfo blas = ensureBlasKernel(argc, argv);
  tuneHostAllocator();
  CLI::App app{"Train the embedded default model (a tiny FLUX.1) on synthetic captioned shapes",
               "ditstudio-train"};
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
  app.add_option("--template", templ,
                 "diffusers FLUX.1 folder whose tokenizers, CLIP/T5 encoders (kept frozen) and "
                 "scheduler config are used and copied")
      ->required();
  app.add_option("--out", out, "output diffusers folder")->required();
  app.add_option("--seed", seed, "seed of the data, the initial weights and every draw");
  app.add_option("--size", size, "image side in pixels (multiple of 2 * vae_scale_factor)");
  app.add_option("--vae-steps", vaeSteps, "AutoencoderKL optimisation steps");
  app.add_option("--steps", steps, "transformer optimisation steps");
  app.add_option("--batch", batch, "transformer batch size");
  app.add_option("--vae-batch", vaeBatch, "AutoencoderKL batch size");
  app.add_option("--lr", lr, "transformer peak learning rate (AdamW)");
  app.add_option("--vae-lr", vaeLr, "AutoencoderKL peak learning rate (AdamW)");
  app.add_option("--vae-loss", vaeLoss,
                 "AutoencoderKL (and decoder) reconstruction loss: mse, or l1 (sharper edges)")
      ->check(CLI::IsMember({"mse", "l1"}));
  app.add_option("--uniform-sigma-fraction", uniformFraction,
                 "fraction of the transformer's noise levels drawn uniformly from [0, 1] instead "
                 "of logit-normal (default 0.3)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--caption-dropout", captionDropout,
                 "fraction of training captions replaced by the empty prompt (for true CFG with "
                 "--negative-prompt \"\" at generation; default 0)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--default-true-cfg-scale", defaultCfg,
                 "with --caption-dropout: the true CFG scale (against the empty prompt) the GUI "
                 "starts the model with, model_index.json \"_dit_studio_default_settings\" "
                 "(default 5; 1: none)")
      ->check(CLI::Range(1.0, 100.0));
  app.add_option("--decoder-steps", decoderSteps,
                 "after the transformer: steps fine-tuning the VAE decoder alone (encoder frozen, "
                 "latent space unchanged; default 0)");
  app.add_option("--decoder-lr", decoderLr, "decoder fine-tuning peak learning rate (AdamW)");
  app.add_option("--ema-decay", emaDecay,
                 "keep an exponential moving average of the transformer's weights with this decay "
                 "(diffusers EMAModel, e.g. 0.999) and write it instead of the last weights "
                 "(default 0: off)")
      ->check(CLI::Range(0.0, 0.99999));
  app.add_option("--vae-edge-weight", edgeWeight,
                 "AutoencoderKL / decoder MSE weight of pixels on the objects' outlines against "
                 "1 for the rest (default 1: plain MSE)")
      ->check(CLI::Range(1.0, 1000.0));
  app.add_option("--vae-grid", vaeGrid,
                 "write a PNG of the first 16 held-out drawings (top rows) above their VAE "
                 "reconstructions");
  app.add_option("--position-jitter", jitter,
                 "the transformer's training scenes: offset from their cell's centre, uniform "
                 "within +-PX pixels at 64x64 (0: where eval-demo draws its held-out scenes); "
                 "the VAE phases always use the default 3, so their result does not depend on it")
      ->check(CLI::Range(0.0, 16.0));
  app.add_option("--vae-from", vaeFrom,
                 "take the AutoencoderKL (config, weights, shift/scale) of a folder this tool "
                 "wrote and skip phase 1; the transformer's in_channels follow its latents")
      ->check(CLI::ExistingDirectory);
  app.add_option("--mixed-precision", mixedPrecision,
                 "the transformer phase's matrix products: no (float32), or bf16 (bfloat16 "
                 "autocast; weights, AdamW and loss in float32). bf16 needs a CPU with bf16 "
                 "instructions (avx512_bf16 / amx_bf16): elsewhere LibTorch emulates it, tens of "
                 "times slower, so it falls back to float32 and says so")
      ->check(CLI::IsMember({"no", "bf16"}));
  app.add_option("--kl-weight", klWeight, "weight of the KL term (per latent element)");
  app.add_option("--num-layers", layers, "double-stream blocks");
  app.add_option("--num-single-layers", singleLayers, "single-stream blocks");
  app.add_option("--num-attention-heads", heads);
  app.add_option("--attention-head-dim", headDim);
  app.add_option("--axes-dims-rope", axes, "must sum to attention_head_dim");
  app.add_option("--vae-block-out-channels", vaeChannels);
  app.add_option(
         "--vae-latent-channels", latentChannels,
         "AutoencoderKL latent channels (the transformer's in_channels are 4x: 2x2 packing)")
      ->check(CLI::Range(1, 64));
  app.add_option("--vae-layers-per-block", vaeLayersPerBlock, "AutoencoderKL resnets per block")
      ->check(CLI::Range(1, 4));
  app.add_option("--max-sequence-length", t5Len, "T5 tokens (tokenizer_2 model_max_length)");
  app.add_option("--threads", threads, "intra-op threads");
  app.add_option("--log-every", logEvery, "print the mean loss every N steps");
  app.add_option("--checkpoint", checkpoint,
                 "resume from this file when it exists; written every --checkpoint-every steps "
                 "and at the end of each phase");
  app.add_option("--checkpoint-every", ckptEvery);
  int64_t stopAt = -1;
  app.add_option("--stop-at-step", stopAt,
                 "write the checkpoint at this transformer step and exit (tests of resuming)");
  app.add_option("--probe", probe,
                 "write fixed transformer inputs and the trainer's own prediction for them "
                 "(tests compare it with the saved folder run through the normal loader)");
  CLI11_PARSE(app, argc, argv);
  if (vaeLoss == "l1" && edgeWeight != 1.0) {
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
      dp.part(batch), dp.part(vaeBatch);
    } catch (const std::exception& e) {
      abortGroup(worldRank(), e.what());
    }
  }
  // Rank 0 speaks for the group; the others' stdout is dropped (errors still go to stderr).
  if (dp.rank != 0 && !std::freopen("/dev/null", "w", stdout))
    abortGroup(dp.rank, "cannot redirect stdout to /dev/null");
  const bool writer = dp.rank == 0;
  auto finish = [&] {
    dp.group.reset();
    if (runtimeActive()) finalizeRuntime();
  };
  try {
    at::set_num_threads(threads);
    setBlasThreads(threads);
    std::cout << "BLAS: " << blas.library << ", core " << blas.core << " (" << blas.selection
              << "), " << threads << " thread(s)";
    if (dp.size > 1) std::cout << " per rank, " << dp.size << " data-parallel ranks";
    std::cout << std::endl;
    const auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    const fs::path T(templ), O(out), tmp = out + ".partial";
    // Only rank 0 writes files (writeFile); every rank builds the same configs in memory.
    auto writeFile = [&](const fs::path& p, const json& j) {
      if (writer) writeJson(p, j);
    };
    // --vae-from: that folder's VAE config, checked under its own path before anything is
    // written (weights and shapes are checked against it once the model is built).
    json vaeFromConfig;
    const fs::path vaeFromConfigPath = fs::path(vaeFrom) / "vae/config.json";
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
      settings["negative_prompt"] = "", settings["true_cfg_scale"] = defaultCfg;
    mi["_dit_studio_default_settings"] = settings;
    writeFile(tmp / "model_index.json", mi);
    json tok2 = readJson(T / "tokenizer_2/tokenizer_config.json");
    tok2["model_max_length"] = t5Len;
    writeFile(tmp / "tokenizer_2/tokenizer_config.json", tok2);
    json tc = readJson(T / "transformer/config.json");
    tc["num_layers"] = layers;
    tc["num_single_layers"] = singleLayers;
    tc["num_attention_heads"] = heads;
    tc["attention_head_dim"] = headDim;
    tc["axes_dims_rope"] = axes;
    tc["guidance_embeds"] = false;
    tc["in_channels"] = 4 * latentChannels;
    if (!tc["out_channels"].is_null()) tc["out_channels"] = 4 * latentChannels;
    writeFile(tmp / "transformer/config.json", tc);
    json vc = readJson(T / "vae/config.json");
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

    AutoencoderKLConfig vcfg = parseAutoencoderKLConfig(vc, (tmp / "vae/config.json").string());
    const int vsf = vcfg.vaeScaleFactor();
    // The trained size becomes the model's default image size (ModelDims::default_sample_size).
    tc["sample_size"] = size / vsf;
    writeFile(tmp / "transformer/config.json", tc);
    const FluxTransformerConfig tcfg =
        parseFluxTransformerConfig(tc, (tmp / "transformer/config.json").string());
    if (size % (2 * vsf) != 0)
      throw std::invalid_argument("--size " + std::to_string(size) + " is not a multiple of " +
                                  std::to_string(2 * vsf));

    // Frozen text encoders: the template's, through the normal pipeline.
    FluxPipeline textPipe(ModelFolder::open(templ), PipelineOptions{});
    std::map<std::string, PromptEmbeds> embedCache;
    auto embed = [&](const std::string& prompt) -> const PromptEmbeds& {
      auto it = embedCache.find(prompt);
      if (it != embedCache.end()) return it->second;
      return embedCache.emplace(prompt, textPipe.encodePrompt(prompt, t5Len)).first->second;
    };

    Params vae = initParams(seed * 7 + 1, [&](WeightSource& w) { AutoencoderKL m(vcfg, w); });
    Params tr =
        initParams(seed * 7 + 2, [&](WeightSource& w) { FluxTransformer2DModel m(tcfg, w); },
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
    AdamW vaeOpt, trOpt;
    Params trEma;  // --ema-decay: the transformer's moving average (empty until its first step)
    Checkpoint ck{"vae", 0, 0, 1};
    auto save = [&] {
      if (writer && !checkpoint.empty())
        saveCheckpoint(checkpoint, ck, vae, vaeOpt, tr, trOpt, trEma);
    };
    const bool resumed =
        !checkpoint.empty() && loadCheckpoint(checkpoint, ck, vae, vaeOpt, tr, trOpt, trEma);
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
    int64_t vaeParams = 0, trParams = 0;
    for (auto& [k, t] : vae) vaeParams += t.numel();
    for (auto& [k, t] : tr) trParams += t.numel();
    std::cout << "AutoencoderKL " << vaeParams << " parameters, FluxTransformer2DModel " << trParams
              << " parameters, images " << size << "x" << size << ", latents " << size / vsf << "x"
              << size / vsf << "x" << vcfg.latent_channels << ", "
              << (size / vsf / 2) * (size / vsf / 2) << " image tokens, " << t5Len << " text tokens"
              << std::endl;
    // The VAE's and the decoder's training loss (`mse`: the plain MSE of rec against x).
    auto reconstructionLoss = [&](const at::Tensor& rec, const at::Tensor& x,
                                  const at::Tensor& mse) -> at::Tensor {
      if (vaeLoss == "l1") return (rec - x).abs().mean();
      if (edgeWeight == 1.0) return mse;
      return ((rec - x).pow(2) * edgeWeights(x, edgeWeight)).mean();
    };
    // This rank's part of a batch of scenes, drawn: [n / ranks, 3, size, size].
    auto drawPart = [&](const std::vector<demo::ShapeScene>& all) {
      const auto [lo, hi] = dp.part(static_cast<int>(all.size()));
      return drawBatch({all.begin() + lo, all.begin() + hi}, size);
    };
    // The shape of `part` with the whole batch's rows (random draws are made for the whole batch
    // and sliced, so that every rank count draws the same numbers).
    auto wholeBatch = [](const at::Tensor& part, int n) {
      std::vector<int64_t> s = part.sizes().vec();
      s[0] = n;
      return s;
    };
    // Phases 1, 2 and 6 draw the VAE's scenes (default jitter), 3-5 the transformer's.
    auto scenes = [&](uint64_t phase, int64_t step, int n) {
      const float phaseJitter =
          phase >= 3 && phase <= 5 ? static_cast<float>(jitter) : demo::kDefaultPositionJitter;
      std::vector<demo::ShapeScene> s;
      for (int i = 0; i < n; ++i)
        s.push_back(demo::trainingScene(seed + phase * 1000003, static_cast<uint64_t>(step) * n + i,
                                        phaseJitter));
      return s;
    };

    // Phase 1: AutoencoderKL.
    double vaeFirst = -1, vaeLast = -1;
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
    vcfg.shift_factor = ck.shift;
    vcfg.scaling_factor = ck.scale;
    std::printf("latents: shift_factor %.5f scaling_factor %.5f\n", ck.shift, ck.scale);
    const Params vaeFinal = detached(vae);
    auto vaeW = WeightSource::fromTensors(vaeFinal);
    const AutoencoderKL frozenVae(vcfg, *vaeW);

    const int64_t hl = size / vsf;
    const at::Tensor imgIds =
        FluxPipeline::latentImageIds(static_cast<int>(hl / 2), static_cast<int>(hl / 2));
    // Phase 2: the transformer.
    // The VAE posteriors (mean, std: [n, C, h, w]) of scenes. Without jitter each is encoded alone
    // (its numbers independent of the batch and the rank count) and kept: finitely many such
    // drawings, about 11,000, 90 MB per rank at 64x64.
    std::map<std::tuple<int, int, int, int, int, int>, std::pair<at::Tensor, at::Tensor>>
        posteriorCache;
    auto posteriors = [&](const std::vector<demo::ShapeScene>& sc) {
      // Jittered scenes (each drawing new): one batched encode, as without the cache.
      for (const auto& s : sc)
        if (s.jitter_x != 0 || s.jitter_y != 0) {
          const DiagonalGaussianDistribution post = frozenVae.encode(drawBatch(sc, size));
          return std::make_pair(post.mean, post.std);
        }
      std::vector<at::Tensor> means, stdevs;
      for (const auto& s : sc) {
        const auto key =
            std::make_tuple(s.shape, s.colour, s.background, s.position, s.size, s.count);
        auto it = posteriorCache.find(key);
        if (it == posteriorCache.end()) {
          const DiagonalGaussianDistribution post = frozenVae.encode(drawBatch({s}, size));
          it =
              posteriorCache.emplace(key, std::make_pair(post.mean[0].clone(), post.std[0].clone()))
                  .first;
        }
        means.push_back(it->second.first), stdevs.push_back(it->second.second);
      }
      return std::make_pair(at::stack(means), at::stack(stdevs));
    };
    // The inputs of a batch of n scenes, rows [lo, hi) of it (the random draws are the whole
    // batch's, sliced).
    auto batchInputs = [&](uint64_t phase, int64_t step, int n, int lo, int hi, at::Tensor& x0,
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
    };
    double acc = 0;
    int accN = 0;
    double firstLoss = -1, lastLoss = -1;
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
        finish();
        return 0;
      }
    }
    if (!checkpoint.empty() && ck.phase == "transformer") {
      ck.step = steps;
      save();
    }
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
    // Rank 0 alone from here: the reports and the folder.
    if (!writer) {
      finish();
      return 0;
    }
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
    // What the folder holds: the moving average with --ema-decay, else the last weights.
    const Params trFinal = emaDecay > 0 ? trEma : detached(tr);
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
