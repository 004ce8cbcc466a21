// dit_protocol (app/protocol/): request and event round trips, exact 64-bit seeds, field errors,
// Strategy JSON, worker argv from a Strategy, the mpirun command line and mpirun failure parsing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/launcher/launch.h"
#include "app/protocol/events.h"
#include "app/protocol/file_fingerprint.h"
#include "app/protocol/protocol.h"
#include "app/protocol/run_options.h"
#include "app/protocol/strategy_args.h"
#include "strategy_util.h"

using namespace dit;
using namespace dit::protocol;
using namespace dit::launcher;
using nlohmann::json;

namespace {

// The message of the ProtocolError thrown by `fn`, with its field checked.
template <class F>
std::string errorOf(F&& fn, const std::string& field) {
  try {
    fn();
  } catch (const ProtocolError& e) {
    EXPECT_EQ(e.field(), field) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no ProtocolError (field " << field << ")";
  return {};
}

using dit::test::strat;

}  // namespace

TEST(Protocol, DefaultsAreTheOneSet) {
  const GenerationParams p;
  EXPECT_EQ(p.prompt, kDefaultPrompt);
  EXPECT_EQ(p.width, 0);
  EXPECT_EQ(p.height, 0);
  EXPECT_EQ(p.steps, 0);
  EXPECT_EQ(p.seed, 42u);
  EXPECT_FALSE(p.random_seed);
  EXPECT_EQ(p.num_images, 1);
  EXPECT_DOUBLE_EQ(p.guidance, 3.5);
  // A request without parameters carries exactly these defaults.
  const auto r = std::get<GenerateRequest>(parseRequestLine(R"({"type":"generate","id":"a"})"));
  EXPECT_EQ(r.params, p);
  EXPECT_EQ(r.imageCount(), 1);
}

TEST(Protocol, GenerateRoundTrip) {
  GenerateRequest g;
  g.id = "r1";
  g.params.prompt = "café 日本";
  g.params.negative_prompt = "blurry";
  g.params.options["true_cfg_scale"] = 4.5;
  g.params.width = 96;
  g.params.height = 64;
  g.params.steps = 7;
  g.params.guidance = 2.25;
  g.params.seed = 123;
  g.params.max_sequence_length = 48;
  g.output = "/tmp/a b/x.png";
  g.output_dir = "/tmp/out";
  g.output_tensors = "/tmp/t.safetensors";
  g.preview_every = 2;
  g.prompts = {"one", "two", "three"};
  g.params.num_images = 3;
  const std::string line = requestLine(g);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const Request back = parseRequestLine(line + "\r\n");
  EXPECT_EQ(requestType(back), "generate");
  EXPECT_EQ(std::get<GenerateRequest>(back), g);
  EXPECT_EQ(std::get<GenerateRequest>(back).imageCount(), 3);
  // The prompt list decides the image count.
  const auto j = json::parse(R"({"type":"generate","id":"x","num_images":5,"prompts":["a","b"]})");
  EXPECT_EQ(std::get<GenerateRequest>(parseRequest(j)).imageCount(), 2);
}

TEST(Protocol, CancelAndShutdownRoundTrip) {
  const Request c = CancelRequest{"r7"};
  EXPECT_EQ(requestLine(c), R"({"id":"r7","type":"cancel"})");
  EXPECT_EQ(std::get<CancelRequest>(parseRequestLine(requestLine(c))).id, "r7");
  const Request s = ShutdownRequest{};
  EXPECT_EQ(requestLine(s), R"({"type":"shutdown"})");
  EXPECT_TRUE(std::holds_alternative<ShutdownRequest>(parseRequestLine(requestLine(s))));
  const Request why = ShutdownRequest{"stdin closed"};
  EXPECT_EQ(std::get<ShutdownRequest>(parseRequestLine(requestLine(why))).reason, "stdin closed");
}

TEST(Protocol, SeedsAre64BitExact) {
  const std::uint64_t seeds[] = {0ULL, (1ULL << 53) + 1, 1ULL << 63,
                                 std::numeric_limits<std::uint64_t>::max()};
  for (std::uint64_t seed : seeds) {
    GenerateRequest g;
    g.id = "s";
    g.params.seed = seed;
    const std::string line = requestLine(g);
    EXPECT_NE(line.find("\"seed\":" + std::to_string(seed)), std::string::npos) << line;
    EXPECT_EQ(std::get<GenerateRequest>(parseRequestLine(line)).params.seed, seed) << line;
    // From literal text too (what another client may write).
    const auto r =
        parseRequestLine(R"({"type":"generate","id":"s","seed":)" + std::to_string(seed) + "}");
    EXPECT_EQ(std::get<GenerateRequest>(r).params.seed, seed);
    // And inside an event (image events report the seed used).
    const auto ev =
        parseEventLine(eventLine(json{{"event", "image"}, {"id", "s"}, {"seed", seed}}));
    ASSERT_TRUE(ev);
    EXPECT_EQ(ev->data["seed"].get<std::uint64_t>(), seed);
  }
  // Negative: random; the explicit seed is kept for the GUI.
  GenerationParams d;
  d.seed = 77;
  const GenerationParams r = paramsFromJson(json{{"seed", -1}}, d);
  EXPECT_TRUE(r.random_seed);
  EXPECT_EQ(r.seed, 77u);
  EXPECT_EQ(toJson(r)["seed"], -1);
  EXPECT_EQ(paramsFromJson(toJson(r), d), r);
  // A double never stands for a seed (2^53 + 1 is not representable).
  EXPECT_EQ(
      errorOf([] { parseRequestLine(R"({"type":"generate","id":"s","seed":9007199254740993.0})"); },
              "seed"),
      "request field 'seed' has the wrong type: 9.007199254740992e+15");
  // Past 2^64 - 1: nlohmann reads it as a double, refused the same way.
  errorOf([] { parseRequestLine(R"({"type":"generate","id":"s","seed":18446744073709551616})"); },
          "seed");
}

TEST(Protocol, MalformedRequestsNameTheField) {
  EXPECT_EQ(errorOf([] { parseRequestLine("42"); }, ""), "request must be a JSON object, got 42");
  EXPECT_EQ(errorOf([] { parseRequestLine("[1,2]"); }, ""),
            "request must be a JSON object, got [1,2]");
  EXPECT_EQ(
      errorOf([] { parseRequestLine("garbage"); }, "").rfind("request is not valid JSON: ", 0), 0u);
  // Invalid UTF-8 names the field and the byte offset inside its text (issue 11).
  EXPECT_EQ(
      errorOf([] { parseRequestLine("{\"type\":\"gen\xff\"}"); }, "type"),
      "request field 'type' is not valid UTF-8: invalid byte 0xff at byte offset 3 of its text");
  EXPECT_EQ(errorOf([] { parseRequestLine("{}"); }, "type"),
            "request needs a string \"type\" (generate, cancel or shutdown)");
  EXPECT_EQ(errorOf([] { parseRequestLine(R"({"type":5})"); }, "type"),
            "request needs a string \"type\" (generate, cancel or shutdown)");
  EXPECT_EQ(errorOf([] { parseRequestLine(R"({"type":"paint"})"); }, "type"),
            "unknown request type 'paint' (generate, cancel or shutdown)");
  EXPECT_EQ(errorOf([] { parseRequestLine(R"({"type":"cancel","id":5})"); }, "id"),
            "a cancel request needs a string \"id\"");
  EXPECT_EQ(errorOf([] { parseRequestLine(R"({"type":"generate"})"); }, "id"),
            "a generate request needs a string \"id\"");
  const std::pair<const char*, const char*> cases[] = {
      {R"("output_dir":5)", "output_dir"},
      {R"("preview_every":"a")", "preview_every"},
      {R"("prompts":[1,2])", "prompts"},
      {R"("prompts":"one")", "prompts"},
      {R"("width":"64")", "width"},
      {R"("steps":true)", "steps"},
      {R"("guidance":"3.5")", "guidance"},
      {R"("prompt":["a"])", "prompt"},
      {R"("options":null,"negative_prompt":1)", "negative_prompt"},
      {R"("seed":"42")", "seed"},
      {R"("output":{})", "output"},
      {R"("max_sequence_length":[])", "max_sequence_length"},
  };
  for (const auto& [fields, field] : cases) {
    const std::string line = std::string(R"({"type":"generate","id":"bad",)") + fields + "}";
    try {
      parseRequestLine(line);
      ADD_FAILURE() << "accepted " << line;
    } catch (const ProtocolError& e) {
      EXPECT_EQ(e.field(), field) << line;
      EXPECT_EQ(std::string(e.what()).rfind(
                    std::string("request field '") + field + "' has the wrong type: ", 0),
                0u)
          << e.what();
      ASSERT_TRUE(e.requestId());
      EXPECT_EQ(*e.requestId(), "bad");
    }
  }
  EXPECT_EQ(errorOf([] { parseRequestLine(R"({"type":"generate","id":"x","output_dir":5})"); },
                    "output_dir"),
            "request field 'output_dir' has the wrong type: 5");
  EXPECT_EQ(errorOf([] { parseRequestLine(R"({"type":"generate","id":"x","width":4294967360})"); },
                    "width"),
            "request field 'width' must be 0 (the model's default) or 1 .. 16384 pixels, got "
            "4294967360");
  EXPECT_EQ(errorOf([] { parseRequestLine(R"({"type":"generate","id":"x","num_images":0})"); },
                    "num_images"),
            "request field 'num_images' must be in 1 .. 10000, got 0");
  // null keeps the default.
  const auto r =
      std::get<GenerateRequest>(parseRequestLine(R"({"type":"generate","id":"n","steps":null})"));
  EXPECT_EQ(r.params.steps, 0);
}

TEST(Protocol, EveryEventTypeRoundTrips) {
  const json events[] = {
      {{"event", "hello"}, {"rank", 1}, {"world", 2}, {"pid", 4242}, {"host", "vm"}},
      {{"event", "ready"},
       {"world", 2},
       {"strategy", strategyToJson(strat(2, 1, 2, 1))},
       {"model",
        {{"path", "/m"},
         {"heads", 4},
         {"inner_dim", 64},
         {"layers", 1},
         {"single_layers", 2},
         {"vae_scale_factor", 2},
         {"default_steps", 28},
         {"guidance_embeds", true},
         {"max_sequence_length", 48}}},
       {"load_seconds", 0.5}},
      {{"event", "status"}, {"stage", "loading"}, {"message", "loading /m"}},
      {{"event", "ranks"},
       {"ranks", json::array({{{"rank", 0},
                               {"stage", "denoising"},
                               {"step", 2},
                               {"steps", 4},
                               {"rss", 1LL << 40},
                               {"rss_peak", 2},
                               {"dev", 3},
                               {"dev_peak", 4},
                               {"bytes_sent", 5},
                               {"step_ms", 1.5}}})}},
      {{"event", "accepted"}, {"id", "r1"}, {"queue_position", 0}},
      {{"event", "progress"},
       {"id", "r1"},
       {"step", 1},
       {"steps", 4},
       {"step_ms", 10.0},
       {"eta_s", 0.03},
       {"image_index", 0}},
      {{"event", "preview"},
       {"id", "r1"},
       {"step", 1},
       {"image_index", 0},
       {"png", "iVBORw0KGgo="}},
      {{"event", "image"},
       {"id", "r1"},
       {"image_index", 0},
       {"path", "/tmp/r1-0.png"},
       {"seed", std::numeric_limits<std::uint64_t>::max()},
       {"params", toJson(GenerationParams{})},
       {"seconds", 1.0}},
      {{"event", "done"}, {"id", "r1"}, {"seconds", 2.0}},
      {{"event", "cancelled"}, {"id", "r1"}, {"step", 3}},
      errorEvent(std::string("r1"), 1, "boom", false),
      errorEvent(std::nullopt, 0, "fatal", true),
      {{"event", "log"}, {"rank", 0}, {"level", "info"}, {"message", "café 日本"}},
      {{"event", "bye"}},
  };
  for (const json& e : events) {
    const std::string line = eventLine(e);
    EXPECT_EQ(line.rfind(kEventPrefix, 0), 0u);
    auto ev = parseEventLine(line);
    ASSERT_TRUE(ev) << line;
    EXPECT_EQ(ev->type, e["event"].get<std::string>());
    EXPECT_EQ(ev->data, e) << line;
    // OpenMPI --tag-output, leading blanks and CRLF.
    ev = parseEventLine("[1,0]<stdout>:" + line + "\r\n");
    ASSERT_TRUE(ev);
    EXPECT_EQ(ev->data, e);
    ev = parseEventLine("  " + line);
    ASSERT_TRUE(ev);
    EXPECT_EQ(ev->data, e);
  }
  const json err = errorEvent(std::nullopt, 3, "x", true);
  EXPECT_TRUE(err["id"].is_null());
  EXPECT_EQ(err["rank"], 3);
  EXPECT_EQ(err["fatal"], true);
  // Insertion order kept for ordered_json (abortGroup's documented line).
  nlohmann::ordered_json o;
  o["event"] = "error";
  o["id"] = nullptr;
  EXPECT_EQ(eventLine(o), "@@DIT {\"event\":\"error\",\"id\":null}");
  // Invalid UTF-8 is replaced, not thrown.
  EXPECT_NE(eventLine(json{{"event", "log"}, {"message", "bad \xff byte"}}).find("\xEF\xBF\xBD"),
            std::string::npos);
  // A "type" name is accepted as the event name.
  auto t = parseEventLine(R"(@@DIT {"type":"bye"})");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->type, "bye");
  // The ranks event's figures.
  const auto ranks = parseRanks(events[3]);
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(ranks[0].rss, 1LL << 40);
  EXPECT_EQ(ranks[0].stage, "denoising");
  EXPECT_DOUBLE_EQ(ranks[0].step_ms, 1.5);
  EXPECT_EQ(ranks[0].bytes_sent, 5);
}

