// ditstudio-bench: load-and-step benchmark of any registered family's transformer under any
// parallel strategy. Runs under mpirun (or alone as one rank). The transformer is created through
// the family tables by its config's "_class_name" (the family record, models/family.h, for the
// sizes and plans; its FamilyRuntime, backend/family_runtime.h, for the load, the random inputs
// and the traffic model).
//
// What is measured: only the transformer. It is loaded (shard-on-load under tp) from a diffusers
// folder (--model) or defined by its config alone with random weights (--config ...
// --random-weights: WeightSource::random generates each rank's shards directly, so per-rank
// weight memory is ~1/tp of the sharded part). Then `--warmup` untimed and `--steps` timed
// forwards run on random inputs drawn from a fixed-seed CPU generator (identical on every rank).
// A timed step is what one denoising step of the pipeline costs in the transformer: the forward,
// plus, with cfg_degree 2, the allgather of the two predictions and the CFG combination.
// Rank 0 prints ONE JSON object on stdout (also written to --json-out when given); logs go to
// stderr. Units are in the key names (_bytes, _ms, _s, _tflops).
//
// Communication figures: `bytes_sent_per_step` is the delta of DeviceMesh::bytesSent() over the
// timed steps divided by the step count, i.e. the process groups' payload accounting (allreduce
// counted as ring-allreduce volume 2(n-1)/n x size, allgather as own part x (n-1), all-to-all
// and send/recv as payload sent to other ranks) — not bytes measured on a wire.
// `expected_bytes_per_step` is the closed form of what the strategy must move per step for the
// family's forward (FamilyRuntime::traffic); the two agree when the implementation issues exactly
// the collectives the strategy needs.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "app/common/blas_kernel.h"
#include "app/common/device_stats.h"
#include "app/common/generation.h"
#include "app/launcher/launch.h"
#include "app/protocol/protocol.h"
#include "backend/family_runtime.h"
#include "backend/io/config_json.h"
#include "backend/io/model_folder.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_loader.h"
#include "backend/io/weight_source.h"
#include "backend/models/checkpoint_layouts.h"
#include "backend/models/family_registry.h"
#include "parallel/attention.h"
#include "parallel/context_parallel.h"
#include "parallel/device_mesh.h"
#include "parallel/runtime.h"
#include "parallel/strategy.h"
#include "parallel/torch_compat.h"

using namespace dit;
using nlohmann::ordered_json;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// ------------------------------------------------------------------ per-operator profile
// --profile: one more forward after the timed ones with RecordFunction callbacks on this thread
// (ATen operators as dispatched; intra-op worker threads run inside them), aggregated by operator
// name: calls, total and self milliseconds (self = total minus the operators called inside it).
// Same idea as torch.profiler's key_averages() table; the callbacks add a few microseconds per op.
struct OpStat {
  int64_t calls = 0;
  double totalMs = 0.0, selfMs = 0.0;
};
struct OpFrame {
  const char* name;
  Clock::time_point t0;
  double childMs;
};
thread_local std::vector<OpFrame> t_opStack;
thread_local std::map<std::string, OpStat>* t_opStats = nullptr;

std::unique_ptr<at::ObserverContext> onOpStart(const at::RecordFunction& fn) {
  if (t_opStats) t_opStack.push_back({fn.name(), Clock::now(), 0.0});
  return nullptr;
}

void onOpEnd(const at::RecordFunction& /*fn*/, at::ObserverContext* /*ctx*/) {
  if (!t_opStats || t_opStack.empty()) return;
  const OpFrame f = t_opStack.back();
  t_opStack.pop_back();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - f.t0).count();
  OpStat& st = (*t_opStats)[f.name];
  ++st.calls;
  st.totalMs += ms;
  st.selfMs += ms - f.childMs;
  if (!t_opStack.empty()) t_opStack.back().childMs += ms;
}

