// ditstudio-cli: headless generation. One rank runs in-process; --np N (or any degree > 1)
// launches `mpirun -np N ditstudio-worker` and drives it with the worker protocol
// (app/PROTOCOL.md). `ditstudio-cli bench` prints per-stage timings and peak memory as JSON.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <regex>
#include <nlohmann/json.hpp>

#include "app/generation.h"
#include "backend/flux_pipeline.h"
#include "backend/model_config.h"
#include "backend/tensor_io.h"
#include "parallel/runtime.h"
#include "parallel/strategy.h"

using namespace dit;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct CliOptions {
  std::string model, prompt = "a photo of a cat", negative, output = "ditstudio-output.png",
                     outputTensors, dtype = "float32", device = "cpu", hostfile;
  double trueCfg = 1.0, guidance = 3.5;
  int width = 0, height = 0, steps = 0, maxSeq = 0, numImages = 1, np = 0, ompThreads = 0;
  int64_t seed = 0;
  Strategy strategy;
  bool jsonEvents = false;
  std::vector<std::string> prompts;
};

std::string exeDir() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

json requestJson(const CliOptions& o) {
  json r{{"type", "generate"},
         {"id", "cli"},
         {"prompt", o.prompt},
         {"negative_prompt", o.negative},
         {"true_cfg_scale", o.trueCfg},
         {"width", o.width},
         {"height", o.height},
         {"steps", o.steps},
         {"guidance", o.guidance},
         {"seed", o.seed},
         {"num_images", o.numImages},
         {"max_sequence_length", o.maxSeq},
         {"output", fs::absolute(o.output).string()},
         {"preview_every", 0}};
  if (!o.outputTensors.empty()) r["output_tensors"] = fs::absolute(o.outputTensors).string();
  if (!o.prompts.empty()) r["prompts"] = o.prompts;
  return r;
}

