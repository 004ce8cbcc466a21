// End-to-end failure handling of the real process group (ditstudio-cli -> mpirun ->
// ditstudio-worker): a rank that throws, exits or sees a corrupt model ends every rank within
// 60 seconds, and the user is told which rank failed and why. Faults are injected with
// DITSTUDIO_FAULT_RANK / DITSTUDIO_FAULT (see app/worker/fault_injection.h).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "golden_util.h"

namespace fs = std::filesystem;

namespace {

struct Outcome {
  int rc;
  double seconds;
  std::string log;
};

Outcome runWithFault(const std::string& env, const std::string& flags, const std::string& model) {
  const fs::path dir =
      fs::temp_directory_path() / ("ditstudio-faults-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string log = (dir / "log.txt").string();
  const std::string cmd =
      env + " timeout 120 " + DITSTUDIO_CLI + " --model " + model +
      " --prompt 'a cat' --width 32 --height 32 --steps 4 --max-sequence-length 48 " + flags +
      " --output " + (dir / "out.png").string() + " > " + log + " 2>&1";
  auto t0 = std::chrono::steady_clock::now();
  const int rc = std::system(cmd.c_str());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ifstream in(log);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : 128, s,
          std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>())};
}

}  // namespace

TEST(WorkerFaults, RankThrowsMidRun) {
  auto o = runWithFault("DITSTUDIO_FAULT_RANK=1 DITSTUDIO_FAULT=throw_at_step:2", "--tp-degree 2",
                        dit::test::fixtureDir());
  EXPECT_NE(o.rc, 0) << o.log;
  EXPECT_NE(o.rc, 124) << "timed out (hang)\n" << o.log;
  EXPECT_LT(o.seconds, 60.0);
  EXPECT_NE(o.log.find("rank 1: injected fault: exception at step 2"), std::string::npos) << o.log;
}

TEST(WorkerFaults, RankExitsMidRun) {
  auto o = runWithFault("DITSTUDIO_FAULT_RANK=1 DITSTUDIO_FAULT=exit_at_step:2",
                        "--ulysses-degree 2", dit::test::fixtureDir());
  EXPECT_NE(o.rc, 0) << o.log;
  EXPECT_NE(o.rc, 124) << "timed out (hang)\n" << o.log;
  EXPECT_LT(o.seconds, 60.0);
  // mpirun names the rank that exited.
  EXPECT_NE(o.log.find("error: rank 1 exited with code 3"), std::string::npos) << o.log;
}

TEST(WorkerFaults, CorruptModelOnOneRankOnly) {
  const fs::path bad =
      fs::temp_directory_path() / ("ditstudio-faults-model-" + std::to_string(::getpid()));
  fs::remove_all(bad);
  fs::copy(dit::test::fixtureDir(), bad, fs::copy_options::recursive);
  for (auto& e : fs::recursive_directory_iterator(bad))
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  const fs::path f = bad / "transformer/diffusion_pytorch_model.safetensors";
  fs::resize_file(f, fs::file_size(f) - 4096);
  auto o = runWithFault("DITSTUDIO_FAULT_RANK=1 DITSTUDIO_FAULT=model:" + bad.string(),
                        "--tp-degree 2", dit::test::fixtureDir());
  EXPECT_NE(o.rc, 0) << o.log;
  EXPECT_NE(o.rc, 124) << "timed out (hang)\n" << o.log;
  EXPECT_LT(o.seconds, 60.0);
  EXPECT_NE(o.log.find("rank 1: " + f.string()), std::string::npos) << o.log;
  EXPECT_NE(o.log.find("outside the data section"), std::string::npos) << o.log;
}

TEST(WorkerFaults, HungRankEndsAtCollectiveTimeout) {
  // A rank stuck in compute: the others give up at the collective timeout (10 s here; default
  // 300 s, DITSTUDIO_COLLECTIVE_TIMEOUT_S) and the whole group is aborted.
  auto o = runWithFault(
      "DITSTUDIO_COLLECTIVE_TIMEOUT_S=10 DITSTUDIO_FAULT_RANK=1 DITSTUDIO_FAULT=hang_at_step:2",
      "--ring-degree 2", dit::test::fixtureDir());
  EXPECT_NE(o.rc, 0) << o.log;
  EXPECT_NE(o.rc, 124) << "timed out (hang)\n" << o.log;
  EXPECT_LT(o.seconds, 60.0);
  EXPECT_NE(o.log.find("rank 0: "), std::string::npos) << o.log;
  EXPECT_NE(o.log.find("collective timeout"), std::string::npos) << o.log;
  EXPECT_NE(o.log.find("rank(s) 1 (world 1) never arrived"), std::string::npos) << o.log;
}

TEST(WorkerFaults, ModelMissingOnOneRankOnlyEndsTogether) {
  // One node's model folder differs (here: missing on rank 1): every rank learns it before the
  // mesh is built and exits; nothing waits for a rank that will never arrive.
  auto o = runWithFault("DITSTUDIO_FAULT_RANK=1 DITSTUDIO_FAULT=model:/nonexistent/model",
                        "--tp-degree 2", dit::test::fixtureDir());
  EXPECT_EQ(o.rc, 2) << o.log;
  EXPECT_LT(o.seconds, 60.0);
  EXPECT_NE(o.log.find("rank 1: /nonexistent/model: model folder does not exist"),
            std::string::npos)
      << o.log;
}