/// Runs fn once under the operator callbacks; returns {"step_ms", "ops": top `top` by self time}.
template <typename F>
ordered_json profileOps(F&& fn, size_t top = 25) {
  std::map<std::string, OpStat> stats;
  t_opStats = &stats;
  t_opStack.clear();
  const at::CallbackHandle h = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&onOpStart, &onOpEnd).scopes({at::RecordScope::FUNCTION}));
  const auto t0 = Clock::now();
  fn();
  const double stepMs = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  at::removeCallback(h);
  t_opStats = nullptr;
  std::vector<std::pair<std::string, OpStat>> v(stats.begin(), stats.end());
  std::sort(v.begin(), v.end(),
            [](const auto& x, const auto& y) { return x.second.selfMs > y.second.selfMs; });
  ordered_json ops = ordered_json::array();
  double selfSum = 0.0;
  for (const auto& [name, st] : v) selfSum += st.selfMs;
  for (size_t i = 0; i < v.size() && i < top; ++i)
    ops.push_back({{"op", v[i].first},
                   {"calls", v[i].second.calls},
                   {"self_ms", v[i].second.selfMs},
                   {"total_ms", v[i].second.totalMs}});
  return {{"step_ms", stepMs},
          {"ops_self_ms", selfSum},
          {"outside_ops_ms", stepMs - selfSum},
          {"ops", ops}};
}

struct Args {
  std::string model, config, dtype = "bfloat16", phase = "all", jsonOut;
  bool randomWeights = false, pretty = false, profile = false;
  int width = 1024, height = 1024, textLen = 512, steps = 10, warmup = 2, batch = 1;
  uint64_t seed = 0;
  double peakTflops = -1.0;
  Strategy s;
};

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

// ------------------------------------------------------------------ the benchmark
// What ensureBlasKernel() found and chose (reported in the JSON: CPU figures depend on it).
BlasInfo g_blas;

