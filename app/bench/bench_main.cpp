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

#include <ATen/ATen.h>
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/bench/bench.h"
#include "app/bench/bench_profile.h"
#include "app/common/blas_kernel.h"
#include "app/common/device_stats.h"
#include "app/common/generation.h"
#include "app/protocol/strategy_args.h"
#include "backend/family_runtime.h"
#include "backend/io/config_json.h"
#include "backend/io/model_folder.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_loader.h"
#include "backend/io/weight_source.h"
#include "backend/models/checkpoint_layouts.h"
#include "backend/models/family_registry.h"
#include "parallel/context_parallel.h"
#include "parallel/device_mesh.h"
#include "parallel/process_group.h"
#include "parallel/runtime.h"
#include "parallel/strategy.h"

using namespace dit;

namespace dit::bench {

using nlohmann::ordered_json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// ------------------------------------------------------------------ 1. the model definition
// `cls`: the class ModelFolder::open resolved; empty = the config's own "_class_name".
void readTransformerConfig(BenchModel& m, const std::string& file, std::string cls) {
  m.configFile = file;
  m.configJson = readConfigJson(file);
  if (cls.empty()) getConfigValue(m.configJson, "_class_name", cls, file);
  if (cls.empty())
    throw ModelFileError(file,
                         "no \"_class_name\" (the transformer class, e.g. FluxTransformer2DModel)");
  m.transformerClass = cls;
  m.family = &transformerFamily(cls, file);  // refuses an unregistered class
  m.runtime = &familyRuntime(m.family->pipeline_class, file);
  m.md = m.family->dims(m.configJson, file);
}

// --model FILE: hyper-parameters from the tensor shapes; --config (a transformer config.json) only
// supplies what the shapes cannot (e.g. FLUX.1's RoPE axes when the head dim is not 128).
void singleFileModel(BenchModel& m, const Args& a) {
  m.singleFile = a.model;
  const CheckpointInfo info = inspectCheckpoint(a.model);
  info.require("transformer", "--model");
  m.family = &checkpointFamily(info.family, a.model);
  if (!m.family->single_file_transformer_config)
    throw ModelFileError(a.model, m.family->refusal("single_file"));
  m.runtime = &familyRuntime(m.family->pipeline_class, a.model);
  m.configJson = m.family->single_file_transformer_config(a.model, a.config);
  m.configFile = a.model;
  m.transformerClass = m.family->transformer_class;
  m.md = m.family->dims(m.configJson, a.model);
  m.source = a.model;
}

// --model DIR: a diffusers model folder or a transformer folder itself.
void folderModel(BenchModel& m, const Args& a) {
  if (fs::exists(fs::path(a.model) / "model_index.json")) {
    ModelFolder f = ModelFolder::open(a.model);
    readTransformerConfig(m, f.component("transformer") + "/config.json", f.transformer_class);
    m.vaeScale = f.dims().vae_scale_factor;
    m.weightsDir = f.component("transformer");
  } else if (fs::exists(fs::path(a.model) / "config.json")) {  // a transformer folder itself
    readTransformerConfig(m, (fs::path(a.model) / "config.json").string(), "");
    m.weightsDir = a.model;
  } else {
    throw ModelFileError(a.model,
                         "neither a diffusers model folder (model_index.json) nor a "
                         "transformer folder (config.json)");
  }
  m.source = a.model;
}

// The transformer of --model or --config (configs only; every rank reaches the same verdict
// without a collective). Throws naming the file and the cause.
BenchModel defineModel(const Args& a) {
  BenchModel m;
  if (!a.model.empty() && fs::is_regular_file(a.model)) {
    singleFileModel(m, a);
    return m;
  }
  if (!a.model.empty() == (a.randomWeights || !a.config.empty()))
    throw std::invalid_argument(
        "give either --model DIR or --config transformer_config.json --random-weights");
  if (!a.model.empty()) {
    folderModel(m, a);
  } else {
    if (a.config.empty() || !a.randomWeights)
      throw std::invalid_argument("--config needs --random-weights (and vice versa)");
    readTransformerConfig(m, a.config, "");
    m.source = a.config + " (random weights)";
  }
  return m;
}

// The run's own limits: "" when they hold, else the refusal.
std::string checkRunArgs(const Args& a) {
  if (a.phase != "all" && a.phase != "load") return "--phase must be 'all' or 'load'";
  if (a.steps < 1 && a.phase == "all") return "--steps must be at least 1";
  if (a.warmup < 0 || a.batch < 1) return "--warmup must be >= 0 and --batch >= 1";
  return "";
}

// The strategy against the model and the benchmark's request: "" when accepted.
std::string strategyRefusal(const Args& a, const ModelDims& md) {
  const Strategy& s = a.s;
  RequestDims rd;
  rd.width = a.width;
  rd.height = a.height;
  rd.text_len = a.textLen;
  rd.true_cfg = s.cfg_degree == 2;  // the benchmark plays true CFG when cfg parallel is asked for
  rd.num_images = s.dp_degree;
  auto issues = validateDegrees(s);
  if (issues.empty()) issues = validateForModel(s, md);
  if (issues.empty()) issues = validateForRequest(s, md, rd);
  return issues.empty() ? "" : "strategy refused: " + joinIssues(issues);
}

// ------------------------------------------------------------------ 2. mesh and groups
// As ditstudio-worker builds them.
struct Groups {
  TransformerParallelism par;
  std::shared_ptr<ProcessGroup> cfg;  ///< null without cfg parallel
};
Groups makeGroups(DeviceMesh& mesh, const Strategy& s) {
  Groups g;
  if (s.tp_degree > 1) g.par.tp = mesh.group("tp");
  if (s.cpDegree() > 1) {
    ContextParallelOptions co{s.ring_degree, s.ulysses_degree, s.ulysses_anything, s.ring_anything};
    g.par.cp = std::make_shared<ContextParallel>(mesh.group("ring"), mesh.group("ulysses"),
                                                 mesh.group("cp"), co);
  }
  g.cfg = s.cfg_degree == 2 ? mesh.group("cfg") : nullptr;
  return g;
}

// ------------------------------------------------------------------ 3. load
struct Loaded {
  std::unique_ptr<DiffusionTransformer> model;
  int64_t weightBytes = 0;
  std::map<std::string, int64_t> storageBytes;  ///< this rank's transformer weights by storage
  double seconds = 0;
  int64_t rssBefore = 0, rssAfterLoad = 0, rssPeakLoad = 0;
  DeviceMem dev;
  bool hwmReset = false;
};
// The transformer only, with the memory figures around its load.
Loaded loadModel(const Args& a, const BenchModel& m, const TransformerParallelism& par,
                 ProcessGroup& world, at::ScalarType dtype, const c10::Device& device) {
  Loaded l;
  ::malloc_trim(0);
  l.hwmReset = resetPeakResidentSet();
  resetDevicePeak(device);
  l.rssBefore = static_cast<int64_t>(residentSetBytes());
  world.barrier()->wait();
  const auto tl0 = Clock::now();
  {
    std::shared_ptr<WeightSource> w;
    if (!m.singleFile.empty()) {
      SafetensorsReader r(m.singleFile);
      w = WeightSource::fromLayout(
          componentLayout(r, inspectCheckpoint(m.singleFile).require("transformer", "--model")),
          dtype, device);
    } else {
      w = m.weightsDir.empty()
              ? WeightSource::random(a.seed + 1, dtype, device)
              : WeightSource::fromFolder(m.weightsDir, "diffusion_pytorch_model", dtype, device);
    }
    l.model = loadTransformer(m.transformerClass, m.configJson, m.configFile, *w, par);
    l.storageBytes =
        heldBytesByStorage(l.model->parameters(), static_cast<int64_t>(c10::elementSize(dtype)),
                           computeDTypeName(dtype));
    l.weightBytes = static_cast<int64_t>(w->bytesLoaded());
  }  // the source (and its file mappings) is released here
  deviceSync(device);
  l.seconds = std::chrono::duration<double>(Clock::now() - tl0).count();
  l.rssAfterLoad = static_cast<int64_t>(residentSetBytes());
  l.rssPeakLoad = static_cast<int64_t>(peakResidentSetBytes());
  l.dev = deviceMemory(device);
  return l;
}

// ------------------------------------------------------------------ 4. steps
struct Timed {
  std::vector<double> stepMs;        ///< this rank's
  std::vector<double> deviceStepMs;  ///< CUDA: this rank's, between events around each step
  ordered_json opProfile;
  int64_t bytes = 0;  ///< sent over the timed steps
};
// `steps` timed steps after the warm-up (a.warmup), each after a barrier; --profile: one more.
Timed timeSteps(const Args& a, const BenchModel& m, const BenchShape& shape, int steps,
                DiffusionTransformer& model, const Groups& g, DeviceMesh& mesh, ProcessGroup& world,
                const c10::Device& device) {
  Timed t;
  // The family's own inputs for this shape (seeded, identical on every rank); the negative
  // text features on the second CFG half.
  const bool negHalf = g.cfg && g.cfg->rank() == 1;
  TransformerInputs inputs =
      m.runtime->exampleInputs(m.configJson, m.configFile, shape, a.seed + 2, negHalf);
  for (auto& [name, x] : inputs) x = x.to(device);
  const double trueCfgScale = 4.0;
  auto step = [&] {
    at::Tensor v = model.forward(inputs);
    if (g.cfg) {  // as FluxPipeline: exchange the two predictions, combine
      at::Tensor both = g.cfg->allgather(v.contiguous().unsqueeze(0), 0)->result();
      v = both[1] + trueCfgScale * (both[0] - both[1]);
    }
    return v;
  };
  for (int i = 0; i < a.warmup; ++i) step();
  deviceSync(device);
  world.barrier()->wait();
  const uint64_t b0 = mesh.bytesSent();
  // CUDA: events around each step on the current stream (no synchronisation inside the step;
  // the deviceSync after it only ends the host clock's interval).
  DeviceEventMarks marks(device);
  for (int i = 0; i < steps; ++i) {
    world.barrier()->wait();
    const auto t0 = Clock::now();
    marks.mark();
    at::Tensor v = step();
    marks.mark();
    deviceSync(device);
    t.stepMs.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  t.bytes = static_cast<int64_t>(mesh.bytesSent() - b0);
  const std::vector<double> iv = marks.intervalsMs();  // step, gap, step, gap, ...
  for (size_t i = 0; i < iv.size(); i += 2) t.deviceStepMs.push_back(iv[i]);
  if (a.profile && steps > 0) {
    world.barrier()->wait();
    t.opProfile = profileOps(
        [&] {
          at::Tensor v = step();
          deviceSync(device);
        },
        device);
  }
  return t;
}

// ------------------------------------------------------------------ 5. gather
// Every rank's figures (after the timed region and the bytes measurement) into r.rankRows, and
// on rank 0 the slowest rank's time of each step into r.stepMs. Collective.
void gatherFigures(BenchResults& r, const Loaded& l, const Timed& t, ProcessGroup& world) {
  const DeviceMem devEnd = deviceMemory(r.device);
  const std::vector<int64_t> row{l.weightBytes,
                                 l.rssBefore,
                                 l.rssAfterLoad,
                                 l.rssPeakLoad,
                                 static_cast<int64_t>(residentSetBytes()),
                                 static_cast<int64_t>(peakResidentSetBytes()),
                                 l.dev.cur,
                                 l.dev.peak,
                                 devEnd.cur,
                                 devEnd.peak,
                                 t.bytes,
                                 static_cast<int64_t>(l.seconds * 1e6)};
  r.rankRows = world.allgather(at::tensor(row, at::kLong).unsqueeze(0), 0)->result();
  at::Tensor stepNs = at::empty({std::max(r.steps, 1)}, at::kLong).fill_(0);
  for (int i = 0; i < r.steps; ++i) stepNs[i] = static_cast<int64_t>(t.stepMs[i] * 1e6);
  world.allreduce(stepNs, ReduceOp::Max)->wait();
  // CUDA: the device times of each step, the slowest rank's (every rank has the same device kind).
  const bool dev = r.device.is_cuda() && r.steps > 0;
  at::Tensor devNs = at::zeros({std::max(r.steps, 1)}, at::kLong);
  if (dev) {
    for (int i = 0; i < r.steps && i < static_cast<int>(t.deviceStepMs.size()); ++i)
      devNs[i] = static_cast<int64_t>(t.deviceStepMs[i] * 1e6);
    world.allreduce(devNs, ReduceOp::Max)->wait();
  }
  if (worldRank() != 0) return;
  for (int i = 0; i < r.steps; ++i) r.stepMs.push_back(stepNs[i].item<int64_t>() / 1e6);
  if (dev)
    for (int i = 0; i < r.steps; ++i) r.deviceStepMs.push_back(devNs[i].item<int64_t>() / 1e6);
}

// Rank 0: the JSON on stdout (and in --json-out).
void printReport(const Args& a, const ordered_json& j) {
  const std::string out = a.pretty ? j.dump(2) : j.dump();
  std::cout << out << std::endl;
  if (!a.jsonOut.empty()) {
    std::ofstream f(a.jsonOut);
    f << out << "\n";
  }
}

}  // namespace

// The benchmark, on every rank; returns the exit code (2: refused, with rank 0's
// {"error": ...} line on stdout).
int runBench(Args a, const BlasInfo& blas) {
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
  BenchModel m;
  try {
    m = defineModel(a);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  if (const std::string msg = checkRunArgs(a); !msg.empty()) return fail(msg);
  BenchResults r;
  try {
    const ComputeDType cd = resolveComputeDType(a.dtype, s.device);
    r.dtype = cd.dtype;
    r.dtypeNote = cd.note;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  m.md.vae_scale_factor = m.vaeScale;
  if (!m.md.parameters || !m.md.tensor_parallel_plan)
    return fail("transformer class " + m.transformerClass +
                " declares no parameter table or tensor-parallel plan");
  if (const std::string msg = strategyRefusal(a, m.md); !msg.empty()) return fail(msg);

  // 2. Mesh and groups, as ditstudio-worker builds them.
  DeviceMesh mesh(s);
  auto worldG = mesh.world();
  const Groups groups = makeGroups(mesh, s);
  if (s.device == "cuda")
    r.device =
        c10::Device(at::kCUDA, static_cast<c10::DeviceIndex>(std::max(0, mesh.deviceIndex())));
  else if (s.device != "cpu")
    return fail("--device must be cpu or cuda");
  r.meshBackend = mesh.backend();

  // 3. Load (the transformer only).
  r.shape = BenchShape{a.batch, a.height / (2 * m.vaeScale), a.width / (2 * m.vaeScale), a.textLen};
  const Loaded l = loadModel(a, m, groups.par, *worldG, r.dtype, r.device);
  r.storageBytes = l.storageBytes;
  r.hwmReset = l.hwmReset;

  // 4. Steps.
  r.steps = a.phase == "all" ? a.steps : 0;
  Timed t;
  if (a.phase == "all")
    t = timeSteps(a, m, r.shape, r.steps, *l.model, groups, mesh, *worldG, r.device);
  r.opProfile = t.opProfile;

  // 5. Gather per-rank figures (after the timed region and the bytes measurement).
  gatherFigures(r, l, t, *worldG);
  if (rank != 0) return 0;

  // 6. Report (rank 0).
  r.flopsPerForward = l.model->forwardFlops(r.shape.imageTokens(), r.shape.text_tokens);
  printReport(a, benchReport(a, m, r, blas));
  if (!r.opProfile.is_null()) std::cerr << "rank 0 " << profileSummary(r.opProfile) << std::flush;
  return 0;
}

}  // namespace dit::bench

int main(int argc, char** argv) {
  // Before MPI_Init: may re-execute with a better OpenBLAS kernel; reported in the JSON.
  const BlasInfo blas = dit::ensureBlasKernel(argc, argv);
  tuneHostAllocator();
  initRuntime(argc, argv);
  CLI::App app{
      "Benchmark a diffusion transformer of any supported family (load + timed forwards) under a "
      "parallel strategy",
      "ditstudio-bench"};
  bench::Args a;
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
               "ATen operators and profile scopes: calls, self and total ms, top 25 by self "
               "time) and the step broken into categories (gemm, attention, norm_modulation, "
               "rope, copy_layout, elementwise, collective, other; CUDA: also by device "
               "events) in \"op_profile\"; a readable table on stderr");
  protocol::addStrategyOptions(app, a.s);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = worldRank() == 0 ? app.exit(e) : (e.get_exit_code() ? 2 : 0);
    finalizeRuntime();
    return rc;
  }
  const int rc = runOrAbort([&] { return bench::runBench(a, blas); });
  finalizeRuntime();
  return rc;
}
