// Model fingerprint (issue 18): a cheap digest that two hosts compare to make sure every rank of
// a multi-host group reads the same checkpoint. Part of dit_launcher (app/launcher/): no Torch, no
// Qt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dit::launcher {

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

/// One file's part of a model fingerprint.
struct FileFingerprint {
  std::string path;    ///< the root as given, then '/', then the path relative to it
  std::uint64_t size;  ///< bytes
  std::string digest;  ///< 16 hex digits over the relative path, size and sampled blocks
};

/// The files modelFingerprint() covers, in its order, each with its own digest (same rules and
/// errors as modelFingerprint). modelFingerprint(paths) is a digest of this list.
std::vector<FileFingerprint> modelFileFingerprints(const std::vector<std::string>& paths);

/// What differs between this machine's files `mine` and another host's `theirs` (both from
/// modelFileFingerprints of the same paths): "PATH missing there", "PATH only there", "PATH
/// differs (size A vs B)" or "PATH differs (same size)", at most `max` of them joined by "; ",
/// then "and N more". Empty when the lists are equal.
std::string describeDifferences(const std::vector<FileFingerprint>& mine,
                                const std::vector<FileFingerprint>& theirs, int max = 4);

}  // namespace dit::launcher
