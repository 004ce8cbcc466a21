// Model fingerprint (issue 18): a cheap digest that two hosts compare to make sure every rank of
// a multi-host group reads the same checkpoint. Part of dit_protocol: no Torch, no Qt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dit::protocol {

/// Digest of the files under `paths` (each a folder, walked recursively in name order, or a
/// single file; hidden entries, names starting with '.', are skipped). Per file: its path
/// relative to the root it was found under, its size in bytes, the FNV-1a 64 hash of its first
/// 1 MiB (a safetensors header and the first tensors) and of its last 64 KiB, and of 64 blocks of
/// 4 KiB spread evenly through the rest. Reads at most ~1.3 MiB a file, so a 24 GB FLUX.1
/// checkpoint is fingerprinted in milliseconds; two checkpoints that differ only in bytes outside
/// those blocks get the same fingerprint (a different fine-tune changes nearly every block).
/// Empty path strings are ignored. Returns 16 hex digits. Throws std::runtime_error naming the
/// path when one does not exist or a file cannot be read.
std::string modelFingerprint(const std::vector<std::string>& paths);

}  // namespace dit::protocol
