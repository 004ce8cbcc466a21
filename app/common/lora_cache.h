// The worker's LoRA cache (issue 13): each LoRA file is parsed once per model and kept as this
// rank's prepared shards (tensor_parallel::PreparedLora: only the slices this rank's layers need,
// in the compute dtype, on the device), keyed by the file's absolute path, size and modification
// time, bounded by a byte budget (least recently used entries go first; entries in use by the
// current request stay alive through their shared_ptr). Requests then switch LoRAs and strengths
// without touching the base weights (LoraTargets::apply).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "app/protocol/protocol.h"
#include "backend/io/lora_file.h"
#include "backend/models/diffusion_transformer.h"
#include "parallel/tensor_parallel/lora.h"

namespace dit {

class LoraCache {
 public:
  struct Entry {
    std::string key;   ///< absolute path | size | mtime | device:inode
    std::string file;  ///< as requested
    std::string sha256;
    LoraFileInfo info;  ///< header summary (format, rank, modules)
    std::shared_ptr<const tensor_parallel::PreparedLora> prepared;
  };

  /// `budgetBytes`: most bytes of prepared shards kept (0 = keep nothing between requests).
  explicit LoraCache(uint64_t budgetBytes) : budget_(budgetBytes) {}

  /// The prepared adapter of `file` for `model`: from the cache, else parsed (loadLoraAdapter with
  /// the model's kohya mapping), checked and sharded (LoraTargets::prepare) and hashed (SHA-256).
  /// Throws ModelFileError / std::invalid_argument / std::runtime_error naming the file (missing
  /// file, corrupt file, unknown format, first module that does not exist or does not fit).
  std::shared_ptr<const Entry> get(const std::string& file, DiffusionTransformer& model);

  /// Resolves a request's LoRA list and applies it to the model (an empty list restores the base
  /// weights exactly); fills each entry's sha256. All-or-nothing: on a throw nothing was applied.
  std::vector<std::shared_ptr<const Entry>> apply(std::vector<protocol::LoraRequest>& loras,
                                                  DiffusionTransformer& model);

  uint64_t bytes() const { return bytes_; }
  /// Files parsed so far (cache misses).
  int loads() const { return loads_; }

 private:
  void evict();
  uint64_t budget_, bytes_ = 0;
  int loads_ = 0;
  std::list<std::shared_ptr<const Entry>> lru_;  ///< most recently used first
};

/// The budget from DITSTUDIO_LORA_CACHE_MB (MiB; default 4096).
uint64_t loraCacheBudgetFromEnv();

}  // namespace dit
