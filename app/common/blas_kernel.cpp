#include "app/common/blas_kernel.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

namespace dit {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool has(const std::vector<std::string>& flags, const char* f) {
  return std::find(flags.begin(), flags.end(), f) != flags.end();
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

template <typename F>
F blasSymbol(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

[[noreturn]] void reexec(char** argv) {
  ::execv("/proc/self/exe", argv);
  // Only reached when exec failed: the caller's process is unchanged, tell why and go on would
  // be wrong (the environment now asks for a kernel this process does not run), so stop.
  std::fprintf(stderr, "error: could not re-execute /proc/self/exe to select the BLAS kernel: %s\n",
               std::strerror(errno));
  std::_Exit(2);
}

}  // namespace

std::vector<std::string> cpuFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream words(line.substr(colon + 1));
    std::vector<std::string> out;
    for (std::string w; words >> w;) out.push_back(lower(w));
    return out;
  }
  return {};
}

int blasCoreTier(const std::string& coreName) {
  const std::string c = lower(coreName);
  static const std::pair<const char*, int> tiers[] = {
      {"prescott", 1},    {"core2", 1},       {"penryn", 1},        {"dunnington", 1},
      {"nehalem", 1},     {"atom", 1},        {"katmai", 1},        {"coppermine", 1},
      {"northwood", 1},   {"banias", 1},      {"opteron", 1},       {"opteron_sse3", 1},
      {"barcelona", 1},   {"shanghai", 1},    {"istanbul", 1},      {"bobcat", 1},
      {"nano", 1},        {"sandybridge", 2}, {"bulldozer", 2},     {"piledriver", 2},
      {"steamroller", 2}, {"excavator", 2},   {"haswell", 3},       {"zen", 3},
      {"skylakex", 4},    {"cooperlake", 5},  {"sapphirerapids", 6}};
  for (const auto& [name, tier] : tiers)
    if (c == name) return tier;
  return 0;
}

std::vector<std::string> blasCoreCandidates(const std::vector<std::string>& flags) {
  std::vector<std::string> out;
  const bool avx2 = has(flags, "avx2") && has(flags, "fma");
  if (!avx2) return out;
  const bool avx512 = has(flags, "avx512f") && has(flags, "avx512bw") && has(flags, "avx512dq") &&
                      has(flags, "avx512vl");
  // SapphireRapids kernels exist only in OpenBLAS >= 0.3.22-ish and a library that does not know
  // the name silently keeps its own choice, so Cooperlake (AVX512-BF16, known since 0.3.11) is the
  // top candidate: it is what AMX machines get from a current OpenBLAS for float32 GEMM anyway.
  if (avx512 && has(flags, "avx512_bf16")) out.push_back("Cooperlake");
  if (avx512) out.push_back("SkylakeX");
  out.push_back("Haswell");
  return out;
}

std::string blasCoreToForce(const std::string& detected, const std::vector<std::string>& flags) {
  auto candidates = blasCoreCandidates(flags);
  if (candidates.empty()) return "";
  const int tier = blasCoreTier(detected);
  if (tier >= 3 || tier == 0) return "";  // has AVX2 kernels, or a name we do not rank: keep it
  return candidates.front();
}

bool setBlasThreads(int n) {
  auto set = blasSymbol<void (*)(int)>("openblas_set_num_threads");
  if (!set) return false;
  set(n);
  return true;
}

BlasInfo queryBlas() {
  BlasInfo b;
  auto corename = blasSymbol<char* (*)()>("openblas_get_corename");
  auto config = blasSymbol<char* (*)()>("openblas_get_config");
  auto threads = blasSymbol<int (*)()>("openblas_get_num_threads");
  if (!corename) {
    b.library = "unknown";
    b.selection = "unavailable";
    b.note = "the loaded BLAS is not OpenBLAS (no openblas_get_corename); kernel selection skipped";
    return b;
  }
  b.core = corename();
  b.config = config ? config() : "";
  b.threads = threads ? threads() : 0;
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..." -> "OpenBLAS 0.3.21"
  std::istringstream w(b.config);
  std::string name, version;
  w >> name >> version;
  b.library = name.empty() ? "OpenBLAS" : name + (version.empty() ? "" : " " + version);
  b.selection = "detected";
  b.note = "OpenBLAS detected core " + b.core;
  return b;
}

std::string blasSelfCheck() {
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);
  auto sgemm = blasSymbol<Sgemm>("cblas_sgemm");
  if (!sgemm) return "cblas_sgemm not found in the loaded BLAS";
  constexpr int M = 96, K = 80, N = 72;
  constexpr int kRowMajor = 101, kNoTrans = 111;
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(M * K), b(K * N), c(M * N, 0.0f);
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);
  sgemm(kRowMajor, kNoTrans, kNoTrans, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N);
  double maxErr = 0, maxRef = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double ref = 0;
      for (int k = 0; k < K; ++k) ref += static_cast<double>(a[i * K + k]) * b[k * N + j];
      maxErr = std::max(maxErr, std::abs(ref - c[i * N + j]));
      maxRef = std::max(maxRef, std::abs(ref));
    }
  if (!std::isfinite(maxErr) || maxErr > 1e-5 * std::max(1.0, maxRef)) {
    std::ostringstream o;
    o << "SGEMM self-check failed: max |error| " << maxErr
      << " against a float64 reference (max |C| " << maxRef << ")";
    return o.str();
  }
  return "";
}

