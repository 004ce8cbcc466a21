#include "parallel/device_mesh.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <set>
#include <stdexcept>

#include "parallel/process_group_checked.h"
#include "parallel/process_group_mpi.h"
#include "parallel/process_group_nccl.h"
#include "parallel/runtime.h"

namespace dit {

namespace {

int dimIndex(const std::string& dim) {
  for (size_t i = 0; i < DeviceMesh::kDims.size(); ++i)
    if (dim == DeviceMesh::kDims[i]) return static_cast<int>(i);
  return -1;
}

std::array<int, 5> degreesOf(const Strategy& s) {
  return {s.dp_degree, s.cfg_degree, s.ring_degree, s.ulysses_degree, s.tp_degree};
}

}  // namespace

bool collectiveChecksEnabled(const std::string& backend, int option) {
  if (option == 0 || option == 1) return option == 1;
  const char* v = std::getenv("DITSTUDIO_CHECK_COLLECTIVES");
  if (!v || !*v) return backend == "mpi";
  const std::string s = v;
  if (s == "1") return true;
  if (s == "0") return false;
  throw std::invalid_argument("DITSTUDIO_CHECK_COLLECTIVES='" + s + "' is not 0 or 1");
}

#ifndef DITSTUDIO_HAVE_NCCL
std::shared_ptr<ProcessGroup> makeNCCLProcessGroup(std::shared_ptr<ProcessGroupMPI>, int) {
  throw std::runtime_error("ProcessGroupNCCL is not available: DiT Studio was built without NCCL");
}
void setCurrentCudaDevice(int) {}
#endif

DeviceMesh::DeviceMesh(const Strategy& s, MPI_Comm world, const DeviceMeshOptions& opts)
    : strategy_(s) {
  int worldSize = 1;
  MPI_Comm_rank(world, &rank_);
  MPI_Comm_size(world, &worldSize);
  auto issues = validateDegrees(s);
  if (issues.empty() && s.world != worldSize)
    issues.push_back({"world", "the strategy is for " + std::to_string(s.world) + " ranks (" +
                                   s.describe() + ") but the process group has " +
                                   std::to_string(worldSize) + " ranks"});
  if (!issues.empty())
    throw std::invalid_argument("invalid parallel strategy: " + joinIssues(issues));
  timeout_ = opts.timeout_s >= 0 ? opts.timeout_s : defaultCollectiveTimeoutSeconds();
  coords_ = meshCoords(s, rank_);

  // Backend.
  const bool cuda = s.device == "cuda";
  if (opts.backend != "auto" && opts.backend != "mpi" && opts.backend != "nccl")
    throw std::invalid_argument("DeviceMesh: backend '" + opts.backend +
                                "' is not one of auto, mpi, nccl");
  if (opts.backend == "nccl" && !kHaveNCCL)
    throw std::runtime_error(
        "DeviceMesh: backend nccl requested but this build has no NCCL (DITSTUDIO_HAVE_NCCL off)");
  if (opts.backend == "nccl" && !cuda)
    throw std::invalid_argument("DeviceMesh: backend nccl needs device cuda (strategy device is " +
                                s.device + ")");
  const bool useNccl = cuda && kHaveNCCL && opts.backend != "mpi";
  backend_ = worldSize == 1 ? "local" : (useNccl ? "nccl" : "mpi");
  checked_ = worldSize > 1 && collectiveChecksEnabled(backend_, opts.check_collectives);
  if (cuda) {
    const int local = localRank();  // collective on first use; every rank reaches this line
    const size_t n = at::getNumGPUs();
    if (n == 0)
      throw std::runtime_error(
          "device cuda requested on world rank " + std::to_string(rank_) +
          " but no CUDA device is visible (CPU-only LibTorch, or CUDA_VISIBLE_DEVICES empty)");
    deviceIndex_ = localDeviceIndex(local, static_cast<int>(n));
    if (useNccl) setCurrentCudaDevice(deviceIndex_);
  }

  // Communicator creation (MPI_Comm_split / MPI_Comm_dup) blocks with no deadline: every rank
  // first shows up within the collective timeout, or the missing ranks are named.
  if (worldSize > 1) checkStartupArrival(world, "creating the process groups", timeout_);
  // Groups, created in the same order on every rank.
  world_ = worldSize == 1 ? makeLocalProcessGroup() : makeGroup(world, "world");
  const auto deg = degreesOf(s);
  for (size_t k = 0; k < kDims.size(); ++k) {
    const std::string dim = kDims[k];
    if (deg[k] == 1) {
      groups_[dim] = makeLocalProcessGroup();
      continue;
    }
    auto base = coords_;
    base[k] = 0;
    const int color = rankOf(base);
    MPI_Comm sub;
    if (MPI_Comm_split(world, color, coords_[k], &sub) != MPI_SUCCESS)
      throw std::runtime_error("DeviceMesh: MPI_Comm_split for dim " + dim + " failed");
    // When ring_degree (ulysses_degree) is 1 the cp group has exactly the ranks of the ulysses
    // (ring) group: share it instead of creating a second communicator.
    std::string name = dim;
    if ((dim == "ulysses" && s.ring_degree == 1) || (dim == "ring" && s.ulysses_degree == 1))
      name += "=cp";
    try {
      groups_[dim] = makeGroup(sub, name);
    } catch (...) {
      MPI_Comm_free(&sub);
      throw;
    }
    MPI_Comm_free(&sub);
  }
  if (s.ring_degree == 1) {
    groups_["cp"] = groups_["ulysses"];
  } else if (s.ulysses_degree == 1) {
    groups_["cp"] = groups_["ring"];
  } else {
    auto base = coords_;
    base[2] = 0;
    base[3] = 0;
    const int color = rankOf(base);
    const int key = coords_[2] * s.ulysses_degree + coords_[3];
    MPI_Comm sub;
    if (MPI_Comm_split(world, color, key, &sub) != MPI_SUCCESS)
      throw std::runtime_error("DeviceMesh: MPI_Comm_split for dim cp failed");
    try {
      groups_["cp"] = makeGroup(sub, "cp");
    } catch (...) {
      MPI_Comm_free(&sub);
      throw;
    }
    MPI_Comm_free(&sub);
  }
  groups_["world"] = world_;
}

DeviceMesh::~DeviceMesh() = default;

std::shared_ptr<ProcessGroup> DeviceMesh::makeGroup(MPI_Comm comm, const std::string& name) {
  auto mpi = std::make_shared<ProcessGroupMPI>(comm, name, timeout_);
  std::shared_ptr<ProcessGroup> g = mpi;
  if (backend_ == "nccl") g = makeNCCLProcessGroup(mpi, deviceIndex_);
  if (checked_) g = makeCheckedProcessGroup(std::move(g), comm);
  return g;
}

int DeviceMesh::rankOf(const std::array<int, 5>& c) const {
  const auto& s = strategy_;
  return (((c[0] * s.cfg_degree + c[1]) * s.ring_degree + c[2]) * s.ulysses_degree + c[3]) *
             s.tp_degree +
         c[4];
}

std::shared_ptr<ProcessGroup> DeviceMesh::group(const std::string& dim) const {
  auto it = groups_.find(dim);
  if (it == groups_.end())
    throw std::invalid_argument("DeviceMesh: unknown dim '" + dim +
                                "' (valid: dp, cfg, ring, ulysses, tp, cp, world)");
  return it->second;
}

int DeviceMesh::coord(const std::string& dim) const {
  if (dim == "world") return rank_;
  if (dim == "cp") return coords_[2] * strategy_.ulysses_degree + coords_[3];
  const int k = dimIndex(dim);
  if (k < 0)
    throw std::invalid_argument("DeviceMesh: unknown dim '" + dim +
                                "' (valid: dp, cfg, ring, ulysses, tp, cp, world)");
  return coords_[k];
}

int DeviceMesh::size(const std::string& dim) const {
  if (dim == "world") return strategy_.world;
  if (dim == "cp") return strategy_.cpDegree();
  const int k = dimIndex(dim);
  if (k < 0)
    throw std::invalid_argument("DeviceMesh: unknown dim '" + dim +
                                "' (valid: dp, cfg, ring, ulysses, tp, cp, world)");
  return degreesOf(strategy_)[k];
}

uint64_t DeviceMesh::bytesSent() const {
  std::set<const ProcessGroup*> seen;
  uint64_t total = 0;
  for (const auto& [name, g] : groups_)
    if (seen.insert(g.get()).second) total += g->bytesSent();
  return total;
}

void DeviceMesh::setTimeoutSeconds(double seconds) {
  timeout_ = seconds;
  for (auto& [name, g] : groups_) g->setTimeoutSeconds(seconds);
}

}  // namespace dit
