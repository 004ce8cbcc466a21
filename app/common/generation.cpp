#include "app/common/generation.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>

#include "app/common/request_values.h"
#include "backend/io/image_io.h"
#include "backend/io/png_io.h"
#include "backend/io/tensor_io.h"
#include "backend/models/family_registry.h"

namespace dit {
namespace fs = std::filesystem;
using nlohmann::json;

PipelineInputs pipelineParams(const protocol::GenerationParams& p) {
  PipelineInputs g;
  g.prompt = p.prompt;
  g.negative_prompt = p.negative_prompt;
  g.negative_prompt_given = p.hasNegativePrompt();
  g.width = p.width;
  g.height = p.height;
  g.steps = p.steps;
  g.guidance = p.guidance;
  g.options = p.options;
  g.seed = p.seed;  // unsigned 64-bit end to end (torch.Generator.manual_seed's range)
  g.max_sequence_length = p.max_sequence_length;
  g.init_image = p.init_image;
  g.mask_image = p.mask_image;
  for (const protocol::ReferenceImage& ref : p.reference_images)
    g.reference_images.push_back(ref.file);
  g.strength = p.strength;
  g.cache = parseStepCacheConfig(p.cache);
  return g;
}

namespace {
// Throws naming `what` and the file when `file` does not have the SHA-256 `recorded`.
void checkRecordedHash(const std::string& what, const std::string& file,
                       const std::string& recorded) {
  if (recorded.empty()) return;
  const std::string h = sha256File(file);
  std::string want = recorded;
  for (char& c : want) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (h != want)
    throw std::runtime_error(what + " " + file + " has SHA-256 " + h + ", not the recorded " +
                             want + " (the file changed since the image was made)");
}
}  // namespace

void checkInputImages(const protocol::GenerationParams& p) {
  if (!p.init_image.empty()) {
    readImage(p.init_image);  // throws naming the file
    checkRecordedHash("init image", p.init_image, p.init_image_sha256);
  }
  if (!p.mask_image.empty()) readImage(p.mask_image);
  for (size_t i = 0; i < p.reference_images.size(); ++i) {
    const protocol::ReferenceImage& ref = p.reference_images[i];
    const std::string what = "reference image " + std::to_string(i + 1);
    try {
      readImage(ref.file);
    } catch (const std::exception& e) {
      throw std::runtime_error(what + ": " + e.what());
    }
    checkRecordedHash(what, ref.file, ref.sha256);
  }
}

json cacheReport(const GenerationResult& r) {
  if (r.cache_computed.empty()) return nullptr;
  json computed = json::array(), reused = json::array();
  double computedMs = 0, reusedMs = 0;
  int nc = 0, nr = 0;
  for (size_t i = 0; i < r.cache_computed.size(); ++i) {
    auto it = r.timings_ms.find("step." + std::to_string(i + 1));
    const double ms = it == r.timings_ms.end() ? 0.0 : it->second;
    if (r.cache_computed[i]) {
      computed.push_back(i);
      computedMs += ms;
      ++nc;
    } else {
      reused.push_back(i);
      reusedMs += ms;
      ++nr;
    }
  }
  const double mean = nc ? computedMs / nc : 0.0;
  return json{{"mode", r.params.cache.toString()},
              {"computed_steps", computed},
              {"reused_steps", reused},
              {"steps", r.cache_computed.size()},
              {"step_ms_computed", mean},
              {"saved_ms", std::max(0.0, nr * mean - reusedMs)}};
}

protocol::GenerationParams imageParams(protocol::GenerationParams request,
                                       const PipelineInputs& resolved) {
  request.prompt = resolved.prompt;
  request.width = resolved.width;
  request.height = resolved.height;
  request.steps = resolved.steps;
  request.max_sequence_length = resolved.max_sequence_length;
  request.seed = resolved.seed;
  request.random_seed = false;
  request.num_images = 1;
  request.cache = resolved.cache.enabled() ? resolved.cache.toString() : "";
  if (!request.init_image.empty() && request.init_image_sha256.empty()) {
    try {
      request.init_image_sha256 = sha256File(request.init_image);
    } catch (const std::exception&) {
      // The file went away after the image was made: recorded by path only.
    }
  }
  for (protocol::ReferenceImage& ref : request.reference_images)
    if (ref.sha256.empty()) {
      try {
        ref.sha256 = sha256File(ref.file);
      } catch (const std::exception&) {
        // As above: recorded by path only.
      }
    }
  return request;
}

static void makeParent(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
}

void writeImagePng(const std::string& path, const GenerationResult& r,
                   const protocol::GenerationParams& params, const json& extra) {
  makeParent(path);
  json meta = protocol::toJson(params);
  for (auto it = extra.begin(); it != extra.end(); ++it) meta[it.key()] = *it;
  if (json c = cacheReport(r); !c.is_null()) meta["cache_report"] = c;
  meta["generator"] = "DiT Studio";
  auto rgb = toRGB8(r.image);
  // ensure_ascii: the tEXt chunk is Latin-1; non-ASCII prompt text is \u-escaped JSON.
  writePng(path, rgb.data(), static_cast<int>(r.image.size(2)), static_cast<int>(r.image.size(1)),
           {{"parameters", meta.dump(-1, ' ', true)}, {"Software", "DiT Studio"}});
}

void writeResultTensors(const std::string& path, const GenerationResult& r,
                        const protocol::GenerationParams& params) {
  makeParent(path);
  std::map<std::string, at::Tensor> t{{"initial_latents", r.initial_latents},
                                      {"final_latents", r.final_latents}};
  if (r.image.defined()) t["image"] = r.image;
  saveTensors(path, t, {{"parameters", protocol::toJson(params).dump(-1, ' ', true)}});
}

std::string indexedPath(const std::string& path, int index, int count) {
  if (count <= 1) return path;
  fs::path p(path);
  return (p.parent_path() /
          (p.stem().string() + "-" + std::to_string(index) + p.extension().string()))
      .string();
}

std::string uniqueImagePath(const std::string& dir, const std::string& id, int index,
                            uint64_t seed) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create the output folder " + dir + ": " + ec.message());
  std::string safeId;
  for (char c : id)
    safeId +=
        (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  if (safeId.size() > 64) safeId.resize(64);
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::strftime(date, sizeof date, "%Y%m%d-%H%M%S", &tm);
  const std::string stem = (fs::path(dir) / (std::string(date) + "-" + safeId + "-" +
                                             std::to_string(index) + "-s" + std::to_string(seed)))
                               .string();
  for (int n = 1; n < 100000; ++n) {
    std::string path =
        stem;  // appended piecewise: `"-" + to_string(n)` trips GCC 12's -Wstringop-overflow
    if (n > 1) path.append("-").append(std::to_string(n));
    path.append(".png");
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::close(fd);
      return path;
    }
    if (errno != EEXIST)
      throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
  }
  throw std::runtime_error("no free image name for " + stem + ".png");
}

