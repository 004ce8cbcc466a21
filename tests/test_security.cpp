// Issue 16, files and outputs: model files opened as what they claim (regular files only, no
// blocking on a FIFO, index shards inside the folder, safetensors header limits as the reference
// implementation, no file bytes echoed), non-finite weights refused naming the tensor (with the
// opt-in), configs checked against a schema and against the tensors present before any compute,
// outputs written through a temporary file that is removed on failure with the system's cause.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/io/config_json.h"
#include "backend/io/file_guard.h"
#include "backend/io/model_folder.h"
#include "backend/io/png_io.h"
#include "backend/io/safe_write.h"
#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_source.h"
#include "backend/pipelines/flux/pipeline_flux.h"
#include "backend/tokenizers/t5_tokenizer.h"
#include "golden_util.h"

using namespace dit;
namespace fs = std::filesystem;

using test::copyFixture;
using test::tempDir;
using test::writeRaw;

namespace {

// The message of what `fn` throws ("" and a failure when nothing is thrown).
template <typename F>
std::string errorOf(F fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return {};
}

#define EXPECT_HAS(msg, part) \
  EXPECT_NE((msg).find(part), std::string::npos) << "message: " << (msg) << "\nmissing: " << (part)

void editJson(const fs::path& f, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j;
  {
    std::ifstream in(f);
    j = nlohmann::json::parse(in);
  }
  edit(j);
  std::ofstream(f, std::ios::trunc) << j.dump();
}

// Fails the test (instead of hanging the suite) when a call blocks on a FIFO.
struct NoBlock {
  NoBlock() { ::alarm(20); }
  ~NoBlock() { ::alarm(0); }
};

bool leftovers(const fs::path& dir, const std::string& keep = "") {
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename() != keep) return true;
  return false;
}

}  // namespace

// ------------------------------------------------------------------ files are what they claim
TEST(SecurityFiles, FifoAndDevicesRefusedWithoutBlocking) {
  NoBlock guard;
  const fs::path d = tempDir("fifo");
  const fs::path fifo = d / "x.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::string m = errorOf([&] { SafetensorsReader r(fifo.string()); });
  EXPECT_HAS(m, fifo.string());
  EXPECT_HAS(m, "is a FIFO (named pipe), not a regular file");
  m = errorOf([&] { readConfigJson(fifo.string()); });
  EXPECT_HAS(m, "is a FIFO (named pipe), not a regular file");
  m = errorOf([&] { SafetensorsReader r("/dev/zero"); });
  EXPECT_HAS(m, "/dev/zero: is a character device, not a regular file");
  m = errorOf([&] { readConfigJson(d.string()); });
  EXPECT_HAS(m, "is a directory, not a regular file");

  // In a model folder: a FIFO config, a FIFO shard named by an index, a FIFO tokenizer file.
  fs::path model = copyFixture("fifo-model");
  fs::remove(model / "vae/config.json");
  ASSERT_EQ(::mkfifo((model / "vae/config.json").c_str(), 0644), 0);
  m = errorOf([&] { ModelFolder::open(model.string()); });
  EXPECT_HAS(m, (model / "vae/config.json").string() + ": is a FIFO");

  const fs::path idx = tempDir("fifo-index");
  ASSERT_EQ(::mkfifo((idx / "s.safetensors").c_str(), 0644), 0);
  std::ofstream(idx / "m.safetensors.index.json") << R"({"weight_map":{"a":"s.safetensors"}})";
  m = errorOf([&] { SafetensorsCollection c((idx / "m.safetensors.index.json").string()); });
  EXPECT_HAS(m, "is a FIFO");

  fs::path tok = copyFixture("fifo-tokenizer");
  fs::remove(tok / "tokenizer_2/spiece.model");
  ASSERT_EQ(::mkfifo((tok / "tokenizer_2/spiece.model").c_str(), 0644), 0);
  m = errorOf([&] { T5Tokenizer t((tok / "tokenizer_2").string()); });
  EXPECT_HAS(m, "is a FIFO");
}

