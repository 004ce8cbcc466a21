// dit_server's Torch-free pieces without a worker: pool specs and files, base64, image decoding
// limits, encoders, and the OpenAI mask -> inpainting mask conversion.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "app/protocol/events.h"
#include "app/server/image_codec.h"
#include "app/server/pool.h"
#include "backend/io/model_folder.h"
#include "backend/models/placement_planner.h"
#include "backend/models/text_encoder_placement.h"

using namespace dit::server;
namespace fs = std::filesystem;

namespace {
std::string messageOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}
Pixels rgb(int w, int h, std::uint8_t v) {
  Pixels p;
  p.width = w;
  p.height = h;
  p.channels = 3;
  p.data.assign(static_cast<size_t>(w) * h * 3, v);
  return p;
}
}  // namespace

TEST(ServerPool, GroupSpecKeys) {
  GroupSpec d;
  d.model = "/m/tiny-flux";
  const GroupSpec g = parseGroupSpec("name=a,np=2,tp=2,threads=3,devices=0+1,device=cuda", d);
  EXPECT_EQ(g.name, "a");
  EXPECT_EQ(g.np, 2);
  EXPECT_EQ(g.strategy.tp_degree, 2);
  EXPECT_EQ(g.omp_threads, 3);
  EXPECT_EQ(g.devices, "0,1");
  EXPECT_EQ(g.device, "cuda");
  EXPECT_EQ(g.model, "/m/tiny-flux");  // from the defaults
  EXPECT_EQ(modelId(g.model), "tiny-flux");
  EXPECT_EQ(modelId("/m/flux1-dev.safetensors"), "flux1-dev.safetensors");
  EXPECT_EQ(modelId("/m/FLUX.1-dev/"), "FLUX.1-dev");
  EXPECT_NE(messageOf([&] { parseGroupSpec("np=2,color=red", d); }).find("unknown key 'color'"),
            std::string::npos);
  EXPECT_NE(messageOf([&] { parseGroupSpec("np=two", d); }).find("np must be an integer"),
            std::string::npos);
  EXPECT_NE(messageOf([&] { parseGroupSpec("tp", d); }).find("'tp' is not key=value"),
            std::string::npos);
  // A hostfile group's settings (the one group start's pre-flight and ports).
  const GroupSpec h = parseGroupSpec(
      "hostfile=/h,ssh_options=-i /k/id -p 2222,port_range=50000-50099,preflight=0", d);
  EXPECT_EQ(h.hostfile, "/h");
  EXPECT_EQ(h.ssh_options, "-i /k/id -p 2222");
  EXPECT_EQ(h.port_range, "50000-50099");
  EXPECT_FALSE(h.preflight);
  EXPECT_TRUE(d.preflight);
  EXPECT_NE(messageOf([&] { parseGroupSpec("preflight=yes", d); }).find("must be 0 or 1"),
            std::string::npos);
  // The group's run options (issue 47), as the CLI's flags of the same names.
  const GroupSpec r =
      parseGroupSpec("text_encoder_placement=once,prompt_cache=4,vae_tiling=256", d);
  EXPECT_EQ(r.run.text_encoder_placement, "once");
  EXPECT_EQ(r.run.prompt_cache, 4);
  EXPECT_EQ(r.run.vae_tiling, 256);
  EXPECT_EQ(parseGroupSpec("vae_tiling=off", r).run.vae_tiling, -1);
  EXPECT_EQ(d.run, dit::protocol::RunOptions{});
  EXPECT_NE(messageOf([&] {
              parseGroupSpec("text_encoder_placement=everywhere", d);
            }).find("text_encoder_placement: unknown text-encoder placement 'everywhere'"),
            std::string::npos);
  EXPECT_NE(messageOf([&] {
              parseGroupSpec("prompt_cache=many", d);
            }).find("prompt_cache must be an integer"),
            std::string::npos);
  // The CLI's ranges, in its words.
  EXPECT_EQ(parseGroupSpec("prompt_cache=100000,vae_tiling=8192", d).run.prompt_cache, 100000);
  EXPECT_NE(messageOf([&] {
              parseGroupSpec("vae_tiling=-2", d);
            }).find("vae_tiling: vae tiling -2 is out of range (-1: off"),
            std::string::npos);
}

