// DeviceMesh: the ranks of MPI_COMM_WORLD arranged as the 5-D grid of a Strategy, with one
// ProcessGroup per named dimension.
//
// Dims (outermost first): dp, cfg, ring, ulysses, tp (tp innermost), so that
//   world rank = ((((dp_i*cfg + cfg_i)*ring + ring_i)*ulysses + uly_i)*tp + tp_i)
// (strategy.h meshCoords()). Groups: one per single dim (the ranks that differ only in that
// coordinate; group rank = the coordinate), "cp" = ring x ulysses (the ranks sharing dp, cfg and
// tp; cp rank = ring_i*ulysses + uly_i), and "world". A dim of degree 1 gets
// makeLocalProcessGroup(); a dim whose ranks are exactly those of another group shares that group
// object (e.g. "cp" is the "ulysses" group when ring_degree is 1).
//
// Backend: "mpi" for device cpu; for cuda, ProcessGroupNCCL when built with NCCL
// (DITSTUDIO_HAVE_NCCL), else ProcessGroupMPI staging through host memory.
//
// Agreement checks: every multi-rank group is wrapped in ProcessGroupChecked
// (parallel/process_group_checked.h: CollectiveMismatchError naming ranks and calls, timeouts
// naming the missing ranks) when collectiveChecksEnabled() says so: by default on for the MPI
// backend and off for NCCL (a blocking host round trip per call would serialise the GPU path);
// the environment variable DITSTUDIO_CHECK_COLLECTIVES=1 turns it on for NCCL (debugging), =0
// turns it off for MPI.
//
// Device: for cuda, this rank uses device localDeviceIndex(localRank(), device count)
// (parallel/runtime.h), the one rule shared by the NCCL communicator and the pipeline (which
// takes deviceIndex() from the mesh).
#pragma once

#include <mpi.h>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/process_group.h"
#include "parallel/strategy.h"

namespace dit {

struct DeviceMeshOptions {
  /// Collective deadline for every group; < 0: defaultCollectiveTimeoutSeconds().
  double timeout_s = -1.0;
  /// "auto" (see above), "mpi" (force MPI, also for cuda tensors) or "nccl" (throws when NCCL is
  /// not compiled in).
  std::string backend = "auto";
  /// Wrap the groups in ProcessGroupChecked: -1 from the environment / backend default (see
  /// collectiveChecksEnabled()), 0 off, 1 on.
  int check_collectives = -1;
};

/// Whether DeviceMesh wraps its groups of `backend` ("mpi", "nccl", "local") in
/// ProcessGroupChecked: `option` 0/1 forces it; -1 reads DITSTUDIO_CHECK_COLLECTIVES ("1" on, "0"
/// off; unset or empty: on for "mpi", off otherwise). Throws std::invalid_argument for another
/// value of the variable. Local, no communication.
bool collectiveChecksEnabled(const std::string& backend, int option = -1);

class DeviceMesh {
 public:
  /// Names of the single dims, outermost first.
  static constexpr std::array<const char*, 5> kDims = {"dp", "cfg", "ring", "ulysses", "tp"};

  /// Builds every group. Collective over `world`: all its ranks construct the mesh at the same
  /// point with the same strategy (sub-communicators are split in the fixed order dp, cfg, ring,
  /// ulysses, tp, cp). Throws std::invalid_argument when validateDegrees(s) reports an issue or
  /// s.world differs from the size of `world` (message: joinIssues); std::runtime_error when the
  /// requested backend is unavailable. For cuda, selects CUDA device
  /// localDeviceIndex(localRank(), device count) (std::runtime_error when none is visible).
  DeviceMesh(const Strategy& s, MPI_Comm world = MPI_COMM_WORLD,
             const DeviceMeshOptions& opts = {});
  ~DeviceMesh();
  DeviceMesh(const DeviceMesh&) = delete;
  DeviceMesh& operator=(const DeviceMesh&) = delete;

  /// Group of `dim` ("dp", "cfg", "ring", "ulysses", "tp", "cp" or "world"). Local lookup.
  /// Throws std::invalid_argument for an unknown name (listing the valid ones).
  std::shared_ptr<ProcessGroup> group(const std::string& dim) const;
  /// This rank's coordinate along `dim` (== group(dim)->rank()); "cp": ring_i*ulysses + uly_i;
  /// "world": the world rank. Local.
  int coord(const std::string& dim) const;
  /// Degree of `dim` (== group(dim)->size()); "cp": ring*ulysses; "world": world size. Local.
  int size(const std::string& dim) const;
  /// The whole-world group (every rank).
  std::shared_ptr<ProcessGroup> world() const { return world_; }
  const Strategy& strategy() const { return strategy_; }
  /// World rank of this process.
  int rank() const { return rank_; }
  /// Backend of the multi-rank groups: "mpi" or "nccl" ("local" for a 1-rank world).
  const std::string& backend() const { return backend_; }
  /// CUDA device index used by this rank (-1 for cpu): the device the pipeline must run on.
  int deviceIndex() const { return deviceIndex_; }
  /// True when the multi-rank groups are wrapped in ProcessGroupChecked.
  bool checksCollectives() const { return checked_; }
  /// World rank of the mesh coordinates {dp, cfg, ring, ulysses, tp}.
  int rankOf(const std::array<int, 5>& coords) const;
  /// Sum of bytesSent() over the distinct groups of the mesh (payload bytes this rank sent).
  uint64_t bytesSent() const;
  /// Sets timeoutSeconds() on every group (local; set the same value on every rank).
  void setTimeoutSeconds(double seconds);

 private:
  std::shared_ptr<ProcessGroup> makeGroup(MPI_Comm comm, const std::string& name);

  Strategy strategy_;
  int rank_ = 0;
  int deviceIndex_ = -1;
  bool checked_ = false;
  std::string backend_;
  double timeout_ = 300.0;
  std::array<int, 5> coords_{};
  std::shared_ptr<ProcessGroup> world_;
  std::map<std::string, std::shared_ptr<ProcessGroup>> groups_;
};

}  // namespace dit
