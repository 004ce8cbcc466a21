// LoRA (issue 13) on the tiny-flux-A fixture, one process, float32 CPU: every case of
// tests/data/tiny-flux-A/lora/lora_golden.safetensors (diffusers reference, copy of
// ../shared/fixtures/tiny-flux-A/lora) within 1e-5 — each file format, strengths 1.0 and 0.6,
// alpha from the adapter metadata and from alpha tensors, two LoRAs together — applied unfused
// through the Linear seam; fused then unfused restores the base weights bit for bit; bad files
// are refused naming the file and the first offending module.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/io/lora_file.h"
#include "backend/io/model_folder.h"
#include "backend/io/weight_source.h"
#include "backend/models/flux/flux_lora.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/nn/lora_loader.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"
#include "golden_util.h"

using namespace dit;
using namespace dit::test;
namespace fs = std::filesystem;
using tensor_parallel::LoraAdapter;
using tensor_parallel::PreparedLora;

namespace {

constexpr double kTol = 1e-5;

std::string loraDir() { return fixtureDir() + "/lora"; }
std::string loraFile(const std::string& stem) { return loraDir() + "/" + stem + ".safetensors"; }

const SafetensorsCollection& loraGoldens() {
  static SafetensorsCollection g(loraDir() + "/lora_golden.safetensors");
  return g;
}
at::Tensor lg(const std::string& name) { return loadTensor(loraGoldens(), name, at::kFloat); }

FluxTransformer2DModel& model() {
  static std::shared_ptr<WeightSource> w = WeightSource::fromFolder(
      fixtureDir() + "/transformer", "diffusion_pytorch_model", at::kFloat, c10::Device(at::kCPU));
  static FluxTransformer2DModel m(fluxConfig(ModelFolder::open(fixtureDir())).transformer, *w);
  return m;
}

at::Tensor runCase(int i) {
  at::NoGradGuard ng;
  const std::string p = "dit." + std::to_string(i) + ".in.";
  return model().forward(lg(p + "hidden_states"), lg(p + "encoder_hidden_states"),
                         lg(p + "pooled_projections"), lg(p + "timestep"), lg(p + "img_ids"),
                         lg(p + "txt_ids"), lg(p + "guidance"));
}

std::shared_ptr<const PreparedLora> prepared(const std::string& stem) {
  auto& m = model();
  return m.loraTargets().prepare(loadLoraAdapter(loraFile(stem), m.kohyaLoraMapping()));
}

// Max |out - golden| over the three forward cases for golden case `name`.
double caseError(const std::string& name) {
  double worst = 0;
  for (int i = 0; i < 3; ++i) {
    const double d = maxAbsDiff(runCase(i), lg(name + ".dit." + std::to_string(i) + ".out"));
    std::printf("  %-30s dit.%d max |diff| %.3g\n", name.c_str(), i, d);
    worst = std::max(worst, d);
  }
  return worst;
}

std::string tmpFile(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("ditstudio-lora-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

// Every tensor of a LoRA file, for building altered copies.
std::map<std::string, at::Tensor> tensorsOf(const std::string& path) {
  SafetensorsCollection c(path);
  std::map<std::string, at::Tensor> t;
  for (const auto& n : c.names()) t[n] = loadTensor(c, n, at::kFloat);
  return t;
}

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LoraFile, InspectsEachFormat) {
  const LoraFileInfo d = inspectLoraFile(loraFile("lora-diffusers"));
  EXPECT_EQ(d.format, LoraFormat::Diffusers);
  EXPECT_EQ(d.rank, 4);
  EXPECT_EQ(d.modules.size(), 40u);
  EXPECT_EQ(d.alphaSource, "lora_adapter_metadata");
  EXPECT_DOUBLE_EQ(d.modules[0].scale, 1.0);
  const LoraFileInfo meta = inspectLoraFile(loraFile("lora-diffusers-metaalpha"));
  EXPECT_EQ(meta.alphaSource, "lora_adapter_metadata");
  for (const auto& m : meta.modules) EXPECT_DOUBLE_EQ(m.scale, 1.5) << m.name;
  const LoraFileInfo al = inspectLoraFile(loraFile("lora-diffusers-alphas"));
  EXPECT_EQ(al.alphaSource, "alpha tensors");
  EXPECT_EQ(al.modules.size(), 40u);
  for (const auto& m : al.modules) EXPECT_DOUBLE_EQ(m.scale, 0.5) << m.name;
  const LoraFileInfo k = inspectLoraFile(loraFile("lora-kohya"));
  EXPECT_EQ(k.format, LoraFormat::Kohya);
  EXPECT_EQ(k.modules.size(), 26u);
  EXPECT_EQ(k.alphaSource, "kohya .alpha");
  for (const auto& m : k.modules) EXPECT_DOUBLE_EQ(m.scale, 0.5) << m.name;
  EXPECT_EQ(k.summary(), "kohya, rank 4, 26 modules, alpha from kohya .alpha");
}

TEST(LoraFile, KohyaSplitsFusedModules) {
  const LoraAdapter a = loadLoraAdapter(loraFile("lora-kohya"), fluxKohyaTargets);
  ASSERT_EQ(a.modules.size(), 40u);  // 26 kohya modules -> the 40 diffusers modules
  std::map<std::string, const tensor_parallel::LoraModule*> by;
  for (const auto& m : a.modules) by[m.name] = &m;
  const auto* q = by.at("single_transformer_blocks.1.attn.to_q");
  const auto* mlp = by.at("single_transformer_blocks.1.proj_mlp");
  EXPECT_EQ(q->B.sizes(), (at::IntArrayRef{64, 4}));
  EXPECT_EQ(mlp->B.sizes(), (at::IntArrayRef{256, 4}));
  // lora_down copied to every part, lora_up cut by rows [D, D, D, 4D].
  SafetensorsCollection st(loraFile("lora-kohya"));
  at::Tensor up = loadTensor(st, "lora_unet_single_blocks_1_linear1.lora_up.weight", at::kFloat);
  at::Tensor down =
      loadTensor(st, "lora_unet_single_blocks_1_linear1.lora_down.weight", at::kFloat);
  EXPECT_TRUE(at::equal(mlp->B, up.narrow(0, 192, 256)));
  EXPECT_TRUE(at::equal(q->A, down));
  EXPECT_TRUE(at::equal(by.at("single_transformer_blocks.1.attn.to_v")->B, up.narrow(0, 128, 64)));
  EXPECT_DOUBLE_EQ(q->scale, 0.5);
  // The final-layer trap: halves swapped, scale 1.
  const auto t = fluxKohyaTargets("final_layer_adaLN_modulation_1", 128, 64);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].module, "norm_out.linear");
  EXPECT_TRUE(t[0].swapHalves);
  EXPECT_TRUE(t[0].scaleOne);
  EXPECT_TRUE(fluxKohyaTargets("double_blocks_0_img_attn_nope", 10, 10).empty());
  // Through the loader: a kohya file with the final layer's adaLN module gets norm_out.linear's
  // lora_B with the (shift, scale) halves swapped to diffusers' (scale, shift) and scale 1
  // whatever alpha / rank is (diffusers drops that alpha).
  auto gen = at::detail::createCPUGenerator(5);
  const at::Tensor up2 = at::randn({128, 4}, gen), down2 = at::randn({4, 64}, gen);
  const std::string f = tmpFile("kohya-final.safetensors");
  saveTensors(f, {{"lora_unet_final_layer_adaLN_modulation_1.lora_up.weight", up2},
                  {"lora_unet_final_layer_adaLN_modulation_1.lora_down.weight", down2},
                  {"lora_unet_final_layer_adaLN_modulation_1.alpha", at::full({}, 2.0)}});
  const LoraAdapter fin = loadLoraAdapter(f, fluxKohyaTargets);
  ASSERT_EQ(fin.modules.size(), 1u);
  EXPECT_EQ(fin.modules[0].name, "norm_out.linear");
  EXPECT_DOUBLE_EQ(fin.modules[0].scale, 1.0);
  EXPECT_TRUE(at::equal(fin.modules[0].B.narrow(0, 0, 64), up2.narrow(0, 64, 64)));
  EXPECT_TRUE(at::equal(fin.modules[0].B.narrow(0, 64, 64), up2.narrow(0, 0, 64)));
  // And it applies to the model (norm_out.linear is [2C, C] = [128, 64]).
  EXPECT_NO_THROW(model().loraTargets().prepare(fin));
}

