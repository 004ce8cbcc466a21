// ditstudio-make-model: writes a diffusers folder of any registered family with random weights:
// the differently-shaped checkpoints the tests use (bf16 on disk, sharded transformer, guidance
// embeds off, other VAE depths) and configs for benchmarks. The family is the template folder's
// (model_index.json); tokenizers and the scheduler config are copied from it; every other config
// is the template's, with the overrides given on the command line; each component is built with
// fresh weights through its family's runtime (FamilyRuntime::buildComponent).
#include <ATen/ATen.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "backend/family_runtime.h"
#include "backend/io/config_json.h"
#include "backend/io/model_folder.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_source.h"
#include "backend/models/family_registry.h"

using namespace dit;
using nlohmann::json;
namespace fs = std::filesystem;

static json readJson(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  return json::parse(in);
}
static void writeJson(const fs::path& p, const json& j) {
  std::ofstream o(p);
  o << j.dump(2) << "\n";
}

// Saves `tensors` as one file or as shards of at most `shardBytes` plus an index.
static void saveComponent(const fs::path& dir, const std::string& stem,
                          const std::map<std::string, at::Tensor>& tensors, at::ScalarType diskType,
                          uint64_t shardBytes) {
  std::map<std::string, at::Tensor> conv;
  for (auto& [k, v] : tensors) conv[k] = v.to(diskType).contiguous();
  if (shardBytes == 0) {
    saveTensors((dir / (stem + ".safetensors")).string(), conv, {{"format", "pt"}});
    return;
  }
  std::vector<std::map<std::string, at::Tensor>> shards(1);
  uint64_t cur = 0;
  for (auto& [k, v] : conv) {
    const uint64_t b = v.numel() * v.element_size();
    if (cur > 0 && cur + b > shardBytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back()[k] = v;
    cur += b;
  }
  json index{{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  uint64_t total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[128];
    std::snprintf(name, sizeof name, "%s-%05zu-of-%05zu.safetensors", stem.c_str(), i + 1,
                  shards.size());
    saveTensors((dir / name).string(), shards[i], {{"format", "pt"}});
    for (auto& [k, v] : shards[i]) {
      index["weight_map"][k] = name;
      total += v.numel() * v.element_size();
    }
  }
  index["metadata"]["total_size"] = total;
  writeJson(dir / (stem + ".safetensors.index.json"), index);
}

int main(int argc, char** argv) {
  CLI::App app{"Write a diffusers model folder (the template's family) with random weights",
               "ditstudio-make-model"};
  std::string templ, out, diskDtype = "float32";
  uint64_t seed = 2026, shardBytes = 0;
  int layers = -1, singleLayers = -1, heads = -1, headDim = -1, guidance = -1;
  std::vector<int> vaeBlocks, axes;
  double stdev = 0.02;
  app.add_option("--template", templ,
                 "diffusers folder (any supported family) whose tokenizers, scheduler and "
                 "configs are copied")
      ->required();
  app.add_option("--out", out, "output folder")->required();
  app.add_option("--seed", seed, "weight seed");
  app.add_option("--std", stdev, "weight standard deviation");
  app.add_option("--disk-dtype", diskDtype, "float32 | bfloat16 | float16 on disk");
  app.add_option("--shard-bytes", shardBytes,
                 "shard the transformer into files of at most this size");
  app.add_option("--num-layers", layers);
  app.add_option("--num-single-layers", singleLayers);
  app.add_option("--num-attention-heads", heads);
  app.add_option("--attention-head-dim", headDim);
  app.add_option("--axes-dims-rope", axes);
  app.add_option("--guidance-embeds", guidance, "1 or 0");
  app.add_option("--vae-block-out-channels", vaeBlocks);
  CLI11_PARSE(app, argc, argv);
  try {
    const fs::path t(templ), o(out);
    const fs::path tmp = o.string() + ".partial";
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    const ModelFolder templateFolder = ModelFolder::open(t.string());
    const FamilySpec& family = familyOf(templateFolder);
    // Model components (a config.json) get their config; the rest (tokenizers, the scheduler)
    // are copied whole.
    for (const std::string& d : family.components) {
      if (fs::exists(t / d / "config.json")) {
        fs::create_directories(tmp / d);
        fs::copy_file(t / d / "config.json", tmp / d / "config.json");
      } else {
        fs::copy(t / d, tmp / d, fs::copy_options::recursive);
      }
    }
    fs::copy_file(t / "model_index.json", tmp / "model_index.json");
    json tc = readJson(tmp / "transformer/config.json");
    if (layers >= 0) tc["num_layers"] = layers;
    if (singleLayers >= 0) tc["num_single_layers"] = singleLayers;
    if (heads > 0) tc["num_attention_heads"] = heads;
    if (headDim > 0) tc["attention_head_dim"] = headDim;
    if (!axes.empty()) tc["axes_dims_rope"] = axes;
    if (guidance >= 0) tc["guidance_embeds"] = guidance == 1;
    writeJson(tmp / "transformer/config.json", tc);
    if (!vaeBlocks.empty()) {
      json vc = readJson(tmp / "vae/config.json");
      vc["block_out_channels"] = vaeBlocks;
      vc["down_block_types"] = std::vector<std::string>(vaeBlocks.size(), "DownEncoderBlock2D");
      vc["up_block_types"] = std::vector<std::string>(vaeBlocks.size(), "UpDecoderBlock2D");
      writeJson(tmp / "vae/config.json", vc);
    }
    const auto m = ModelFolder::open(tmp.string());
    const at::ScalarType disk = parseComputeDType(diskDtype);
    auto make = [&](uint64_t s) {
      auto w = WeightSource::random(seed + s, at::kFloat, at::kCPU, stdev);
      w->setRecording(true);
      return w;
    };
    const std::string modelIndex = m.path + "/model_index.json";
    const FamilyRuntime& runtime = familyRuntime(m.pipeline_class, modelIndex);
    uint64_t k =
        0;  // seed offset: 1 for the transformer, then each component in the family's order
    for (const std::string& c : family.components) {
      if (!fs::exists(tmp / c / "config.json")) continue;  // tokenizers, scheduler
      auto w = make(++k);
      if (c == family.transformer_component) {
        const std::string cfgFile = m.component(c) + "/config.json";
        const auto model =
            loadTransformer(m.transformer_class, readConfigJson(cfgFile), cfgFile, *w);
        saveComponent(tmp / c, "diffusion_pytorch_model", w->recorded(), disk, shardBytes);
      } else {
        const std::string stem = runtime.buildComponent(m, c, *w);
        if (!stem.empty()) saveComponent(tmp / c, stem, w->recorded(), disk, 0);
      }
    }
    fs::remove_all(o);
    fs::rename(tmp, o);
    std::cout << "wrote " << o.string() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