TEST(Protocol, NoiseIsNotAnEvent) {
  const char* noise[] = {"",
                         "loading kernels",
                         "@@DIT",
                         "@@DIT ",
                         "@@DIT {",
                         "@@DIT [1,2]",
                         "@@DIT {\"x\":1}",
                         "@@DIT {\"event\":\"\"}",
                         "@@DIT {\"event\":5}",
                         "@@DITX {\"event\":\"bye\"}",
                         "xx @@DIT {\"event\":\"bye\"}",
                         "@@DIT {\"event\":\"bye\"} trailing"};
  for (const char* n : noise) EXPECT_FALSE(parseEventLine(n)) << n;
}

TEST(Protocol, EventInsideALine) {
  // A whole event line: offset 0, the --tag-output prefix included.
  auto f = findEventInLine("[1,0]<stdout>:@@DIT {\"event\":\"bye\"}\n");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->offset, 0u);
  EXPECT_EQ(f->event.type, "bye");
  // After a rank's log text (OpenMPI 5 puts a stdout event inside a stderr line).
  f = findEventInLine("[12:00:01] [rank 0/2] da@@DIT {\"event\":\"progress\",\"step\":2}");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->offset, std::string("[12:00:01] [rank 0/2] da").size());
  EXPECT_EQ(f->event.data["step"], 2);
  // A fatal error event cut by its own stderr copy (seen with OpenMPI 5.0.7: the stdout line is
  // read from its pty in two pieces, the stderr copy lands between them).
  const std::string whole =
      R"(@@DIT {"event":"error","id":null,"rank":1,"message":"/tmp/m/diffusion_pytorch_model.safetensors: tensor 'x_embedder.weight': data_offsets [1929024, 1933120) lie outside the data section","fatal":true})";
  const std::string cut = whole.substr(0, 60);
  f = findEventInLine(cut + whole);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->offset, 60u);
  EXPECT_EQ(f->event.type, "error");
  EXPECT_EQ(f->event.data["rank"], 1);
  EXPECT_EQ(f->event.data["fatal"], true);
  EXPECT_EQ(f->event.data["message"].get<std::string>().substr(0, 9), "/tmp/m/di");
  // The cut event's rest on the next line is not an event; neither is noise.
  EXPECT_FALSE(findEventInLine(whole.substr(60)));
  EXPECT_FALSE(findEventInLine("loading kernels"));
  EXPECT_FALSE(findEventInLine("@@DIT {\"event\":\"error\",\"rank\":1@@DIT {\"x\":1}"));
  // The first occurrence that parses wins (a complete event after a cut one, not its inner text).
  f = findEventInLine(
      "a@@DIT {\"event\":\"log\",\"message\":\"@@DIT {\\\"event\\\":\\\"bye\\\"}\"}");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->offset, 1u);
  EXPECT_EQ(f->event.type, "log");
}