// Issue 47: the server uses the placement planner for its groups (--plan): the group's degrees,
// ranks and text-encoder placement become the plan's (the same plan `ditstudio-cli plan
// --text-encoder auto` makes); what it cannot plan is refused naming the group.
TEST(ServerPool, PlanChoosesTheGroupsDegreesAndPlacement) {
  GroupSpec g;
  g.name = "a";
  g.model = DITSTUDIO_TEST_DATA "/tiny-flux2dev-A";
  g.np = 2;
  g.device = "cpu";
  g.dtype = "float32";
  GroupPlanSettings ps;
  ps.memory = "1G";
  GroupSpec planned = g;
  const std::string text = planGroup(planned, ps);
  // The planner's own plan for the same inputs.
  const dit::PlannerModel model = dit::plannerModel(dit::ModelFolder::open(g.model));
  dit::PlannerRanks ranks;
  ranks.count = 2;
  ranks.memory_per_rank = dit::parseMemorySize("1G");
  ranks.device = "cpu";
  dit::PlannerRequest req;
  req.width = req.height = model.dims.defaultImageSide();
  req.text_len = 512;
  req.dtype = "float32";
  req.element_bytes = 4;
  req.text_encoder_placements = {
      dit::TextEncoderPlacement::Sharded, dit::TextEncoderPlacement::OwnRank,
      dit::TextEncoderPlacement::HostStreamed, dit::TextEncoderPlacement::Once};
  const dit::Plan want = dit::planPlacement(model, ranks, req);
  ASSERT_TRUE(want.fits) << want.message;
  EXPECT_EQ(text, dit::planText(want));
  EXPECT_EQ(planned.np, 2);
  EXPECT_EQ(planned.strategy.tp_degree, want.strategy.tp_degree);
  EXPECT_EQ(planned.strategy.ulysses_degree, want.strategy.ulysses_degree);
  EXPECT_EQ(planned.strategy.ring_degree, want.strategy.ring_degree);
  EXPECT_EQ(planned.strategy.ulysses_anything, want.strategy.ulysses_anything);
  EXPECT_EQ(planned.strategy.device, "cpu");
  EXPECT_EQ(planned.run.text_encoder_placement, dit::textEncoderPlacementName(want.text_encoder));
  // A placement the group gives is kept (planned under it alone).
  GroupSpec once = g;
  once.run.text_encoder_placement = "once";
  const std::string onceText = planGroup(once, ps);
  req.text_encoder_placements = {dit::TextEncoderPlacement::Once};
  EXPECT_EQ(onceText, dit::planText(dit::planPlacement(model, ranks, req)));
  EXPECT_EQ(once.run.text_encoder_placement, "once");
  // The group's component flags are the model the plan opens: a missing VAE is named.
  GroupSpec badVae = g;
  badVae.model_args = {"--vae", "/nonexistent/vae"};
  const std::string vaeMsg = messageOf([&] { planGroup(badVae, ps); });
  EXPECT_NE(vaeMsg.find("group a: --plan: "), std::string::npos) << vaeMsg;
  EXPECT_NE(vaeMsg.find("/nonexistent/vae"), std::string::npos) << vaeMsg;
  // Refused, naming the group: degrees of its own, a hostfile, a GPU group without memory, a
  // memory nothing fits in (with what it needs).
  GroupSpec withTp = g;
  withTp.strategy.tp_degree = 2;
  EXPECT_NE(messageOf([&] {
              planGroup(withTp, ps);
            }).find("group a: --plan chooses the degrees: give the ranks (np) only"),
            std::string::npos);
  GroupSpec hosts = g;
  hosts.hostfile = "/h";
  EXPECT_NE(messageOf([&] { planGroup(hosts, ps); }).find("does not plan hostfile groups"),
            std::string::npos);
  GroupSpec gpu = g;
  gpu.device = "cuda";
  EXPECT_NE(messageOf([&] {
              planGroup(gpu, GroupPlanSettings{});
            }).find("group a: --plan: needs --plan-memory (per GPU"),
            std::string::npos);
  GroupPlanSettings tiny;
  tiny.memory = "1M";
  const std::string none = messageOf([&] { planGroup(g, tiny); });
  EXPECT_NE(none.find("group a: --plan: "), std::string::npos) << none;
  EXPECT_NE(none.find("MiB"), std::string::npos) << none;
}

