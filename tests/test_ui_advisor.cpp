// Advisor (ui/advisor.h): the DESIGN.md "Choosing a strategy" rules, and every recommendation
// passes the worker's own validation (dit::validateForRequest).
#include <QtTest>
#include <cmath>
#include <stdexcept>

#include "backend/io/stored_weight_bytes.h"
#include "backend/models/flux/flux_plan.h"
#include "backend/models/memory_estimate.h"
#include "parallel/strategy.h"
#include "ui/advisor.h"

using namespace dit::ui;

namespace {

AdvisorInput flux(int gpus, double mem, Interconnect ic, int w = 1024, int h = 1024) {
  AdvisorInput in;  // FLUX.1-dev sizes: 11.9 B transformer, T5-XXL + CLIP + VAE about 4.9 B
  in.num_devices = gpus;
  in.memory_gib_per_device = mem;
  in.interconnect = ic;
  in.width = w;
  in.height = h;
  return in;
}

QString issuesOf(const Advice& a, const AdvisorInput& in) {
  // The worker's rules on the same declared model the advisor sized (plan + parameter table).
  dit::RequestDims r;
  r.width = in.width;
  r.height = in.height;
  r.text_len = in.text_len;
  r.true_cfg = in.true_cfg;
  r.num_images = in.images_per_request;
  return QString::fromStdString(
      dit::joinIssues(dit::validateForRequest(a.strategy, in.transformer, r)));
}

// Elements of a FLUX.1 transformer that the FLUX.1 tensor-parallel plan (DESIGN.md section 3)
// splits across tp ranks, in closed form: per double block the colwise to_q/k/v, add_q/k/v_proj
// (weight and bias), ff.net.0.proj and ff_context.net.0.proj (weight and bias), the rowwise
// to_out.0, to_add_out, ff.net.2, ff_context.net.2 (weight only: their bias is replicated); per
// single block the colwise to_q/k/v and proj_mlp (weight and bias) and the packed rowwise proj_out
// weight [C, C + M]; and the AdaLN modulation linears, colwise with their output all-gathered
// (norm1.linear and norm1_context.linear [6C, C] per double block, norm.linear [3C, C] per single
// block, weight and bias).
double fluxShardedElements(const dit::FluxTransformerConfig& c) {
  const double C = c.innerDim(), M = c.mlpHidden();
  const double dbl =
      6 * (C * C + C) + 2 * (C * M + M) + 2 * C * C + 2 * M * C + 2 * (6 * C * C + 6 * C);
  const double sgl = 3 * (C * C + C) + (C * M + M) + (C + M) * C + (3 * C * C + 3 * C);
  return c.num_layers * dbl + c.num_single_layers * sgl;
}

double tableElements(const dit::ParameterTable& t) {
  double n = 0;
  for (const auto& p : t) n += double(p.numel());
  return n;
}

}  // namespace