// One rank, in this process.
int runLocal(const CliOptions& o) {
  auto model = ModelFolder::open(o.model);
  PipelineOptions po;
  po.dtype = parseComputeDType(o.dtype);
  po.device = o.device;
  spdlog::info("loading {} ({}, {})", o.model, o.dtype, o.device);
  auto t0 = std::chrono::steady_clock::now();
  FluxPipeline pipe(model, po);
  spdlog::info("loaded in {:.2f} s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const int n = o.prompts.empty() ? o.numImages : static_cast<int>(o.prompts.size());
  for (int i = 0; i < n; ++i) {
    GenerationParams p = paramsFromJson(requestJson(o));
    if (!o.prompts.empty()) p.prompt = o.prompts[i];
    if (p.seed < 0) p.seed = randomSeed();
    else if (o.prompts.empty()) p.seed += i;
    PipelineCallbacks cb;
    cb.onStep = [&](int step, int steps, const at::Tensor&, const at::Tensor&, double ms) {
      spdlog::info("image {}/{} step {}/{} ({:.1f} ms)", i + 1, n, step, steps, ms);
      return true;
    };
    auto res = pipe.generate(p, cb);
    const std::string out = indexedPath(o.output, i, n);
    writeImagePng(out, res, json{{"model", o.model}, {"strategy", "1 rank"}, {"dtype", o.dtype}});
    if (!o.outputTensors.empty()) writeResultTensors(indexedPath(o.outputTensors, i, n), res);
    std::cout << "wrote " << out << " (seed " << res.params.seed << ", " << res.params.width << "x"
              << res.params.height << ", " << res.params.steps << " steps)" << std::endl;
  }
  return 0;
}

// Several ranks: mpirun + ditstudio-worker, request written to its stdin.
int runMpi(const CliOptions& o) {
  const char* mpirunEnv = std::getenv("DITSTUDIO_MPIRUN");
  std::vector<std::string> args{mpirunEnv && *mpirunEnv ? mpirunEnv : "mpirun", "--allow-run-as-root",
                                "--oversubscribe", "-np", std::to_string(o.np)};
  if (!o.hostfile.empty()) args.insert(args.end(), {"--hostfile", o.hostfile});
  const int threads = o.ompThreads > 0 ? o.ompThreads : 1;
  args.insert(args.end(), {"-x", "OMP_NUM_THREADS=" + std::to_string(threads)});
  const auto& s = o.strategy;
  args.insert(args.end(), {exeDir() + "/ditstudio-worker", "--model", o.model, "--dtype", o.dtype,
                           "--device", o.device, "--tp-degree", std::to_string(s.tp_degree),
                           "--ring-degree", std::to_string(s.ring_degree), "--ulysses-degree",
                           std::to_string(s.ulysses_degree), "--cfg-degree",
                           std::to_string(s.cfg_degree), "--dp-degree", std::to_string(s.dp_degree)});
  if (s.ulysses_anything) args.push_back("--ulysses-anything");
  if (s.ring_anything) args.push_back("--ring-anything");

  int toChild[2], fromChild[2];
  if (pipe(toChild) != 0 || pipe(fromChild) != 0) throw std::runtime_error("pipe() failed");
  pid_t pid = fork();
  if (pid == 0) {
    dup2(toChild[0], 0);
    dup2(fromChild[1], 1);
    dup2(fromChild[1], 2);  // mpirun's own messages too: they name ranks that died
    close(toChild[1]);
    close(fromChild[0]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::perror("exec mpirun");
    _exit(127);
  }
  close(toChild[0]);
  close(fromChild[1]);
  // Ctrl-C / SIGTERM on the CLI ends the process group too (mpirun forwards it to every rank).
  static pid_t child = 0;
  child = pid;
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    if (child > 0) ::kill(child, sig);
  };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a group that dies before reading stdin must not kill the CLI silently
  std::string req = requestJson(o).dump() + "\n" + json{{"type", "shutdown"}}.dump() + "\n";
  if (write(toChild[1], req.data(), req.size()) != static_cast<ssize_t>(req.size()))
    spdlog::warn("could not write the whole request to the worker");
  close(toChild[1]);
  FILE* in = fdopen(fromChild[0], "r");
  char* line = nullptr;
  size_t cap = 0;
  int images = 0;
  bool fatal = false;
  std::string firstError, deadRank, deadHow;
  while (getline(&line, &cap, in) > 0) {
    std::string l(line);
    // stdout and stderr share this pipe, and mpirun forwards them separately: OpenMPI 5 can put
    // an event line in the middle of a rank's stderr line ("...: da@@DIT {...}\n"). The text
    // before the marker is log output; the event runs from the marker to the end of the line.
    if (const size_t at = l.find("@@DIT "); at != std::string::npos && at > 0) {
      std::cerr << l.substr(0, at) << '\n';
      l.erase(0, at);
    }
    if (l.rfind("@@DIT ", 0) != 0) {
      std::cerr << l;
      // OpenMPI's reports of a rank that died: "Process name: [[job,1],R]" (OpenMPI 4) or
      // "[prterun-host-pid@1,R]" (OpenMPI 5) + "Exit code: N", or
      // "mpirun noticed that process rank R with PID P on node H exited on signal S (...)".
      std::smatch m;
      static const std::regex procName(R"(Process name:\s*\[(?:\[\d+,\d+\]|[^\]\s@]+@\d+),(\d+)\])");
      static const std::regex exitCode(R"(Exit code:\s*(\d+))");
      static const std::regex noticed(R"(process rank (\d+) with PID (\d+) on node (\S+) exited on signal (\d+)(.*))");
      if (std::regex_search(l, m, procName)) deadRank = m[1];
      else if (std::regex_search(l, m, exitCode)) deadHow = "exited with code " + m[1].str();
      else if (std::regex_search(l, m, noticed)) {
        deadRank = m[1];
        std::string detail = m[5].str();
        while (!detail.empty() && (detail.back() == '.' || std::isspace(static_cast<unsigned char>(detail.back()))))
          detail.pop_back();
        deadHow = "was killed by signal " + m[4].str() + detail;
      }
      continue;
    }
    json ev;
    try {
      ev = json::parse(l.substr(6));
    } catch (...) {
      continue;
    }
    if (o.jsonEvents) std::cout << ev.dump() << std::endl;
    const std::string e = ev.value("event", "");
    if (e == "ready") {
      spdlog::info("process group ready: {} ranks, {} (loaded in {:.2f} s)", ev.value("world", 0),
                   ev["strategy"].dump(), ev.value("load_seconds", 0.0));
    } else if (e == "progress") {
      spdlog::info("image {} step {}/{} ({:.1f} ms)", ev.value("image_index", 0), ev.value("step", 0),
                   ev.value("steps", 0), ev.value("step_ms", 0.0));
    } else if (e == "image") {
      ++images;
      if (!o.jsonEvents)
        std::cout << "wrote " << ev.value("path", "") << " (seed " << ev.value("seed", 0) << ")" << std::endl;
    } else if (e == "error") {
      const std::string msg = "rank " + ev["rank"].dump() + ": " + ev.value("message", "");
      if (firstError.empty()) firstError = msg;
      fatal = fatal || ev.value("fatal", false);
      std::cerr << "error: " << msg << std::endl;
    }
  }
  free(line);
  fclose(in);
  int status = 0;
  waitpid(pid, &status, 0);
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (!firstError.empty()) return rc ? rc : 1;
  if (rc != 0 && !deadRank.empty()) {
    std::cerr << "error: rank " << deadRank << " " << (deadHow.empty() ? "died" : deadHow)
              << " without reporting an error; mpirun ended the process group" << std::endl;
    return rc;
  }
  if (rc != 0) {
    std::cerr << "error: the process group exited with status " << rc << std::endl;
    return rc;
  }
  const int expected = o.prompts.empty() ? o.numImages : static_cast<int>(o.prompts.size());
  if (images < expected) {
    std::cerr << "error: expected " << expected << " images, got " << images << std::endl;
    return 1;
  }
  return 0;
}

// Benchmark of the whole pipeline on one rank: JSON with each stage's time and peak RSS.
int runBench(const CliOptions& o, int warmup) {
  auto model = ModelFolder::open(o.model);
  PipelineOptions po;
  po.dtype = parseComputeDType(o.dtype);
  po.device = o.device;
  auto t0 = std::chrono::steady_clock::now();
  FluxPipeline pipe(model, po);
  const double loadS = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  GenerationParams p = paramsFromJson(requestJson(o));
  for (int i = 0; i < warmup; ++i) pipe.generate(p);
  auto res = pipe.generate(p);
  json steps = json::array();
  for (int i = 1; i <= res.steps_done; ++i) steps.push_back(res.timings_ms["step." + std::to_string(i)]);
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
  std::cout << out.dump(2) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tuneHostAllocator();
  spdlog::set_default_logger(spdlog::stderr_color_mt("cli"));
  spdlog::set_pattern("[%H:%M:%S] [cli] %v");
  CLI::App app{"DiT Studio headless generation (FLUX.1, one or many ranks)", "ditstudio-cli"};
  CliOptions o;
  int warmup = 0;
  auto addGen = [&](CLI::App* a) {
    a->add_option("--model", o.model, "diffusers FLUX.1 folder (default: the embedded tiny model)");
    a->add_option("--prompt", o.prompt, "prompt");
    a->add_option("--negative-prompt", o.negative, "negative prompt (true CFG when --true-cfg-scale > 1)");
    a->add_option("--true-cfg-scale", o.trueCfg, "true CFG scale")->check(CLI::PositiveNumber);
    a->add_option("--width", o.width, "width in pixels (multiple of 2 x vae_scale_factor; default 128 x vae_scale_factor)");
    a->add_option("--height", o.height, "height in pixels");
    a->add_option("--steps", o.steps, "denoising steps (default 28)");
    a->add_option("--guidance", o.guidance, "distilled guidance scale (guidance_embeds models)");
    a->add_option("--seed", o.seed, "seed of the CPU noise generator (-1: random)");
    a->add_option("--max-sequence-length", o.maxSeq, "T5 tokens (default from tokenizer_2, at most 512)");
    a->add_option("--dtype", o.dtype, "float32 | bfloat16 | float16");
    a->add_option("--device", o.device, "cpu | cuda");
    a->add_option("--output", o.output, "output PNG (with data parallel / several images: FILE-i.png)");
    a->add_option("--output-tensors", o.outputTensors, "safetensors with image, initial_latents, final_latents");
    a->add_option("--num-images", o.numImages, "images per request")->check(CLI::PositiveNumber);
    a->add_option("--prompts", o.prompts, "several prompts (split across data-parallel replicas)");
    a->add_option("--omp-threads", o.ompThreads, "OpenMP threads per rank (mpirun; default 1)");
  };
  addGen(&app);
  app.add_option("--np", o.np, "number of ranks (mpirun -np); default: product of the degrees");
  app.add_option("--tp-degree", o.strategy.tp_degree, "tensor parallel degree");
  app.add_option("--ring-degree", o.strategy.ring_degree, "ring attention degree");
  app.add_option("--ulysses-degree", o.strategy.ulysses_degree, "Ulysses attention degree");
  app.add_flag("--ulysses-anything", o.strategy.ulysses_anything, "Ulysses with uneven sequence/heads");
  app.add_flag("--ring-anything", o.strategy.ring_anything, "ring attention with uneven sequence");
  app.add_option("--cfg-degree", o.strategy.cfg_degree, "CFG parallel degree (1 or 2)");
  app.add_option("--dp-degree", o.strategy.dp_degree, "data parallel replicas");
  app.add_option("--hostfile", o.hostfile, "mpirun hostfile for several machines");
  app.add_flag("--json", o.jsonEvents, "print the worker's events as JSON lines");
  auto* bench = app.add_subcommand("bench", "time each stage (tokenize, encode, each step, decode) and peak memory; prints JSON");
  addGen(bench);
  bench->add_option("--warmup", warmup, "untimed runs first");
  CLI11_PARSE(app, argc, argv);
  try {
    if (o.model.empty()) o.model = defaultModelDir();
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
      throw std::invalid_argument("float16 is not supported on the CPU; use float32 or bfloat16 (float16 on GPUs)");
    if (o.np == 1 && o.hostfile.empty()) return runLocal(o);
    // Refuse an impossible strategy before anything starts (configs only, no weights read).
    const auto model = ModelFolder::open(o.model);
    const int n = o.prompts.empty() ? o.numImages : static_cast<int>(o.prompts.size());
    if (auto msg = validateStrategyForRequest(s, model, paramsFromJson(requestJson(o)), n); !msg.empty())
      throw std::invalid_argument("strategy refused: " + msg);
    return runMpi(o);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 2;
  }
}
