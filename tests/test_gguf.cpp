// GGUF checkpoints (issue 33) on ../shared/fixtures/tiny-flux-gguf-A (README there): the reader
// (header, metadata, tensor infos in torch order), the dequantization of every tensor of every one
// of the 12 files against ggml's own (SHA-256 of the float32 bytes in gguf_report.json, and the
// rows of dequant_rows.safetensors at 0 ulp), and refusals of broken files naming the file, the
// tensor and the cause.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "backend/io/gguf.h"
#include "backend/io/gguf_types.h"
#include "backend/io/model_folder.h"
#include "backend/io/safetensors.h"
#include "backend/io/sha256.h"
#include "backend/io/stored_weight_bytes.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_source.h"
#include "backend/models/checkpoint_layouts.h"
#include "backend/models/flux/flux_bfl_config.h"
#include "backend/models/flux/flux_plan.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"
#include "backend/pipelines/flux/pipeline_flux.h"
#include "gguf_test_util.h"
#include "golden_util.h"

using namespace dit;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const json& report() {
  static const json r = [] {
    std::ifstream in(test::ggufFixture("gguf/gguf_report.json"));
    return json::parse(in);
  }();
  return r;
}

// Whole tensor `i` of `r` dequantized to float32, row-major (torch order).
std::vector<float> dequantAll(const SafetensorsReader& r, const TensorInfo& i) {
  const GgmlType t = test::ggmlTypeOf(i.dtype);
  int64_t n = i.numel();
  const int64_t width = i.shape.empty() ? 1 : i.shape.back();
  std::vector<float> out(static_cast<size_t>(n));
  const int64_t rows = width ? n / width : 0;
  const uint8_t* p = r.data(i);
  for (int64_t row = 0; row < rows; ++row)
    dequantizeGgml(t, p + row * ggmlRowBytes(t, width), out.data() + row * width, width);
  return out;
}

}  // namespace

TEST(Gguf, HeaderMetadataAndTensorInfos) {
  for (const auto& [type, rep] : report()["types"].items()) {
    SafetensorsReader r(test::ggufFile(type));
    ASSERT_TRUE(r.isGguf());
    EXPECT_EQ(r.ggufHeader()->version, 3u);
    EXPECT_EQ(r.ggufHeader()->dataOffset, rep["data_start"].get<uint64_t>()) << type;
    EXPECT_EQ(r.fileSize(), rep["file_bytes"].get<uint64_t>());
    EXPECT_EQ(r.metadata().at("general.architecture"), "flux");
    EXPECT_EQ(r.metadata().at("general.file_type"),
              std::to_string(rep["kv"]["general.file_type"]["value"].get<int>()));
    EXPECT_EQ(r.names().size(), 52u);
    std::map<std::string, int> counts;
    for (const auto& [name, t] : rep["tensors"].items()) {
      const TensorInfo& i = r.info(name);
      EXPECT_EQ(dtypeName(i.dtype), t["ggml_type"].get<std::string>()) << type << " " << name;
      EXPECT_EQ(i.shape, t["torch_shape"].get<std::vector<int64_t>>()) << name;
      EXPECT_EQ(i.begin, r.ggufHeader()->dataOffset + t["offset"].get<uint64_t>()) << name;
      EXPECT_EQ(i.nbytes(), t["nbytes"].get<uint64_t>()) << name;
      counts[dtypeName(i.dtype)]++;
    }
    for (const auto& [ty, n] : rep["tensor_type_counts"].items())
      EXPECT_EQ(counts[ty], n.get<int>()) << type << " " << ty;
  }
}