TEST(LoraGolden, BaseIsTheFixtureGolden) {
  model().loraTargets().clear();
  for (int i = 0; i < 3; ++i)
    EXPECT_LT(maxAbsDiff(runCase(i), lg("dit." + std::to_string(i) + ".out")), 1e-4) << i;
}

TEST(LoraGolden, EveryCaseWithin1e5) {
  auto& t = model().loraTargets();
  const auto diffusers = prepared("lora-diffusers");
  const auto alphas = prepared("lora-diffusers-alphas");
  const auto metaalpha = prepared("lora-diffusers-metaalpha");
  const auto kohya = prepared("lora-kohya");
  const std::vector<
      std::pair<std::string, std::vector<std::pair<std::shared_ptr<const PreparedLora>, double>>>>
      cases = {{"lora.diffusers.s1", {{diffusers, 1.0}}},
               {"lora.diffusers.s06", {{diffusers, 0.6}}},
               {"lora.diffusers_alphas.s1", {{alphas, 1.0}}},
               {"lora.diffusers_metaalpha.s1", {{metaalpha, 1.0}}},
               {"lora.kohya.s1", {{kohya, 1.0}}},
               {"lora.both", {{diffusers, 1.0}, {kohya, 0.5}}}};
  for (const auto& [name, loras] : cases) {
    t.apply(loras);
    EXPECT_LT(caseError(name), kTol) << name;
  }
  // Off again: the base output exactly (the layers hold no delta at all).
  t.clear();
  EXPECT_EQ(t.appliedBytes(), 0u);
  model().loraTargets().clear();
  const at::Tensor base = runCase(0);
  t.apply({{kohya, 1.0}});
  const at::Tensor with = runCase(0);
  t.clear();
  EXPECT_TRUE(at::equal(runCase(0), base));
  EXPECT_FALSE(at::equal(with, base));
}