TEST(Protocol, StrategyJson) {
  Strategy s = strat(16, 2, 1, 2, 2, 2);
  s.ulysses_anything = true;
  s.device = "cuda";
  const json j = s;  // ADL to_json
  EXPECT_EQ(j, strategyToJson(s));
  EXPECT_EQ(j["world"], 16);
  EXPECT_EQ(j["ulysses_anything"], true);
  const Strategy b = j.get<Strategy>();
  EXPECT_EQ(json(b), j);
  // world: given, an older spelling, or the product of the degrees.
  EXPECT_EQ(strategyFromJson(json{{"tp_degree", 2}, {"dp_degree", 3}}).world, 6);
  EXPECT_EQ(strategyFromJson(json{{"np", 4}, {"ring_degree", 4}}).world, 4);
  EXPECT_EQ(strategyFromJson(json{{"ranks", 3}}).world, 3);
  EXPECT_EQ(strategyFromJson(json{{"world", 5}, {"tp_degree", 2}}).world,
            5);  // kept, refused by validateDegrees
  EXPECT_EQ(strategyFromJson(json::object()).world, 1);
  EXPECT_EQ(strategyFromJson(json::object()).device, "cpu");
  EXPECT_EQ(errorOf(
                [] {
                  strategyFromJson(json{{"tp_degree", "2"}});
                },
                "tp_degree"),
            "strategy field 'tp_degree' has the wrong type: \"2\"");
  EXPECT_EQ(errorOf(
                [] {
                  strategyFromJson(json{{"ring_anything", 1}});
                },
                "ring_anything"),
            "strategy field 'ring_anything' has the wrong type: 1");
  EXPECT_EQ(errorOf(
                [] {
                  strategyFromJson(json{{"device", 0}});
                },
                "device"),
            "strategy field 'device' has the wrong type: 0");
  EXPECT_EQ(errorOf([] { strategyFromJson(json::array()); }, ""),
            "strategy must be a JSON object, got []");
}

TEST(Protocol, WorkerArgvFromStrategy) {
  Strategy s = strat(16, 2, 1, 2, 2, 2);
  s.ulysses_anything = true;
  s.device = "cuda";
  const std::vector<std::string> expected = {
      "--tp-degree",  "2", "--ring-degree", "1", "--ulysses-degree", "2",   "--ulysses-anything",
      "--cfg-degree", "2", "--dp-degree",   "2", "--device",         "cuda"};
  EXPECT_EQ(strategyArgs(s), expected);
  // Parsed back by the programs' option registration (+ --device).
  Strategy back;
  CLI::App app;
  addStrategyOptions(app, back);
  app.add_option("--device", back.device);
  std::vector<std::string> argv = strategyArgs(s);
  std::vector<const char*> cargv{"worker"};
  for (auto& a : argv) cargv.push_back(a.c_str());
  app.parse(static_cast<int>(cargv.size()), cargv.data());
  back.world = s.world;
  EXPECT_EQ(json(back), json(s));
  // Registering twice on one app is refused (one definition of the flags).
  EXPECT_THROW(addStrategyOptions(app, back), CLI::OptionAlreadyAdded);
}

// Issue 47: the group's run options, written by every launcher (CLI, server pool, GUI) and parsed
// back by the worker's registration: defaults leave the argv alone, a value outside a range is
// refused on both ends with the option named.
TEST(Protocol, RunOptionsRoundTrip) {
  EXPECT_TRUE(runOptionArgs(RunOptions{}).empty());
  RunOptions o;
  o.vae_tiling = 0;
  o.text_encoder_placement = "own-rank";
  o.prompt_cache = 8;
  const std::vector<std::string> expected = {
      "--vae-tiling", "0", "--text-encoder-placement", "own-rank", "--prompt-cache", "8"};
  EXPECT_EQ(runOptionArgs(o), expected);
  RunOptions back;
  CLI::App app;
  addRunOptions(app, back);
  std::vector<const char*> cargv{"worker"};
  for (const auto& a : expected) cargv.push_back(a.c_str());
  app.parse(static_cast<int>(cargv.size()), cargv.data());
  EXPECT_EQ(back, o);
  EXPECT_THROW(addRunOptions(app, back), CLI::OptionAlreadyAdded);
  // Refused by the parser and by the writer, naming the option.
  for (const std::vector<const char*>& bad :
       {std::vector<const char*>{"w", "--text-encoder-placement", "everywhere"},
        std::vector<const char*>{"w", "--vae-tiling", "-2"},
        std::vector<const char*>{"w", "--prompt-cache", "100001"}}) {
    RunOptions r;
    CLI::App a;
    addRunOptions(a, r);
    EXPECT_THROW(a.parse(static_cast<int>(bad.size()), bad.data()), CLI::ValidationError) << bad[1];
  }
  RunOptions wrong;
  wrong.text_encoder_placement = "everywhere";
  EXPECT_EQ(runOptionsIssue(wrong),
            "unknown text-encoder placement 'everywhere' (expected sharded, own-rank, "
            "host-streamed or once)");
  EXPECT_THROW(runOptionArgs(wrong), std::invalid_argument);
  wrong = RunOptions{};
  wrong.vae_tiling = -5;
  EXPECT_NE(runOptionsIssue(wrong).find("vae tiling -5 is out of range"), std::string::npos);
  wrong = RunOptions{};
  wrong.prompt_cache = -1;
  EXPECT_NE(runOptionsIssue(wrong).find("prompt cache -1 is out of range"), std::string::npos);
}

