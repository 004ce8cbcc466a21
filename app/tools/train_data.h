// ditstudio-train's data and ranks: the data-parallel group (DataParallel), the drawn batches of
// synthetic shapes, the packed latents, the edge weights of the reconstruction loss, and the JSON
// files of the folder.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "app/demo/shapes_dataset.h"
#include "app/tools/train_state.h"
#include "parallel/process_group.h"
#include "parallel/process_group_mpi.h"

namespace dit::train {

/// The JSON file `p`. Throws std::runtime_error naming the file (unreadable, not JSON).
nlohmann::json readJson(const std::filesystem::path& p);
/// Writes `j` (indented) to `p`. Throws std::runtime_error naming the file.
void writeJson(const std::filesystem::path& p, const nlohmann::json& j);

/// Data-parallel training over the ranks of `mpirun -np N ditstudio-train ...` (torch
/// DistributedDataParallel's semantics): every rank makes the same random draws for the whole
/// batch and computes the loss on its own contiguous 1/N of it; after backward the gradients are
/// averaged over the ranks with one allreduce of all of them (ProcessGroupMPI), so every rank
/// applies the same AdamW update and the parameters stay equal. The result equals the one-process
/// run's up to the order of floating-point sums. Rank 0 writes the folder, the checkpoints and
/// the log. One process (no mpirun): size 1, no MPI.
struct DataParallel {
  std::unique_ptr<ProcessGroupMPI> group;
  int rank = 0, size = 1;

  /// Rows [lo, hi) of a batch of n that this rank computes. Throws std::invalid_argument when
  /// the ranks do not divide n.
  std::pair<int, int> part(int n) const {
    if (n % size != 0)
      throw std::invalid_argument("batch " + std::to_string(n) + " is not divisible by the " +
                                  std::to_string(size) + " data-parallel ranks");
    return {rank * n / size, (rank + 1) * n / size};
  }
  /// This rank's rows of a whole-batch tensor (dim 0 = n).
  at::Tensor slice(const at::Tensor& t) const {
    const auto [lo, hi] = part(static_cast<int>(t.size(0)));
    return t.slice(0, lo, hi);
  }
  /// Averages the gradients of `p` (and this rank's loss) over the ranks; returns the mean loss.
  /// `extra` (e.g. the KL term for the log) is averaged too, in place. Collective: every rank
  /// calls it once per step, with the same parameters.
  double averageGradients(Params& p, double localLoss, double* extra = nullptr) const {
    if (size == 1) return localLoss;
    std::vector<at::Tensor> grads, flat;
    for (auto& [k, t] : p)
      if (t.grad().defined())
        grads.push_back(t.mutable_grad()), flat.push_back(grads.back().reshape(-1));
    flat.push_back(at::full({1}, localLoss, at::kFloat));
    flat.push_back(at::full({1}, extra ? *extra : 0.0, at::kFloat));
    at::Tensor buf = at::cat(flat);
    group->allreduce(buf)->wait();
    buf.div_(size);
    int64_t off = 0;
    for (auto& g : grads) {
      g.copy_(buf.slice(0, off, off + g.numel()).view(g.sizes()));
      off += g.numel();
    }
    if (extra) *extra = buf[off + 1].item<double>();
    return buf[off].item<double>();
  }
  /// Throws std::runtime_error unless every rank holds the same `values` (e.g. the phase and step
  /// each resumed at: ranks resuming from different checkpoints would issue different
  /// collectives). Collective.
  void requireSame(const std::vector<int64_t>& values, const std::string& what) const {
    if (size == 1) return;
    at::Tensor hi = at::tensor(values, at::kLong), lo = hi.clone();
    group->allreduce(hi, ReduceOp::Max)->wait();
    group->allreduce(lo, ReduceOp::Min)->wait();
    if (!at::equal(hi, lo))
      throw std::runtime_error("the data-parallel ranks disagree on " + what + " (rank " +
                               std::to_string(rank) +
                               " has its own; is the checkpoint on a file system all ranks see?)");
  }
};

/// Per-pixel weights of the reconstruction loss, [B, 1, H, W]: `edgeWeight` on pixels whose 3x3
/// neighbourhood holds a colour change (the objects' outlines, 10-15% of the pixels), 1
/// elsewhere, normalised to mean 1 per image. Plain MSE spends its gradient on the flat areas and
/// learns outlines last; shapes are told apart by their outlines. edgeWeight 1: plain MSE.
at::Tensor edgeWeights(const at::Tensor& x, double edgeWeight);

/// Images of the scenes: [B, 3, H, W] float32 in [-1, 1].
at::Tensor drawBatch(const std::vector<demo::ShapeScene>& scenes, int size);

/// diffusers FluxPipeline._pack_latents: [B, C, h, w] -> [B, (h/2)(w/2), 4C].
at::Tensor packLatents(const at::Tensor& z);

}  // namespace dit::train