TEST(Gguf, EveryTensorOfEveryFileDequantizesBitExactlyAsGgml) {
  SafetensorsReader rows(test::ggufFixture("gguf/dequant_rows.safetensors"));
  for (const auto& [type, rep] : report()["types"].items()) {
    SafetensorsReader r(test::ggufFile(type));
    int matched = 0, rowsMatched = 0;
    for (const auto& [name, t] : rep["tensors"].items()) {
      const TensorInfo& i = r.info(name);
      const std::string raw(reinterpret_cast<const char*>(r.data(i)), i.nbytes());
      EXPECT_EQ(sha256Hex(raw), t["raw_sha256"].get<std::string>()) << type << " " << name;
      const std::vector<float> v = dequantAll(r, i);
      const std::string bytes(reinterpret_cast<const char*>(v.data()), v.size() * 4);
      const bool ok = sha256Hex(bytes) == t["dequant_f32_sha256"].get<std::string>();
      EXPECT_TRUE(ok) << type << " " << name << " (" << dtypeName(i.dtype)
                      << "): float32 dequantization differs from ggml's";
      matched += ok;
      // The stored rows (0, 1, last; the whole of a 1-D tensor), compared bit for bit.
      const TensorInfo& g = rows.info(type + "/" + name);
      const float* ref = reinterpret_cast<const float*>(rows.data(g));
      const int64_t width = i.shape.back();
      std::vector<int64_t> pick;
      if (i.shape.size() == 1)
        pick = {0};
      else
        pick = {0, 1, i.shape[0] - 1};
      bool rowsOk = true;
      for (size_t k = 0; k < pick.size(); ++k)
        rowsOk = rowsOk && std::memcmp(ref + k * width, v.data() + pick[k] * width,
                                       static_cast<size_t>(width) * 4) == 0;
      EXPECT_TRUE(rowsOk) << type << " " << name;
      rowsMatched += rowsOk;
    }
    std::printf("  %-7s %2d / 52 tensors bit-exact (SHA-256), %2d / 52 row sets at 0 ulp\n",
                type.c_str(), matched, rowsMatched);
  }
}

TEST(Gguf, BytesPerParameterByStorage) {
  EXPECT_DOUBLE_EQ(storageBytesPerParameter("Q8_0"), 34.0 / 32);
  EXPECT_DOUBLE_EQ(storageBytesPerParameter("Q4_K"), 144.0 / 256);
  EXPECT_DOUBLE_EQ(storageBytesPerParameter("Q2_K"), 84.0 / 256);
  EXPECT_DOUBLE_EQ(storageBytesPerParameter("BF16"), 2);
  EXPECT_DOUBLE_EQ(storageBytesPerParameter("F8_E4M3"), 1);
  EXPECT_DOUBLE_EQ(storageBytesPerParameter("IQ2_XXS"), 0);
}

// ---------------------------------------------------------------------------------------------
// Loading: the BFL key layout of the GGUF files, weights kept quantized, forward goldens.

namespace {

const SafetensorsCollection& ggoldens() {
  static SafetensorsCollection g(test::ggufFixture("gguf/gguf_golden.safetensors"));
  return g;
}
at::Tensor ggolden(const std::string& name) { return loadTensor(ggoldens(), name, at::kFloat); }

const FluxTransformerConfig& ggufFolderConfig() {
  static const FluxTransformerConfig c =
      fluxConfig(ModelFolder::open(test::ggufFixture("."))).transformer;
  return c;
}

struct GgufModel {
  CheckpointInfo info;
  std::shared_ptr<WeightSource> w;
  std::unique_ptr<FluxTransformer2DModel> model;
};

GgufModel loadGguf(const std::string& file, FluxParallelism par = {}) {
  GgufModel m;
  m.info = inspectCheckpoint(file);
  const CheckpointComponent& c = m.info.require("transformer", "--model");
  SafetensorsReader r(file);
  m.w = WeightSource::fromLayout(componentLayout(r, c), at::kFloat, at::kCPU);
  m.model = std::make_unique<FluxTransformer2DModel>(
      fluxConfigFromBfl(r, c.prefix, &ggufFolderConfig()), *m.w, std::move(par));
  return m;
}

at::Tensor runCase(const FluxTransformer2DModel& m, int k) {
  at::NoGradGuard ng;
  const std::string p = "dit." + std::to_string(k) + ".in.";
  return m.forward(ggolden(p + "hidden_states"), ggolden(p + "encoder_hidden_states"),
                   ggolden(p + "pooled_projections"), ggolden(p + "timestep"),
                   ggolden(p + "img_ids"), ggolden(p + "txt_ids"), ggolden(p + "guidance"));
}

}  // namespace

