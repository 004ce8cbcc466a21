// ditstudio-bench's report: rank 0's one JSON object (units in the key names), from the
// per-rank figures every rank gathered (bench.h BenchResults).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "app/bench/bench.h"
#include "app/common/device_stats.h"
#include "app/protocol/protocol.h"
#include "backend/io/model_folder.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_source.h"
#include "backend/models/checkpoint_layouts.h"
#include "backend/models/memory_estimate.h"
#include "parallel/attention.h"
#include "parallel/strategy.h"
#include "parallel/torch_compat.h"

namespace dit::bench {

using nlohmann::ordered_json;

namespace {

// ------------------------------------------------------------------ model sizes (from the plan)
struct ParamSplit {
  int64_t total = 0;    ///< every parameter the model declares (its ParameterTable)
  int64_t sharded = 0;  ///< parameters the plan splits over tp at this run's tp_degree
  int64_t replicated() const { return total - sharded; }
};
// Parameter counts from the family's declared parameters and tensor-parallel plan: the same plan
// the loader shards by.
ParamSplit planParams(const ParameterTable& params, const ShardingPlan& plan, int tp) {
  ParamSplit p;
  for (const auto& info : params) {
    p.total += info.numel();
    if (tp > 1 && !plan.shardSpec(info.name, info.shape, 0, tp).replicated())
      p.sharded += info.numel();
  }
  return p;
}

ordered_json trafficJson(const CollectiveTraffic& t) {
  ordered_json j;
  j["total_bytes"] = t.total();
  j["tp_allreduce_bytes"] = t.tp_allreduce;
  j["tp_allgather_bytes"] = t.tp_allgather;
  j["ulysses_all_to_all_bytes"] = t.ulysses_all_to_all;
  j["ring_kv_bytes"] = t.ring_kv;
  j["cp_output_gather_bytes"] = t.cp_gather;
  j["cfg_prediction_gather_bytes"] = t.cfg_gather;
  return j;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "config": the family, the config's own sizes as declared, and the plan's parameter counts.
ordered_json configReport(const Args& a, const BenchModel& m) {
  const ParamSplit ps = planParams(*m.md.parameters, *m.md.tensor_parallel_plan, a.s.tp_degree);
  ordered_json mc;
  mc["family"] = m.family->display_name;
  mc["transformer_class"] = m.transformerClass;
  for (const auto& [k, v] : m.configJson.items())  // the config's own sizes, as declared
    if (!k.empty() && k[0] != '_' && (v.is_number() || v.is_boolean() || v.is_array()))
      mc[k] = ordered_json::parse(v.dump());
  mc["inner_dim"] = m.md.innerDim();
  mc["mlp_hidden_dim"] = m.md.mlp_hidden_dim;
  mc["parameters"] = ps.total;
  mc["parameters_tp_sharded"] = ps.sharded;
  mc["parameters_replicated"] = ps.replicated();
  return mc;
}

// "step_ms" and the achieved TFLOP/s (null without timed steps).
void addStepTimes(ordered_json& j, const BenchResults& r, double stepFlops, int world) {
  const std::vector<double>& stepMs = r.stepMs;
  if (r.steps > 0) {
    const double med = median(stepMs);
    const double mean = std::accumulate(stepMs.begin(), stepMs.end(), 0.0) / stepMs.size();
    ordered_json sm;
    sm["min"] = *std::min_element(stepMs.begin(), stepMs.end());
    sm["median"] = med;
    sm["mean"] = mean;
    sm["max"] = *std::max_element(stepMs.begin(), stepMs.end());
    sm["all"] = stepMs;
    j["step_ms"] = sm;
    j["step_ms_note"] = "per timed step, slowest rank (barrier before each step)";
    if (!r.deviceStepMs.empty()) {
      const std::vector<double>& d = r.deviceStepMs;
      j["device_step_ms"] = {
          {"min", *std::min_element(d.begin(), d.end())}, {"median", median(d)}, {"all", d}};
      j["device_step_ms_note"] =
          "CUDA events on the current stream around each step (no synchronisation inside it), "
          "slowest rank";
    }
    const double tot = stepFlops / (med / 1e3) / 1e12;
    j["achieved_tflops_total"] = tot;
    j["achieved_tflops_per_rank"] = tot / world;
    j["achieved_tflops_note"] = "flops_per_step_total / median step; per rank = total / world";
  } else {
    j["step_ms"] = nullptr;
    j["achieved_tflops_total"] = nullptr;
    j["achieved_tflops_per_rank"] = nullptr;
  }
}

// The device's peak TFLOP/s per rank (--peak-tflops, or a known GPU's dense bf16/fp16 figure) and
// the fraction of it reached.
void addPeakFraction(ordered_json& j, const Args& a, const BenchResults& r) {
  double peak = a.peakTflops;
  std::string peakSource = peak > 0 ? "--peak-tflops" : "";
  if (peak <= 0 && r.device.is_cuda() && r.dtype != at::kFloat) {
    const std::string n = deviceName(r.device);
    if (n.find("H100") != std::string::npos || n.find("H200") != std::string::npos) {
      peak = 989.0;
      peakSource = "default: H100/H200 SXM dense bf16/fp16";
    }
  }
  j["peak_tflops_per_rank"] = peak > 0 ? ordered_json(peak) : ordered_json(nullptr);
  j["peak_tflops_source"] = peak > 0 ? ordered_json(peakSource) : ordered_json(nullptr);
  if (peak > 0 && r.steps > 0)
    j["fraction_of_peak"] = j["achieved_tflops_per_rank"].get<double>() / peak;
  else
    j["fraction_of_peak"] = nullptr;
}

// GEMM roofline (CPU): the best FLOP/s this BLAS reaches on the model's own projection shapes
// ([S, C] x [C, C] and [S, C] x [C, mlp] in the compute dtype, this rank's threads), and the step
// time the model's FLOPs would take at that rate. fraction = roofline / measured median step:
// how close the whole step (attention, norms, RoPE, collectives included) comes to pure GEMM.
ordered_json gemmRoofline(const BenchModel& m, const BenchResults& r, double stepFlops, int world) {
  const int64_t S = r.shape.imageTokens() + r.shape.text_tokens, C = m.md.innerDim(),
                M = std::max(m.md.mlp_hidden_dim, 1);
  const at::ScalarType dtype = r.dtype;
  double best = 0;
  for (const int64_t n : {C, M}) {
    at::Tensor x = at::randn({S, C}, at::TensorOptions().dtype(dtype));
    at::Tensor w = at::randn({C, n}, at::TensorOptions().dtype(dtype));
    at::Tensor y = at::mm(x, w);  // warm-up
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      y = at::mm(x, w);
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, 2.0 * S * C * n / sec);
    }
  }
  ordered_json g;
  g["gemm_tflops"] = best / 1e12;
  const double rooflineMs = stepFlops / world / best * 1e3;
  g["roofline_step_ms"] = rooflineMs;
  g["fraction_of_roofline"] = rooflineMs / median(r.stepMs);
  g["note"] =
      "best at::mm FLOP/s on the model's [S,C]x[C,C] and [S,C]x[C,mlp] shapes (this rank's "
      "threads, compute dtype); roofline = step FLOPs per rank at that rate; fraction = "
      "roofline / median step";
  return g;
}

// The weight bytes a rank should hold: replicated + tp-sharded / tp_degree in the compute dtype;
// for a single file, as held: a linear weight stored as an 8-bit float stays 1 byte per element
// (from the file's header through its key layout, independently of the loader), the rest `es`.
uint64_t expectedWeightBytes(const Args& a, const BenchModel& m, uint64_t es) {
  const ParameterTable& params = *m.md.parameters;  // the family's declared table and plan
  const ShardingPlan& plan = *m.md.tensor_parallel_plan;
  if (m.singleFile.empty())
    return plan.bytesPerRank(params, a.s.tp_degree, static_cast<int64_t>(es));
  SafetensorsReader r(m.singleFile);
  const auto layout =
      componentLayout(r, inspectCheckpoint(m.singleFile).require("transformer", "--model"));
  ParameterTable held;
  for (ParameterInfo p : params) {
    auto it = layout->tensors.find(p.name);
    const DType d =
        it == layout->tensors.end() ? DType::F32 : r.info(it->second.segments.front().key).dtype;
    const bool f8 = (d == DType::F8_E4M3 || d == DType::F8_E5M2) && p.shape.size() == 2;
    p.elementBytes = f8 ? 1 : static_cast<int64_t>(es);
    held.add(p);
  }
  return plan.bytesPerRank(held, a.s.tp_degree, 0);
}

// "ranks": each rank's coordinates, weights, memory, load time and traffic against the expected.
ordered_json ranksReport(const Args& a, const BenchModel& m, const BenchResults& r, uint64_t es) {
  const Strategy& s = a.s;
  const int world = s.world;
  const int steps = r.steps;
  ordered_json ranks = ordered_json::array();
  const uint64_t expected = expectedWeightBytes(a, m, es);
  // The memory model's peak for this rank (issue 47): the transformer's weights at tp plus its
  // stage (activations and attention, estimateTransformerMemory) for each image of the batch.
  ModelDims dims = m.md;
  dims.vae_scale_factor = m.vaeScale;
  RequestDims rd;
  rd.width = a.width;
  rd.height = a.height;
  rd.text_len = a.textLen;
  const MemoryEstimate stage = estimateTransformerMemory(dims, s, rd, static_cast<int64_t>(es),
                                                         s.device.rfind("cuda", 0) != 0);
  const uint64_t planned = expected + static_cast<uint64_t>(std::max(1, a.batch)) *
                                          (stage.activations + stage.attention);
  for (int rank = 0; rank < world; ++rank) {
    auto v = [&](int i) { return r.rankRows[rank][i].item<int64_t>(); };
    ordered_json rj;
    rj["rank"] = rank;
    const auto co = meshCoords(s, rank);
    rj["coords"] = {
        {"dp", co[0]}, {"cfg", co[1]}, {"ring", co[2]}, {"ulysses", co[3]}, {"tp", co[4]}};
    rj["weight_bytes"] = v(kWeightBytes);
    rj["expected_weight_bytes"] = expected;
    if (rank == 0) rj["weight_storage_bytes"] = r.storageBytes;
    rj["rss_before_load_bytes"] = v(kRssBefore);
    rj["rss_after_load_bytes"] = v(kRssAfterLoad);
    rj["rss_peak_load_bytes"] = v(kRssPeakLoad);
    rj["rss_peak_load_growth_bytes"] = v(kRssPeakLoad) - v(kRssBefore);
    rj["rss_bytes"] = v(kRss);
    rj["rss_peak_bytes"] = v(kRssPeak);
    rj["planned_peak_bytes"] = planned;
    rj["rss_peak_growth_bytes"] = v(kRssPeak) - v(kRssBefore);
    rj["rss_peak_growth_over_planned"] =
        planned > 0
            ? static_cast<double>(v(kRssPeak) - v(kRssBefore)) / static_cast<double>(planned)
            : 0.0;
    rj["dev_after_load_bytes"] = v(kDevAfterLoad);
    rj["dev_peak_load_bytes"] = v(kDevPeakLoad);
    rj["dev_bytes"] = v(kDev);
    rj["dev_peak_bytes"] = v(kDevPeak);
    rj["load_s"] = v(kLoadMicroseconds) / 1e6;
    if (steps > 0) {
      rj["bytes_sent_per_step"] = v(kBytesTimed) / steps;
      const CollectiveTraffic t =
          m.runtime->traffic(m.configJson, m.configFile, s, rank, r.shape, es);
      rj["expected_bytes_per_step"] = t.total();
      rj["expected_bytes_per_step_breakdown"] = trafficJson(t);
    }
    ranks.push_back(rj);
  }
  return ranks;
}

// "notes": what each figure is.
ordered_json notes(bool hwmReset) {
  return {
      {"weight_storage_bytes",
       "rank 0's transformer weights by storage: 8-bit float checkpoints keep their linear "
       "weights as 1-byte codes (dequantized at use), the rest is held in the compute dtype"},
      {"weight_bytes",
       "WeightSource::bytesLoaded(): this rank's transformer weights in the compute dtype; "
       "expected = replicated + tp-sharded/tp_degree (closed form from the config; single "
       "files: 1 byte per element for linear weights stored as 8-bit floats)"},
      {"rss",
       "VmRSS/VmHWM of the process (host). VmHWM was reset (clear_refs) just before loading: " +
           std::string(hwmReset ? "yes" : "no (lifetime peak)") +
           "; rss_peak_load_bytes is VmHWM right after the load, rss_peak_bytes at the end"},
      {"planned_peak_bytes",
       "the memory model's peak for this rank (backend/models/memory_estimate.h): the "
       "transformer's weights at tp (expected_weight_bytes) + its stage per image of the batch "
       "(estimateTransformerMemory: activations and attention; no text encoder or VAE here); "
       "rss_peak_growth_bytes = rss_peak_bytes - rss_before_load_bytes, the measured counterpart "
       "on CPU ranks"},
      {"dev",
       "CUDA caching allocator allocated_bytes (aggregate), current and peak; 0 on cpu; peak reset "
       "before loading"},
      {"bytes_sent_per_step",
       "DeviceMesh::bytesSent() delta over the timed steps / steps: process-group payload "
       "accounting (allreduce = 2(n-1)/n x size), not measured on the wire"},
      {"expected_bytes_per_step",
       "closed form of what the strategy must send per step for the family's forward "
       "(FamilyRuntime::traffic, from its plans)"}};
}

}  // namespace

