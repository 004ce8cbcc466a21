// ditstudio-server: the OpenAI Images API (and an AUTOMATIC1111 subset, DiT Studio's own
// endpoints and a page at /) over one or several worker groups. docs/server.md describes it.
//   ditstudio-server                              the embedded model, one rank, 127.0.0.1:8000
//   ditstudio-server --model DIR --tp-degree 2    one group of 2 ranks
//   ditstudio-server --pool np=1 --pool np=1      two 1-rank groups behind one queue
//   ditstudio-server --pool-file pool.json        groups from a file
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "app/protocol/run_options.h"
#include "app/protocol/strategy_args.h"
#include "app/server/http_server.h"
#include "app/server/pool.h"

using namespace dit;
namespace fs = std::filesystem;

namespace {

int stopPipe[2] = {-1, -1};

void onSignal(int) {
  const char c = 's';
  [[maybe_unused]] const ssize_t n = ::write(stopPipe[1], &c, 1);
}

std::string exeDir() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

// The embedded default model: $DITSTUDIO_MODEL_DIR, else <bin>/../share/ditstudio/models/tiny-flux
// (the build tree and the installed layout alike).
std::string defaultModel() {
  if (const char* env = std::getenv("DITSTUDIO_MODEL_DIR"); env && *env) return env;
  return fs::weakly_canonical(fs::path(exeDir()) / "../share/ditstudio/models/tiny-flux").string();
}

bool isLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string randomToken() {
  std::ifstream in("/dev/urandom", std::ios::binary);
  unsigned char b[24];
  if (!in.read(reinterpret_cast<char*>(b), sizeof b))
    throw std::runtime_error("cannot read /dev/urandom for a token");
  static const char hex[] = "0123456789abcdef";
  std::string t = "dit-";
  for (unsigned char c : b) {
    t += hex[c >> 4];
    t += hex[c & 15];
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "DiT Studio server: OpenAI Images API, AUTOMATIC1111 subset and a page over a pool "
      "of worker groups",
      "ditstudio-server"};
  server::ServerOptions so;
  server::GroupSpec g;
  std::vector<std::string> poolSpecs;
  std::string poolFile, imagesDir = "ditstudio-images", tokenFile;
  int groups = 1;
  std::size_t maxQueue = 16, maxBodyMb = 32;
  std::string config, vae, te, te2, tok, tok2;
  app.add_option("--host", so.host,
                 "address to listen on (default 127.0.0.1: this machine only; another address "
                 "needs a bearer token, generated and printed when --token is absent)")
      ->capture_default_str();
  app.add_option("--port", so.port, "TCP port (0: any free port, printed)")->capture_default_str();
  app.add_option("--token", so.token,
                 "bearer token clients must send (Authorization: Bearer TOKEN); also "
                 "$DITSTUDIO_SERVER_TOKEN");
  app.add_option("--token-file", tokenFile, "read the bearer token from this file");
  app.add_option("--cors-origin", so.cors_origins,
                 "allow cross-origin requests from this origin (repeatable; '*' = any); off by "
                 "default");
  app.add_option("--images-dir", imagesDir,
                 "folder the images are written to (created; nothing in it is overwritten)")
      ->capture_default_str();
  app.add_option("--lora-dir", so.lora_dir,
                 "folder of LoRA files requests may name (by file name); without it LoRAs are "
                 "refused");
  app.add_option("--max-queue", maxQueue, "requests waiting at most; more get 429")
      ->capture_default_str();
  app.add_option("--max-n", so.max_n, "images per request at most")->capture_default_str();
  app.add_option("--max-side", so.max_side, "width/height of requests and uploads at most")
      ->capture_default_str();
  app.add_option("--max-body-mb", maxBodyMb,
                 "request body size at most (MiB), counted while reading (chunked too): 413")
      ->capture_default_str();
  app.add_option("--max-json-depth", so.max_json_depth,
                 "JSON nesting of a request body at most (objects and arrays): 400")
      ->capture_default_str();
  app.add_option("--max-prompt-bytes", so.max_prompt_bytes,
                 "bytes of a prompt or negative prompt at most: 400 before anything is queued")
      ->capture_default_str();
  app.add_option("--request-timeout-s", so.request_timeout_s,
                 "seconds a whole request (request line, headers, body) may take to arrive: "
                 "408 or the connection closed")
      ->capture_default_str();
  app.add_option("--max-connections", so.max_connections,
                 "open connections at most (each has a thread of its own); more get 503")
      ->capture_default_str();
  app.add_option("--max-client-connections", so.max_client_connections,
                 "open connections from one client address at most; more get 503")
      ->capture_default_str();
  app.add_option("--max-event-streams", so.max_event_streams,
                 "open /v1/events streams at most (the page holds one per tab); more get 503")
      ->capture_default_str();
  app.add_option("--allowed-host", so.allowed_hosts,
                 "a name the Host header may carry (repeatable; '*' = any); default: localhost, "
                 "127.0.0.1, ::1 and --host (any when --host is 0.0.0.0 or ::)");
  app.add_option("--model", g.model,
                 "diffusers folder or single-file checkpoint (default: the embedded tiny model)");
  app.add_option("--config", config, "diffusers folder completing single-file checkpoints");
  app.add_option("--vae", vae, "VAE folder or file");
  app.add_option("--text-encoder", te, "CLIP-L text encoder folder or file");
  app.add_option("--text-encoder-2", te2, "T5 text encoder folder or file");
  app.add_option("--tokenizer", tok, "CLIP tokenizer folder");
  app.add_option("--tokenizer-2", tok2, "T5 tokenizer folder");
  app.add_option("--np", g.np, "ranks per group (default: the product of the degrees)");
  protocol::addStrategyOptions(app, g.strategy);
  app.add_option("--omp-threads", g.omp_threads, "OpenMP threads per rank")->capture_default_str();
  app.add_option("--device", g.device, "cpu | cuda")->capture_default_str();
  app.add_option("--dtype", g.dtype, "float32 | bfloat16 | float16")->capture_default_str();
  protocol::addRunOptions(app, g.run);
  app.add_option("--hostfile", g.hostfile, "mpirun hostfile (a group over several machines)");
  app.add_option("--network-interface", g.network_interface,
                 "with --hostfile: interfaces / subnets for the MPI traffic");
  app.add_option("--ssh-options", g.ssh_options,
                 "with --hostfile: ssh options for the pre-flight and mpirun (e.g. '-i KEY')");
  app.add_option("--port-range", g.port_range,
                 "with --hostfile: MIN-MAX, every TCP port the group listens on");
  bool noPreflight = false;
  app.add_flag("--no-preflight", noPreflight,
               "with --hostfile: skip the ssh check of the other hosts (worker, model files)");
  app.add_option("--groups", groups,
                 "start this many identical groups of the options above (one queue)")
      ->capture_default_str();
  app.add_option(
      "--pool", poolSpecs,
      "one group per use, key=value,... over the options above: name, model, np, tp, "
      "ring, ulysses, cfg, dp, threads, device, dtype, devices (CUDA_VISIBLE_DEVICES, "
      "'+'-separated), cpus (the CPUs mpirun starts on, '+'-separated), hostfile, vae_tiling, "
      "text_encoder_placement, prompt_cache; e.g. --pool "
      "np=2,tp=2,devices=0+1 --pool "
      "np=2,tp=2,devices=2+3");
  bool plan = false;
  server::GroupPlanSettings planSettings;
  app.add_flag("--plan", plan,
               "let the placement planner choose each group's degrees and text-encoder placement "
               "for its ranks (--np), device and dtype, and print the plan (docs/planner.md)");
  app.add_option("--plan-memory", planSettings.memory,
                 "with --plan: memory per rank (80G, 24GiB, bytes); default on CPU: this host's "
                 "MemAvailable / ranks; CUDA groups need it");
  app.add_option("--plan-usable", planSettings.usable,
                 "with --plan: share of each rank's memory a plan may fill, (0, 1]")
      ->capture_default_str();
  app.add_option("--pool-file", poolFile,
                 "JSON {\"groups\": [{\"name\", \"model\", \"np\", \"tp_degree\", ...}]}");
  CLI11_PARSE(app, argc, argv);

  try {
    g.preflight = !noPreflight;
    if (g.model.empty()) g.model = defaultModel();
    auto add = [&](const char* flag, const std::string& v) {
      if (!v.empty()) {
        g.model_args.push_back(flag);
        g.model_args.push_back(v);
      }
    };
    add("--config", config);
    add("--vae", vae);
    add("--text-encoder", te);
    add("--text-encoder-2", te2);
    add("--tokenizer", tok);
    add("--tokenizer-2", tok2);
    std::vector<server::GroupSpec> specs;
    if (!poolFile.empty()) specs = server::parsePoolFile(poolFile, g);
    for (const std::string& s : poolSpecs) specs.push_back(server::parseGroupSpec(s, g));
    if (specs.empty()) {
      if (groups < 1 || groups > 256) throw std::invalid_argument("--groups must be in 1 .. 256");
      specs.assign(static_cast<size_t>(groups), g);
    }
    for (auto& s : specs)
      if (s.model.empty()) s.model = defaultModel();
    if (plan) {
      // CPU groups on this host share its MemAvailable.
      for (const server::GroupSpec& s : specs)
        if (s.device == "cpu" && s.hostfile.empty()) planSettings.host_ranks += std::max(1, s.np);
    }
    if (plan)
      for (size_t i = 0; i < specs.size(); ++i) {
        server::GroupSpec& s = specs[i];
        if (s.name.empty()) s.name = "g" + std::to_string(i);  // the pool's own default name
        const std::string text = server::planGroup(s, planSettings);
        std::istringstream lines(text);
        for (std::string line; std::getline(lines, line);)
          std::cerr << "group " << s.name << ": plan: " << line << std::endl;
      }

    if (so.token.empty() && !tokenFile.empty()) {
      std::ifstream in(tokenFile);
      if (!in || !std::getline(in, so.token) || so.token.empty())
        throw std::invalid_argument("--token-file " + tokenFile + " holds no token");
    }
    if (so.token.empty())
      if (const char* env = std::getenv("DITSTUDIO_SERVER_TOKEN"); env && *env) so.token = env;
    if (!isLoopback(so.host) && so.token.empty()) {
      so.token = randomToken();
      std::cout << "bearer token (generated; --host " << so.host
                << " is not loopback): " << so.token << std::endl;
    }
    if (so.max_n < 1 || so.max_n > protocol::kMaxImages)
      throw std::invalid_argument("--max-n must be in 1 .. 10000");
    if (so.max_side < 16 || so.max_side > protocol::kMaxSide)
      throw std::invalid_argument("--max-side must be in 16 .. 16384");
    if (maxQueue < 1) throw std::invalid_argument("--max-queue must be at least 1");
    if (maxBodyMb < 1 || maxBodyMb > 4096)
      throw std::invalid_argument("--max-body-mb must be in 1 .. 4096");
    if (so.max_json_depth < 2 || so.max_json_depth > 64)
      throw std::invalid_argument("--max-json-depth must be in 2 .. 64");
    if (so.max_prompt_bytes < 1 || so.max_prompt_bytes > protocol::kMaxRequestLineBytes / 2)
      throw std::invalid_argument("--max-prompt-bytes must be in 1 .. 8388608");
    if (so.request_timeout_s < 1 || so.request_timeout_s > 3600)
      throw std::invalid_argument("--request-timeout-s must be in 1 .. 3600");
    if (so.max_connections < 1 || so.max_connections > 100000)
      throw std::invalid_argument("--max-connections must be in 1 .. 100000");
    if (so.max_client_connections < 1)
      throw std::invalid_argument("--max-client-connections must be at least 1");
    if (so.max_event_streams < 1)
      throw std::invalid_argument("--max-event-streams must be at least 1");
    so.max_body_bytes = maxBodyMb << 20;

    server::PoolOptions po;
    po.images_dir = imagesDir;
    po.exe_dir = exeDir();
    po.max_queue = maxQueue;
    // The hostfile plan, each host's pre-flight and a remote rank found stopped: on stderr.
    po.log = [](const std::string& line) { std::cerr << line << std::endl; };
    server::Pool pool(specs, po);
    server::HttpServer http(pool, so);
    const int port = http.bind();  // before the groups start: a taken port fails fast

    // Throws naming the group for a strategy or hostfile it refuses, and a host that failed its
    // pre-flight (the host and the file that differs), before any group loads.
    pool.start();
    if (::pipe(stopPipe) != 0) throw std::runtime_error("pipe failed");
    struct sigaction sa {};
    sa.sa_handler = onSignal;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    std::thread stopper([&] {
      char c = 0;
      while (::read(stopPipe[0], &c, 1) < 0 && errno == EINTR) {
      }
      if (c == 's') http.stop();
    });

    for (const auto& s : specs)
      std::cerr << "group " << (s.name.empty() ? "(auto)" : s.name) << ": " << s.model
                << (s.np ? ", np " + std::to_string(s.np) : "") << std::endl;
    std::cout << "listening on http://"
              << (so.host.find(':') != std::string::npos ? "[" + so.host + "]" : so.host) << ":"
              << port << " (images in " << pool.imagesDir() << ")" << std::endl;
    http.listen();
    std::cerr << "stopping the groups" << std::endl;
    pool.stop();
    const char q = 'q';
    [[maybe_unused]] const ssize_t n = ::write(stopPipe[1], &q, 1);
    stopper.join();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 2;
  }
}