TEST(LoraGolden, FuseMatchesAndUnfuseRestoresExactly) {
  auto& t = model().loraTargets();
  t.clear();
  std::vector<at::Tensor> before;
  for (const auto& l : t.layers()) before.push_back(l->weight());
  const at::Tensor base = runCase(1);
  t.apply({{prepared("lora-diffusers"), 1.0}, {prepared("lora-kohya"), 0.5}});
  t.fuse();
  EXPECT_TRUE(t.fused());
  EXPECT_LT(caseError("lora.both"), kTol);
  t.unfuse();
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_TRUE(at::equal(t.layers()[i]->weight(), before[i])) << t.layers()[i]->name();
  // Unfused deltas still apply after unfuse; clearing gives the base bit for bit.
  EXPECT_LT(caseError("lora.both"), kTol);
  t.fuse();
  t.clear();
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_TRUE(at::equal(t.layers()[i]->weight(), before[i])) << t.layers()[i]->name();
  EXPECT_TRUE(at::equal(runCase(1), base));
}

TEST(LoraErrors, RefusedNamingFileAndModule) {
  auto& m = model();
  const auto k = m.kohyaLoraMapping();
  // A module the model does not have.
  auto t = tensorsOf(loraFile("lora-diffusers"));
  t["transformer.transformer_blocks.7.attn.to_q.lora_A.weight"] = at::zeros({4, 64});
  t["transformer.transformer_blocks.7.attn.to_q.lora_B.weight"] = at::zeros({64, 4});
  const std::string missing = tmpFile("missing-module.safetensors");
  saveTensors(missing, t);
  std::string e = errorOf([&] { m.loraTargets().prepare(loadLoraAdapter(missing, k)); });
  EXPECT_NE(e.find(missing), std::string::npos) << e;
  EXPECT_NE(e.find("'transformer_blocks.7.attn.to_q' does not exist"), std::string::npos) << e;
  // A shape that does not match (a LoRA for a wider model).
  t = tensorsOf(loraFile("lora-diffusers"));
  t["transformer.transformer_blocks.0.ff.net.2.lora_A.weight"] = at::zeros({4, 512});
  const std::string shape = tmpFile("shape.safetensors");
  saveTensors(shape, t);
  e = errorOf([&] { m.loraTargets().prepare(loadLoraAdapter(shape, k)); });
  EXPECT_NE(e.find(shape), std::string::npos) << e;
  EXPECT_NE(e.find("'transformer_blocks.0.ff.net.2'"), std::string::npos) << e;
  EXPECT_NE(e.find("[64, 256]"), std::string::npos) << e;
  // A kohya module FLUX does not have.
  t = tensorsOf(loraFile("lora-kohya"));
  t["lora_unet_double_blocks_0_img_attn_foo.lora_down.weight"] = at::zeros({4, 64});
  t["lora_unet_double_blocks_0_img_attn_foo.lora_up.weight"] = at::zeros({64, 4});
  const std::string kohyaBad = tmpFile("kohya-bad.safetensors");
  saveTensors(kohyaBad, t);
  e = errorOf([&] { loadLoraAdapter(kohyaBad, k); });
  EXPECT_NE(e.find(kohyaBad), std::string::npos) << e;
  EXPECT_NE(e.find("lora_unet_double_blocks_0_img_attn_foo"), std::string::npos) << e;
  // Unknown format.
  const std::string unknown = tmpFile("unknown.safetensors");
  saveTensors(unknown, {{"model.layers.0.weight", at::zeros({4, 4})}});
  e = errorOf([&] { inspectLoraFile(unknown); });
  EXPECT_NE(e.find(unknown), std::string::npos) << e;
  EXPECT_NE(e.find("unknown LoRA format: key 'model.layers.0.weight'"), std::string::npos) << e;
  // Corrupt file (truncated).
  const std::string corrupt = tmpFile("corrupt.safetensors");
  fs::copy_file(loraFile("lora-diffusers"), corrupt, fs::copy_options::overwrite_existing);
  fs::resize_file(corrupt, 5000);
  e = errorOf([&] { loadLoraAdapter(corrupt, k); });
  EXPECT_NE(e.find(corrupt), std::string::npos) << e;
  // Both metadata and alpha tensors: refused as diffusers refuses it.
  t = tensorsOf(loraFile("lora-diffusers-alphas"));
  SafetensorsReader meta(loraFile("lora-diffusers"));
  const std::string both = tmpFile("both.safetensors");
  saveTensors(both, t, meta.metadata());
  e = errorOf([&] { inspectLoraFile(both); });
  EXPECT_NE(e.find("both lora_adapter_metadata and alpha tensors"), std::string::npos) << e;
  // lora_A without lora_B.
  t = tensorsOf(loraFile("lora-diffusers"));
  t.erase("transformer.transformer_blocks.1.ff.net.2.lora_B.weight");
  const std::string half = tmpFile("half.safetensors");
  saveTensors(half, t);
  e = errorOf([&] { inspectLoraFile(half); });
  EXPECT_NE(e.find("'transformer.transformer_blocks.1.ff.net.2' has lora_A but no lora_B"),
            std::string::npos)
      << e;
  // After all refusals the model still computes the base output.
  m.loraTargets().clear();
  EXPECT_LT(maxAbsDiff(runCase(0), lg("dit.0.out")), 1e-4);
}

