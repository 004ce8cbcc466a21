// Fault injection, for the fault tests (tests/test_worker_faults.cpp) and for rehearsing failures
// on a demo rig: DITSTUDIO_FAULT_RANK=r with DITSTUDIO_FAULT=throw_at_step:N | exit_at_step:N |
// hang_at_step:N | kill_at_step:N | slow_encode:MS (the text encoding takes MS ms longer: a long
// encode to cancel) |
// model:/other/folder (that rank alone loads another — e.g. corrupt — model folder).
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

namespace dit::worker {

/// The fault this rank was asked to inject (none: kind empty).
struct Fault {
  std::string kind;
  std::string arg;
  int step = -1;
  /// Reads DITSTUDIO_FAULT_RANK / DITSTUDIO_FAULT; the fault applies only to rank `rank`.
  static Fault fromEnv(int rank) {
    Fault f;
    const char* r = std::getenv("DITSTUDIO_FAULT_RANK");
    const char* k = std::getenv("DITSTUDIO_FAULT");
    if (!r || !k || std::atoi(r) != rank) return f;
    std::string spec(k);
    auto colon = spec.find(':');
    f.kind = spec.substr(0, colon);
    f.arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
    if (f.kind != "model" && !f.arg.empty()) f.step = std::atoi(f.arg.c_str());
    return f;
  }
  /// Called at each denoising step: throws (std::runtime_error), exits, kills or hangs this rank
  /// at the chosen step.
  void atStep(int step) const {
    if (step != this->step) return;
    if (kind == "throw_at_step")
      throw std::runtime_error("injected fault: exception at step " + std::to_string(step));
    if (kind == "exit_at_step") std::_Exit(3);
    if (kind == "kill_at_step") ::raise(SIGKILL);  // as `kill -9` of this rank
    if (kind == "hang_at_step") std::this_thread::sleep_for(std::chrono::hours(1));
  }
  /// Called as each pipeline stage starts ("encode", "denoise", ...): slow_encode sleeps there.
  void atStage(const std::string& stage) const {
    if (kind == "slow_encode" && stage == "encode")
      std::this_thread::sleep_for(std::chrono::milliseconds(step));
  }
};

}  // namespace dit::worker
