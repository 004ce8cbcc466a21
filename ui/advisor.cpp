#include "ui/advisor.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "backend/io/gguf_types.h"
#include "backend/io/stored_weight_bytes.h"
#include "backend/models/family_registry.h"
#include "backend/models/memory_estimate.h"

namespace dit::ui {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

struct Memory {
  double weights = 0, activations = 0, total = 0;
};

// The one memory model (dit::estimateTransformerMemory, what the worker and the CLI refuse by):
// activations, attention scores and the VAE decode of one request at tp x cp, plus the weights
// this rank holds and the runtime overhead.
Memory estimate(const AdvisorInput& in, int tp, int cp) {
  Memory m;
  m.weights = weightBytesPerRank(in, tp) / kGiB;
  dit::Strategy s;
  s.tp_degree = tp;
  s.ring_degree = std::max(1, cp);  // tokens per rank split cp ways (ring's score blocks: worst)
  dit::RequestDims r;
  r.width = in.width;
  r.height = in.height;
  r.text_len = in.text_len;
  const bool cpu = in.interconnect == Interconnect::CPU;  // the CPU math kernel holds the scores
  const dit::MemoryEstimate e = dit::estimateTransformerMemory(
      in.transformer, s, r, std::max<int64_t>(1, std::llround(in.bytes_per_param)), cpu);
  m.activations = double(e.peak()) / kGiB;
  const double overhead = cpu ? 0.5 : 1.0;  // runtime, CUDA context
  m.total = m.weights + m.activations + overhead;
  return m;
}

QString gib(double v) { return QString::number(v, 'f', v < 10 ? 1 : 0) + " GiB"; }

}  // namespace

dit::ModelDims defaultAdvisorModelDims() {
  for (const auto& f : dit::modelFamilies())
    if (f.known_models)
      for (const auto& k : f.known_models()) return k.dims;
  return {};
}

std::vector<KnownModel> knownModels() {
  // Every registered family's real-size models, in registration order.
  std::vector<KnownModel> v;
  for (const auto& f : dit::modelFamilies()) {
    if (!f.known_models) continue;
    for (const auto& k : f.known_models())
      v.push_back({QString::fromStdString(k.name), k.dims, k.other_parameters, k.text_len});
  }
  return v;
}

double transformerParameters(const AdvisorInput& in) {
  double n = 0;
  if (in.transformer.parameters)
    for (const auto& p : *in.transformer.parameters) n += double(p.numel());
  return n;
}

double weightBytesPerRank(const AdvisorInput& in, int tp) {
  if (tp < 1) throw std::invalid_argument("weightBytesPerRank: tp_degree must be >= 1");
  const int64_t eb = std::max<int64_t>(1, std::llround(in.bytes_per_param));
  double transformer = 0;
  bool stored = false;  // a GGUF transformer's table carries its stored types (Q4_K, ...)
  if (in.transformer.parameters)
    for (const auto& p : *in.transformer.parameters) {
      dit::GgmlType g;
      stored = stored || (dit::parseGgmlType(p.dtype, g) && dit::ggmlIsQuantized(g));
    }
  if (in.transformer.parameters) {
    if (in.transformer.tensor_parallel_plan && stored)
      transformer = double(dit::storedWeightBytesPerRank(*in.transformer.tensor_parallel_plan,
                                                         *in.transformer.parameters, tp, eb, true));
    else if (in.transformer.tensor_parallel_plan)
      transformer = double(
          in.transformer.tensor_parallel_plan->bytesPerRank(*in.transformer.parameters, tp, eb));
    else if (tp == 1)
      transformer = transformerParameters(in) * double(eb);
    else
      throw std::invalid_argument("weightBytesPerRank: the model declares no tensor-parallel plan");
  }
  return transformer + in.other_params * in.bytes_per_param;
}

int imageTokens(int width, int height, int vsf) {
  const int step = 2 * std::max(1, vsf);
  return (height / step) * (width / step);
}

