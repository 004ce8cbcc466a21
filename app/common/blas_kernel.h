// BLAS kernel selection: never run on OpenBLAS's slowest kernels by accident.
//
// Why: OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels at load time from the CPU
// model. A version that does not know a newer CPU falls back to its "Prescott" (SSE3) kernels:
// Debian 12's OpenBLAS 0.3.21 on Xeons reporting family 6 model 207 does, and every float32 GEMM
// then runs about 3.5x slower (measured in issue 10: 1036-1086 ms per step instead of 297-316 ms
// with OPENBLAS_CORETYPE=Cooperlake). The kernel is chosen once, when the library initialises, so
// the only fix from inside the program is to set OPENBLAS_CORETYPE and re-execute itself before
// any work (the rank programs do so before MPI_Init, so it also covers workers started by the GUI
// or by hand with mpirun).
//
// Policy (ensureBlasKernel):
//  - OPENBLAS_CORETYPE set by the user: never overridden (selection "user").
//  - The detected core has no AVX2 kernels while the CPU offers AVX2+FMA (or better): the best
//    core this CPU's flags allow among those OpenBLAS has (Cooperlake for AVX512-BF16/AMX,
//    SkylakeX for AVX-512 F/BW/DQ/VL, Haswell for AVX2+FMA) is set and the program re-executes
//    itself; the new process checks that OpenBLAS took that core and that an SGEMM on random
//    data matches a float64 reference (relative error <= 1e-5) before any model work
//    (selection "auto"). If either check fails it re-executes once more without the setting and
//    says why (selection "fallback").
//  - Otherwise the library's own choice stands (selection "detected").
//  - Thread pools: when OpenBLAS runs its own pthreads pool with more than one thread and the user
//    set neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY, GOMP_SPINCOUNT=10000 is set (see
//    ompSpinPolicy) and the program re-executes itself (once, together with a core change if there
//    is one): libgomp reads it only when it loads.
// The result (library, config, core, threads, selection, note) goes into the worker's hello
// event, the CLI's log and ditstudio-bench's JSON.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace dit {

struct BlasInfo {
  std::string library;    ///< "OpenBLAS 0.3.21" ("unknown" when the BLAS is not OpenBLAS)
  std::string config;     ///< openblas_get_config()
  std::string core;       ///< openblas_get_corename(), e.g. "Cooperlake"
  int threads = 0;        ///< openblas_get_num_threads()
  std::string selection;  ///< "detected" | "user" | "auto" | "fallback" | "unavailable"
  std::string note;       ///< one sentence for the log (what was detected and chosen, and why)
  /// "GOMP_SPINCOUNT=N" when ensureBlasKernel set LibTorch's OpenMP spin count (see
  /// ompSpinPolicy; "would set GOMP_SPINCOUNT=N" without re-execution), "" otherwise.
  std::string threadPolicy;
};

/// libgomp's spin count ensureBlasKernel sets (iterations a waiting OpenMP thread spins before it
/// sleeps; libgomp's default is 300000).
inline constexpr const char* kOmpSpinCount = "10000";

/// The GOMP_SPINCOUNT to set, or "" to leave the OpenMP runtime alone: non-empty when OpenBLAS runs
/// its own thread pool (a pthreads build, no USE_OPENMP in its config) with more than one thread
/// and the user set neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY. Then LibTorch's OpenMP threads,
/// spinning after each parallel region, and OpenBLAS's threads compete for the same cores: on 2
/// cores of a Xeon, 2 threads, the 73.4 M config in float32 took 370-540 ms a step, against 119
/// ms with GOMP_SPINCOUNT=10000 (OMP_WAIT_POLICY=PASSIVE: 120 ms, but bfloat16, whose GEMMs run
/// on OpenMP through oneDNN, went from 51 to 77 ms; with 10000 it is 54-58 ms).
std::string ompSpinPolicy(int blasThreads, const std::string& blasConfig);

/// The CPU's instruction-set flags (lower case, as in /proc/cpuinfo "flags"). Empty when unknown.
std::vector<std::string> cpuFlags();

/// Kernel tier of an OpenBLAS core name: 1 SSE-only (Prescott, Core2, Penryn, Nehalem, Atom, ...),
/// 2 AVX (Sandybridge, Bulldozer...), 3 AVX2 (Haswell, Zen, ...), 4 AVX-512 (SkylakeX),
/// 5 AVX-512 BF16 (Cooperlake), 6 AMX (SapphireRapids). 0 for an unknown name. Case-insensitive.
int blasCoreTier(const std::string& core);

/// OpenBLAS core names worth trying for a CPU with `flags`, best first (empty when the CPU has
/// no AVX2+FMA, where no better choice exists).
std::vector<std::string> blasCoreCandidates(const std::vector<std::string>& flags);

/// The core to force, or "" to keep the library's choice: non-empty only when `detected` has
/// no AVX2 kernels (tier < 3) while the CPU offers them.
std::string blasCoreToForce(const std::string& detected, const std::vector<std::string>& flags);

/// What the loaded BLAS reports now (no selection logic; selection "detected" or "unavailable").
BlasInfo queryBlas();

/// SGEMM self-check through the loaded BLAS (cblas_sgemm on 96x80 @ 80x72 random data) against a
/// float64 reference. Returns "" when it matches within 1e-5 relative (max-norm), else the reason.
std::string blasSelfCheck();

/// Applies the policy above; may not return (re-executes /proc/self/exe with the same argv).
/// Call first thing in main(), before MPI_Init and before any thread starts. `allowReexec` false:
/// only report what would be done (tests). Environment: OPENBLAS_CORETYPE (user's choice wins);
/// DITSTUDIO_BLAS_AUTO / DITSTUDIO_BLAS_DETECTED (set by this function across the re-exec);
/// DITSTUDIO_BLAS_SELECT=0 disables the policy; DITSTUDIO_BLAS_ASSUME_DETECTED=NAME makes the
/// policy act as if OpenBLAS had detected NAME (tests, for machines whose OpenBLAS detects the
/// CPU); GOMP_SPINCOUNT / OMP_WAIT_POLICY (the user's wins); DITSTUDIO_OMP_SPIN (set across the
/// re-exec when this function set GOMP_SPINCOUNT).
BlasInfo ensureBlasKernel(int argc, char** argv, bool allowReexec = true);

/// Sets OpenBLAS's own thread count (openblas_set_num_threads) to `n`, for programs that choose
/// their intra-op threads after start-up (at::set_num_threads leaves OpenBLAS's pool, sized from
/// OMP_NUM_THREADS or the core count when the library loaded, as it was: the two pools then spin
/// against each other). Returns false when the loaded BLAS is not OpenBLAS.
bool setBlasThreads(int n);

/// JSON object {library, config, core, threads, selection, note, thread_policy}.
nlohmann::json blasInfoJson(const BlasInfo& b);

}  // namespace dit