TEST(GgufLoad, DetectsTheTransformerAndItsTypes) {
  const CheckpointInfo i = inspectCheckpoint(test::ggufFile("Q4_K_S"));
  EXPECT_EQ(i.family, "flux");
  EXPECT_EQ(i.variant, "flux-dev");
  ASSERT_NE(i.find("transformer"), nullptr);
  EXPECT_EQ(i.find("transformer")->layout, "bfl");
  EXPECT_EQ(i.describe(), "flux-dev: transformer (bfl, F16 x5 + F32 x34 + Q4_K x13)");
  const FluxTransformerConfig c = [] {
    SafetensorsReader r(test::ggufFile("Q8_0"));
    return fluxConfigFromBfl(r, "", &ggufFolderConfig());
  }();
  EXPECT_EQ(c.num_attention_heads * c.attention_head_dim, 256);
  EXPECT_EQ(c.num_layers, 1);
  EXPECT_EQ(c.num_single_layers, 1);
}

TEST(GgufLoad, ForwardOfEveryTypeMatchesGoldenAndStaysQuantized) {
  for (const auto& [type, rep] : report()["types"].items()) {
    GgufModel m = loadGguf(test::ggufFile(type));
    // Every weight of a quantized or 16-bit type is held as stored: the rank's bytes of them
    // equal the file's bytes of those tensors.
    int64_t held = 0, kept = 0;
    for (const auto& p : m.model->parameters()) {
      if (p.heldBytes > 0) {
        held += p.heldBytes;
        ++kept;
      }
    }
    // Quantized and 16-bit tensors are all linear weights here: held as stored.
    int64_t fileKeptBytes = 0;
    for (const auto& [name, t] : rep["tensors"].items())
      if (t["ggml_type"].get<std::string>() != "F32") fileKeptBytes += t["nbytes"].get<int64_t>();
    EXPECT_EQ(held, fileKeptBytes) << type;
    EXPECT_EQ(kept, rep["tensor_type_counts"].size() == 2
                        ? 30    // 23 16-bit BFL tensors = 30 diffusers weights
                        : 25);  // 13 quantized + 5 F16 BFL tensors = 25 diffusers weights
    for (int k = 0; k < 3; ++k) {
      const at::Tensor out = runCase(*m.model, k);
      const at::Tensor ref = ggolden("dit." + std::to_string(k) + ".out." + type);
      ASSERT_EQ(out.sizes(), ref.sizes());
      const double d = test::maxAbsDiff(out, ref);
      std::printf("  %-7s dit.%d  max |diff| %.3g   (kept quantized: %lld bytes)\n", type.c_str(),
                  k, d, static_cast<long long>(held));
      EXPECT_LT(d, 1e-4) << type << " dit." << k;
    }
  }
}