// Issue 35: a LoRA whose factors hold NaN / Inf, or whose alpha makes a scale outside float32, is
// refused where it enters, naming the file and the tensor (it used to give a black image).
TEST(LoraErrors, NonFiniteFactorsAndScalesRefusedNamingFileAndTensor) {
  const auto k = model().kohyaLoraMapping();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  SafetensorsReader meta(loraFile("lora-diffusers"));
  // NaN in a diffusers lora_A (metadata kept: the alpha is fine).
  auto t = tensorsOf(loraFile("lora-diffusers"));
  const std::string keyA = "transformer.transformer_blocks.1.attn.to_q.lora_A.weight";
  ASSERT_TRUE(t.count(keyA));
  t[keyA] = t[keyA].clone();
  t[keyA].view({-1})[7] = nan;
  const std::string nanFile = tmpFile("nan-factor.safetensors");
  saveTensors(nanFile, t, meta.metadata());
  std::string e = errorOf([&] { loadLoraAdapter(nanFile, k); });
  EXPECT_NE(e.find(nanFile), std::string::npos) << e;
  EXPECT_NE(e.find("tensor '" + keyA + "' holds 1 non-finite value (first: nan at flat index 7"),
            std::string::npos)
      << e;
  // -Inf in a kohya lora_up.
  t = tensorsOf(loraFile("lora-kohya"));
  const std::string keyB = "lora_unet_single_blocks_1_linear1.lora_up.weight";
  ASSERT_TRUE(t.count(keyB));
  t[keyB] = t[keyB].clone();
  t[keyB].view({-1})[0] = -inf;
  t[keyB].view({-1})[3] = inf;
  const std::string infFile = tmpFile("inf-factor.safetensors");
  saveTensors(infFile, t);
  e = errorOf([&] { loadLoraAdapter(infFile, k); });
  EXPECT_NE(e.find(infFile), std::string::npos) << e;
  EXPECT_NE(e.find("tensor '" + keyB + "' holds 2 non-finite values (first: -inf"),
            std::string::npos)
      << e;
  // An F64 alpha tensor whose alpha / rank is no float32: the scale would be Inf in the delta.
  t = tensorsOf(loraFile("lora-diffusers-alphas"));
  const std::string keyAlpha = "transformer.transformer_blocks.0.attn.to_k.alpha";
  ASSERT_TRUE(t.count(keyAlpha));
  t[keyAlpha] = at::full({}, 1e300, at::kDouble);
  const std::string bigAlpha = tmpFile("big-alpha.safetensors");
  saveTensors(bigAlpha, t);
  e = errorOf([&] { inspectLoraFile(bigAlpha); });
  EXPECT_NE(e.find(bigAlpha), std::string::npos) << e;
  EXPECT_NE(e.find("module 'transformer_blocks.0.attn.to_k'"), std::string::npos) << e;
  EXPECT_NE(e.find("outside the float32 range"), std::string::npos) << e;
  // Metadata lora_alpha beyond float32 (the scale would overflow to Inf).
  auto m = meta.metadata();
  auto j = nlohmann::json::parse(m.at("lora_adapter_metadata"));
  j["transformer.lora_alpha"] = 1e39;
  m["lora_adapter_metadata"] = j.dump();
  t = tensorsOf(loraFile("lora-diffusers"));
  const std::string bigMeta = tmpFile("big-meta-alpha.safetensors");
  saveTensors(bigMeta, t, m);
  e = errorOf([&] { inspectLoraFile(bigMeta); });
  EXPECT_NE(e.find(bigMeta), std::string::npos) << e;
  EXPECT_NE(e.find("field 'lora_alpha'"), std::string::npos) << e;
  EXPECT_NE(e.find("outside the float32 range"), std::string::npos) << e;
}