TEST(SecurityFiles, IndexShardsStayInsideTheFolder) {
  const fs::path root = tempDir("index-escape");
  const fs::path model = root / "model";
  fs::create_directories(model);
  // A "secret" next to the model folder: its bytes must never appear in a message.
  const std::string secret = "SECRET-BYTES-0123456789-password=hunter2\n";
  std::ofstream(root / "secret.safetensors") << secret;
  std::ofstream(model / "inside.txt") << secret;
  const std::pair<std::string, std::string> cases[] = {
      {"../secret.safetensors", "outside the folder (a '..' part)"},
      {"sub/../../secret.safetensors", "outside the folder (a '..' part)"},
      {(root / "secret.safetensors").string(), "by an absolute path"},
      {"", "with an empty name"},
  };
  for (const auto& [shard, why] : cases) {
    std::ofstream(model / "m.safetensors.index.json", std::ios::trunc)
        << nlohmann::json{{"weight_map", {{"w", shard}}}}.dump();
    const std::string m =
        errorOf([&] { SafetensorsCollection c((model / "m.safetensors.index.json").string()); });
    EXPECT_HAS(m, "m.safetensors.index.json");
    EXPECT_HAS(m, "weight_map entry 'w'");
    EXPECT_HAS(m, why);
    EXPECT_EQ(m.find("SECRET"), std::string::npos) << m;
  }
  // A shard inside the folder that is not a safetensors file: refused without its bytes.
  std::ofstream(model / "m.safetensors.index.json", std::ios::trunc)
      << R"({"weight_map":{"w":"inside.txt"}})";
  const std::string m =
      errorOf([&] { SafetensorsCollection c((model / "m.safetensors.index.json").string()); });
  EXPECT_HAS(m, "inside.txt: header length field exceeds the limit of 100000000 bytes");
  EXPECT_EQ(m.find("SECRET"), std::string::npos) << m;
  EXPECT_EQ(m.find("hunter2"), std::string::npos) << m;
}

TEST(SecurityFiles, SafetensorsHeaderLimitsAsTheReference) {
  const fs::path d = tempDir("header");
  std::string m =
      errorOf([&] { SafetensorsReader r(writeRaw(d / "big.safetensors", "{}", 0, 100'000'001)); });
  EXPECT_HAS(m, "header length field exceeds the limit of 100000000 bytes");
  m = errorOf([&] { SafetensorsReader r(writeRaw(d / "start.safetensors", "[1]", 0)); });
  EXPECT_HAS(m, "header does not start with '{'");
  // Bytes no tensor claims: a gap, or trailing data.
  m = errorOf([&] {
    SafetensorsReader r(writeRaw(
        d / "gap.safetensors",
        R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
        12));
  });
  EXPECT_HAS(m, "tensor 'b' starts at data offset 8 but the data before it ends at 4");
  m = errorOf([&] {
    SafetensorsReader r(writeRaw(d / "trail.safetensors",
                                 R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 9));
  });
  EXPECT_HAS(m, "the tensors cover 4 bytes of the 9-byte data section");
  // Deep nesting in a header: an error, not a stack overflow; the parser's quote is not shown.
  std::string deep = "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  m = errorOf([&] { SafetensorsReader r(writeRaw(d / "deep.safetensors", deep, 0)); });
  EXPECT_HAS(m, "header nests JSON more than 64 levels deep");
  m = errorOf(
      [&] { SafetensorsReader r(writeRaw(d / "json.safetensors", "{\"SECRET\": tru", 0)); });
  EXPECT_HAS(m, "header is not valid JSON: syntax error at byte");
  EXPECT_EQ(m.find("SECRET"), std::string::npos) << m;
}

// Issue 35: a tensor named twice in a header is reported as such (the JSON parser kept the last
// entry, and the first one's bytes then read as a gap in the data section).
TEST(SecurityFiles, DuplicatedTensorNameInAHeaderNamed) {
  const fs::path d = tempDir("duplicate");
  const std::string f = writeRaw(
      d / "dup.safetensors",
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      8);
  std::string m = errorOf([&] { SafetensorsReader r(f); });
  EXPECT_HAS(m, f);
  EXPECT_HAS(m, "header lists the key 'w' twice");
  EXPECT_EQ(m.find("gap"), std::string::npos) << m;
  // In a nested object (an entry's own fields) too.
  const std::string g =
      writeRaw(d / "dup-field.safetensors",
               R"({"w":{"dtype":"F32","shape":[1],"dtype":"F16","data_offsets":[0,4]}})", 4);
  m = errorOf([&] { SafetensorsReader r(g); });
  EXPECT_HAS(m, "header lists the key 'dtype' twice in one nested object");
}