TEST(Protocol, ThreadPlacement) {
  ::unsetenv("DITSTUDIO_THREAD_PLACEMENT");
  using V = std::vector<std::string>;
  // ranks x threads <= cores: each rank its own `threads` cores, OpenMP threads one per core.
  EXPECT_EQ(threadPlacementArgs(2, 4, 8), (V{"--map-by", "slot:PE=4", "--bind-to", "core", "-x",
                                             "OMP_PROC_BIND=close", "-x", "OMP_PLACES=cores"}));
  EXPECT_EQ(threadPlacementArgs(1, 2, 2).at(1), "slot:PE=2");
  EXPECT_EQ(threadPlacementArgs(2, 1, 2).at(1), "slot:PE=1");
  // More threads than cores: unpinned (OpenMPI's default would stack a rank's threads on one core).
  EXPECT_EQ(threadPlacementArgs(2, 2, 2), (V{"--bind-to", "none"}));
  EXPECT_EQ(threadPlacementArgs(4, 1, 2), (V{"--bind-to", "none"}));
  EXPECT_THROW(threadPlacementArgs(0, 1, 2), std::invalid_argument);
  EXPECT_THROW(threadPlacementArgs(1, 0, 2), std::invalid_argument);
  EXPECT_THROW(threadPlacementArgs(1, 1, 0), std::invalid_argument);
  ::setenv("DITSTUDIO_THREAD_PLACEMENT", "0", 1);
  EXPECT_TRUE(threadPlacementArgs(2, 1, 8).empty());
  ::unsetenv("DITSTUDIO_THREAD_PLACEMENT");
  // This process's cores: at least 1, at most the CPUs it may run on.
  const int cores = availableCores();
  EXPECT_GE(cores, 1);
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_LE(cores, CPU_COUNT(&set));
}

TEST(Protocol, MpirunCommandLine) {
  ::unsetenv("DITSTUDIO_MPIRUN");
  MpirunLaunch l;
  l.strategy = strat(2, 1, 2, 1);
  l.worker = "/opt/ditstudio/bin/ditstudio-worker";
  l.model = "/models/tiny-flux";
  l.cores = 4;  // 2 ranks x 1 thread fit: pinned, one core per rank
  ::unsetenv("DITSTUDIO_THREAD_PLACEMENT");
  std::vector<std::string> expected = {"mpirun",
                                       "--allow-run-as-root",
                                       "--oversubscribe",
                                       "-np",
                                       "2",
                                       "--mca",
                                       "pml",
                                       "ob1",
                                       "--mca",
                                       "btl",
                                       "^tcp,ofi,openib,usnic,uct",
                                       "--map-by",
                                       "slot:PE=1",
                                       "--bind-to",
                                       "core",
                                       "-x",
                                       "OMP_PROC_BIND=close",
                                       "-x",
                                       "OMP_PLACES=cores",
                                       "-x",
                                       "OMP_NUM_THREADS=1",
                                       "/opt/ditstudio/bin/ditstudio-worker",
                                       "--model",
                                       "/models/tiny-flux",
                                       "--tp-degree",
                                       "1",
                                       "--ring-degree",
                                       "2",
                                       "--ulysses-degree",
                                       "1",
                                       "--cfg-degree",
                                       "1",
                                       "--dp-degree",
                                       "1",
                                       "--device",
                                       "cpu"};
  EXPECT_EQ(mpirunArgv(l), expected);
  // 2 ranks x 3 threads > 4 cores: not pinned; the hostfile path below places nothing.
  l.omp_threads = 3;
  const auto over = mpirunArgv(l);
  EXPECT_EQ(std::vector<std::string>(over.begin() + 11, over.begin() + 13),
            (std::vector<std::string>{"--bind-to", "none"}));
  EXPECT_EQ(over.at(14), "OMP_NUM_THREADS=3");
  l.hostfile = " /etc/mpi hosts ";
  l.omp_threads = 4;
  l.mpirun = "/usr/local/bin/mpirun";
  l.extra_worker_args = {"--dtype", "bfloat16"};
  // Issue 18: with a hostfile no --oversubscribe unless asked, no binding, ssh never prompts,
  // the product's environment reaches every rank.
  ::setenv("DITSTUDIO_COLLECTIVE_TIMEOUT_S", "30", 1);
  const std::vector<std::string> env = forwardedEnvironment();
  EXPECT_NE(std::find(env.begin(), env.end(), "DITSTUDIO_COLLECTIVE_TIMEOUT_S"), env.end());
  expected = {"/usr/local/bin/mpirun",
              "--allow-run-as-root",
              "-np",
              "2",
              "--hostfile",
              "/etc/mpi hosts",
              "--bind-to",
              "none",
              "--mca",
              "plm_rsh_args",
              "-o BatchMode=yes -o ConnectTimeout=10",
              "-x",
              "OMP_NUM_THREADS=4"};
  for (const std::string& n : env) expected.insert(expected.end(), {"-x", n});
  expected.insert(expected.end(), {"/opt/ditstudio/bin/ditstudio-worker", "--model",
                                   "/models/tiny-flux", "--tp-degree", "1", "--ring-degree", "2",
                                   "--ulysses-degree", "1", "--cfg-degree", "1", "--dp-degree", "1",
                                   "--device", "cpu", "--dtype", "bfloat16"});
  EXPECT_EQ(mpirunArgv(l), expected);
  // Hostfile groups use the interfaces the user names (issue 16).
  l.network_interface = "eth1";
  auto withIface = mpirunArgv(l);
  std::vector<std::string> mca(withIface.begin() + 11, withIface.begin() + 17);
  EXPECT_EQ(mca, (std::vector<std::string>{"--mca", "btl_tcp_if_include", "eth1", "--mca",
                                           "oob_tcp_if_include", "eth1"}));
  l.network_interface.clear();
  EXPECT_EQ(mpirunArgv(l), expected);
  // Settings: ssh options after the defaults, port range, oversubscribe when asked, extra args.
  l.ssh_options = "-i /k/id -p 2222";
  l.port_range = "50000-50099";
  l.oversubscribe = true;
  l.extra_mpirun_args = " --report-bindings  --tag-output ";
  auto set = mpirunArgv(l);
  EXPECT_EQ(set[2], "--oversubscribe");
  EXPECT_EQ(set[11], "-o BatchMode=yes -o ConnectTimeout=10 -i /k/id -p 2222");
  // Issue 36: one range for every listener: mpirun's channel gets its first quarter.
  EXPECT_EQ(std::vector<std::string>(set.begin() + 12, set.begin() + 21),
            (std::vector<std::string>{"--mca", "oob_tcp_dynamic_ipv4_ports", "50000-50024", "--mca",
                                      "btl_tcp_port_min_v4", "50025", "--mca",
                                      "btl_tcp_port_range_v4", "75"}));
  auto w = std::find(set.begin(), set.end(), "/opt/ditstudio/bin/ditstudio-worker");
  ASSERT_NE(w, set.end());
  EXPECT_EQ(*(w - 2), "--report-bindings");
  EXPECT_EQ(*(w - 1), "--tag-output");
  for (const char* bad : {"80-90", "50000", "60000-50000", "5000-70000", "a-b", "50000-50002"}) {
    l.port_range = bad;
    EXPECT_THROW(mpirunArgv(l), std::invalid_argument) << bad;
  }
  l.port_range.clear();
  l.ssh_options.clear();
  l.oversubscribe = false;
  l.extra_mpirun_args.clear();
  ::unsetenv("DITSTUDIO_COLLECTIVE_TIMEOUT_S");
  EXPECT_EQ(shellQuoted({"mpirun", "-np", "2", "/m/FLUX.1 dev", "it's", ""}),
            "mpirun -np 2 '/m/FLUX.1 dev' 'it'\\''s' ''");
  ::setenv("DITSTUDIO_MPIRUN", "/opt/openmpi/bin/mpirun", 1);
  l.mpirun.clear();
  EXPECT_EQ(mpirunArgv(l).front(), "/opt/openmpi/bin/mpirun");
  ::unsetenv("DITSTUDIO_MPIRUN");
  EXPECT_EQ(defaultMpirun(), "mpirun");
  l.strategy.world = 0;
  EXPECT_THROW(mpirunArgv(l), std::invalid_argument);
  l.strategy.world = 1;
  l.worker.clear();
  EXPECT_THROW(mpirunArgv(l), std::invalid_argument);
}