class TestAdvisor : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void singleGpu() {
    const AdvisorInput in = flux(1, 80, Interconnect::NVLink);
    const Advice a = adviseStrategy(in);
    QCOMPARE(a.strategy.world, 1);
    QCOMPARE(a.strategy.tp_degree, 1);
    QCOMPARE(a.strategy.cpDegree(), 1);
    QCOMPARE(a.strategy.device, std::string("cuda"));
    QVERIFY(a.fits);
    QVERIFY(a.total_gib > 30 && a.total_gib < 40);  // 16.8 B params in bf16 + activations
    QCOMPARE(issuesOf(a, in), QString());
  }

  void fitsSoContextParallelOnNvlink() {
    const AdvisorInput in = flux(4, 80, Interconnect::NVLink);
    const Advice a = adviseStrategy(in);
    QCOMPARE(a.strategy.ulysses_degree, 4);
    QCOMPARE(a.strategy.ring_degree, 1);
    QCOMPARE(a.strategy.tp_degree, 1);
    QVERIFY(!a.strategy.ulysses_anything);
    QCOMPARE(issuesOf(a, in), QString());
    QVERIFY(a.reasons.join(' ').contains("Ulysses"));
  }

  void pcieUsesRingAndAvoidsTp() {
    const AdvisorInput in = flux(4, 48, Interconnect::PCIe);
    const Advice a = adviseStrategy(in);
    QCOMPARE(a.strategy.ring_degree, 4);
    QCOMPARE(a.strategy.ulysses_degree, 1);
    QCOMPARE(a.strategy.tp_degree, 1);
    QVERIFY(a.warnings.join(' ').indexOf("Tensor parallel") < 0);
    QCOMPARE(issuesOf(a, in), QString());
  }

  void weightsDoNotFitNeedTp() {
    AdvisorInput in = flux(2, 24, Interconnect::NVLink);
    in.other_params = 0.2e9;  // text encoders offloaded: only the transformer counts
    const Advice a = adviseStrategy(in);
    QCOMPARE(a.strategy.tp_degree, 2);
    QCOMPARE(a.strategy.world, 2);
    QVERIFY(a.fits);
    QVERIFY(a.warnings.isEmpty());
    QCOMPARE(issuesOf(a, in), QString());
  }

  void tpOverPcieIsWarned() {
    AdvisorInput in = flux(2, 24, Interconnect::PCIe);
    in.other_params = 0.2e9;
    const Advice a = adviseStrategy(in);
    QCOMPARE(a.strategy.tp_degree, 2);
    QVERIFY(a.warnings.join(' ').contains("PCIe"));
  }

  void tpTakesOnlyWhatIsNeeded() {
    AdvisorInput in = flux(8, 24, Interconnect::NVLink);
    in.other_params = 0.2e9;
    const Advice a = adviseStrategy(in);
    QCOMPARE(a.strategy.tp_degree, 2);  // tp 2 fits; the other factor 4 goes to Ulysses
    QCOMPARE(a.strategy.ulysses_degree, 4);
    QCOMPARE(a.strategy.world, 8);
    QCOMPARE(issuesOf(a, in), QString());
  }

  void doesNotFitAtAll() {
    const Advice a = adviseStrategy(flux(1, 8, Interconnect::NVLink));
    QVERIFY(!a.fits);
    QVERIFY(!a.warnings.isEmpty());
  }

  void indivisibleSequenceUsesAnything() {
    // 1008x1008 -> 63x63 = 3969 image tokens: only the anything modes run (DESIGN.md section 3).
    const AdvisorInput nv = flux(4, 80, Interconnect::NVLink, 1008, 1008);
    const Advice a = adviseStrategy(nv);
    QCOMPARE(a.strategy.ulysses_degree, 4);
    QVERIFY(a.strategy.ulysses_anything);
    QCOMPARE(issuesOf(a, nv), QString());
    const AdvisorInput pc = flux(4, 80, Interconnect::PCIe, 1008, 1008);
    const Advice b = adviseStrategy(pc);
    QCOMPARE(b.strategy.ring_degree, 4);
    QVERIFY(b.strategy.ring_anything);
    QCOMPARE(issuesOf(b, pc), QString());
  }

  void headsDoNotDivideUsesUnified() {
    const AdvisorInput in = flux(16, 80, Interconnect::NVLink);  // 24 heads, 16 ranks
    const Advice a = adviseStrategy(in);
    QCOMPARE(a.strategy.ring_degree * a.strategy.ulysses_degree, 16);
    QVERIFY(a.strategy.ring_degree > 1);
    QVERIFY(a.strategy.ulysses_degree > 1);
    QCOMPARE(24 % a.strategy.ulysses_degree, 0);
    QCOMPARE(issuesOf(a, in), QString());
  }

  void trueCfgUsesCfgParallel() {
    AdvisorInput in = flux(8, 80, Interconnect::NVLink);
    in.true_cfg = true;
    const Advice a = adviseStrategy(in);
    QCOMPARE(a.strategy.cfg_degree, 2);
    QCOMPARE(a.strategy.ulysses_degree, 4);
    QCOMPARE(issuesOf(a, in), QString());
    // Without true CFG, cfg stays 1 and the reason says why.
    in.true_cfg = false;
    const Advice b = adviseStrategy(in);
    QCOMPARE(b.strategy.cfg_degree, 1);
    QVERIFY(b.reasons.join(' ').contains("idle"));
  }

  void manyImagesUseDataParallel() {
    AdvisorInput in = flux(4, 80, Interconnect::NVLink);
    in.images_per_request = 4;
    const Advice a = adviseStrategy(in);
    QCOMPARE(a.strategy.dp_degree, 4);
    QCOMPARE(a.strategy.cpDegree(), 1);
    QCOMPARE(issuesOf(a, in), QString());
    in.images_per_request = 2;  // 2 replicas x Ulysses 2
    const Advice b = adviseStrategy(in);
    QCOMPARE(b.strategy.dp_degree, 2);
    QCOMPARE(b.strategy.ulysses_degree, 2);
  }

  void cpuRanks() {
    AdvisorInput in;
    dit::FluxTransformerConfig c;  // the tiny fixture's sizes
    c.num_layers = c.num_single_layers = 2;
    c.num_attention_heads = 4;
    c.attention_head_dim = 16;
    c.joint_attention_dim = 32;
    c.pooled_projection_dim = 32;
    c.in_channels = c.out_channels = 16;
    c.guidance_embeds = true;
    in.transformer = dit::fluxModelDims(c, 2);
    in.other_params = 1.7e6;
    in.bytes_per_param = 4;
    in.num_devices = 2;
    in.memory_gib_per_device = 4;
    in.interconnect = Interconnect::CPU;
    in.width = in.height = 64;
    const Advice a = adviseStrategy(in);
    QCOMPARE(a.strategy.device, std::string("cpu"));
    QCOMPARE(a.strategy.ring_degree, 2);
    QVERIFY(a.fits);
    QCOMPARE(issuesOf(a, in), QString());
    QVERIFY(a.title.contains("CPU"));
  }

  void weightsFollowThePlan() {
    // FLUX.1-dev: the default model is the declared FLUX.1 table and plan (11.9 B parameters).
    dit::FluxTransformerConfig c;
    c.guidance_embeds = true;
    AdvisorInput in = flux(2, 24, Interconnect::NVLink);
    const double total = tableElements(*in.transformer.parameters);
    QVERIFY(total > 11.8e9 && total < 12.0e9);
    QCOMPARE(transformerParameters(in), total);
    const double sharded = fluxShardedElements(c);
    // Only the embedders, the final layer and the norms' own weights stay replicated.
    QVERIFY(sharded > 0.99 * total && sharded < total);
    for (int tp : {1, 2, 4, 8}) {
      const double expect = ((total - sharded) + sharded / tp) * 2.0 + in.other_params * 2.0;
      QCOMPARE(weightBytesPerRank(in, tp), expect);
    }
    // What the advice reports is the plan's figure at the chosen tp (here tp 2), in GiB.
    in.other_params = 0.2e9;
    const Advice a = adviseStrategy(in);
    QCOMPARE(a.strategy.tp_degree, 2);
    const double expect2 = ((total - sharded) + sharded / 2) * 2.0 + 0.2e9 * 2.0;
    QVERIFY(std::abs(a.weights_gib - expect2 / (1024.0 * 1024.0 * 1024.0)) < 1e-9);
    // Above the naive params / tp figure: the plan's replicated part (64.5 M elements: the
    // embedders, norm_out, proj_out) is held whole on every rank, 64.5 MB more in bf16 at tp 2.
    const double replicated = a.weights_gib * 1024.0 * 1024.0 * 1024.0 - (total / 2 + 0.2e9) * 2.0;
    QVERIFY(replicated > 0.06e9 && replicated < 0.07e9);
    // float32 compute: 4 bytes per element of the same split.
    in.bytes_per_param = 4;
    QCOMPARE(weightBytesPerRank(in, 4), ((total - sharded) + sharded / 4) * 4.0 + 0.2e9 * 4.0);
    // A model without a plan cannot be split: tp stays 1, and tp > 1 is refused.
    in.transformer.tensor_parallel_plan = nullptr;
    QCOMPARE(weightBytesPerRank(in, 1), total * 4.0 + 0.2e9 * 4.0);
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, weightBytesPerRank(in, 2));
    in.bytes_per_param = 2;
    QCOMPARE(adviseStrategy(in).strategy.tp_degree, 1);
  }

  // A GGUF transformer (issue 33): the table carries the stored types (every 2-D block weight
  // Q4_K here), and the weights per rank are their quantized bytes (0.5625 per parameter),
  // replicated AdaLN modulation included: about 4.4 GB at tp 2 instead of 12 GB in bf16.
  void gguf_weightsUseQuantizedSizes() {
    AdvisorInput in = flux(2, 24, Interconnect::NVLink);
    in.other_params = 0;
    dit::ParameterTable q;
    for (dit::ParameterInfo p : *in.transformer.parameters) {
      if (p.shape.size() == 2 && p.name.find("transformer_blocks.") != std::string::npos)
        p.dtype = "Q4_K", p.elementBytes = 1;
      q.add(p);
    }
    const double bf16 = weightBytesPerRank(in, 2);
    in.transformer.parameters = std::make_shared<const dit::ParameterTable>(q);
    const double quant = weightBytesPerRank(in, 2);
    QCOMPARE(quant, double(dit::storedWeightBytesPerRank(*in.transformer.tensor_parallel_plan, q, 2,
                                                         2, true)));
    QVERIFY(quant > 3.4e9 && quant < 4.6e9);
    QVERIFY(quant < 0.4 * bf16);
  }

  // FLUX.2 sizes from the declared parameter tables (the issue's 4B / 9B / 32B), and the advice
  // they get: FLUX.2 [dev] does not fit one 80 GiB GPU in bf16 and takes tensor parallel on 4.
  void knowsFlux2Sizes() {
    const auto known = knownModels();
    QCOMPARE(int(known.size()), 6);  // FLUX.1 [dev], FLUX.2 x 3, Qwen-Image, Z-Image-Turbo
    auto params = [&](int i) {
      AdvisorInput in;
      in.transformer = known[size_t(i)].transformer;
      return transformerParameters(in) / 1e9;
    };
    QCOMPARE(known[1].name, QStringLiteral("FLUX.2 [klein] 4B"));
    QVERIFY2(params(1) > 3.8 && params(1) < 3.95, qPrintable(QString::number(params(1))));
    QVERIFY2(params(2) > 8.9 && params(2) < 9.1, qPrintable(QString::number(params(2))));
    QVERIFY2(params(3) > 31.5 && params(3) < 32.5, qPrintable(QString::number(params(3))));
    QCOMPARE(known[3].transformer.num_attention_heads, 48);
    AdvisorInput dev;
    dev.transformer = known[3].transformer;
    dev.other_params = known[3].other_params;
    dev.num_devices = 1;
    dev.memory_gib_per_device = 80;
    QVERIFY(!adviseStrategy(dev).fits);
    dev.num_devices = 4;
    const Advice a = adviseStrategy(dev);
    QVERIFY(a.strategy.tp_degree > 1);
    QCOMPARE(48 % a.strategy.tp_degree, 0);
    // Z-Image-Turbo (6.15 B transformer, 30 heads of 128) from its declared parameter table.
    QCOMPARE(known[5].name, QStringLiteral("Z-Image-Turbo"));
    QVERIFY2(params(5) > 6.1 && params(5) < 6.2, qPrintable(QString::number(params(5))));
    QCOMPARE(known[5].transformer.num_attention_heads, 30);
  }

  // Qwen-Image 20 B from its declared table (60 blocks, 24 heads x 128, joint_attention_dim
  // 3584): the advice on 4 GPUs keeps whole heads per tensor-parallel rank.
  void knowsQwenImageSizes() {
    const auto known = knownModels();
    QCOMPARE(known[4].name, QStringLiteral("Qwen-Image"));
    AdvisorInput in;
    in.transformer = known[4].transformer;
    in.other_params = known[4].other_params;
    const double p = transformerParameters(in) / 1e9;
    QVERIFY2(p > 20.0 && p < 20.6, qPrintable(QString::number(p)));
    QCOMPARE(in.transformer.num_attention_heads, 24);
    in.num_devices = 4;
    in.memory_gib_per_device = 24;
    const Advice a = adviseStrategy(in);
    QCOMPARE(24 % a.strategy.tp_degree, 0);
  }

  // One memory model: the advisor's activation figure is the worker's estimate
  // (dit::estimateTransformerMemory, what estimateRequestMemory refuses requests by) for the same
  // strategy, request and dtype, on a GPU and on CPU ranks (scores held by the math kernel).
  void usesTheWorkersMemoryModel() {
    for (const Interconnect ic : {Interconnect::NVLink, Interconnect::CPU}) {
      AdvisorInput in;
      in.interconnect = ic;
      in.num_devices = 1;
      in.memory_gib_per_device = 4096;
      in.width = 768;
      in.height = 512;
      in.text_len = 256;
      in.bytes_per_param = 2;
      const Advice a = adviseStrategy(in);
      QCOMPARE(a.strategy.tp_degree, 1);
      dit::RequestDims r;
      r.width = 768;
      r.height = 512;
      r.text_len = 256;
      const dit::MemoryEstimate e =
          dit::estimateTransformerMemory(in.transformer, a.strategy, r, 2, ic == Interconnect::CPU);
      const double gib = 1024.0 * 1024.0 * 1024.0;
      QVERIFY2(std::abs(a.activations_gib - double(e.peak()) / gib) < 1e-12,
               qPrintable(QString("%1 vs %2").arg(a.activations_gib).arg(double(e.peak()) / gib)));
      QVERIFY(e.activations > 0 && e.attention > 0 && e.vae_decode > 0);
    }
  }

  void imageTokenCount() {
    QCOMPARE(imageTokens(1024, 1024, 8), 4096);
    QCOMPARE(imageTokens(1008, 1008, 8), 3969);
    QCOMPARE(imageTokens(64, 32, 2), 128);
  }
};

QTEST_GUILESS_MAIN(TestAdvisor)
#include "test_ui_advisor.moc"