namespace {
// The core selection of ensureBlasKernel (the policy in blas_kernel.h); may re-execute.
BlasInfo selectCore(BlasInfo b, char** argv, bool allowReexec) {
  const char* autoCore = env("DITSTUDIO_BLAS_AUTO");
  const char* userCore = env("OPENBLAS_CORETYPE");
  const std::string detectedBefore =
      env("DITSTUDIO_BLAS_DETECTED") ? env("DITSTUDIO_BLAS_DETECTED") : "";

  if (autoCore && std::string(autoCore) == "failed") {
    b.selection = "fallback";
    const char* why = env("DITSTUDIO_BLAS_NOTE");
    b.note = "automatic BLAS kernel selection failed (" +
             std::string(why ? why : "unknown reason") + "); using OpenBLAS's own choice " +
             b.core + " (set OPENBLAS_CORETYPE to choose)";
    return b;
  }
  if (autoCore) {  // this process was re-executed with our choice: verify it before any work
    // The choice may come from another host (a hostfile group forwards it to every rank): a
    // core whose instructions this CPU lacks would fault in the self-check.
    const std::vector<std::string> flags = cpuFlags();
    int runnable = has(flags, "avx") ? 2 : 1;
    for (const std::string& c : blasCoreCandidates(flags))
      runnable = std::max(runnable, blasCoreTier(c));
    std::string problem;
    if (blasCoreTier(autoCore) > runnable)
      problem = "this CPU lacks the instructions of core " + std::string(autoCore) +
                " (chosen on another host)";
    else if (lower(b.core) != lower(autoCore))
      problem = "OpenBLAS did not take core " + std::string(autoCore) + " (it runs " + b.core + ")";
    else
      problem = blasSelfCheck();
    if (problem.empty()) {
      b.selection = "auto";
      b.note = "OpenBLAS detected " +
               (detectedBefore.empty() ? std::string("a slower core") : detectedBefore) +
               " on a CPU with better instructions; selected " + b.core +
               " (SGEMM self-check passed; set OPENBLAS_CORETYPE to override)";
      return b;
    }
    if (!allowReexec) {
      b.selection = "fallback";
      b.note = problem;
      return b;
    }
    ::unsetenv("OPENBLAS_CORETYPE");
    ::setenv("DITSTUDIO_BLAS_AUTO", "failed", 1);
    ::setenv("DITSTUDIO_BLAS_NOTE", problem.c_str(), 1);
    reexec(argv);
  }
  if (userCore) {
    b.selection = "user";
    b.note =
        "OPENBLAS_CORETYPE=" + std::string(userCore) + " set by the user: OpenBLAS runs " + b.core;
    return b;
  }
  const char* assumed = env("DITSTUDIO_BLAS_ASSUME_DETECTED");
  const std::string detected = assumed ? assumed : b.core;
  const std::string force = blasCoreToForce(detected, cpuFlags());
  if (force.empty()) return b;
  if (!allowReexec) {
    b.note = "OpenBLAS detected " + detected + " on a CPU that offers " + force +
             " kernels; would select " + force;
    return b;
  }
  ::setenv("OPENBLAS_CORETYPE", force.c_str(), 1);
  ::setenv("DITSTUDIO_BLAS_AUTO", force.c_str(), 1);
  ::setenv("DITSTUDIO_BLAS_DETECTED", detected.c_str(), 1);
  reexec(argv);
}
}  // namespace

std::string ompSpinPolicy(int blasThreads, const std::string& blasConfig) {
  if (blasThreads <= 1 || blasConfig.find("USE_OPENMP") != std::string::npos) return "";
  if (env("GOMP_SPINCOUNT") || env("OMP_WAIT_POLICY")) return "";
  return kOmpSpinCount;
}

BlasInfo ensureBlasKernel(int /*argc*/, char** argv, bool allowReexec) {
  BlasInfo b = queryBlas();
  if (b.selection == "unavailable") return b;
  if (const char* off = env("DITSTUDIO_BLAS_SELECT"); off && std::string(off) == "0") {
    b.note += " (automatic selection disabled by DITSTUDIO_BLAS_SELECT=0)";
    return b;
  }
  // Thread pools: set before the core selection, so that one re-execution serves both. The
  // marker counts only together with the value it names (a rank started on another host gets
  // the DITSTUDIO_* variables forwarded but not GOMP_SPINCOUNT: it applies the policy itself).
  bool spinNeedsReexec = false;
  const char* mark = env("DITSTUDIO_OMP_SPIN");
  const char* spinNow = env("GOMP_SPINCOUNT");
  if (mark && spinNow && std::string(mark) == spinNow) {
    b.threadPolicy = std::string("GOMP_SPINCOUNT=") + mark;
  } else if (const std::string spin = ompSpinPolicy(b.threads, b.config); !spin.empty()) {
    b.threadPolicy = (allowReexec ? "GOMP_SPINCOUNT=" : "would set GOMP_SPINCOUNT=") + spin;
    if (allowReexec) {
      ::setenv("GOMP_SPINCOUNT", spin.c_str(), 1);
      ::setenv("DITSTUDIO_OMP_SPIN", spin.c_str(), 1);
      spinNeedsReexec = true;
    }
  }
  b = selectCore(b, argv, allowReexec);
  if (spinNeedsReexec) {  // the core stayed as detected: re-execute for the spin count alone
    ::execv("/proc/self/exe", argv);
    // Nothing depends on it: go on with libgomp's default, and say why.
    const std::string why = std::strerror(errno);
    ::unsetenv("GOMP_SPINCOUNT");
    ::unsetenv("DITSTUDIO_OMP_SPIN");
    b.threadPolicy.clear();
    b.note += " (could not re-execute to set GOMP_SPINCOUNT: " + why + ")";
  }
  return b;
}

nlohmann::json blasInfoJson(const BlasInfo& b) {
  return nlohmann::json{
      {"library", b.library},           {"config", b.config},       {"core", b.core},
      {"threads", b.threads},           {"selection", b.selection}, {"note", b.note},
      {"thread_policy", b.threadPolicy}};
}

}  // namespace dit