// Issue 18: a hostfile without slots= put every rank on the first host, silently.
TEST(Protocol, HostfilePlan) {
  auto hosts = parseHostfile("# two machines\n10.77.0.1 slots=1\n\n  10.77.0.2 slots=1 # b\n");
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[1].host, "10.77.0.2");
  EXPECT_EQ(hosts[1].line, 4);
  auto plan = planHostfile(hosts, 2, false, "h");
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].second, std::vector<int>{0});
  EXPECT_EQ(plan[1].second, std::vector<int>{1});
  // By slot, in order: 3 slots on a then b.
  plan = planHostfile(parseHostfile("a slots=3 max_slots=4\nb slots=2\n"), 4, false, "h");
  EXPECT_EQ(plan[0].second, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(plan[1].second, (std::vector<int>{3}));
  try {
    planHostfile(parseHostfile("a slots=1\nb\n"), 2, false, "/etc/hosts.mpi");
    ADD_FAILURE() << "no slots= accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("line 2: host b has no slots=N"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(planHostfile(parseHostfile("a slots=1\nb slots=1\n"), 3, false, "h"),
               std::invalid_argument);
  plan = planHostfile(parseHostfile("a slots=1\nb slots=1\n"), 3, true, "h");
  EXPECT_EQ(plan[0].second, (std::vector<int>{0, 2}));
  EXPECT_THROW(planHostfile(parseHostfile("# none\n"), 1, false, "h"), std::invalid_argument);
  EXPECT_THROW(parseHostfile("a slots=x\n"), std::invalid_argument);
  EXPECT_THROW(parseHostfile("a slots=0\n"), std::invalid_argument);
}

// Issue 18: the model fingerprint two hosts compare. Stable, and it sees a changed header byte, a
// changed byte in a sampled block of a large file, a renamed file and a changed size.
TEST(Protocol, ModelFingerprint) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / ("ditstudio-fp-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "transformer");
  fs::create_directories(d / ".git");
  std::string big(8 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 2654435761u >> 13);
  auto put = [&](const fs::path& f, const std::string& bytes) {
    std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
  };
  put(d / "model_index.json", "{\"_class_name\": \"FluxPipeline\"}");
  put(d / "transformer/diffusion_pytorch_model.safetensors", big);
  const std::string fp = modelFingerprint({d.string()});
  EXPECT_EQ(fp.size(), 16u);
  EXPECT_EQ(modelFingerprint({d.string(), ""}), fp);
  put(d / ".git/HEAD", "hidden entries are skipped");
  EXPECT_EQ(modelFingerprint({d.string()}), fp);
  // The last sampled block before the tail starts at size - 64 KiB - 4 KiB.
  for (size_t at : {size_t(10), size_t(big.size() - (68 << 10) + 5), big.size() - 1}) {
    std::string changed = big;
    changed[at] = static_cast<char>(changed[at] ^ 1);
    put(d / "transformer/diffusion_pytorch_model.safetensors", changed);
    EXPECT_NE(modelFingerprint({d.string()}), fp) << "byte " << at;
  }
  put(d / "transformer/diffusion_pytorch_model.safetensors", big + "x");
  EXPECT_NE(modelFingerprint({d.string()}), fp);
  put(d / "transformer/diffusion_pytorch_model.safetensors", big);
  EXPECT_EQ(modelFingerprint({d.string()}), fp);
  // Per file: the pre-flight names what differs on another host.
  const auto here = modelFileFingerprints({d.string()});
  ASSERT_EQ(here.size(), 2u);
  EXPECT_EQ(here[0].path, (d / "model_index.json").string());
  EXPECT_EQ(here[1].size, big.size());
  EXPECT_EQ(describeDifferences(here, here), "");
  fs::rename(d / "model_index.json", d / "model_index2.json");
  EXPECT_NE(modelFingerprint({d.string()}), fp);
  auto there = modelFileFingerprints({d.string()});
  const std::string m = (d / "model_index.json").string(), m2 = (d / "model_index2.json").string();
  EXPECT_EQ(describeDifferences(here, there), m + " missing there; " + m2 + " only there");
  there[1].digest = "0";
  there[0].size = 1;
  const std::string t = (d / "transformer/diffusion_pytorch_model.safetensors").string();
  EXPECT_EQ(describeDifferences(here, there, 2),
            m + " missing there; " + t + " differs (same size); and 1 more");
  there[1].size = 3;
  EXPECT_NE(describeDifferences(here, there).find(t + " differs (size 8388608 here, 3 there)"),
            std::string::npos);
  EXPECT_THROW(modelFingerprint({(d / "absent").string()}), std::runtime_error);
  fs::create_directories(d / "empty");
  EXPECT_THROW(modelFingerprint({(d / "empty").string()}), std::runtime_error);
  fs::remove_all(d);
}