// ------------------------------------------------------------------ weights
namespace {
// Writes `value` over element `index` of float32 tensor `name` in the transformer checkpoint.
void poison(const fs::path& model, const std::string& name, float value, int64_t index = 0) {
  const fs::path f = model / "transformer/diffusion_pytorch_model.safetensors";
  uint64_t at = 0;
  {
    SafetensorsReader r(f.string());
    ASSERT_EQ(r.info(name).dtype, DType::F32);
    at = r.info(name).begin + static_cast<uint64_t>(index) * 4;
  }
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(static_cast<std::streamoff>(at));
  io.write(reinterpret_cast<const char*>(&value), 4);
}
}  // namespace

TEST(SecurityWeights, NonFiniteRefusedNamingTheTensor) {
  const fs::path model = copyFixture("nan");
  poison(model, "transformer_blocks.1.attn.to_q.weight", std::numeric_limits<float>::quiet_NaN(),
         5);
  poison(model, "transformer_blocks.1.attn.to_q.weight", std::numeric_limits<float>::infinity(), 9);
  const ModelFolder m = ModelFolder::open(model.string());
  setAllowNonFiniteWeights(false);
  std::string msg = errorOf([&] { FluxPipeline p(m, {}); });
  EXPECT_HAS(msg, (model / "transformer/diffusion_pytorch_model.safetensors").string());
  EXPECT_HAS(msg,
             "tensor 'transformer_blocks.1.attn.to_q.weight' holds 2 non-finite values "
             "(first: nan at flat index 5");
  EXPECT_HAS(msg, "--allow-nonfinite-weights");
  // bfloat16 compute: still caught after the conversion.
  PipelineOptions bf;
  bf.dtype = at::kBFloat16;
  msg = errorOf([&] { FluxPipeline p(m, bf); });
  EXPECT_HAS(msg, "non-finite values");
  // The opt-in loads it.
  setAllowNonFiniteWeights(true);
  EXPECT_NO_THROW(FluxPipeline p(m, {}));
  setAllowNonFiniteWeights(false);
}

// Issue 35: weights loaded anyway (--allow-nonfinite-weights) make NaN latents; the pipeline
// refuses the result instead of handing a black image on as a success.
TEST(SecurityWeights, NonFiniteLatentsAreAnErrorNotAnImage) {
  const fs::path model = copyFixture("nan-latents");
  poison(model, "proj_out.weight", std::numeric_limits<float>::quiet_NaN(), 3);
  const ModelFolder m = ModelFolder::open(model.string());
  setAllowNonFiniteWeights(true);
  FluxPipeline p(m, {});
  setAllowNonFiniteWeights(false);
  PipelineInputs in;
  in.prompt = "a lighthouse";
  in.width = 32;
  in.height = 32;
  in.steps = 2;
  in.max_sequence_length = 16;
  in.seed = 3;
  const std::string msg = errorOf([&] { p.generate(in, {}); });
  EXPECT_HAS(msg, "the denoised latents hold");
  EXPECT_HAS(msg, "non-finite value");
  EXPECT_HAS(msg, "after 2 steps");
  EXPECT_HAS(msg, "likely cause: the weights");
  EXPECT_HAS(msg, "No image was written");
}