ModelDims modelDims(const ModelFolder& m) { return m.dims(); }

std::string validateStrategyForRequest(const Strategy& s, const ModelFolder& m,
                                       const protocol::GenerationParams& p, int numImages) {
  auto issues = validateDegrees(s);
  if (!issues.empty()) return joinIssues(issues);
  // The family's declared request, resolved once (sizes from the init image included).
  protocol::GenerationParams q = p;
  q.num_images = numImages;
  const ResolvedRequest r = resolveRequest(requestSpecOf(m), requestValues(q));
  if (!r.ok()) return r.message();
  return joinIssues(validateForRequest(s, modelDims(m), r.dims()));
}

void tuneHostAllocator() {
  // No mmap-backed chunks at all (the mmap threshold cannot exceed 32 MiB, and attention scores
  // are larger); keep up to 1 GiB of free heap before trimming.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // Denormal floats (tiny activations of random-weight models) slow CPU math several-fold.
  at::globalContext().setFlushDenormal(true);
}

uint64_t randomSeed() {
  std::random_device rd;
  // Drawn from [0, 2^63): any seed up to 2^64 - 1 can be requested, but a seed the program picks
  // itself stays exact in every store that holds signed 64-bit integers (Qt's JSON, the GUI's
  // history), so Reuse and recall give the same image.
  return ((uint64_t(rd()) << 32) | rd()) >> 1;
}

}  // namespace dit