// Issue 36: the full content hash the ranks of a multi-host group compare. It sees a byte the
// sampled fingerprint skips, equals xxh128sum's digits, and its cache (keyed by device, inode and
// path, validated by size and mtime) answers without reading the file until the file changes.
TEST(Protocol, ContentHashAndItsCache) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / ("ditstudio-ch-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "m");
  const std::string cache = (d / "cache" / "hashes.tsv").string();
  ::setenv("DITSTUDIO_HASH_CACHE", cache.c_str(), 1);
  auto put = [&](const fs::path& f, const std::string& bytes) {
    std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
  };
  put(d / "empty", "");
  // XXH3-128 of no bytes, as `printf '' | xxh128sum` prints it.
  EXPECT_EQ(contentHash((d / "empty").string()), "99aa06d3014798d86001c324468d497f");
  std::string big(4 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 2654435761u >> 13);
  const fs::path f = d / "m" / "w.safetensors";
  put(f, big);
  bool cached = true;
  const std::string h = contentHash(f.string(), &cached);
  EXPECT_FALSE(cached);
  EXPECT_EQ(h.size(), 32u);
  EXPECT_EQ(contentHash(f.string(), &cached), h);
  EXPECT_TRUE(cached) << "the second call must come from " << cache;
  EXPECT_TRUE(fs::exists(cache));
  // A byte between the fingerprint's sampled blocks (right after the first 1 MiB + 4 KiB).
  const std::string fp = modelFingerprint({(d / "m").string()});
  std::string changed = big;
  changed[(1 << 20) + (4 << 10) + 100] ^= 1;
  struct stat before {};
  ASSERT_EQ(::stat(f.c_str(), &before), 0);
  put(f, changed);
  EXPECT_EQ(modelFingerprint({(d / "m").string()}), fp) << "sampled: cannot see that byte";
  // Same size and, restored by hand, the same mtime: the cache answers (the file is not read).
  const timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, f.c_str(), times, 0), 0);
  EXPECT_EQ(contentHash(f.string(), &cached), h);
  EXPECT_TRUE(cached);
  // A new mtime: hashed again, and every byte counts.
  const timespec later[2] = {{before.st_mtim.tv_sec + 5, 0}, {before.st_mtim.tv_sec + 5, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, f.c_str(), later, 0), 0);
  const std::string h2 = contentHash(f.string(), &cached);
  EXPECT_FALSE(cached);
  EXPECT_NE(h2, h);
  const auto listed = modelContentHashes({(d / "m").string()});
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].path, f.string());
  EXPECT_EQ(listed[0].size, big.size());
  EXPECT_EQ(listed[0].digest, h2);
  // A corrupt cache is ignored and rewritten; "off" disables it.
  put(cache, "garbage\n1 2 3\n");
  EXPECT_EQ(contentHash(f.string(), &cached), h2);
  EXPECT_FALSE(cached);
  EXPECT_EQ(contentHash(f.string(), &cached), h2);
  EXPECT_TRUE(cached);
  ::setenv("DITSTUDIO_HASH_CACHE", "off", 1);
  EXPECT_EQ(contentHash(f.string(), &cached), h2);
  EXPECT_FALSE(cached);
  EXPECT_THROW(contentHash((d / "absent").string()), std::runtime_error);
  ::unsetenv("DITSTUDIO_HASH_CACHE");
  // The exchange between ranks: lists as text, and what differs named by file, rank and host.
  const std::vector<FileFingerprint> mine{{"/m/a b.json", 3, "aa"}, {"/m/w", 9, "bb"}};
  const auto round = decodeFileList(encodeFileList(mine));
  ASSERT_EQ(round.size(), 2u);
  EXPECT_EQ(round[0].path, "/m/a b.json");
  EXPECT_EQ(round[1].size, 9u);
  EXPECT_EQ(fileListDigest(round), fileListDigest(mine));
  std::vector<FileFingerprint> theirs{{"/m/w", 9, "cc"}, {"/m/x", 1, "dd"}};
  EXPECT_NE(fileListDigest(theirs), fileListDigest(mine));
  EXPECT_EQ(describeRankDifferences({{0, "a", mine}, {1, "b", mine}}), "");
  EXPECT_EQ(describeRankDifferences({{0, "a", mine}, {2, "b", theirs}}),
            "/m/a b.json: missing on rank 2 (host b); /m/w: content hash bb on rank 0 (host a), cc "
            "on rank 2 (host b); /m/x: only on rank 2 (host b)");
  theirs[0].size = 10;
  EXPECT_EQ(describeRankDifferences({{0, "a", mine}, {1, "b", theirs}}, 1),
            "/m/a b.json: missing on rank 1 (host b); and 2 more");
  EXPECT_NE(
      describeRankDifferences({{0, "a", mine}, {1, "b", theirs}}).find("(size 9 vs 10 bytes)"),
      std::string::npos);
  fs::remove_all(d);
}

TEST(Protocol, MpirunFailures) {
  auto f = parseMpirunFailure(
      "Primary job  terminated normally, but 1 process returned\n"
      "a non-zero exit code. Per user-direction, the job has been aborted.\n"
      "mpirun noticed that process rank 1 with PID 31337 on node worker-a exited on signal 9 "
      "(Killed).\n");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->rank, 1);
  EXPECT_EQ(f->pid, 31337);
  EXPECT_EQ(f->signal, 9);
  EXPECT_EQ(f->node, "worker-a");
  EXPECT_EQ(f->reason, "rank 1 (pid 31337 on worker-a) was killed by signal 9 (Killed)");

  f = parseMpirunFailure(
      "mpirun detected that one or more processes exited with non-zero status, thus causing\n"
      "the job to be terminated. The first process to do so was:\n\n"
      "  Process name: [[6180,1],1]\n  Exit code:    3\n");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->rank, 1);
  EXPECT_EQ(f->exit_code, 3);
  EXPECT_EQ(f->reason, "rank 1 exited with code 3");  // the CLI prints "error: " + reason

  f = parseMpirunFailure(
      "MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD\nwith errorcode 1.\n");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->rank, 2);
  EXPECT_EQ(f->exit_code, 1);
  EXPECT_EQ(f->reason, "rank 2 aborted the group (MPI_Abort, error code 1)");

  f = parseMpirunFailure(
      "mpirun noticed that process rank 3 with PID 9 on node h exited with status 4\n");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->rank, 3);
  EXPECT_EQ(f->exit_code, 4);

  f = parseMpirunFailure(
      "Primary job  terminated normally, but 1 process returned\na non-zero exit code.");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->rank, -1);
  EXPECT_FALSE(parseMpirunFailure("all fine\nnothing to see"));
  // Long noise before the report (regex on a large text must neither hang nor overflow).
  std::string big(1 << 20, 'x');
  big += "\nMPI_ABORT was invoked on rank 5 in communicator MPI_COMM_WORLD\nwith errorcode 2.\n";
  f = parseMpirunFailure(big);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->rank, 5);
}

