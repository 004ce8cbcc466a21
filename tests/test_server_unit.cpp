// dit_server's Torch-free pieces without a worker: pool specs and files, base64, image decoding
// limits, encoders, and the OpenAI mask -> inpainting mask conversion.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "app/server/image_codec.h"
#include "app/server/pool.h"

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
