// Model-file and request errors: each case asserts that loading fails with a message naming the
// file and the cause (never reading past the mapped file).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/family_runtime.h"
#include "backend/io/config_json.h"
#include "backend/io/model_folder.h"
#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_source.h"
#include "backend/models/family_registry.h"
#include "backend/models/flux/flux_plan.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/pipelines/flux/pipeline_flux.h"
#include "golden_util.h"
#include "parallel/strategy.h"

using namespace dit;
namespace fs = std::filesystem;

using test::copyFixture;
using test::tempDir;
using test::writeRaw;

namespace {

// Expects `fn` to throw ModelFileError whose message contains every `parts`.
template <typename F>
void expectError(F fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    FAIL() << "no error thrown";
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}

}  // namespace

TEST(SafetensorsErrors, MissingFile) {
  expectError([] { SafetensorsReader r("/nonexistent/x.safetensors"); },
              {"/nonexistent/x.safetensors", "cannot open"});
}

TEST(SafetensorsErrors, ShorterThanHeaderLength) {
  auto f = tempDir("short") / "a.safetensors";
  std::ofstream(f) << "abc";
  expectError([&] { SafetensorsReader r(f.string()); }, {f.string(), "truncated"});
}

TEST(SafetensorsErrors, HeaderLengthPastEnd) {
  auto f = writeRaw(tempDir("hlen") / "a.safetensors", "{}", 0, 1 << 20);
  expectError([&] { SafetensorsReader r(f); }, {f, "header length 1048576 runs past the end"});
}

TEST(SafetensorsErrors, BadJson) {
  auto f = writeRaw(tempDir("json") / "a.safetensors", "{\"a\": [1, 2", 0);
  expectError([&] { SafetensorsReader r(f); }, {f, "not valid JSON"});
}