// The GUI's Serve API (issue 45): a pool over a group that runs elsewhere. Its jobs are handed
// to that group's queue as they come, stay queued until the group's first news of them, and
// finish with the group's callbacks; the group's own requests are not the pool's; a cancel goes
// to the group; a failed group fails the jobs waiting; stopping the pool takes its jobs back.
namespace {
struct FakeGroup : AttachedGroup {
  std::mutex mu;
  std::vector<dit::protocol::GenerateRequest> submitted;
  std::vector<std::string> cancelled;
  void submit(dit::protocol::GenerateRequest r) override {
    std::lock_guard l(mu);
    submitted.push_back(std::move(r));
  }
  void cancel(const std::string& id) override {
    std::lock_guard l(mu);
    cancelled.push_back(id);
  }
  std::size_t count() {
    std::lock_guard l(mu);
    return submitted.size();
  }
};
template <class F>
bool eventually(F f) {
  for (int i = 0; i < 400 && !f(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return f();
}
dit::protocol::Event eventOf(const std::string& type, nlohmann::json data) {
  data["event"] = type;
  return dit::protocol::Event{type, data};
}
}  // namespace

TEST(ServerPool, AttachedGroupTakesTheJobsIntoItsQueue) {
  using State = dit::launcher::SessionObserver::State;
  const fs::path dir = fs::temp_directory_path() / ("attached-" + std::to_string(::getpid()));
  FakeGroup group;
  GroupSpec spec;
  spec.name = "gui";
  spec.model = "/m/tiny-flux";
  PoolOptions po;
  po.images_dir = dir.string();
  Pool pool(spec, group, po);
  EXPECT_THROW(Pool(std::vector<GroupSpec>{spec}, po).attachedObserver(), std::logic_error);
  auto& obs = pool.attachedObserver();
  pool.start();  // starts no process
  obs.stateChanged(State::Ready);
  const auto ready = eventOf("ready", {{"world", 2}, {"load_seconds", 1.5}});
  obs.event(ready, dit::protocol::decodeEvent(ready));
  EXPECT_TRUE(pool.waitReady(std::chrono::milliseconds(100)));

  Job a;
  a.api = "openai.generations";
  a.request.params.prompt = "a star";
  const auto ja = pool.submit(a);
  const auto jb = pool.submit(a);
  ASSERT_TRUE(eventually([&] { return group.count() == 2; }));
  {
    std::lock_guard l(group.mu);
    EXPECT_EQ(group.submitted[0].id, ja->id);
    EXPECT_EQ(group.submitted[0].output_dir, pool.imagesDir());
    EXPECT_EQ(group.submitted[1].id, jb->id);
  }
  {
    std::lock_guard l(pool.mutex());
    EXPECT_EQ(ja->state, JobState::Queued);  // in the group's queue, not started there yet
  }
  EXPECT_EQ(pool.jobsJson()["queue"].size(), 2u);
  // The group's own request is not the pool's; the job's first progress starts it.
  obs.requestDone("r1-window", 0.5);
  const auto progress = eventOf("progress", {{"id", ja->id}, {"step", 1}, {"steps", 4}});
  obs.event(progress, dit::protocol::decodeEvent(progress));
  {
    std::lock_guard l(pool.mutex());
    EXPECT_EQ(ja->state, JobState::Running);
    EXPECT_EQ(ja->step, 1);
  }
  obs.requestDone(ja->id, 2.0);
  {
    std::lock_guard l(pool.mutex());
    EXPECT_EQ(ja->state, JobState::Done);
  }
  EXPECT_EQ(pool.groupsJson()["data"][0]["jobs_done"].get<int>(), 1);
  // Cancelling the handed job: the group is asked, its answer finishes the job.
  EXPECT_TRUE(pool.cancel(jb->id));
  ASSERT_TRUE(eventually([&] {
    std::lock_guard l(group.mu);
    return group.cancelled.size() == 1;
  }));
  obs.requestCancelled(jb->id, 0);
  {
    std::lock_guard l(pool.mutex());
    EXPECT_EQ(jb->state, JobState::Cancelled);
  }
  EXPECT_TRUE(pool.jobsJson()["queue"].empty());
  // The group fails: the next job is refused with the cause; started again, it serves again.
  dit::launcher::GroupFailure f;
  f.message = "rank 1 exited with code 3";
  obs.stateChanged(State::Failed);
  obs.groupFailed(f);
  EXPECT_NE(messageOf([&] { pool.submit(a); }).find("rank 1 exited with code 3"),
            std::string::npos);
  obs.stateChanged(State::Starting);
  const auto jc = pool.submit(a);
  ASSERT_TRUE(eventually([&] { return group.count() == 3; }));
  // Started again with another model (the window's Start): the pool serves that one.
  const auto other =
      eventOf("ready", {{"world", 1}, {"model", {{"path", "/m/other-model"}, {"family", "flux"}}}});
  obs.event(other, dit::protocol::decodeEvent(other));
  EXPECT_EQ(pool.models(), std::vector<std::string>{"other-model"});
  EXPECT_EQ(pool.groupsJson()["data"][0]["model_path"], "/m/other-model");
  pool.stop();  // the job it was given is taken back
  {
    std::lock_guard l(group.mu);
    ASSERT_EQ(group.cancelled.size(), 2u);
    EXPECT_EQ(group.cancelled[1], jc->id);
  }
  {
    std::lock_guard l(pool.mutex());
    EXPECT_EQ(jc->state, JobState::Failed);
    EXPECT_EQ(jc->error_status, 503);
  }
  fs::remove_all(dir);
}

TEST(ServerPool, PoolFile) {
  const fs::path f = fs::temp_directory_path() / ("pool-" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream(f) << R"({"groups": [{"name": "a", "np": 2, "tp_degree": 2},
                                       {"name": "b", "devices": "2,3"}]})";
  }
  const auto groups = parsePoolFile(f.string(), GroupSpec{});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].strategy.tp_degree, 2);
  EXPECT_EQ(groups[1].devices, "2,3");
  { std::ofstream(f) << R"({"groups": [{"name": "a", "np": 1.5}]})"; }
  EXPECT_NE(messageOf([&] {
              parsePoolFile(f.string(), GroupSpec{});
            }).find("groups[0]: field 'np' must be a string or an integer"),
            std::string::npos);
  { std::ofstream(f) << "{"; }
  EXPECT_NE(messageOf([&] { parsePoolFile(f.string(), GroupSpec{}); }).find("not valid JSON"),
            std::string::npos);
  fs::remove(f);
  EXPECT_NE(messageOf([&] { parsePoolFile(f.string(), GroupSpec{}); }).find("cannot be read"),
            std::string::npos);
}