int runBench(Args a) {
  const int rank = worldRank(), world = worldSize();
  Strategy& s = a.s;
  s.world = world;
  auto fail = [&](const std::string& msg) {
    if (rank == 0) {
      ordered_json e;
      e["error"] = msg;
      std::cout << e.dump() << std::endl;
    }
    return 2;
  };

  // 1. Model definition (configs only; every rank reaches the same verdict without a collective).
  const FamilySpec* family = nullptr;      // the config's family record
  const FamilyRuntime* runtime = nullptr;  // its Torch half
  int vaeScale = 8;                        // the usual VAE scale; a model folder gives its own
  std::string source, weightsDir;
  nlohmann::json configJson;  // the transformer's config.json
  std::string configFile, transformerClass;
  ModelDims md;  // the registered family's sizes and plans
  // `cls`: the class ModelFolder::open resolved; empty = the config's own "_class_name".
  auto readTransformerConfig = [&](const std::string& file, std::string cls) {
    configFile = file;
    configJson = readConfigJson(file);
    if (cls.empty()) getConfigValue(configJson, "_class_name", cls, file);
    if (cls.empty())
      throw ModelFileError(
          file, "no \"_class_name\" (the transformer class, e.g. FluxTransformer2DModel)");
    transformerClass = cls;
    family = &transformerFamily(cls, file);  // refuses an unregistered class
    runtime = &familyRuntime(family->pipeline_class, file);
    md = family->dims(configJson, file);
  };
  std::string singleFile;  // --model FILE: a single-file transformer / all-in-one checkpoint
  try {
    if (!a.model.empty() && fs::is_regular_file(a.model)) {
      // Hyper-parameters from the tensor shapes; --config (a transformer config.json) only
      // supplies what the shapes cannot (e.g. FLUX.1's RoPE axes when the head dim is not 128).
      singleFile = a.model;
      const CheckpointInfo info = inspectCheckpoint(a.model);
      info.require("transformer", "--model");
      family = &checkpointFamily(info.family, a.model);
      if (!family->single_file_transformer_config)
        throw ModelFileError(a.model, family->refusal("single_file"));
      runtime = &familyRuntime(family->pipeline_class, a.model);
      configJson = family->single_file_transformer_config(a.model, a.config);
      configFile = a.model;
      transformerClass = family->transformer_class;
      md = family->dims(configJson, a.model);
      source = a.model;
    } else if (!a.model.empty() == (a.randomWeights || !a.config.empty()))
      throw std::invalid_argument(
          "give either --model DIR or --config transformer_config.json --random-weights");
    if (!singleFile.empty()) {
      // configured above, from the file's shapes
    } else if (!a.model.empty()) {
      if (fs::exists(fs::path(a.model) / "model_index.json")) {
        ModelFolder m = ModelFolder::open(a.model);
        readTransformerConfig(m.component("transformer") + "/config.json", m.transformer_class);
        vaeScale = m.dims().vae_scale_factor;
        weightsDir = m.component("transformer");
      } else if (fs::exists(fs::path(a.model) / "config.json")) {  // a transformer folder itself
        readTransformerConfig((fs::path(a.model) / "config.json").string(), "");
        weightsDir = a.model;
      } else {
        throw ModelFileError(a.model,
                             "neither a diffusers model folder (model_index.json) nor a "
                             "transformer folder (config.json)");
      }
      source = a.model;
    } else {
      if (a.config.empty() || !a.randomWeights)
        throw std::invalid_argument("--config needs --random-weights (and vice versa)");
      readTransformerConfig(a.config, "");
      source = a.config + " (random weights)";
    }
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  if (a.phase != "all" && a.phase != "load") return fail("--phase must be 'all' or 'load'");
  if (a.steps < 1 && a.phase == "all") return fail("--steps must be at least 1");
  if (a.warmup < 0 || a.batch < 1) return fail("--warmup must be >= 0 and --batch >= 1");
  at::ScalarType dtype;
  std::string dtypeNote;
  try {
    const ComputeDType cd = resolveComputeDType(a.dtype, s.device);
    dtype = cd.dtype;
    dtypeNote = cd.note;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  md.vae_scale_factor = vaeScale;
  if (!md.parameters || !md.tensor_parallel_plan)
    return fail("transformer class " + transformerClass +
                " declares no parameter table or tensor-parallel plan");
  RequestDims rd;
  rd.width = a.width;
  rd.height = a.height;
  rd.text_len = a.textLen;
  rd.true_cfg = s.cfg_degree == 2;  // the benchmark plays true CFG when cfg parallel is asked for
  rd.num_images = s.dp_degree;
  auto issues = validateDegrees(s);
  if (issues.empty()) issues = validateForModel(s, md);
  if (issues.empty()) issues = validateForRequest(s, md, rd);
  if (!issues.empty()) return fail("strategy refused: " + joinIssues(issues));

  // 2. Mesh and groups, as ditstudio-worker builds them.
  DeviceMesh mesh(s);
  auto worldG = mesh.world();
  TransformerParallelism par;
  if (s.tp_degree > 1) par.tp = mesh.group("tp");
  if (s.cpDegree() > 1) {
    ContextParallelOptions co{s.ring_degree, s.ulysses_degree, s.ulysses_anything, s.ring_anything};
    par.cp = std::make_shared<ContextParallel>(mesh.group("ring"), mesh.group("ulysses"),
                                               mesh.group("cp"), co);
  }
  std::shared_ptr<ProcessGroup> cfgG = s.cfg_degree == 2 ? mesh.group("cfg") : nullptr;
  c10::Device device(at::kCPU);
  if (s.device == "cuda")
    device = c10::Device(at::kCUDA, static_cast<c10::DeviceIndex>(std::max(0, mesh.deviceIndex())));
  else if (s.device != "cpu")
    return fail("--device must be cpu or cuda");

  // 3. Load (the transformer only).
  const int64_t tokH = a.height / (2 * vaeScale), tokW = a.width / (2 * vaeScale);
  const int64_t simg = tokH * tokW, stxt = a.textLen, B = a.batch;
  ::malloc_trim(0);
  const bool hwmReset = resetPeakResidentSet();
  resetDevicePeak(device);
  const int64_t rssBefore = static_cast<int64_t>(residentSetBytes());
  worldG->barrier()->wait();
  const auto tl0 = Clock::now();
  std::unique_ptr<DiffusionTransformer> model;
  int64_t weightBytes = 0;
  std::map<std::string, int64_t> storageBytes;  // this rank's transformer weights by storage
  {
    std::shared_ptr<WeightSource> w;
    if (!singleFile.empty()) {
      SafetensorsReader r(singleFile);
      w = WeightSource::fromLayout(
          componentLayout(r, inspectCheckpoint(singleFile).require("transformer", "--model")),
          dtype, device);
    } else {
      w = weightsDir.empty()
              ? WeightSource::random(a.seed + 1, dtype, device)
              : WeightSource::fromFolder(weightsDir, "diffusion_pytorch_model", dtype, device);
    }
    model = loadTransformer(transformerClass, configJson, configFile, *w, par);
    storageBytes =
        heldBytesByStorage(model->parameters(), static_cast<int64_t>(c10::elementSize(dtype)),
                           computeDTypeName(dtype));
    weightBytes = static_cast<int64_t>(w->bytesLoaded());
  }  // the source (and its file mappings) is released here
  deviceSync(device);
  const double loadRankS = std::chrono::duration<double>(Clock::now() - tl0).count();
  const int64_t rssAfterLoad = static_cast<int64_t>(residentSetBytes());
  const int64_t rssPeakLoad = static_cast<int64_t>(peakResidentSetBytes());
  const DeviceMem devLoad = deviceMemory(device);

  // 4. Steps.
  std::vector<double> myStepMs;
  ordered_json opProfile;
  int64_t bytesTimed = 0;
  const int steps = a.phase == "all" ? a.steps : 0;
  if (a.phase == "all") {
    // The family's own inputs for this shape (seeded, identical on every rank); the negative
    // text features on the second CFG half.
    const bool negHalf = cfgG && cfgG->rank() == 1;
    TransformerInputs inputs = runtime->exampleInputs(
        configJson, configFile, BenchShape{B, tokH, tokW, stxt}, a.seed + 2, negHalf);
    for (auto& [name, t] : inputs) t = t.to(device);
    const double trueCfgScale = 4.0;
    auto step = [&] {
      at::Tensor v = model->forward(inputs);
      if (cfgG) {  // as FluxPipeline: exchange the two predictions, combine
        at::Tensor both = cfgG->allgather(v.contiguous().unsqueeze(0), 0)->result();
        v = both[1] + trueCfgScale * (both[0] - both[1]);
      }
      return v;
    };
    for (int i = 0; i < a.warmup; ++i) step();
    deviceSync(device);
    worldG->barrier()->wait();
    const uint64_t b0 = mesh.bytesSent();
    for (int i = 0; i < steps; ++i) {
      worldG->barrier()->wait();
      const auto t0 = Clock::now();
      at::Tensor v = step();
      deviceSync(device);
      myStepMs.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    bytesTimed = static_cast<int64_t>(mesh.bytesSent() - b0);
    if (a.profile && steps > 0) {
      worldG->barrier()->wait();
      opProfile = profileOps([&] {
        at::Tensor v = step();
        deviceSync(device);
      });
    }
  }
  const DeviceMem devEnd = deviceMemory(device);

  // 5. Gather per-rank figures (after the timed region and the bytes measurement).
  const std::vector<int64_t> row{weightBytes,
                                 rssBefore,
                                 rssAfterLoad,
                                 rssPeakLoad,
                                 static_cast<int64_t>(residentSetBytes()),
                                 static_cast<int64_t>(peakResidentSetBytes()),
                                 devLoad.cur,
                                 devLoad.peak,
                                 devEnd.cur,
                                 devEnd.peak,
                                 bytesTimed,
                                 static_cast<int64_t>(loadRankS * 1e6)};
  at::Tensor all = worldG->allgather(at::tensor(row, at::kLong).unsqueeze(0), 0)->result();
  at::Tensor stepNs = at::empty({std::max(steps, 1)}, at::kLong).fill_(0);
  for (int i = 0; i < steps; ++i) stepNs[i] = static_cast<int64_t>(myStepMs[i] * 1e6);
  worldG->allreduce(stepNs, ReduceOp::Max)->wait();
  if (rank != 0) return 0;

  // 6. Report (rank 0).
  const uint64_t es = c10::elementSize(dtype);
  const ParameterTable& params = *md.parameters;  // the family's declared table and plan
  const ShardingPlan& plan = *md.tensor_parallel_plan;
  const ParamSplit ps = planParams(params, plan, s.tp_degree);
  std::vector<double> stepMs;
  for (int i = 0; i < steps; ++i) stepMs.push_back(stepNs[i].item<int64_t>() / 1e6);
  ordered_json j;
  j["benchmark"] = "ditstudio-bench: " + transformerClass + " load + forward";
  j["source"] = source;
  j["phase"] = a.phase;
  j["blas"] = ordered_json::parse(blasInfoJson(g_blas).dump());
  ordered_json mc;
  mc["family"] = family->display_name;
  mc["transformer_class"] = transformerClass;
  for (const auto& [k, v] : configJson.items())  // the config's own sizes, as declared
    if (!k.empty() && k[0] != '_' && (v.is_number() || v.is_boolean() || v.is_array()))
      mc[k] = ordered_json::parse(v.dump());
  mc["inner_dim"] = md.innerDim();
  mc["mlp_hidden_dim"] = md.mlp_hidden_dim;
  mc["parameters"] = ps.total;
  mc["parameters_tp_sharded"] = ps.sharded;
  mc["parameters_replicated"] = ps.replicated();
  j["config"] = mc;
  j["width"] = a.width;
  j["height"] = a.height;
  j["batch"] = B;
  j["image_tokens"] = simg;
  j["text_tokens"] = stxt;
  j["dtype"] = computeDTypeName(dtype);
  j["requested_dtype"] = a.dtype;
  if (!dtypeNote.empty()) j["dtype_note"] = dtypeNote;
  j["device"] = s.device;
  j["device_name"] = deviceName(device);
  j["torch_version"] = dit::torch_compat::kTorchVersion;
  j["blas_core"] = g_blas.core;  // also in j["blas"]
  ordered_json sj = ordered_json::parse(protocol::strategyToJson(s).dump());
  sj["describe"] = s.describe();
  sj["backend"] = mesh.backend();
  j["strategy"] = sj;
  double loadMax = 0;
  for (int r = 0; r < world; ++r) loadMax = std::max(loadMax, all[r][11].item<int64_t>() / 1e6);
  j["load_s"] = loadMax;
  j["load_s_note"] = "slowest rank, transformer only (open + read/generate + copy to device)";
  j["warmup_steps"] = steps ? a.warmup : 0;
  j["timed_steps"] = steps;
  // This rank's attention kernels (every rank runs the same code path on the same shapes).
  j["attention_kernels"] = dit::attentionKernelsUsed();
  // FLOPs of one step: FluxTransformer2DModel::flops per image, x batch, x cfg (both halves
  // predict), x dp (every replica works on its own image).
  const double flopsPerForward = model->forwardFlops(simg, stxt);
  const double stepFlops = flopsPerForward * B * s.cfg_degree * s.dp_degree;
  j["flops_per_forward"] = flopsPerForward;
  j["flops_per_step_total"] = stepFlops;
  if (steps > 0) {
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
    const double tot = stepFlops / (med / 1e3) / 1e12;
    j["achieved_tflops_total"] = tot;
    j["achieved_tflops_per_rank"] = tot / world;
    j["achieved_tflops_note"] = "flops_per_step_total / median step; per rank = total / world";
  } else {
    j["step_ms"] = nullptr;
    j["achieved_tflops_total"] = nullptr;
    j["achieved_tflops_per_rank"] = nullptr;
  }
  double peak = a.peakTflops;
  std::string peakSource = peak > 0 ? "--peak-tflops" : "";
  if (peak <= 0 && device.is_cuda() && dtype != at::kFloat) {
    const std::string n = deviceName(device);
    if (n.find("H100") != std::string::npos || n.find("H200") != std::string::npos) {
      peak = 989.0;
      peakSource = "default: H100/H200 SXM dense bf16/fp16";
    }
  }
  j["peak_tflops_per_rank"] = peak > 0 ? ordered_json(peak) : ordered_json(nullptr);
  j["peak_tflops_source"] = peak > 0 ? ordered_json(peakSource) : ordered_json(nullptr);
  if (peak > 0 && steps > 0)
    j["fraction_of_peak"] = j["achieved_tflops_per_rank"].get<double>() / peak;
  else
    j["fraction_of_peak"] = nullptr;

  // GEMM roofline (CPU): the best FLOP/s this BLAS reaches on the model's own projection shapes
  // ([S, C] x [C, C] and [S, C] x [C, mlp] in the compute dtype, this rank's threads), and the step
  // time the model's FLOPs would take at that rate. fraction = roofline / measured median step:
  // how close the whole step (attention, norms, RoPE, collectives included) comes to pure GEMM.
  if (!device.is_cuda() && steps > 0) {
    const int64_t S = simg + stxt, C = md.innerDim(), M = std::max(md.mlp_hidden_dim, 1);
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
    g["fraction_of_roofline"] = rooflineMs / median(stepMs);
    g["note"] =
        "best at::mm FLOP/s on the model's [S,C]x[C,C] and [S,C]x[C,mlp] shapes (this rank's "
        "threads, compute dtype); roofline = step FLOPs per rank at that rate; fraction = "
        "roofline / median step";
    j["gemm_roofline"] = g;
  }

  ordered_json ranks = ordered_json::array();
  uint64_t expectedWeightBytes = plan.bytesPerRank(params, s.tp_degree, static_cast<int64_t>(es));
  if (!singleFile.empty()) {
    // As held: a linear weight stored as an 8-bit float stays 1 byte per element (from the
    // file's header through its key layout, independently of the loader), the rest `es`.
    SafetensorsReader r(singleFile);
    const auto layout =
        componentLayout(r, inspectCheckpoint(singleFile).require("transformer", "--model"));
    ParameterTable held;
    for (ParameterInfo p : params) {
      auto it = layout->tensors.find(p.name);
      const DType d =
          it == layout->tensors.end() ? DType::F32 : r.info(it->second.segments.front().key).dtype;
      const bool f8 = (d == DType::F8_E4M3 || d == DType::F8_E5M2) && p.shape.size() == 2;
      p.elementBytes = f8 ? 1 : static_cast<int64_t>(es);
      held.add(p);
    }
    expectedWeightBytes = plan.bytesPerRank(held, s.tp_degree, 0);
  }
  for (int r = 0; r < world; ++r) {
    auto v = [&](int i) { return all[r][i].item<int64_t>(); };
    ordered_json rj;
    rj["rank"] = r;
    const auto co = meshCoords(s, r);
    rj["coords"] = {
        {"dp", co[0]}, {"cfg", co[1]}, {"ring", co[2]}, {"ulysses", co[3]}, {"tp", co[4]}};
    rj["weight_bytes"] = v(0);
    rj["expected_weight_bytes"] = expectedWeightBytes;
    if (r == 0) rj["weight_storage_bytes"] = storageBytes;
    rj["rss_before_load_bytes"] = v(1);
    rj["rss_after_load_bytes"] = v(2);
    rj["rss_peak_load_bytes"] = v(3);
    rj["rss_peak_load_growth_bytes"] = v(3) - v(1);
    rj["rss_bytes"] = v(4);
    rj["rss_peak_bytes"] = v(5);
    rj["dev_after_load_bytes"] = v(6);
    rj["dev_peak_load_bytes"] = v(7);
    rj["dev_bytes"] = v(8);
    rj["dev_peak_bytes"] = v(9);
    rj["load_s"] = v(11) / 1e6;
    if (steps > 0) {
      rj["bytes_sent_per_step"] = v(10) / steps;
      const CollectiveTraffic t =
          runtime->traffic(configJson, configFile, s, r, BenchShape{B, tokH, tokW, stxt}, es);
      rj["expected_bytes_per_step"] = t.total();
      rj["expected_bytes_per_step_breakdown"] = trafficJson(t);
    }
    ranks.push_back(rj);
  }
  j["ranks"] = ranks;
  if (!opProfile.is_null()) j["op_profile"] = opProfile;
  j["notes"] = {
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
      {"dev",
       "CUDA caching allocator allocated_bytes (aggregate), current and peak; 0 on cpu; peak reset "
       "before loading"},
      {"bytes_sent_per_step",
       "DeviceMesh::bytesSent() delta over the timed steps / steps: process-group payload "
       "accounting (allreduce = 2(n-1)/n x size), not measured on the wire"},
      {"expected_bytes_per_step",
       "closed form of what the strategy must send per step for the family's forward "
       "(FamilyRuntime::traffic, from its plans)"}};
  const std::string out = a.pretty ? j.dump(2) : j.dump();
  std::cout << out << std::endl;
  if (!a.jsonOut.empty()) {
    std::ofstream f(a.jsonOut);
    f << out << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Before MPI_Init: may re-execute with a better OpenBLAS kernel; reported in the JSON.
  g_blas = dit::ensureBlasKernel(argc, argv);
  tuneHostAllocator();
  initRuntime(argc, argv);
  CLI::App app{
      "Benchmark a diffusion transformer of any supported family (load + timed forwards) under a "
      "parallel strategy",
      "ditstudio-bench"};
  Args a;
  app.add_option("--model", a.model,
                 "diffusers model folder of any supported family (or its transformer folder), "
                 "or a single-file transformer / all-in-one checkpoint (FLUX.1: BFL, fp8, "
                 "ComfyUI scaled fp8): real weights");
  app.add_option("--config", a.config, "transformer config.json (with --random-weights)");
  app.add_flag("--random-weights", a.randomWeights,
               "random weights from the config alone (shards generated directly)");
  app.add_option("--width", a.width, "image width in pixels");
  app.add_option("--height", a.height, "image height in pixels");
  app.add_option("--text-len", a.textLen, "text tokens (the text encoder's sequence length)");
  app.add_option("--batch", a.batch, "images per forward");
  app.add_option("--steps", a.steps, "timed forwards");
  app.add_option("--warmup", a.warmup, "untimed forwards before timing");
  app.add_option("--dtype", a.dtype, "float32 | bfloat16 | float16");
  app.add_option("--device", a.s.device, "cpu | cuda");
  app.add_option("--seed", a.seed, "seed of the random weights and inputs");
  app.add_option("--phase", a.phase, "all (load + steps) | load (memory figures only)");
  app.add_option("--peak-tflops", a.peakTflops,
                 "device peak TFLOP/s per rank for fraction_of_peak");
  app.add_option("--json-out", a.jsonOut, "also write the JSON to this file");
  app.add_flag("--pretty", a.pretty, "indent the JSON");
  app.add_flag("--profile", a.profile,
               "after the timed steps, one more forward with per-operator timing (rank 0's "
               "ATen operators: calls, self and total ms, top 25 by self time) in \"op_profile\"");
  launcher::addStrategyOptions(app, a.s);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = worldRank() == 0 ? app.exit(e) : (e.get_exit_code() ? 2 : 0);
    finalizeRuntime();
    return rc;
  }
  const int rc = runOrAbort([&] { return runBench(a); });
  finalizeRuntime();
  return rc;
}
