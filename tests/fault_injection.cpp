// fault_injection MODE: a small rank program that makes one rank fail in a chosen way while the
// others are inside (or about to enter) a collective. Run under mpirun; the fault tests check that
// mpirun exits non-zero within the time limit and that the output names the rank and the cause.
//
// Modes:
//   none      every rank completes (control run)
//   throw     rank 1 throws before the second allreduce (-> error event + MPI_Abort)
//   exit      rank 1 calls exit(3) mid-run while the others block in allreduce
//   mismatch  rank r allgathers 4 + r elements without per-rank sizes (-> CollectiveMismatchError)
//   corrupt   rank 1 opens a truncated safetensors file while the others wait in a barrier
//   hang      rank 1 sleeps outside any collective; the others time out
//   (DITSTUDIO_COLLECTIVE_TIMEOUT_S)
#include <ATen/ATen.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>

#include "backend/io/safetensors.h"
#include "parallel/process_group_checked.h"
#include "parallel/process_group_mpi.h"
#include "parallel/runtime.h"

namespace {

void corruptRead(int rank) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("dit_fault_corrupt_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  std::vector<uint8_t> bytes(4 * 1024 * sizeof(float), 0);
  dit::writeSafetensors(path, {{"w", dit::RawTensor{dit::DType::F32, {1024, 4}, bytes}}});
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);  // truncated download
  try {
    dit::SafetensorsReader reader(path);
    std::filesystem::remove(path);
    throw std::runtime_error("rank " + std::to_string(rank) + ": the truncated file " + path +
                             " was accepted");
  } catch (...) {
    std::filesystem::remove(path);
    throw;
  }
}

int run(const std::string& mode) {
  // The agreement checks name the ranks in mismatch and timeout messages (as DeviceMesh does by
  // default).
  auto world = dit::makeCheckedProcessGroup(
      std::make_shared<dit::ProcessGroupMPI>(MPI_COMM_WORLD, "world"), MPI_COMM_WORLD);
  const int rank = world->rank();
  if (world->size() < 2) throw std::runtime_error("fault_injection needs at least 2 ranks");

  at::Tensor t = at::full({4}, static_cast<double>(rank + 1), at::kFloat);
  world->allreduce(t)->wait();  // a healthy first collective: the fault happens mid-run

  if (mode == "throw") {
    if (rank == 1) throw std::runtime_error("fault injection: rank 1 throws before allreduce #2");
    world->allreduce(t)->wait();
  } else if (mode == "exit") {
    if (rank == 1) {
      dit::emitEvent(nlohmann::json{{"event", "log"},
                                    {"rank", rank},
                                    {"level", "error"},
                                    {"message", "fault injection: rank 1 calls exit(3)"}});
      std::exit(3);
    }
    world->allreduce(t)->wait();
  } else if (mode == "mismatch") {
    at::Tensor x = at::ones({4 + rank}, at::kFloat);
    world->allgather(x, 0)->wait();
  } else if (mode == "corrupt") {
    if (rank == 1) corruptRead(rank);
    world->barrier()->wait();
  } else if (mode == "hang") {
    if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(120));
    world->allreduce(t)->wait();
  } else if (mode != "none") {
    throw std::invalid_argument("fault_injection: unknown mode '" + mode + "'");
  }
  world->barrier()->wait();
  if (rank == 0)
    std::printf("fault_injection: rank 0 finished without a fault (%s)\n", mode.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dit::initRuntime(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "none";
  const int rc = dit::runOrAbort([&] { return run(mode); });
  dit::finalizeRuntime();
  return rc;
}