// ------------------------------------------------------------------ configs
TEST(SecurityConfigs, SchemaRefusesBeforeAnyCompute) {
  struct Case {
    std::string file, key;
    nlohmann::json value;
    std::string message;
  };
  const Case cases[] = {
      {"transformer/config.json", "num_layers", -1,
       "config key 'num_layers' must be in 0 .. 1024, got -1"},
      {"transformer/config.json", "num_single_layers", int64_t(1) << 40,
       "config key 'num_single_layers' is out of range: 1099511627776"},
      {"transformer/config.json", "in_channels", int64_t(1) << 31,
       "config key 'in_channels' is out of range: 2147483648"},
      {"transformer/config.json", "num_attention_heads", 2.5,
       "config key 'num_attention_heads' has the wrong type: 2.5 (expected an integer)"},
      {"transformer/config.json", "axes_dims_rope", nlohmann::json::array({4, 6, 1}),
       "axes_dims_rope sizes must be even"},
      {"vae/config.json", "norm_num_groups", 0,
       "config key 'norm_num_groups' must be in 1 .. 65536, got 0"},
      {"vae/config.json", "norm_num_groups", 3, "norm_num_groups 3 does not divide"},
      {"vae/config.json", "block_out_channels", nlohmann::json::array({32, -32}),
       "config key 'block_out_channels' must be in 1 .. 65536, got -32"},
      {"vae/config.json", "scaling_factor", 0, "config key 'scaling_factor' must be in 1e-06"},
      {"scheduler/scheduler_config.json", "num_train_timesteps", 0,
       "config key 'num_train_timesteps' must be in 1 .. 1000000, got 0"},
      {"text_encoder/config.json", "num_hidden_layers", -3,
       "config key 'num_hidden_layers' must be in 1 .. 1024, got -3"},
      {"text_encoder_2/config.json", "d_model", int64_t(1) << 33,
       "config key 'd_model' is out of range: 8589934592"},
  };
  int n = 0;
  for (const Case& c : cases) {
    const fs::path model = copyFixture("config-" + std::to_string(n++));
    editJson(model / c.file, [&](nlohmann::json& j) {
      if (j.contains("text_config"))
        j["text_config"][c.key] = c.value;
      else
        j[c.key] = c.value;
    });
    // ModelFolder::open reads configs only: no weight, no tensor computed.
    const std::string msg = errorOf([&] { ModelFolder::open(model.string()); });
    EXPECT_HAS(msg, (model / c.file).string());
    EXPECT_HAS(msg, c.message);
  }
}

TEST(SecurityConfigs, ConfigMustDescribeTheTensorsPresent) {
  // num_layers 1 for a checkpoint with 2 double blocks: a different model, refused by name.
  fs::path model = copyFixture("fewer-layers");
  editJson(model / "transformer/config.json", [](nlohmann::json& j) { j["num_layers"] = 1; });
  std::string msg = errorOf([&] { FluxPipeline p(ModelFolder::open(model.string()), {}); });
  EXPECT_HAS(msg, "transformer/config.json");
  EXPECT_HAS(msg, "(num_layers 1, num_single_layers 2) does not describe these weights");
  EXPECT_HAS(msg,
             "of the checkpoint that the config has no place for (first: "
             "'transformer_blocks.1.");
  model = copyFixture("more-layers");
  editJson(model / "transformer/config.json",
           [](nlohmann::json& j) { j["num_single_layers"] = 3; });
  msg = errorOf([&] { FluxPipeline p(ModelFolder::open(model.string()), {}); });
  EXPECT_HAS(msg,
             "the config needs that the checkpoint lacks (first: "
             "'single_transformer_blocks.2.");
}