QString interconnectName(Interconnect ic) {
  switch (ic) {
    case Interconnect::NVLink:
      return QStringLiteral("NVLink");
    case Interconnect::PCIe:
      return QStringLiteral("PCIe");
    case Interconnect::CPU:
      return QStringLiteral("CPU (MPI)");
  }
  return {};
}

Advice adviseStrategy(const AdvisorInput& in) {
  Advice a;
  const int n = std::max(1, in.num_devices);
  const int heads = std::max(1, in.transformer.num_attention_heads);
  const bool canTp = in.transformer.tensor_parallel_plan != nullptr;
  const bool fast = in.interconnect == Interconnect::NVLink;
  dit::Strategy& s = a.strategy;
  s.world = n;
  s.device = in.interconnect == Interconnect::CPU ? "cpu" : "cuda";
  a.usable_gib = in.memory_gib_per_device * 0.9;

  // 1. CFG parallel.
  if (in.true_cfg && n % 2 == 0) {
    s.cfg_degree = 2;
    a.reasons << QStringLiteral(
        "True CFG doubles the work per step: cfg 2 lets one half of the ranks compute the "
        "conditional prediction and the other half the unconditional one.");
  } else if (in.true_cfg && n > 1) {
    a.reasons << QStringLiteral("True CFG is on, but cfg parallel needs an even number of ranks.");
  } else if (n > 1) {
    a.reasons << QStringLiteral(
        "CFG scale 1 (no negative prompt): cfg parallel would leave half the ranks idle, so it "
        "stays at 1.");
  }
  const int m = n / s.cfg_degree;

  // 2. Tensor parallel only if the weights do not fit.
  int tp = 0;
  for (int t : divisors(m)) {
    if (heads % t != 0 || (t > 1 && !canTp)) continue;
    if (estimate(in, t, m / t).total <= a.usable_gib) {
      tp = t;
      break;
    }
  }
  if (tp == 0) {
    a.fits = false;
    tp = 1;
    for (int t : divisors(m))
      if (heads % t == 0 && (t == 1 || canTp)) tp = t;
  }
  s.tp_degree = tp;
  const Memory single = estimate(in, 1, m);
  if (tp > 1) {
    a.reasons
        << QStringLiteral(
               "One rank would need about %1 (weights %2) but has %3 usable: tp %4 splits the "
               "transformer's weight matrices across %4 ranks.")
               .arg(gib(single.total), gib(single.weights), gib(a.usable_gib))
               .arg(tp);
    if (!fast)
      a.warnings << QStringLiteral(
                        "Tensor parallel over %1: every transformer block does AllReduces, and on "
                        "a slow link "
                        "the traffic can outweigh the compute saved. Devices with more memory (or "
                        "component "
                        "placement, which DiT Studio does not offer) avoid it.")
                        .arg(interconnectName(in.interconnect));
    else
      a.reasons << QStringLiteral("NVLink makes tp's per-block AllReduce cheap.");
  } else if (a.fits) {
    a.reasons
        << QStringLiteral(
               "The whole model fits on one rank (about %1 of %2 usable): no tensor parallel.")
               .arg(gib(single.total), gib(a.usable_gib));
  }

  // 3. Data parallel for several images per request.
  int r = m / tp;
  if (r > 1 && in.images_per_request > 1) {
    int dp = 1;
    for (int d : divisors(r))
      if (d <= in.images_per_request) dp = d;
    if (dp > 1) {
      s.dp_degree = dp;
      r /= dp;
      a.reasons << QStringLiteral(
                       "%1 images per request: dp %2 replicas each generate a share (throughput "
                       "scales, single-image latency does not).")
                       .arg(in.images_per_request)
                       .arg(dp);
    }
  }

  // 4. Context parallel with what is left.
  const int img = imageTokens(in.width, in.height, in.transformer.vae_scale_factor);
  auto divides = [&](int d) { return img % d == 0 && in.text_len % d == 0; };
  if (r > 1) {
    if (fast) {
      if (heads % r == 0 && divides(r)) {
        s.ulysses_degree = r;
        a.reasons
            << QStringLiteral(
                   "Ulysses %1 splits the sequence (%2 image + %3 text tokens); its all-to-all "
                   "suits a fast interconnect.")
                   .arg(r)
                   .arg(img)
                   .arg(in.text_len);
      } else {
        int bestU = 0;
        if (r >= 4 && divides(r)) {
          for (int u : divisors(r))
            if (u > 1 && u < r && heads % u == 0) bestU = u;
        }
        if (bestU > 0) {
          s.ulysses_degree = bestU;
          s.ring_degree = r / bestU;
          a.reasons
              << QStringLiteral(
                     "%1 heads do not split %2 ways: unified attention runs Ulysses %3 inside "
                     "each group and ring %4 across groups.")
                     .arg(heads)
                     .arg(r)
                     .arg(bestU)
                     .arg(r / bestU);
        } else {
          s.ulysses_degree = r;
          s.ulysses_anything = true;
          a.reasons << QStringLiteral(
                           "The sequence (%1 image + %2 text tokens) or the %3 heads do not divide "
                           "by %4: Ulysses anything splits them unevenly.")
                           .arg(img)
                           .arg(in.text_len)
                           .arg(heads)
                           .arg(r);
        }
      }
    } else {
      s.ring_degree = r;
      if (divides(r)) {
        a.reasons
            << QStringLiteral(
                   "Ring %1 splits the sequence (%2 image + %3 text tokens); K/V blocks travel "
                   "between neighbours, which suits a limited-bandwidth %4 link.")
                   .arg(r)
                   .arg(img)
                   .arg(in.text_len)
                   .arg(interconnectName(in.interconnect));
      } else {
        s.ring_anything = true;
        a.reasons << QStringLiteral(
                         "The sequence (%1 image + %2 text tokens) does not divide by %3: ring "
                         "anything splits it unevenly.")
                         .arg(img)
                         .arg(in.text_len)
                         .arg(r);
      }
    }
    if (img + in.text_len < 1024 * r)
      a.warnings << QStringLiteral(
                        "Short sequence (%1 tokens) for %2 context-parallel ranks: communication "
                        "may outweigh the compute saved; data parallel gives more throughput when "
                        "you generate several images.")
                        .arg(img + in.text_len)
                        .arg(r);
  } else if (n == 1) {
    a.reasons << QStringLiteral("One device: nothing to split.");
  }

  const Memory fin = estimate(in, s.tp_degree, s.cpDegree());
  a.weights_gib = fin.weights;
  a.activations_gib = fin.activations;
  a.total_gib = fin.total;
  a.fits = fin.total <= a.usable_gib;
  if (!a.fits)
    a.warnings << QStringLiteral(
                      "Even so each rank needs about %1 but has %2 usable: use more or larger "
                      "devices, a lower resolution or a smaller dtype.")
                      .arg(gib(fin.total), gib(a.usable_gib));

  QStringList dims;
  if (s.dp_degree > 1) dims << QStringLiteral("dp %1").arg(s.dp_degree);
  if (s.cfg_degree > 1) dims << QStringLiteral("cfg %1").arg(s.cfg_degree);
  if (s.ring_degree > 1)
    dims << QStringLiteral("ring %1%2").arg(s.ring_degree).arg(s.ring_anything ? " anything" : "");
  if (s.ulysses_degree > 1)
    dims << QStringLiteral("ulysses %1%2")
                .arg(s.ulysses_degree)
                .arg(s.ulysses_anything ? " anything" : "");
  if (s.tp_degree > 1) dims << QStringLiteral("tp %1").arg(s.tp_degree);
  a.title = QStringLiteral("%1 x %2: %3")
                .arg(n)
                .arg(s.device == "cpu" ? QStringLiteral("CPU rank") : QStringLiteral("GPU"))
                .arg(dims.isEmpty() ? QStringLiteral("single rank") : dims.join(" x "));
  return a;
}

}  // namespace dit::ui
