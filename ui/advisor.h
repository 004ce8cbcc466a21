// Strategy advisor: recommends degrees from model size, per-device memory, interconnect and
// resolution, encoding DESIGN.md section 3 ("Choosing a strategy" and the context-parallel
// variants table). Pure function, no Qt widgets; unit-tested in tests/test_ui_advisor.cpp.
#pragma once

#include <QString>
#include <QStringList>
#include <vector>

#include "parallel/strategy.h"  // ModelDims (with the declared plan)

namespace dit::ui {

/// Link between the devices. NVLink: fast (tp and Ulysses all-to-all pay off); PCIe: limited
/// bandwidth (prefer ring attention, avoid tp unless the weights do not fit); CPU: ranks on host
/// cores talking over MPI (device "cpu", treated like a slow link).
enum class Interconnect { NVLink, PCIe, CPU };

/// The advisor's default model: the first known model of the first registered family (FLUX.1
/// [dev]'s FluxTransformer2DModel: 19 + 38 blocks, 24 heads x 128, 11.9 B parameters, VAE scale
/// factor 8).
dit::ModelDims defaultAdvisorModelDims();

/// A model the advisor knows without its files: name, the transformer's declared dims (heads,
/// plans, parameter table) and the replicated rest (text encoders + VAE, elements).
struct KnownModel {
  QString name;
  dit::ModelDims transformer;
  double other_params = 0;
  int text_len = 512;
};
/// Every registered family's real-size models (FamilySpec::known_models), in registration order:
/// FLUX.1 [dev] (12 B transformer; CLIP-L + T5-XXL 4.9 B), FLUX.2 [klein] 4B, FLUX.2 [klein] 9B and
/// FLUX.2 [dev] today. Transformer sizes come from the declared parameter tables for their
/// configs; VAEs are counted with the text encoders.
std::vector<KnownModel> knownModels();

/// Advisor input. Parameter counts are elements, memory in GiB, sizes in pixels.
struct AdvisorInput {
  /// The transformer family's declaration (ModelFolder::dims(), ModelInfo::dims()): heads, head
  /// dim, vae_scale_factor, its parameter table and tensor-parallel plan, from which the weight
  /// bytes per rank come (ShardingPlan::bytesPerRank). No plan: tp stays 1.
  dit::ModelDims transformer = defaultAdvisorModelDims();
  double other_params = 4.9e9;   ///< text encoders + VAE (replicated on every rank)
  double bytes_per_param = 2.0;  ///< compute bytes per element: 2 for bf16/fp16, 4 for fp32
  int text_len = 512;   ///< T5 max_sequence_length (text tokens, split by context parallel)
  int num_devices = 1;  ///< GPUs, or CPU ranks for Interconnect::CPU
  double memory_gib_per_device = 80;  ///< GPU memory (host memory per rank on CPU)
  Interconnect interconnect = Interconnect::NVLink;
  int width = 1024;
  int height = 1024;
  bool true_cfg = false;       ///< the request runs CFG (the model's guider: ModelInfo::resolve)
  int images_per_request = 1;  ///< > 1 (many prompts/seeds) favours data parallel
};

/// The recommendation: a complete strategy (world = num_devices), a one-line title, the reasons
/// (one sentence each) and warnings, and the memory estimate per rank in GiB.
struct Advice {
  dit::Strategy strategy;
  QString title;
  QStringList reasons;
  QStringList warnings;
  double weights_gib = 0;      ///< weights held by one rank
  double activations_gib = 0;  ///< activation estimate of one rank
  double total_gib = 0;        ///< weights + activations + runtime overhead
  double usable_gib = 0;       ///< 90% of memory_gib_per_device
  bool fits = true;            ///< total_gib <= usable_gib
};

/// Transformer parameters (elements) in in.transformer's parameter table (0 without one).
double transformerParameters(const AdvisorInput& in);
/// Bytes of weights one rank holds at tensor-parallel degree `tp`: the transformer's
/// ShardingPlan::bytesPerRank(parameters, tp, bytes_per_param) (its whole table at tp 1 without a
/// plan) plus other_params x bytes_per_param. Throws std::invalid_argument for tp > 1 without a
/// plan or tp < 1.
double weightBytesPerRank(const AdvisorInput& in, int tp);

/// Recommends a strategy. Rules, in order:
/// 1. true CFG with an even device count -> cfg 2 (one half conditional, one half unconditional);
///    at CFG 1 cfg parallel would idle half the group.
/// 2. tensor parallel only when the weights do not fit: the smallest tp (dividing the head count
///    and the devices) that fits; warned about on PCIe/CPU (per-layer AllReduce traffic).
/// 3. several images per request -> data parallel replicas (throughput, not latency).
/// 4. the remaining devices -> context parallel: Ulysses on NVLink (unified ring x Ulysses when the
///    head count does not divide), ring on PCIe/CPU; the "anything" variants when the image or
///    text tokens do not divide (e.g. 1008x1008 -> 3969 tokens).
Advice adviseStrategy(const AdvisorInput& in);

/// Image tokens of a request: (height / (2 vsf)) * (width / (2 vsf)).
int imageTokens(int width, int height, int vae_scale_factor);
/// Display name ("NVLink", "PCIe", "CPU (MPI)").
QString interconnectName(Interconnect ic);

}  // namespace dit::ui
