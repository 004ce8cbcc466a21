// Every JSON file a model folder of each family is read from goes through the same guards: a file
// whose top level is not a JSON object ([1,2,3], "x", 5, null) is refused naming that file, by
// ModelFolder::open where the family parses it there, else by the pipeline load (issue 48).
// Table-driven over the four families' test fixtures; the table must list every JSON file a
// fixture holds, so a file added to a family is not silently left out. And a config whose own
// metadata (_class_name, model_type) declares another component is refused naming what it says.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/family_runtime.h"
#include "backend/io/model_folder.h"
#include "backend/models/checkpoint_layouts.h"
#include "backend/pipelines/diffusion_pipeline.h"

using namespace dit;
namespace fs = std::filesystem;

namespace {

// Where a file is first parsed: ModelFolder::open, the pipeline load, or never (Unread: the
// family does not read it, so its content cannot matter; asserted too).
enum class Stage { Open, Load, Unread };

struct FamilyCase {
  const char* fixture;
  // Every JSON file the family reads, relative to the folder, and where it is first parsed.
  std::vector<std::pair<const char*, Stage>> files;
};

const std::vector<FamilyCase>& familyCases() {
  static const std::vector<FamilyCase> c = {
      {"tiny-flux-A",
       {{"model_index.json", Stage::Open},
        {"transformer/config.json", Stage::Open},
        {"text_encoder/config.json", Stage::Open},
        {"text_encoder_2/config.json", Stage::Open},
        {"vae/config.json", Stage::Open},
        {"scheduler/scheduler_config.json", Stage::Open},
        {"tokenizer/tokenizer_config.json", Stage::Open},
        {"tokenizer_2/tokenizer_config.json", Stage::Open},
        {"tokenizer/special_tokens_map.json", Stage::Load},
        {"tokenizer/vocab.json", Stage::Load},
        // T5Tokenizer reads tokenizer_config.json only (its special tokens are there too).
        {"tokenizer_2/special_tokens_map.json", Stage::Unread}}},
      {"tiny-flux2-A",
       {{"model_index.json", Stage::Open},
        {"transformer/config.json", Stage::Open},
        {"text_encoder/config.json", Stage::Open},
        {"vae/config.json", Stage::Open},
        {"scheduler/scheduler_config.json", Stage::Open},
        {"tokenizer/tokenizer.json", Stage::Load},
        {"tokenizer/tokenizer_config.json", Stage::Load},
        {"tokenizer/vocab.json", Stage::Load}}},
      {"tiny-zimage-A",
       {{"model_index.json", Stage::Open},
        {"transformer/config.json", Stage::Open},
        {"text_encoder/config.json", Stage::Open},
        {"vae/config.json", Stage::Open},
        {"scheduler/scheduler_config.json", Stage::Open},
        {"tokenizer/tokenizer.json", Stage::Load},
        {"tokenizer/tokenizer_config.json", Stage::Load},
        {"tokenizer/vocab.json", Stage::Load}}},
      {"tiny-qwenimage-A",
       {{"model_index.json", Stage::Open},
        {"transformer/config.json", Stage::Open},
        {"text_encoder/config.json", Stage::Open},
        {"vae/config.json", Stage::Open},
        {"scheduler/scheduler_config.json", Stage::Open},
        {"tokenizer/tokenizer.json", Stage::Load},
        {"tokenizer/tokenizer_config.json", Stage::Load},
        {"tokenizer/vocab.json", Stage::Load}}},
  };
  return c;
}

// The fixture copied into a fresh temporary folder without its goldens and test reports.
fs::path copyOf(const std::string& fixture) {
  const fs::path d = fs::temp_directory_path() /
                     ("ditstudio-config-guards-" + std::to_string(::getpid())) / fixture;
  fs::remove_all(d);
  fs::create_directories(d.parent_path());
  fs::copy(fs::path(DITSTUDIO_TEST_DATA) / fixture, d, fs::copy_options::recursive);
  for (const char* extra : {"golden", "lora", "pipelines"}) fs::remove_all(d / extra);
  for (auto& e : fs::recursive_directory_iterator(d))
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void put(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

// The message of what `fn` throws; "" (and a test failure) when it does not throw.
template <typename F>
std::string errorOf(F fn, const std::string& what) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  ADD_FAILURE() << what << ": no error";
  return {};
}

}  // namespace

TEST(ConfigGuards, TheTableListsEveryJsonFileOfEachFixture) {
  for (const FamilyCase& fc : familyCases()) {
    const fs::path d = copyOf(fc.fixture);
    std::set<std::string> onDisk, listed;
    for (auto& e : fs::recursive_directory_iterator(d))
      if (e.is_regular_file() && e.path().extension() == ".json")
        onDisk.insert(fs::relative(e.path(), d).string());
    for (const auto& [f, stage] : fc.files) listed.insert(f);
    EXPECT_EQ(onDisk, listed) << fc.fixture;
    fs::remove_all(d);
  }
}

TEST(ConfigGuards, ATopLevelThatIsNotAnObjectIsRefusedNamingTheFile) {
  const std::vector<std::pair<std::string, std::string>> values = {
      {"[1,2,3]", "an array"}, {"\"x\"", "a string"}, {"5", "a number"}, {"null", "null"}};
  for (const FamilyCase& fc : familyCases()) {
    const fs::path d = copyOf(fc.fixture);
    ASSERT_NO_THROW((void)ModelFolder::open(d.string())) << fc.fixture << " as copied";
    for (const auto& [rel, stage] : fc.files) {
      const fs::path file = d / rel;
      const std::string original = slurp(file);
      ASSERT_FALSE(original.empty()) << file;
      for (const auto& [value, kind] : values) {
        SCOPED_TRACE(std::string(fc.fixture) + "/" + rel + " = " + value);
        put(file, value);
        std::string msg;
        if (stage == Stage::Open) {
          msg = errorOf([&] { (void)ModelFolder::open(d.string()); }, "ModelFolder::open");
          // The configs are read by readConfigJson, which says what the top level is.
          EXPECT_NE(msg.find("not a JSON object (its top level is " + kind + ")"),
                    std::string::npos)
              << msg;
        } else if (stage == Stage::Load) {
          ModelFolder m;
          ASSERT_NO_THROW(m = ModelFolder::open(d.string()));
          msg = errorOf([&] { (void)loadPipeline(m, PipelineOptions{}); }, "loadPipeline");
          EXPECT_NE(msg.find("JSON object"), std::string::npos) << msg;
        } else {
          ModelFolder m;
          ASSERT_NO_THROW(m = ModelFolder::open(d.string()));
          EXPECT_NO_THROW((void)loadPipeline(m, PipelineOptions{}));
          continue;
        }
        EXPECT_EQ(msg.rfind(file.string() + ": ", 0), 0u)
            << "does not start with the file: " << msg;
      }
      put(file, original);
    }
    // Every file restored: the folder opens and loads again.
    ModelFolder m;
    ASSERT_NO_THROW(m = ModelFolder::open(d.string())) << fc.fixture;
    EXPECT_NO_THROW((void)loadPipeline(m, PipelineOptions{})) << fc.fixture;
    fs::remove_all(d);
  }
}

TEST(ConfigGuards, AConfigDeclaringAnotherComponentIsRefusedNamingWhatItDeclares) {
  struct Declared {
    const char* fixture;
    const char* file;
    const char* key;
    const char* value;
  };
  const Declared cases[] = {
      {"tiny-flux-A", "scheduler/scheduler_config.json", "_class_name", "DDIMScheduler"},
      {"tiny-flux-A", "vae/config.json", "_class_name", "AutoencoderKLQwenImage"},
      {"tiny-flux-A", "text_encoder/config.json", "model_type", "t5"},
      {"tiny-flux-A", "text_encoder_2/config.json", "model_type", "clip_text_model"},
      {"tiny-flux2-A", "text_encoder/config.json", "model_type", "qwen2_5_vl"},
      {"tiny-zimage-A", "scheduler/scheduler_config.json", "_class_name",
       "UniPCMultistepScheduler"},
      {"tiny-zimage-A", "text_encoder/config.json", "model_type", "mistral"},
      {"tiny-qwenimage-A", "text_encoder/config.json", "model_type", "qwen3"},
      {"tiny-qwenimage-A", "vae/config.json", "_class_name", "AutoencoderKL"},
      // Tokenizer folders, read at load (FLUX.1's CLIP config also at open).
      {"tiny-flux-A", "tokenizer/tokenizer_config.json", "tokenizer_class", "T5Tokenizer"},
      {"tiny-flux-A", "tokenizer_2/tokenizer_config.json", "tokenizer_class", "CLIPTokenizer"},
      {"tiny-zimage-A", "tokenizer/tokenizer_config.json", "tokenizer_class", "LlamaTokenizer"},
  };
  for (const Declared& c : cases) {
    SCOPED_TRACE(std::string(c.fixture) + "/" + c.file + " " + c.key + " = " + c.value);
    const fs::path d = copyOf(c.fixture);
    const fs::path file = d / c.file;
    nlohmann::json j = nlohmann::json::parse(slurp(file));
    j[c.key] = c.value;
    put(file, j.dump(2));
    const std::string msg = errorOf(
        [&] {
          const ModelFolder m = ModelFolder::open(d.string());
          (void)loadPipeline(m, PipelineOptions{});
        },
        "open and load");
    EXPECT_EQ(msg.rfind(file.string() + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(std::string("declares ") + c.key + " \"" + c.value + "\""),
              std::string::npos)
        << msg;
    fs::remove_all(d);
  }
}

// Single files whose metadata names another architecture: a GGUF's general.architecture, a
// safetensors transformer's modelspec.architecture (the shared fixtures' FLUX.1 files, edited).
TEST(ConfigGuards, ACheckpointDeclaringAnotherArchitectureIsRefusedNamingIt) {
  const fs::path shared = DITSTUDIO_SHARED_FIXTURES;
  const fs::path gguf = shared / "tiny-flux-gguf-A" / "gguf" / "transformer-Q8_0.gguf";
  const fs::path bfl = shared / "tiny-flux-A" / "formats" / "transformer-bfl.safetensors";
  if (!fs::exists(gguf) || !fs::exists(bfl)) GTEST_SKIP() << "no shared fixtures at " << shared;
  const fs::path d = fs::temp_directory_path() /
                     ("ditstudio-config-guards-" + std::to_string(::getpid())) / "declared";
  fs::remove_all(d);
  fs::create_directories(d);
  // GGUF: "flux" -> "sdxl" in place (same length).
  std::string g = slurp(gguf);
  const size_t key = g.find("general.architecture");
  ASSERT_NE(key, std::string::npos);
  const size_t value = g.find("flux", key);
  ASSERT_LT(value, key + 64);
  EXPECT_NO_THROW((void)inspectCheckpoint(gguf.string()));
  g.replace(value, 4, "sdxl");
  const fs::path badGguf = d / "transformer.gguf";
  put(badGguf, g);
  std::string msg = errorOf([&] { (void)inspectCheckpoint(badGguf.string()); }, "gguf");
  EXPECT_EQ(msg.rfind(badGguf.string() + ": declares general.architecture \"sdxl\"", 0), 0u) << msg;
  // safetensors: the header rewritten with a model spec.
  const std::string s = slurp(bfl);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(s[static_cast<size_t>(i)]);
  nlohmann::json header = nlohmann::json::parse(s.substr(8, n));
  auto withSpec = [&](const std::string& arch) {
    header["__metadata__"]["modelspec.architecture"] = arch;
    const std::string h = header.dump();
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i)
      out[static_cast<size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
    const fs::path f = d / ("transformer-" + std::to_string(arch.size()) + ".safetensors");
    put(f, out + h + s.substr(8 + n));
    return f;
  };
  const fs::path flux = withSpec("flux-1-dev");
  EXPECT_NO_THROW((void)inspectCheckpoint(flux.string()));
  const fs::path sdxl = withSpec("stable-diffusion-xl-v1-base");
  msg = errorOf([&] { (void)inspectCheckpoint(sdxl.string()); }, "safetensors");
  EXPECT_EQ(
      msg.rfind(sdxl.string() + ": declares modelspec.architecture \"stable-diffusion-xl-v1-base\"",
                0),
      0u)
      << msg;
  fs::remove_all(d);
}