// Issue 11: every number checked for finiteness and range, every text field for UTF-8, at the door.
TEST(Protocol, NumbersAndTextCheckedAtTheDoor) {
  const std::pair<const char*, const char*> bad[] = {
      {R"("guidance":-0.5)",
       "request field 'guidance' must be a finite number in 0 .. 100, got -0.5"},
      {R"("guidance":1e300)",
       "request field 'guidance' must be a finite number in 0 .. 100, got 1e+300"},
      {R"("width":-8)",
       "request field 'width' must be 0 (the model's default) or 1 .. 16384 pixels, got -8"},
      {R"("height":20000)",
       "request field 'height' must be 0 (the model's default) or 1 .. 16384 pixels, got 20000"},
      {R"("steps":-1)",
       "request field 'steps' must be 0 (the model's default) or 1 .. 1000, got -1"},
      {R"("max_sequence_length":65537)",
       "request field 'max_sequence_length' must be 0 (the model's default) or 1 .. 65536 "
       "tokens, got 65537"},
      {R"("num_images":10001)", "request field 'num_images' must be in 1 .. 10000, got 10001"},
      {R"("preview_every":-2)",
       "request field 'preview_every' must be in 0 .. 1000000 (0: no previews), got -2"},
  };
  for (const auto& [fields, message] : bad) {
    const std::string line = std::string(R"({"type":"generate","id":"n",)") + fields + "}";
    try {
      parseRequestLine(line);
      ADD_FAILURE() << "accepted " << line;
    } catch (const ProtocolError& e) {
      EXPECT_EQ(std::string(e.what()), message);
      ASSERT_TRUE(e.requestId());
      EXPECT_EQ(*e.requestId(), "n");
    }
  }
  // NaN and infinity cannot be written in JSON; built in memory (the GUI, the CLI) they are
  // refused.
  GenerationParams p;
  p.guidance = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(errorOf([&] { checkParams(p); }, "guidance"),
            "request field 'guidance' must be a finite number in 0 .. 100, got nan");
  p = GenerationParams{};
  p.options["true_cfg_scale"] = std::numeric_limits<double>::infinity();
  EXPECT_EQ(errorOf([&] { checkParams(p); }, "options.true_cfg_scale"),
            "request field 'options.true_cfg_scale' must be a finite number, got inf");
  // 0 and the limits are accepted (a knob's own range is its family's, checked by the resolve).
  EXPECT_NO_THROW(parseRequestLine(
      R"({"type":"generate","id":"ok","options":{"true_cfg_scale":0},"guidance":100,"width":16384,"steps":1000,"max_sequence_length":512})"));
  // Text: each field named with the byte offset in its decoded text.
  EXPECT_EQ(
      errorOf(
          [] {
            parseRequestLine(
                "{\"type\":\"generate\",\"id\":\"u\",\"prompt\":\"a\\n\xc3\xa9\xff\"}");
          },
          "prompt"),
      "request field 'prompt' is not valid UTF-8: invalid byte 0xff at byte offset 4 of its text");
  EXPECT_EQ(
      errorOf(
          [] {
            parseRequestLine(
                "{\"type\":\"generate\",\"id\":\"u\",\"prompts\":[\"ok\",\"b\xed\xa0\x80\"]}");
          },
          "prompts[1]"),
      "request field 'prompts[1]' is not valid UTF-8: invalid byte 0xed at byte offset 1 of its "
      "text");
  try {
    parseRequestLine(
        "{\"type\":\"generate\",\"id\":\"u7\",\"negative_prompt\":\"\xc0\xaf\"}");  // overlong '/'
    ADD_FAILURE() << "overlong accepted";
  } catch (const ProtocolError& e) {
    EXPECT_EQ(e.field(), "negative_prompt");
    ASSERT_TRUE(e.requestId());
    EXPECT_EQ(*e.requestId(), "u7");
  }
  GenerateRequest g;
  g.id = "c";
  g.output = "/tmp/\xfe.png";
  EXPECT_EQ(
      errorOf([&] { checkRequest(g); }, "output"),
      "request field 'output' is not valid UTF-8: invalid byte 0xfe at byte offset 5 of its text");
  EXPECT_EQ(invalidUtf8Offset("plain \xe2\x82\xac \xf0\x9f\xa6\x8a"), std::string::npos);
  EXPECT_EQ(invalidUtf8Offset("\xf4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(invalidUtf8Offset("ab\xe2\x82"), 2u);        // truncated sequence
}

// Issue 11: a negative prompt given as "" counts (diffusers: negative_prompt is not None).
// Whether CFG then runs is the family's guider (RequestSpec, test_request_spec).
TEST(Protocol, EmptyNegativePromptIsGiven) {
  auto g = std::get<GenerateRequest>(parseRequestLine(
      R"({"type":"generate","id":"e","negative_prompt":"","options":{"true_cfg_scale":4}})"));
  EXPECT_TRUE(g.params.negative_prompt_given);
  EXPECT_TRUE(g.params.hasNegativePrompt());
  EXPECT_EQ(g.params.options.at("true_cfg_scale"), 4.0);
  auto absent = std::get<GenerateRequest>(
      parseRequestLine(R"({"type":"generate","id":"e","options":{"true_cfg_scale":4}})"));
  EXPECT_FALSE(absent.params.hasNegativePrompt());
  auto null = std::get<GenerateRequest>(parseRequestLine(
      R"({"type":"generate","id":"e","negative_prompt":null,"options":{"true_cfg_scale":4}})"));
  EXPECT_FALSE(null.params.hasNegativePrompt());
  // Round trip keeps "given": the key is written for a given empty negative prompt only.
  const json j = toJson(Request{g});
  ASSERT_TRUE(j.contains("negative_prompt"));
  EXPECT_EQ(j["negative_prompt"], "");
  EXPECT_EQ(std::get<GenerateRequest>(parseRequest(j)), g);
  EXPECT_FALSE(toJson(Request{absent}).contains("negative_prompt"));
  GenerationParams plain;
  plain.negative_prompt = "blurry";
  EXPECT_TRUE(plain.hasNegativePrompt());
  // overwrite round-trips and defaults to false.
  EXPECT_FALSE(g.overwrite);
  g.overwrite = true;
  EXPECT_TRUE(std::get<GenerateRequest>(parseRequest(toJson(Request{g}))).overwrite);
}

// Issue 11: the four seeds of the issue survive the request and event JSON exactly.
TEST(Protocol, SeedsRoundTripExactly) {
  for (std::uint64_t seed : {std::uint64_t(0), (std::uint64_t(1) << 53) + 1, std::uint64_t(1) << 63,
                             std::numeric_limits<std::uint64_t>::max()}) {
    const std::string line = R"({"type":"generate","id":"s","seed":)" + std::to_string(seed) + "}";
    const auto g = std::get<GenerateRequest>(parseRequestLine(line));
    EXPECT_EQ(g.params.seed, seed);
    EXPECT_FALSE(g.params.random_seed);
    EXPECT_NE(requestLine(Request{g}).find("\"seed\":" + std::to_string(seed)), std::string::npos);
  }
  EXPECT_EQ(
      errorOf(
          [] { parseRequestLine(R"({"type":"generate","id":"s","seed":18446744073709551616})"); },
          "seed"),
      "request field 'seed' has the wrong type: 1.8446744073709552e+19");
}

// Issue 16: parsing with limits. Each instance of the issue, at the parser (the worker's and the
// CLI's door; the 1- and 2-rank runs are in tests/test_fuzz.cpp).
TEST(ProtocolLimits, DeepNestingIsAnErrorNotACrash) {
  for (int depth : {17, 1000, 100000}) {
    std::string line = R"({"type":"generate","id":"deep","prompt":)";
    line += std::string(static_cast<size_t>(depth), '[') +
            std::string(static_cast<size_t>(depth), ']') + "}";
    EXPECT_EQ(errorOf([&] { parseRequestLine(line); }, ""),
              "request nests JSON more than 16 levels deep (requests need 2)");
  }
  // Brackets inside strings do not count; 16 levels are fine for the scan (the field is then
  // refused for its type).
  EXPECT_NO_THROW(
      parseRequestLine(R"({"type":"generate","id":"b","prompt":"[[[[[[[[[[[[[[[[[[[[[["})"));
  EXPECT_EQ(jsonNestingDepth(R"({"a":"{\"[","b":[[1]]})"), 3);
}

TEST(ProtocolLimits, LineLengthLimit) {
  std::string line = R"({"type":"generate","id":"long","prompt":")" +
                     std::string(kMaxRequestLineBytes, 'a') + "\"}";
  EXPECT_EQ(errorOf([&] { parseRequestLine(line); }, ""),
            "request line is " + std::to_string(line.size()) + " bytes long; at most 16777216");
  // The reader holds at most maxBytes of a line and reads on to the next one.
  std::istringstream in(std::string(100, 'x') + "\nnext\nlast");
  std::string l;
  EXPECT_EQ(readRequestLine(in, l, 10), LineRead::TooLong);
  EXPECT_EQ(l.size(), 10u);
  EXPECT_EQ(readRequestLine(in, l, 10), LineRead::Line);
  EXPECT_EQ(l, "next");
  EXPECT_EQ(readRequestLine(in, l, 10), LineRead::Line);
  EXPECT_EQ(l, "last");
  EXPECT_EQ(readRequestLine(in, l, 10), LineRead::End);
}

TEST(ProtocolLimits, NumbersStateFieldValueAndRange) {
  const std::pair<const char*, const char*> bad[] = {
      {R"("guidance":1e39)",
       "request field 'guidance' must be a finite number in 0 .. 100, got 1e+39"},
      {R"("height":1e18)",
       "request field 'height' must be a JSON integer, 0 (the model's default) or 1 .. 16384 "
       "pixels, got 1e+18"},
      {R"("steps":18446744073709551616)",
       "request field 'steps' must be a JSON integer, 0 (the model's default) or 1 .. 1000, got "
       "1.8446744073709552e+19"},
      {R"("steps":18446744073709551615)",
       "request field 'steps' must be 0 (the model's default) or 1 .. 1000, got "
       "18446744073709551615"},
      {R"("num_images":1000000)", "request field 'num_images' must be in 1 .. 10000, got 1000000"},
      {R"("width":64.0)",
       "request field 'width' must be a JSON integer, 0 (the model's default) or 1 .. 16384 "
       "pixels, got 64.0"},
      {R"("width":64.5)",
       "request field 'width' must be a JSON integer, 0 (the model's default) or 1 .. 16384 "
       "pixels, got 64.5"},
      {R"("num_images":1.0)",
       "request field 'num_images' must be a JSON integer, in 1 .. 10000, got 1.0"},
      {R"("preview_every":-9223372036854775808)",
       "request field 'preview_every' must be in 0 .. 1000000 (0: no previews), got "
       "-9223372036854775808"},
  };
  for (const auto& [fields, message] : bad) {
    const std::string line = std::string(R"({"type":"generate","id":"n",)") + fields + "}";
    try {
      parseRequestLine(line);
      ADD_FAILURE() << "accepted " << line;
    } catch (const ProtocolError& e) {
      EXPECT_EQ(std::string(e.what()), message);
      ASSERT_TRUE(e.requestId());
      EXPECT_EQ(*e.requestId(), "n");
    }
  }
  // The table is the one source: every numeric field has a row, the range text is its message.
  EXPECT_EQ(requestLimit("height").rangeText(), "0 (the model's default) or 1 .. 16384 pixels");
  EXPECT_EQ(requestLimit("guidance").rangeText(), "a finite number in 0 .. 100");
  EXPECT_THROW(requestLimit("no_such_field"), std::logic_error);
  GenerationParams p;
  p.steps = 1001;
  EXPECT_EQ(errorOf([&] { checkParams(p); }, "steps"),
            "request field 'steps' must be 0 (the model's default) or 1 .. 1000, got 1001");
}

TEST(ProtocolLimits, IdsUseASafeCharacterSet) {
  for (const char* id : {"../../etc/x", "a/b", "a b", "", "tab\there", "\xc3\xa9"}) {
    const json j{{"type", "generate"}, {"id", id}};
    const std::string msg = errorOf([&] { parseRequest(j); }, "id");
    EXPECT_NE(
        msg.find(std::string(id).empty() ? "request id is empty" : "request id has the character"),
        std::string::npos)
        << msg;
  }
  EXPECT_NE(errorOf(
                [] {
                  parseRequest(json{{"type", "cancel"}, {"id", "../x"}});
                },
                "id")
                .find("'/' (0x2f) at offset 2"),
            std::string::npos);
  EXPECT_NE(errorOf(
                [] {
                  parseRequest(json{{"type", "generate"}, {"id", std::string(129, 'a')}});
                },
                "id")
                .find("129 characters long; at most 128"),
            std::string::npos);
  for (const char* id : {"r1", "cli", "job-7.a_b:c", "..", "X"})
    EXPECT_NO_THROW(parseRequest(json{{"type", "generate"}, {"id", id}})) << id;
}

// Issue 35: one request cannot write its image and its tensors to the same file (the second
// write would replace the first).
TEST(ProtocolLimits, OutputAndOutputTensorsMustDiffer) {
  for (const char* tensors : {"/tmp/x/a.png", "/tmp/x/./a.png"}) {
    const std::string line =
        std::string(R"({"type":"generate","id":"n","output":"/tmp/x/a.png","output_tensors":")") +
        tensors + "\"}";
    try {
      parseRequestLine(line);
      ADD_FAILURE() << "accepted " << line;
    } catch (const ProtocolError& e) {
      EXPECT_EQ(std::string(e.what()),
                "request fields 'output' and 'output_tensors' name the same file (/tmp/x/a.png): "
                "the tensors would replace the image");
      ASSERT_TRUE(e.requestId());
      EXPECT_EQ(*e.requestId(), "n");
    }
  }
  EXPECT_NO_THROW(parseRequestLine(
      R"({"type":"generate","id":"n","output":"/tmp/x/a.png","output_tensors":"/tmp/x/a.safetensors"})"));
}

// Issue 48: a request line refused unparsed still names its request when the id can be read.
TEST(ProtocolLimits, RefusedLinesNameTheirRequestWhenTheIdCanBeRead) {
  EXPECT_EQ(generateIdInPrefix(R"({"type":"generate","id":"r7-x","prompt":"aaaa)"), "r7-x");
  // Keys in any order, spaces; only the top-level id counts.
  EXPECT_EQ(generateIdInPrefix(R"( { "loras" : [{"id":"inner"}], "id" : "top" , "prompt":"x)"),
            "top");
  EXPECT_EQ(generateIdInPrefix(R"({"prompt":"say \"id\":\"fake\"","id":"real"})"), "real");
  // The id cut by the end of the prefix, an id the door refuses, another type, no object.
  EXPECT_EQ(generateIdInPrefix(R"({"type":"generate","id":"r7)"), std::nullopt);
  EXPECT_EQ(generateIdInPrefix(R"({"id":"../x"})"), std::nullopt);
  EXPECT_EQ(generateIdInPrefix(R"({"type":"cancel","id":"r1"})"), std::nullopt);
  EXPECT_EQ(generateIdInPrefix(R"(["id","r1"])"), std::nullopt);
  EXPECT_EQ(generateIdInPrefix(R"({"prompt":")" + std::string(1 << 20, 'a')), std::nullopt);
  // What the launcher writes (keys sorted: "id" before "prompt") is found in a 16 MiB prefix.
  GenerateRequest g;
  g.id = "r1-abc";
  g.params.prompt = std::string(kMaxRequestLineBytes + 10, 'p');
  const std::string line = requestLine(g);
  EXPECT_EQ(generateIdInPrefix(std::string_view(line).substr(0, kMaxRequestLineBytes)), "r1-abc");
}

TEST(ProtocolEvents, RefusalFlagRoundTrips) {
  ErrorEvent e{std::nullopt, 0, "request line longer than 16777216 bytes refused unread", false};
  EXPECT_FALSE(toJson(e).contains("refused"));  // written only when true
  e.refused = true;
  const json j = toJson(e);
  EXPECT_EQ(j.at("refused"), true);
  EXPECT_TRUE(j.at("id").is_null());
  const auto ev = parseEventLine(eventLine(j));
  ASSERT_TRUE(ev);
  const auto back = std::get<ErrorEvent>(decodeEvent(*ev));
  EXPECT_TRUE(back.refused);
  EXPECT_FALSE(back.fatal);
  EXPECT_EQ(back.message, e.message);
}
