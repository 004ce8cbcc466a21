#include "app/generation.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <malloc.h>

#include <filesystem>
#include <random>

#include "backend/flux_plan.h"
#include "backend/png_io.h"
#include "backend/tensor_io.h"

namespace dit {
namespace fs = std::filesystem;
using nlohmann::json;

GenerationParams paramsFromJson(const json& j) {
  GenerationParams p;
  p.prompt = requestField(j, "prompt", p.prompt);
  p.negative_prompt = requestField(j, "negative_prompt", p.negative_prompt);
  p.true_cfg_scale = requestField(j, "true_cfg_scale", p.true_cfg_scale);
  p.width = requestField(j, "width", p.width);
  p.height = requestField(j, "height", p.height);
  p.steps = requestField(j, "steps", p.steps);
  p.guidance = requestField(j, "guidance", p.guidance);
  p.seed = requestField(j, "seed", p.seed);
  p.max_sequence_length = requestField(j, "max_sequence_length", p.max_sequence_length);
  return p;
}

json paramsToJson(const GenerationParams& p) {
  return json{{"prompt", p.prompt},
              {"negative_prompt", p.negative_prompt},
              {"true_cfg_scale", p.true_cfg_scale},
              {"width", p.width},
              {"height", p.height},
              {"steps", p.steps},
              {"guidance", p.guidance},
              {"seed", p.seed},
              {"max_sequence_length", p.max_sequence_length}};
}

static void makeParent(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
}

void writeImagePng(const std::string& path, const GenerationResult& r, const json& extra) {
  makeParent(path);
  json meta = paramsToJson(r.params);
  for (auto it = extra.begin(); it != extra.end(); ++it) meta[it.key()] = *it;
  meta["generator"] = "DiT Studio";
  auto rgb = toRGB8(r.image);
  // ensure_ascii: the tEXt chunk is Latin-1; non-ASCII prompt text is \u-escaped JSON.
  writePng(path, rgb.data(), static_cast<int>(r.image.size(2)), static_cast<int>(r.image.size(1)),
           {{"parameters", meta.dump(-1, ' ', true)}, {"Software", "DiT Studio"}});
}

void writeResultTensors(const std::string& path, const GenerationResult& r) {
  makeParent(path);
  std::map<std::string, at::Tensor> t{{"initial_latents", r.initial_latents},
                                      {"final_latents", r.final_latents}};
  if (r.image.defined()) t["image"] = r.image;
  saveTensors(path, t, {{"parameters", paramsToJson(r.params).dump(-1, ' ', true)}});
}

std::string indexedPath(const std::string& path, int index, int count) {
  if (count <= 1) return path;
  fs::path p(path);
  return (p.parent_path() / (p.stem().string() + "-" + std::to_string(index) + p.extension().string())).string();
}

ModelDims modelDims(const ModelFolder& m) {
  return fluxModelDims(m.transformer, m.vae.vaeScaleFactor());
}

std::string validateStrategyForRequest(const Strategy& s, const ModelFolder& m, GenerationParams p,
                                       int numImages) {
  auto issues = validateDegrees(s);
  if (!issues.empty()) return joinIssues(issues);
  const int vsf = m.vae.vaeScaleFactor();
  RequestDims r;
  r.width = p.width > 0 ? p.width : 128 * vsf;
  r.height = p.height > 0 ? p.height : 128 * vsf;
  r.text_len = p.max_sequence_length > 0 ? p.max_sequence_length : std::min(512, m.t5_max_length);
  r.true_cfg = p.trueCfg();
  r.num_images = numImages;
  return joinIssues(validateForRequest(s, modelDims(m), r));
}

void tuneHostAllocator() {
  // No mmap-backed chunks at all (the mmap threshold cannot exceed 32 MiB, and attention scores
  // are larger); keep up to 1 GiB of free heap before trimming.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // Denormal floats (tiny activations of random-weight models) slow CPU math several-fold.
  at::globalContext().setFlushDenormal(true);
}

int64_t randomSeed() {
  std::random_device rd;
  return static_cast<int64_t>(((uint64_t(rd()) << 32) | rd()) & 0x7fffffffffffffffULL);
}

}  // namespace dit