// Issue 35: every lora_adapter_metadata field is read with the type PEFT's LoraConfig gives it;
// a wrong type is named (file, key, type) instead of surfacing JSON-library text.
TEST(LoraErrors, MetadataFieldsOfTheWrongTypeNamed) {
  SafetensorsReader meta(loraFile("lora-diffusers"));
  const auto t = tensorsOf(loraFile("lora-diffusers"));
  struct Case {
    std::string key;
    nlohmann::json value;
    std::string message;
  };
  const Case cases[] = {
      {"transformer.use_rslora", "yes",
       "field 'use_rslora' is a string (\"yes\"), expected true or false"},
      {"transformer.use_dora", 1, "field 'use_dora' is an integer (1), expected true or false"},
      {"transformer.r", "4", "field 'r' is a string (\"4\"), expected a positive integer"},
      {"transformer.r", 0, "field 'r' is an integer (0), expected a positive integer"},
      {"transformer.lora_alpha", nlohmann::json::array({4}),
       "field 'lora_alpha' is an array ([4]), expected a number"},
      {"transformer.rank_pattern", nlohmann::json::array({"to_q"}),
       "field 'rank_pattern' is an array ([\"to_q\"]), expected an object"},
      {"transformer.rank_pattern",
       {{"to_q", 2.5}},
       "field 'rank_pattern.to_q' is a number (2.5), expected a positive integer"},
      {"transformer.alpha_pattern",
       {{"to_q", "8"}},
       "field 'alpha_pattern.to_q' is a string (\"8\"), expected a number"},
      {"transformer.alpha_pattern", {{"to_q(", 8}}, "has key 'to_q(', which is not a regular"},
  };
  int i = 0;
  for (const auto& c : cases) {
    auto m = meta.metadata();
    auto j = nlohmann::json::parse(m.at("lora_adapter_metadata"));
    j[c.key] = c.value;
    m["lora_adapter_metadata"] = j.dump();
    const std::string f = tmpFile("typed-" + std::to_string(i++) + ".safetensors");
    saveTensors(f, t, m);
    const std::string e = errorOf([&] { inspectLoraFile(f); });
    EXPECT_NE(e.find(f), std::string::npos) << c.key << ": " << e;
    EXPECT_NE(e.find(c.message), std::string::npos) << c.key << ": " << e;
  }
  // Not an object at all.
  auto m = meta.metadata();
  m["lora_adapter_metadata"] = "[1, 2]";
  const std::string f = tmpFile("typed-array.safetensors");
  saveTensors(f, t, m);
  const std::string e = errorOf([&] { inspectLoraFile(f); });
  EXPECT_NE(e.find("lora_adapter_metadata is an array, expected a PEFT LoraConfig JSON object"),
            std::string::npos)
      << e;
}