TEST(SafetensorsErrors, OffsetsOutOfRange) {
  auto f = writeRaw(tempDir("range") / "a.safetensors",
                    R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  expectError([&] { SafetensorsReader r(f); }, {f, "tensor 'w'", "outside the data section"});
}

TEST(SafetensorsErrors, Overlapping) {
  auto f = writeRaw(
      tempDir("overlap") / "a.safetensors",
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
      24);
  expectError([&] { SafetensorsReader r(f); }, {f, "'a' and 'b' overlap"});
}

TEST(SafetensorsErrors, ShapeAndByteSizeDisagree) {
  auto f = writeRaw(tempDir("size") / "a.safetensors",
                    R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", 8);
  expectError([&] { SafetensorsReader r(f); },
              {f, "tensor 'w'", "need 12 bytes but data_offsets span 8"});
}

TEST(SafetensorsErrors, UnknownDtype) {
  auto f = writeRaw(tempDir("dtype") / "a.safetensors",
                    R"({"w":{"dtype":"F12","shape":[1],"data_offsets":[0,2]}})", 2);
  expectError([&] { SafetensorsReader r(f); }, {f, "unknown dtype 'F12'"});
}

TEST(SafetensorsErrors, GitLfsPointer) {
  auto f = tempDir("lfs") / "diffusion_pytorch_model.safetensors";
  std::ofstream(f) << "version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n";
  expectError([&] { SafetensorsReader r(f.string()); }, {f.string(), "git-lfs pointer"});
}

TEST(SafetensorsErrors, TruncatedRealFile) {
  auto d = tempDir("trunc");
  auto src = fs::path(test::fixtureDir()) / "vae/diffusion_pytorch_model.safetensors";
  auto f = d / "diffusion_pytorch_model.safetensors";
  fs::copy_file(src, f);
  fs::permissions(f, fs::perms::owner_write, fs::perm_options::add);
  fs::resize_file(f, fs::file_size(f) - 1000);
  expectError([&] { SafetensorsReader r(f.string()); }, {f.string(), "outside the data section"});
}

TEST(SafetensorsErrors, IndexNamesMissingShard) {
  auto d = tempDir("index-shard");
  std::ofstream(d / "m.safetensors.index.json")
      << R"({"weight_map":{"w":"m-00001-of-00002.safetensors"}})";
  expectError(
      [&] { SafetensorsCollection c((d / "m.safetensors.index.json").string()); },
      {"m.safetensors.index.json", "shard 'm-00001-of-00002.safetensors'", "does not exist"});
}

TEST(SafetensorsErrors, IndexNamesMissingTensor) {
  auto d = tempDir("index-tensor");
  writeRaw(d / "s.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  std::ofstream(d / "m.safetensors.index.json")
      << R"({"weight_map":{"a":"s.safetensors","b":"s.safetensors"}})";
  expectError([&] { SafetensorsCollection c((d / "m.safetensors.index.json").string()); },
              {"m.safetensors.index.json", "tensor 'b'", "does not contain it"});
}

TEST(SafetensorsErrors, IndexNotJson) {
  auto d = tempDir("index-json");
  std::ofstream(d / "m.safetensors.index.json") << "{weight_map";
  expectError([&] { SafetensorsCollection c((d / "m.safetensors.index.json").string()); },
              {"m.safetensors.index.json", "not valid JSON"});
}

TEST(SafetensorsRoundTrip, SliceReadsOnlyTheSlice) {
  auto d = tempDir("roundtrip");
  at::Tensor w = at::arange(24, at::kFloat).view({4, 6});
  saveTensors((d / "t.safetensors").string(), {{"w", w}, {"b", w.to(at::kBFloat16)}});
  SafetensorsCollection c((d / "t.safetensors").string());
  EXPECT_TRUE(loadTensor(c, "w", at::kFloat).equal(w));
  EXPECT_TRUE(loadSlice(c, "w", 0, 1, 2, at::kFloat).equal(w.slice(0, 1, 3)));
  EXPECT_TRUE(loadSlice(c, "w", 1, 2, 3, at::kFloat).equal(w.slice(1, 2, 5)));
  EXPECT_TRUE(loadSlice(c, "b", 1, 3, 3, at::kFloat).equal(w.slice(1, 3, 6)));
  EXPECT_TRUE(loadPackedSlice(c, "w", 1, {4, 2}, 1, 2, at::kFloat)
                  .equal(at::cat({w.slice(1, 2, 4), w.slice(1, 5, 6)}, 1)));
  expectError([&] { loadSlice(c, "w", 1, 4, 3, at::kFloat); }, {"t.safetensors", "does not fit"});
}

TEST(ModelFolderErrors, MissingFolder) {
  expectError([] { ModelFolder::open("/nonexistent/model"); },
              {"/nonexistent/model", "does not exist"});
}

TEST(ModelFolderErrors, MissingComponent) {
  auto d = copyFixture("nocomp");
  fs::remove_all(d / "vae");
  expectError([&] { ModelFolder::open(d.string()); },
              {(d / "vae").string(), "component folder is missing"});
}

TEST(ModelFolderErrors, MissingModelIndex) {
  auto d = copyFixture("noindex");
  fs::remove(d / "model_index.json");
  expectError([&] { ModelFolder::open(d.string()); }, {"model_index.json", "missing"});
}

TEST(ModelFolderErrors, MissingWeightsFile) {
  auto d = copyFixture("noweights");
  fs::remove(d / "transformer/diffusion_pytorch_model.safetensors");
  auto m = ModelFolder::open(d.string());
  expectError([&] { FluxPipeline p(m, {}); },
              {(d / "transformer").string(), "no diffusion_pytorch_model.safetensors"});
}

TEST(ModelFolderErrors, ConfigDisagreesWithWeights) {
  auto d = copyFixture("mismatch");
  {
    std::ifstream in(d / "transformer/config.json");
    auto j = nlohmann::json::parse(in);
    j["joint_attention_dim"] = 48;
    std::ofstream(d / "transformer/config.json") << j.dump();
  }
  auto m = ModelFolder::open(d.string());
  expectError([&] { FluxPipeline p(m, {}); },
              {"context_embedder.weight", "has shape [64, 32]", "[64, 48]"});
}

TEST(ModelFolderErrors, CorruptTransformerWeights) {
  auto d = copyFixture("corrupt");
  auto f = d / "transformer/diffusion_pytorch_model.safetensors";
  fs::resize_file(f, fs::file_size(f) / 2);
  auto m = ModelFolder::open(d.string());
  expectError([&] { FluxPipeline p(m, {}); }, {f.string(), "outside the data section"});
}

// Registries keyed by diffusers _class_name: an unknown class is refused naming it, the file it
// came from, and listing the supported classes.
void setClassName(const fs::path& file, const std::string& cls) {
  nlohmann::json j;
  {
    std::ifstream in(file);
    j = nlohmann::json::parse(in);
  }
  j["_class_name"] = cls;
  std::ofstream(file) << j.dump();
}

TEST(ModelRegistry, FixtureDispatchesToFlux) {
  const auto m = ModelFolder::open(test::fixtureDir());
  EXPECT_EQ(m.pipeline_class, "FluxPipeline");
  EXPECT_EQ(m.transformer_class, "FluxTransformer2DModel");
  const auto& c = fluxConfig(m);
  EXPECT_EQ(m.dims().num_attention_heads, c.transformer.num_attention_heads);
  EXPECT_EQ(m.dims().attention_head_dim, c.transformer.attention_head_dim);
  EXPECT_EQ(m.dims().vae_scale_factor, c.vae.vaeScaleFactor());
  EXPECT_EQ(supportedPipelineClasses(),
            (std::vector<std::string>{"FluxPipeline", "FluxKontextPipeline", "Flux2KleinPipeline",
                                      "Flux2KleinKVPipeline", "Flux2Pipeline", "QwenImagePipeline",
                                      "ZImagePipeline"}));
  EXPECT_EQ(supportedTransformerClasses(),
            (std::vector<std::string>{"FluxTransformer2DModel", "Flux2Transformer2DModel",
                                      "QwenImageTransformer2DModel", "ZImageTransformer2DModel"}));
}

TEST(ModelRegistry, UnknownPipelineClassRefused) {
  auto d = copyFixture("unknownpipe");
  setClassName(d / "model_index.json", "StableDiffusion3Pipeline");
  expectError([&] { ModelFolder::open(d.string()); },
              {(d / "model_index.json").string(),
               "pipeline class \"StableDiffusion3Pipeline\" is not supported",
               "supported pipeline classes: FluxPipeline, FluxKontextPipeline, Flux2KleinPipeline, "
               "Flux2KleinKVPipeline, Flux2Pipeline, QwenImagePipeline, ZImagePipeline"});
  try {
    ModelFolder::open(d.string());
  } catch (const UnsupportedModelError&) {
    SUCCEED();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected UnsupportedModelError, got " << e.what();
  }
}

TEST(ModelRegistry, UnknownTransformerClassRefused) {
  auto d = copyFixture("unknowntransformer");
  setClassName(d / "transformer/config.json", "SD3Transformer2DModel");
  expectError([&] { ModelFolder::open(d.string()); },
              {(d / "transformer/config.json").string(),
               "transformer class \"SD3Transformer2DModel\" is not supported",
               "supported transformer classes: FluxTransformer2DModel, Flux2Transformer2DModel, "
               "QwenImageTransformer2DModel, ZImageTransformer2DModel"});
}

TEST(ModelRegistry, MissingPipelineClassRefused) {
  auto d = copyFixture("noclass");
  {
    std::ifstream in(d / "model_index.json");
    auto j = nlohmann::json::parse(in);
    in.close();
    j.erase("_class_name");
    std::ofstream(d / "model_index.json") << j.dump();
  }
  expectError([&] { ModelFolder::open(d.string()); }, {"model_index.json", "no \"_class_name\""});
}

TEST(ModelRegistry, TransformerClassFallsBackToModelIndex) {
  auto d = copyFixture("noconfigclass");
  {
    std::ifstream in(d / "transformer/config.json");
    auto j = nlohmann::json::parse(in);
    in.close();
    j.erase("_class_name");
    std::ofstream(d / "transformer/config.json") << j.dump();
  }
  EXPECT_EQ(ModelFolder::open(d.string()).transformer_class, "FluxTransformer2DModel");
}

// model_index.json "_dit_studio_default_settings": read when well formed (the fixture has none),
// refused naming the file and the setting when not.
TEST(ModelFolderErrors, DefaultSettingsCheckedAndRead) {
  EXPECT_EQ(ModelFolder::open(copyFixture("nosettings").string()).default_settings, "");
  auto d = copyFixture("settings");
  auto setSettings = [&](const nlohmann::json& v) {
    std::ifstream in(d / "model_index.json");
    auto j = nlohmann::json::parse(in);
    in.close();
    j["_dit_studio_default_settings"] = v;
    std::ofstream(d / "model_index.json") << j.dump();
  };
  setSettings({{"steps", 20}, {"negative_prompt", ""}, {"true_cfg_scale", 4.5}});
  const auto settings = nlohmann::json::parse(ModelFolder::open(d.string()).default_settings);
  EXPECT_EQ(settings.at("steps"), 20);
  EXPECT_EQ(settings.at("negative_prompt"), "");
  EXPECT_EQ(settings.at("true_cfg_scale"), 4.5);
  const std::string idx = (d / "model_index.json").string();
  setSettings({{"sampler", "euler"}});
  expectError([&] { ModelFolder::open(d.string()); }, {idx, "unknown setting \"sampler\""});
  setSettings({{"steps", 2.5}});
  expectError([&] { ModelFolder::open(d.string()); }, {idx, "\"steps\" must be an integer"});
  setSettings("cfg 5");
  expectError([&] { ModelFolder::open(d.string()); }, {idx, "is not a JSON object"});
}

TEST(ModelRegistry, TorchTablesMatchTheConfigTables) {
  // Every family with a config reader can be loaded, and nothing else.
  EXPECT_EQ(loadablePipelineClasses(), supportedPipelineClasses());
  EXPECT_EQ(loadableTransformerClasses(), supportedTransformerClasses());
}

TEST(ModelRegistry, LoadPipelineDispatchesOnClassName) {
  const auto m = ModelFolder::open(test::fixtureDir());
  const std::unique_ptr<DiffusionPipeline> p = loadPipeline(m, {});
  ASSERT_NE(dynamic_cast<FluxPipeline*>(p.get()), nullptr);
  const auto& c = fluxConfig(m);
  const PipelineModelInfo i = p->info();
  EXPECT_EQ(i.num_attention_heads, 4);
  EXPECT_EQ(i.inner_dim, 64);
  EXPECT_EQ(i.num_layers, 2);
  EXPECT_EQ(i.num_single_layers, 2);
  EXPECT_EQ(i.vae_scale_factor, 2);
  EXPECT_TRUE(i.guidance_embeds);
  EXPECT_EQ(i.default_steps, 28);
  EXPECT_EQ(i.max_sequence_length, std::min(512, c.t5_max_length));
  EXPECT_EQ(m.config->max_sequence_length, std::min(512, c.t5_max_length));
  // resolve() fills the same default text length.
  EXPECT_EQ(p->resolve(PipelineInputs{}).max_sequence_length, i.max_sequence_length);
  EXPECT_EQ(p->transformer().parameters().size(), m.dims().parameters->size());
}

TEST(ModelRegistry, LoadPipelineRefusesUnknownClass) {
  ModelFolder m = ModelFolder::open(test::fixtureDir());
  m.pipeline_class = "StableDiffusion3Pipeline";  // as if a folder of another family got this far
  expectError([&] { (void)loadPipeline(m, {}); },
              {(fs::path(m.path) / "model_index.json").string(), "\"StableDiffusion3Pipeline\"",
               "supported pipeline classes: FluxPipeline, FluxKontextPipeline, Flux2KleinPipeline, "
               "Flux2KleinKVPipeline, Flux2Pipeline, QwenImagePipeline, ZImagePipeline"});
}

TEST(ModelRegistry, LoadTransformerByClassName) {
  const auto m = ModelFolder::open(test::fixtureDir());
  const std::string file = m.component("transformer") + "/config.json";
  const nlohmann::json cfg = readConfigJson(file);
  auto w = WeightSource::fromFolder(m.component("transformer"), "diffusion_pytorch_model",
                                    at::kFloat, c10::Device(at::kCPU));
  const std::unique_ptr<DiffusionTransformer> t =
      loadTransformer(m.transformer_class, cfg, file, *w);
  ASSERT_NE(dynamic_cast<FluxTransformer2DModel*>(t.get()), nullptr);
  EXPECT_EQ(t->parameters().size(), m.dims().parameters->size());
  auto w2 = WeightSource::random(1, at::kFloat, c10::Device(at::kCPU));
  expectError([&] { (void)loadTransformer("SD3Transformer2DModel", cfg, file, *w2); },
              {file, "transformer class \"SD3Transformer2DModel\" is not supported",
               "supported transformer classes: FluxTransformer2DModel, Flux2Transformer2DModel, "
               "QwenImageTransformer2DModel, ZImageTransformer2DModel"});

  // forward by name is the positional forward, bit for bit; names are checked.
  const auto& fc = fluxConfig(m).transformer;
  auto& f = dynamic_cast<FluxTransformer2DModel&>(*t);
  auto gen = at::detail::createCPUGenerator(7);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor hs = at::randn({1, 16, fc.in_channels}, gen, f32);
  const at::Tensor enc = at::randn({1, 8, fc.joint_attention_dim}, gen, f32);
  const at::Tensor pooled = at::randn({1, fc.pooled_projection_dim}, gen, f32);
  const at::Tensor ts = at::full({1}, 0.5, f32), g = at::full({1}, 3.5, f32);
  const at::Tensor img = FluxPipeline::latentImageIds(4, 4), txt = at::zeros({8, 3}, f32);
  const at::Tensor a = f.forward(hs, enc, pooled, ts, img, txt, g);
  TransformerInputs in{{"hidden_states", hs},
                       {"encoder_hidden_states", enc},
                       {"pooled_projections", pooled},
                       {"timestep", ts},
                       {"img_ids", img},
                       {"txt_ids", txt},
                       {"guidance", g}};
  EXPECT_TRUE(at::equal(t->forward(in), a));
  EXPECT_DOUBLE_EQ(t->forwardFlops(16, 8), FluxTransformer2DModel::flops(fc, 16, 8));
  TransformerInputs missing = in;
  missing.erase("txt_ids");
  expectError([&] { (void)t->forward(missing); }, {"input 'txt_ids' is missing"});
  TransformerInputs extra = in;
  extra["encoder_attention_mask"] = txt;
  expectError([&] { (void)t->forward(extra); },
              {"unknown input 'encoder_attention_mask'", "accepted inputs"});
}

TEST(ModelRegistry, FamilyDeclaresItsContextParallelPlan) {
  const auto m = ModelFolder::open(test::fixtureDir());
  ASSERT_TRUE(m.dims().context_parallel_plan);
  const ContextParallelPlan& p = *m.dims().context_parallel_plan;
  ASSERT_EQ(p.inputs.size(), 4u);
  EXPECT_EQ(p.inputs[0].name, "hidden_states");
  EXPECT_EQ(p.inputs[0].split_dim, 1);
  EXPECT_EQ(p.inputs[2].name, "img_ids");
  EXPECT_EQ(p.inputs[2].split_dim, 0);
  EXPECT_EQ(p.output.sizes_from, "hidden_states");
  EXPECT_EQ(p.joint_sequence, (std::vector<std::string>{"encoder_hidden_states", "hidden_states"}));
}

TEST(RequestErrors, SizeNotMultipleOfPatch) {
  static FluxPipeline p(ModelFolder::open(test::fixtureDir()), {});
  PipelineInputs g;
  g.width = 30;
  g.height = 32;
  expectError([&] { p.resolve(g); },
              {"multiples of 4", "2 x vae_scale_factor 2", "30x32", "try 28x32"});
}

TEST(RequestErrors, UnknownDtype) {
  expectError([] { parseComputeDType("float64"); },
              {"unknown dtype 'float64'", "float32, bfloat16 or float16"});
}

TEST(TensorParallelPlan, RefusesDegreesThatDoNotDivide) {
  auto m = ModelFolder::open(test::fixtureDir());
  // The strategy rules through the transformer family's declared plan (what the worker, the CLI,
  // the GUI and FluxPipeline run before reading a weight).
  auto validateTp = [&m](int tp) {
    Strategy s;
    s.world = s.tp_degree = tp;
    auto issues = validateDegrees(s);
    if (issues.empty()) issues = validateForModel(s, m.dims());
    return joinIssues(issues);
  };
  EXPECT_EQ(validateTp(1), "");
  EXPECT_EQ(validateTp(4), "");
  const std::string msg = validateTp(3);
  EXPECT_NE(msg.find("tp_degree 3 does not divide num_attention_heads 4"), std::string::npos)
      << msg;
  // Every sharded dimension the plan declares, named by its rule patterns: 64 = inner_dim
  // (colwise dim 0, rowwise dim 1, packed block 0), 256 = the mlp hidden size.
  EXPECT_NE(msg.find("tp_degree 3 does not divide 64, the size of dimension 0 (ColwiseParallel) of "
                     "transformer_blocks.*.attn.to_q"),
            std::string::npos)
      << msg;
  EXPECT_NE(
      msg.find("tp_degree 3 does not divide 256, the size of block 1 of [64, 256] on dimension 1 "
               "(PackedRowwiseParallel) of single_transformer_blocks.*.proj_out"),
      std::string::npos)
      << msg;
  EXPECT_NE(validateTp(8).find("does not divide num_attention_heads 4"), std::string::npos);
}

// The FLUX.1 parameter table (what the tensor-parallel plan is validated against) is exactly the
// checkpoint's tensors: same names, same shapes; and the plan has no stale rule on it.
TEST(TensorParallelPlan, FluxParameterTableMatchesTheCheckpoint) {
  auto m = ModelFolder::open(test::fixtureDir());
  const ParameterTable table = fluxParameterTable(fluxConfig(m).transformer);
  const auto st = SafetensorsCollection::openFolder(
      test::fixtureDir() + std::string("/transformer"), "diffusion_pytorch_model");
  EXPECT_EQ(table.size(), st.names().size());
  for (const auto& name : st.names()) {
    const ParameterInfo* p = table.find(name);
    ASSERT_NE(p, nullptr) << name << " is in the checkpoint but not declared";
    EXPECT_EQ(p->shape, st.info(name).shape) << name;
  }
  EXPECT_TRUE(fluxShardingPlan(fluxConfig(m).transformer).validate(table, 4).empty());
  EXPECT_TRUE(fluxShardingPlan(fluxConfig(m).transformer).validate(table, 1).empty());
}

TEST(RequestErrors, NegativeAndHugeSizes) {
  static FluxPipeline p(ModelFolder::open(test::fixtureDir()), {});
  PipelineInputs g;
  g.width = -64;
  expectError([&] { p.resolve(g); }, {"cannot be negative"});
  g.width = 100000;
  g.height = 64;
  expectError([&] { p.resolve(g); }, {"limited to 16384 pixels", "100000x64"});
  g.width = 64;
  g.steps = -3;
  expectError([&] { p.resolve(g); }, {"cannot be negative"});
}

TEST(RequestErrors, HalfOnCpuRefused) {
  PipelineOptions o;
  o.dtype = at::kHalf;
  expectError([&] { FluxPipeline p(ModelFolder::open(test::fixtureDir()), o); },
              {"float16 is not supported on the CPU"});
}