ordered_json benchReport(const Args& a, const BenchModel& m, const BenchResults& r,
                         const BlasInfo& blas) {
  const Strategy& s = a.s;
  const int world = s.world;
  const uint64_t es = c10::elementSize(r.dtype);
  ordered_json j;
  j["benchmark"] = "ditstudio-bench: " + m.transformerClass + " load + forward";
  j["source"] = m.source;
  j["phase"] = a.phase;
  j["blas"] = ordered_json::parse(blasInfoJson(blas).dump());
  j["config"] = configReport(a, m);
  j["width"] = a.width;
  j["height"] = a.height;
  j["batch"] = r.shape.batch;
  j["image_tokens"] = r.shape.imageTokens();
  j["text_tokens"] = r.shape.text_tokens;
  j["dtype"] = computeDTypeName(r.dtype);
  j["requested_dtype"] = a.dtype;
  if (!r.dtypeNote.empty()) j["dtype_note"] = r.dtypeNote;
  j["device"] = s.device;
  j["device_name"] = deviceName(r.device);
  j["torch_version"] = dit::torch_compat::kTorchVersion;
  j["blas_core"] = blas.core;  // also in j["blas"]
  ordered_json sj = ordered_json::parse(protocol::strategyToJson(s).dump());
  sj["describe"] = s.describe();
  sj["backend"] = r.meshBackend;
  j["strategy"] = sj;
  double loadMax = 0;
  for (int rank = 0; rank < world; ++rank)
    loadMax = std::max(loadMax, r.rankRows[rank][kLoadMicroseconds].item<int64_t>() / 1e6);
  j["load_s"] = loadMax;
  j["load_s_note"] = "slowest rank, transformer only (open + read/generate + copy to device)";
  j["warmup_steps"] = r.steps ? a.warmup : 0;
  j["timed_steps"] = r.steps;
  // This rank's attention kernels (every rank runs the same code path on the same shapes).
  j["attention_kernels"] = dit::attentionKernelsUsed();
  // FLOPs of one step: the transformer's flops per image, x batch, x cfg (both halves predict),
  // x dp (every replica works on its own image).
  const double stepFlops = r.flopsPerForward * r.shape.batch * s.cfg_degree * s.dp_degree;
  j["flops_per_forward"] = r.flopsPerForward;
  j["flops_per_step_total"] = stepFlops;
  addStepTimes(j, r, stepFlops, world);
  addPeakFraction(j, a, r);
  if (!r.device.is_cuda() && r.steps > 0) j["gemm_roofline"] = gemmRoofline(m, r, stepFlops, world);
  j["ranks"] = ranksReport(a, m, r, es);
  if (!r.opProfile.is_null()) j["op_profile"] = r.opProfile;
  j["notes"] = notes(r.hwmReset);
  return j;
}

}  // namespace dit::bench