// Issue 35: rank_pattern / alpha_pattern as PEFT matches them (peft.utils.other.get_pattern_key:
// the first key, in the file's order, with re.match(rf"(.*\.)?({key})$", module)).
TEST(LoraFile, PeftRankAndAlphaPatterns) {
  SafetensorsReader meta(loraFile("lora-diffusers"));
  auto t = tensorsOf(loraFile("lora-diffusers"));
  // transformer_blocks.0.attn.to_q gets rank 2; every attn.to_k alpha 8 (regex key), the more
  // specific transformer_blocks.1.attn.to_k listed first gets 2.
  const std::string q = "transformer.transformer_blocks.0.attn.to_q";
  t[q + ".lora_A.weight"] = t[q + ".lora_A.weight"].narrow(0, 0, 2).contiguous();
  t[q + ".lora_B.weight"] = t[q + ".lora_B.weight"].narrow(1, 0, 2).contiguous();
  auto m = meta.metadata();
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(m.at("lora_adapter_metadata"));
  j["transformer.rank_pattern"] = nlohmann::ordered_json::object();
  j["transformer.rank_pattern"]["transformer_blocks.0.attn.to_q"] = 2;
  j["transformer.alpha_pattern"] = nlohmann::ordered_json::object();
  j["transformer.alpha_pattern"]["transformer_blocks.1.attn.to_k"] = 2;
  j["transformer.alpha_pattern"]["attn.to_[k]"] = 8;
  j["transformer.alpha_pattern"]["to_q"] = 6;
  m["lora_adapter_metadata"] = j.dump();
  const std::string f = tmpFile("patterns.safetensors");
  saveTensors(f, t, m);
  const LoraFileInfo info = inspectLoraFile(f);
  std::map<std::string, const LoraFileModule*> by;
  for (const auto& mod : info.modules) by[mod.name] = &mod;
  EXPECT_EQ(by.at("transformer_blocks.0.attn.to_q")->rank, 2);
  // alpha 6 (to_q pattern) / rank 2.
  EXPECT_DOUBLE_EQ(by.at("transformer_blocks.0.attn.to_q")->scale, 3.0);
  EXPECT_DOUBLE_EQ(by.at("transformer_blocks.1.attn.to_q")->scale, 1.5);  // 6 / 4
  EXPECT_DOUBLE_EQ(by.at("transformer_blocks.1.attn.to_k")->scale, 0.5);  // first key: 2 / 4
  EXPECT_DOUBLE_EQ(by.at("transformer_blocks.0.attn.to_k")->scale, 2.0);  // 8 / 4
  EXPECT_DOUBLE_EQ(by.at("single_transformer_blocks.0.attn.to_k")->scale, 2.0);
  EXPECT_DOUBLE_EQ(by.at("transformer_blocks.0.attn.to_v")->scale, 1.0);  // lora_alpha 4 / 4
  // A suffix must start at a dot: "o_q" does not match "...to_q"; the lookup still checks rank.
  j["transformer.rank_pattern"] = nlohmann::ordered_json::object();
  j["transformer.rank_pattern"]["o_q"] = 2;
  m["lora_adapter_metadata"] = j.dump();
  const std::string g = tmpFile("patterns-suffix.safetensors");
  saveTensors(g, t, m);
  const std::string e = errorOf([&] { inspectLoraFile(g); });
  EXPECT_NE(e.find("module 'transformer_blocks.0.attn.to_q': lora_adapter_metadata gives r 4 but "
                   "its factors have rank 2"),
            std::string::npos)
      << e;
  // The adapter loads and applies with its per-module rank.
  auto& targets = model().loraTargets();
  EXPECT_NO_THROW(targets.apply({{targets.prepare(loadLoraAdapter(f, fluxKohyaTargets)), 1.0}}));
  targets.clear();
}