// Whole FluxPipeline runs with the transformer from a GGUF file (--model x.gguf, the fixture
// folder as --config and for VAE / text encoders): final latents and image of runs 0 and 1
// within 1e-4 of gguf_golden (diffusers with ggml's dequantized weights), for Q8_0 and Q4_K_S.
TEST(GgufPipeline, RunsFromQ8_0AndQ4_K_SMatchGoldens) {
  struct Run {
    std::string prompt;
    uint64_t seed;
    int height, width, steps;
    double guidance;
  };
  const Run runs[] = {{"a photo of a cat", 42, 32, 32, 4, 3.5},
                      {"A Painting of a Squirrel eating a BURGER!!", 3, 36, 28, 3, 2.0}};
  const std::string root = test::ggufFixture(".");
  for (const std::string type : {"Q8_0", "Q4_K_S"}) {
    ModelSources s;
    s.model = test::ggufFile(type);
    s.config = root;
    s.vae = root + "/vae";
    s.text_encoder = root + "/text_encoder";
    s.text_encoder_2 = root + "/text_encoder_2";
    const ModelFolder mf = ModelFolder::open(s);
    EXPECT_TRUE(mf.components.at("transformer").single_file);
    FluxPipeline pipe(mf, PipelineOptions{});
    for (int r = 0; r < 2; ++r) {
      PipelineInputs p;
      p.prompt = runs[r].prompt;
      p.seed = runs[r].seed;
      p.height = runs[r].height;
      p.width = runs[r].width;
      p.steps = runs[r].steps;
      p.guidance = runs[r].guidance;
      p.max_sequence_length = test::goldenJson()["max_sequence_length"];
      const GenerationResult res = pipe.generate(p);
      const std::string k = "run" + std::to_string(r) + "." + type + ".";
      for (const auto& [what, t] :
           {std::pair<std::string, at::Tensor>{"final_latents", res.final_latents},
            {"image", res.image}}) {
        const at::Tensor ref = ggolden(k + what);
        ASSERT_EQ(t.sizes(), ref.sizes()) << k + what;
        const double d = test::maxAbsDiff(t, ref);
        std::printf("  %-28s max |diff| %.3g\n", (k + what).c_str(), d);
        EXPECT_LT(d, 1e-4) << k + what;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Broken files: refused naming the file, the tensor (or key) and the cause.

namespace {

std::string writeTemp(const std::string& name, const std::string& bytes) {
  const fs::path p = test::tempDir("bad") / name;
  std::ofstream(p, std::ios::binary) << bytes;
  return p.string();
}

void expectRefused(const std::string& bytes, const std::vector<std::string>& words) {
  const std::string p = writeTemp("x.gguf", bytes);
  try {
    SafetensorsReader r(p);
    ADD_FAILURE() << "accepted; expected a refusal with '" << words.front() << "'";
  } catch (const ModelFileError& e) {
    EXPECT_EQ(e.file(), p);
    for (const auto& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << "'" << e.what() << "' lacks '" << w << "'";
  }
}

// smallGguf() with the tensor info of `name` rewritten by `edit` (ne, type, offset fields).
std::string withInfo(const std::string& name, uint32_t nd, const std::vector<uint64_t>& ne,
                     uint32_t type, uint64_t offset) {
  std::string f = test::smallGguf();
  const size_t at = f.find(name);
  test::GgufWriter w;
  w.u32(nd);
  for (uint64_t v : ne) w.u64(v);
  w.u32(type);
  w.u64(offset);
  f.replace(at + name.size(), w.b.size(), w.b);
  return f;
}

}  // namespace

TEST(GgufBadInput, SmallValidFileReads) {
  const std::string p = writeTemp("ok.gguf", test::smallGguf());
  SafetensorsReader r(p);
  EXPECT_EQ(r.info("a.weight").shape, (std::vector<int64_t>{3, 64}));
  EXPECT_EQ(r.info("b.weight").dtype, DType::Q4_K);
  EXPECT_EQ(r.ggufHeader()->find("test.shape")->integers, (std::vector<int64_t>{3, 64}));
}

TEST(GgufBadInput, RefusedNamingFileTensorAndCause) {
  const std::string good = test::smallGguf();
  expectRefused(good.substr(0, 20), {"truncated GGUF file"});
  expectRefused(good.substr(0, good.size() - 100), {"tensor 'b.weight'", "outside"});
  std::string v = good;
  v[4] = 1;
  expectRefused(v, {"version 1"});
  v[4] = 9;
  expectRefused(v, {"version 9"});
  v = good;
  std::memcpy(&v[4], "\0\0\0\3", 4);
  expectRefused(v, {"big-endian"});
  v = good;
  v[8] = 0x7f;  // tensor count
  expectRefused(v, {"tensor count"});
  expectRefused(withInfo("b.weight", 2, {256, 2}, 12, 1 << 30), {"'b.weight'", "outside"});
  expectRefused(withInfo("b.weight", 2, {256, 2}, 12, 33), {"'b.weight'", "misaligned"});
  expectRefused(withInfo("a.weight", 2, {64, uint64_t(1) << 61}, 8, 128), {"'a.weight'", "2^62"});
  expectRefused(withInfo("a.weight", 2, {64, ~uint64_t(0)}, 8, 128), {"'a.weight'", "absurd"});
  expectRefused(withInfo("a.weight", 5, {64, 3, 1, 1, 1}, 8, 128), {"'a.weight'", "5 dimensions"});
  expectRefused(withInfo("b.weight", 2, {256, 2}, 16, 256), {"'b.weight'", "IQ2_XXS"});
  expectRefused(withInfo("b.weight", 2, {256, 2}, 99, 256), {"'b.weight'", "type id 99"});
  expectRefused(withInfo("a.weight", 2, {48, 3}, 8, 128), {"'a.weight'", "multiple of Q8_0"});
  expectRefused(withInfo("b.weight", 2, {256, 2}, 12, 128), {"overlap"});
  std::string dup = good;
  dup.replace(dup.find("b.weight"), 8, "a.weight");
  expectRefused(dup, {"'a.weight' is listed twice"});
  std::string key = good;
  key.replace(key.find("test.shape"), 10, "general.architecture");  // longer: corrupts the rest
  expectRefused(key, {"metadata"});
}

// A real file with a tensor missing (renamed) or mis-shaped: refused when its layout is built,
// naming the tensor.
TEST(GgufBadInput, MissingOrMisShapedTensorInTheTransformer) {
  std::ifstream in(test::ggufFile("Q8_0"), std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string f = good;
  const std::string n = "double_blocks.0.img_mlp.2.bias";
  f.replace(f.find(n), n.size(), "double_blocks.0.img_mlp.2.biaz");
  std::string p = writeTemp("missing.gguf", f);
  try {
    SafetensorsReader r(p);
    componentLayout(r, inspectCheckpoint(p).require("transformer", "--model"));
    ADD_FAILURE() << "accepted";
  } catch (const ModelFileError& e) {
    EXPECT_EQ(e.file(), p);
    EXPECT_NE(std::string(e.what()).find("biaz"), std::string::npos) << e.what();
  }
  f = good;
  const std::string q = "double_blocks.0.img_attn.qkv.weight";
  const size_t at = f.find(q) + q.size() + 4 + 8;  // n_dims, ne[0]
  const uint64_t rows = 512;
  std::memcpy(&f[at], &rows, 8);
  p = writeTemp("misshaped.gguf", f);
  try {
    SafetensorsReader r(p);
    componentLayout(r, inspectCheckpoint(p).require("transformer", "--model"));
    ADD_FAILURE() << "accepted";
  } catch (const ModelFileError& e) {
    EXPECT_NE(std::string(e.what()).find(q), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("768"), std::string::npos) << e.what();
  }
}

// Issue 35: weights kept quantized get the finiteness check of every other weight: a Q8_0 block
// whose f16 scale is NaN is refused at load naming the file and the tensor (it used to load and
// make NaN outputs), and the opt-in loads it.
TEST(GgufBadInput, NonFiniteBlockScaleRefusedAtLoad) {
  const std::string key = "double_blocks.0.img_attn.proj.weight";
  std::ifstream in(test::ggufFile("Q8_0"), std::ios::binary);
  std::string f((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t at = 0;
  {
    SafetensorsReader r(test::ggufFile("Q8_0"));
    const TensorInfo& i = r.info(key);
    ASSERT_EQ(std::string(dtypeName(i.dtype)), "Q8_0");
    at = i.begin;
    ASSERT_EQ(std::memcmp(f.data() + at, r.data(i), 34), 0);  // begin is the file offset
  }
  const uint16_t nanHalf = 0x7E00;
  std::memcpy(&f[at + 34 * 11], &nanHalf, 2);  // block 11: row 1 (256 columns = 8 blocks a row)
  const std::string p = writeTemp("nan-scale.gguf", f);
  setAllowNonFiniteWeights(false);
  try {
    loadGguf(p);
    ADD_FAILURE() << "accepted";
  } catch (const ModelFileError& e) {
    EXPECT_EQ(e.file(), p);
    EXPECT_NE(std::string(e.what()).find("tensor 'transformer_blocks.0.attn.to_out.0.weight' "
                                         "(Q8_0, kept quantized) decodes to non-finite values "
                                         "(first in row 1"),
              std::string::npos)
        << e.what();
  }
  setAllowNonFiniteWeights(true);
  EXPECT_NO_THROW(loadGguf(p));
  setAllowNonFiniteWeights(false);
}

// ---------------------------------------------------------------------------------------------
// Memory estimate with quantized sizes (no weights needed): a FLUX.1-dev-size transformer as
// city96's Q4_K_S file stores it (every 2-D block weight Q4_K; the embedders' second linears,
// context_embedder and norm_out.linear F16; the rest F32), at tp 2.
TEST(GgufMemory, FluxDevSizeQ4_K_SAtTp2) {
  FluxTransformerConfig c;
  c.num_layers = 19;
  c.num_single_layers = 38;
  c.num_attention_heads = 24;
  c.attention_head_dim = 128;
  c.joint_attention_dim = 4096;
  c.pooled_projection_dim = 768;
  c.in_channels = 64;
  c.out_channels = 64;
  c.guidance_embeds = true;
  c.axes_dims_rope = {16, 56, 56};
  const ParameterTable f32 = fluxParameterTable(c);
  const std::set<std::string> f16 = {
      "context_embedder.weight", "time_text_embed.timestep_embedder.linear_2.weight",
      "time_text_embed.text_embedder.linear_2.weight",
      "time_text_embed.guidance_embedder.linear_2.weight", "norm_out.linear.weight"};
  ParameterTable stored, quantOnly, rest;
  int64_t total = 0;
  for (ParameterInfo p : f32) {
    total += p.numel();
    const bool block =
        p.shape.size() == 2 && p.name.find("transformer_blocks.") != std::string::npos;
    p.dtype = block ? "Q4_K" : f16.count(p.name) ? "F16" : "F32";
    p.elementBytes = block ? 1 : f16.count(p.name) ? 2 : 4;
    stored.add(p);
    (block ? quantOnly : rest).add(p);
  }
  const ShardingPlan plan = fluxShardingPlan(c);
  const uint64_t perRank = storedWeightBytesPerRank(plan, stored, 2, 4, true);
  // The same from the plan's own byte count: Q4_K elements of the rank x 144 / 256 + the rest
  // as stored (F16 kept 16-bit, F32).
  const double closed = static_cast<double>(plan.bytesPerRank(quantOnly, 2, 0)) * 144.0 / 256.0 +
                        static_cast<double>(plan.bytesPerRank(rest, 2, 0));
  const uint64_t oneRank = storedWeightBytesPerRank(plan, stored, 1, 4, true);
  std::printf(
      "  FLUX.1-dev size: %.2f B parameters; Q4_K_S weights %.2f GB on one rank, %.2f GB "
      "per rank at tp 2 (float32 compute would hold %.2f GB per rank)\n",
      total / 1e9, oneRank / 1e9, perRank / 1e9, plan.bytesPerRank(f32, 2, 4) / 1e9);
  EXPECT_NEAR(static_cast<double>(perRank), closed, 1.0);
  EXPECT_GT(total, 11.8e9);
  EXPECT_NEAR(oneRank / 1e9, 6.8, 0.2);  // city96's flux1-dev-Q4_K_S.gguf: 6.81 GB
  // Every block weight is split, the AdaLayerNorm modulation linears (3.2 B parameters) too
  // (colwise with the output gathered): about half the file, 3.5 GB, not 24 GB of float32.
  EXPECT_NEAR(perRank / 1e9, 3.5, 0.1);
  EXPECT_LT(static_cast<double>(perRank), 0.52 * static_cast<double>(oneRank));

  // The table of docs/gguf.md: every block weight stored as one type, the rest as above.
  std::printf("  | file type | tp 1 | tp 2 | tp 4 |\n");
  for (const char* type : {"Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q3_K", "Q2_K"}) {
    ParameterTable t;
    for (ParameterInfo p : stored) {
      if (p.dtype == "Q4_K") p.dtype = type;
      t.add(p);
    }
    std::printf("  | %s | %.1f GB | %.1f GB | %.1f GB |\n", type,
                storedWeightBytesPerRank(plan, t, 1, 4, true) / 1e9,
                storedWeightBytesPerRank(plan, t, 2, 4, true) / 1e9,
                storedWeightBytesPerRank(plan, t, 4, 4, true) / 1e9);
  }
  std::printf("  | BF16 held bfloat16 | %.1f GB | %.1f GB | %.1f GB |\n",
              plan.bytesPerRank(f32, 1, 2) / 1e9, plan.bytesPerRank(f32, 2, 2) / 1e9,
              plan.bytesPerRank(f32, 4, 2) / 1e9);
}