// ------------------------------------------------------------------ outputs
TEST(SecurityOutputs, NeverReplacesAFifoOrDevice) {
  NoBlock guard;
  const fs::path d = tempDir("out-fifo");
  const fs::path out = d / "image.png";
  ASSERT_EQ(::mkfifo(out.c_str(), 0644), 0);
  const std::vector<uint8_t> rgb(8 * 8 * 3, 100);
  std::string msg = errorOf([&] { writePng(out.string(), rgb.data(), 8, 8); });
  EXPECT_HAS(msg, "cannot write " + out.string() +
                      ": it is a FIFO (named pipe), not a regular file; refusing to replace it");
  struct stat st {};
  ASSERT_EQ(::lstat(out.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
  EXPECT_FALSE(leftovers(d, "image.png"));
  msg = errorOf([&] { writeSafetensors(out.string(), {{"t", RawTensor{DType::U8, {1}, {7}}}}); });
  EXPECT_HAS(msg, "it is a FIFO (named pipe)");
  // A symlink to a device (e.g. /dev/null) is not replaced either.
  fs::create_symlink("/dev/null", d / "null.png");
  msg = errorOf([&] { writePng((d / "null.png").string(), rgb.data(), 8, 8); });
  EXPECT_HAS(msg, "it is a symbolic link, not a regular file");
  EXPECT_TRUE(fs::is_symlink(d / "null.png"));
  // A regular file is replaced atomically; nothing else is left in the folder.
  std::ofstream(d / "ok.png") << "old";
  writePng((d / "ok.png").string(), rgb.data(), 8, 8);
  EXPECT_GT(fs::file_size(d / "ok.png"), 3u);
  fs::remove(out);
  fs::remove(d / "null.png");
  EXPECT_FALSE(leftovers(d, "ok.png"));
}

// Issue 35: a file that appears at the output path while the image is computed (after the
// request was accepted) is never replaced: the commit fails naming it and leaves it as it is,
// with nothing else left in the folder; a file that existed at acceptance (and the request
// allowed overwriting) is replaced.
TEST(SecurityOutputs, NeverReplacesAFileThatAppearedDuringTheRun) {
  const fs::path d = tempDir("out-appeared");
  const std::string out = (d / "image.png").string();
  const std::vector<uint8_t> rgb(8 * 8 * 3, 100);
  {
    const OutputReplacePolicy policy({});  // accepted: nothing existed, nothing may be replaced
    AtomicFile f(out);                     // the destination is absent now
    const char bytes[] = "new image";
    f.write(bytes, sizeof bytes);
    std::ofstream(out) << "someone else's file";  // appears meanwhile
    const std::string msg = errorOf([&] { f.commit(); });
    EXPECT_HAS(msg, "cannot write " + out + ": a file appeared there while the image was computed");
  }
  std::ifstream in(out);
  const std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "someone else's file");
  EXPECT_FALSE(leftovers(d, "image.png"));
  // Through writePng / writeSafetensors under the same policy.
  {
    const OutputReplacePolicy policy({});
    std::string msg = errorOf([&] { writePng(out, rgb.data(), 8, 8); });
    EXPECT_HAS(msg, "a file appeared there");
    msg = errorOf([&] { writeSafetensors(out, {{"t", RawTensor{DType::U8, {1}, {7}}}}); });
    EXPECT_HAS(msg, "a file appeared there");
    // An absent destination is written.
    writePng((d / "fresh.png").string(), rgb.data(), 8, 8);
    EXPECT_GT(fs::file_size(d / "fresh.png"), 8u);
  }
  EXPECT_EQ(fs::file_size(out), kept.size());
  // Existing when accepted, overwriting allowed: replaced (the same path spelled differently).
  {
    const OutputReplacePolicy policy({(d / "." / "image.png").string()});
    writePng(out, rgb.data(), 8, 8);
  }
  EXPECT_GT(fs::file_size(out), kept.size());
  fs::remove(d / "fresh.png");
  EXPECT_FALSE(leftovers(d, "image.png"));
}

TEST(SecurityOutputs, FailedWriteCarriesTheCauseAndLeavesNothing) {
  // The system refuses the write (RLIMIT_FSIZE: EFBIG, "File too large"): no temporary file
  // stays behind, the destination does not appear, the message has strerror's text.
  const fs::path d = tempDir("out-fsize");
  ::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 200;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::vector<uint8_t> rgb(64 * 64 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7919 % 251);
  const std::string msg = errorOf([&] { writePng((d / "big.png").string(), rgb.data(), 64, 64); });
  const std::string msg2 = errorOf([&] {
    writeSafetensors((d / "t.safetensors").string(),
                     {{"t", RawTensor{DType::U8, {4096}, std::vector<uint8_t>(4096, 1)}}});
  });
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  EXPECT_HAS(msg, "cannot write " + (d / "big.png").string() + ": " + std::strerror(EFBIG));
  EXPECT_HAS(msg2, std::strerror(EFBIG));
  EXPECT_FALSE(leftovers(d)) << "a temporary or partial file was left";
}

TEST(SecurityOutputs, NoSpaceLeftOnDevice) {
  // ENOSPC on a 64 KiB tmpfs: needs mount(2) (root in a container, as in CI); the RLIMIT test
  // above covers the same path without privileges.
  const fs::path d = tempDir("out-enospc");
  if (::mount("tmpfs", d.c_str(), "tmpfs", 0, "size=64k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "); FailedWriteCarriesTheCauseAndLeavesNothing covers the write path";
  std::vector<uint8_t> rgb(256 * 256 * 3);  // incompressible: ~196 KB of PNG on 64 KiB
  std::mt19937 g(5);
  for (auto& b : rgb) b = static_cast<uint8_t>(g());
  const std::string msg =
      errorOf([&] { writePng((d / "big.png").string(), rgb.data(), 256, 256); });
  const bool left = leftovers(d);
  ::umount(d.c_str());
  EXPECT_HAS(msg, std::strerror(ENOSPC));
  EXPECT_FALSE(left) << "a temporary or partial file was left on the full disk";
}