TEST(ServerCodec, Base64RoundTrip) {
  for (const std::string s : {"", "f", "fo", "foo", "foob", "fooba", "foobar"})
    EXPECT_EQ(decodeBase64(encodeBase64(s), "x"), s);
  EXPECT_EQ(encodeBase64("foobar"), "Zm9vYmFy");
  EXPECT_EQ(decodeBase64("data:image/png;base64,Zm9v\nYg==", "x"), "foob");
  EXPECT_NE(messageOf([] {
              decodeBase64("Zm9v!", "init_images[0]");
            }).find("'init_images[0]' is not base64"),
            std::string::npos);
}

TEST(ServerCodec, DecodeLimitsAndEncoders) {
  const std::string png = encodeImage(rgb(40, 8, 200), "png", 100);
  const Pixels back = decodeImage(png, "image", 64, 4096);
  EXPECT_EQ(back.width, 40);
  EXPECT_EQ(back.height, 8);
  EXPECT_EQ(back.channels, 3);
  EXPECT_EQ(back.data, rgb(40, 8, 200).data);
  EXPECT_NE(messageOf([&] {
              decodeImage(png, "image", 32, 4096);
            }).find("'image' is 40x8 pixels; at most 32 per side"),
            std::string::npos);
  EXPECT_NE(messageOf([&] { decodeImage(png, "mask", 64, 100); }).find("and 100 pixels"),
            std::string::npos);
  EXPECT_NE(messageOf([] {
              decodeImage("plain text, not an image", "image", 64, 4096);
            }).find("'image' is not a PNG"),
            std::string::npos);
  EXPECT_NE(messageOf([] { decodeImage("", "image", 64, 4096); }).find("'image' is empty"),
            std::string::npos);
  const std::string jpg = encodeImage(rgb(16, 16, 90), "jpeg", 90);
  ASSERT_GE(jpg.size(), 3u);
  EXPECT_EQ(static_cast<unsigned char>(jpg[0]), 0xff);
  EXPECT_EQ(static_cast<unsigned char>(jpg[1]), 0xd8);
  const std::string webp = encodeImage(rgb(16, 16, 90), "webp", 100);
  EXPECT_EQ(webp.substr(0, 4), "RIFF");
  EXPECT_EQ(webp.substr(8, 4), "WEBP");
  EXPECT_NE(messageOf([] { encodeImage(rgb(4, 4, 0), "gif", 100); }).find("not supported"),
            std::string::npos);
}

TEST(ServerCodec, OpenAiMaskBecomesInpaintingMask) {
  Pixels rgba;
  rgba.width = 2;
  rgba.height = 1;
  rgba.channels = 4;
  rgba.data = {10, 20, 30, 0, 10, 20, 30, 255};  // transparent (edit), opaque (keep)
  const Pixels m = inpaintMask(rgba);
  EXPECT_EQ(m.channels, 1);
  EXPECT_EQ(m.data, (std::vector<std::uint8_t>{255, 0}));
  Pixels grey;
  grey.width = 3;
  grey.height = 1;
  grey.channels = 1;
  grey.data = {0, 128, 255};  // already white = repaint
  EXPECT_EQ(inpaintMask(grey).data, grey.data);
  const Pixels c = inpaintMask(rgb(1, 1, 255));
  EXPECT_EQ(c.data, (std::vector<std::uint8_t>{255}));
}

TEST(ServerPool, CpuSetReplacesThePlacement) {
  const std::vector<std::string> single{
      "mpirun",    "-np",  "1",  "--map-by",          "slot:PE=1",
      "--bind-to", "core", "-x", "OMP_NUM_THREADS=1", "ditstudio-worker"};
  EXPECT_EQ(
      Pool::withCpuSet(single, "2,3"),
      (std::vector<std::string>{"taskset", "--cpu-list", "2,3", "mpirun", "-np", "1", "--bind-to",
                                "none", "-x", "OMP_NUM_THREADS=1", "ditstudio-worker"}));
  EXPECT_EQ(Pool::withCpuSet(single, ""),
            (std::vector<std::string>{"mpirun", "-np", "1", "--bind-to", "none", "-x",
                                      "OMP_NUM_THREADS=1", "ditstudio-worker"}));
  const std::vector<std::string> hostfile{"mpirun", "-np",       "2",    "--hostfile",
                                          "h",      "--bind-to", "none", "w"};
  EXPECT_EQ(Pool::withCpuSet(hostfile, "1"), hostfile);
  EXPECT_EQ(parseGroupSpec("cpus=2+3", GroupSpec{}).cpus, "2,3");
  EXPECT_NE(messageOf([] {
              parseGroupSpec("cpus=all", GroupSpec{});
            }).find("cpus must list CPU numbers and ranges"),
            std::string::npos);
}
