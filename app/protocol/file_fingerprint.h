// Model fingerprint (issue 18): a cheap digest that two hosts compare to make sure every rank of
// a multi-host group reads the same checkpoint (the ssh pre-flight: the launcher runs
// `ditstudio-worker --model-fingerprint` on each host and compares the lists it prints), and the
// full content hash (issue 36) that the ranks of a multi-host group compare for every file they
// read (encodeFileList / decodeFileList: the lists the ranks exchange). Both ends of that wire,
// the launcher (app/launcher/) and the ranks (app/worker/), use these; part of dit_protocol
// (app/protocol/): no Torch, no Qt.
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
/// differs (size A here, B there)" or "PATH differs (same size)", at most `max` of them joined by
/// "; ", then "and N more". Empty when the lists are equal.
std::string describeDifferences(const std::vector<FileFingerprint>& mine,
                                const std::vector<FileFingerprint>& theirs, int max = 4);

/// Content identity of the file at `path`: XXH3-128 (xxHash 0.8) of every byte, 32 lowercase hex
/// digits in xxHash's canonical (big-endian) form, so `xxh128sum FILE` prints the same digits.
/// Cached on disk by (device, inode, path) and validated by size and modification time in
/// nanoseconds (see contentHashCacheFile): a file that changed is hashed again, one that did not is
/// not read at all. A cache that cannot be read or written is ignored (the hash is computed).
/// `from_cache`, when given, is set to whether the digest came from the cache. Throws
/// std::runtime_error naming the file when it cannot be opened or read.
std::string contentHash(const std::string& path, bool* from_cache = nullptr);

/// The cache file contentHash() uses: $DITSTUDIO_HASH_CACHE when set ("" or "off" = no cache),
/// else $XDG_CACHE_HOME/ditstudio/content-hashes.tsv, else
/// $HOME/.cache/ditstudio/content-hashes.tsv
/// ("" when none of them is set). One line per file: `DEV INO SIZE MTIME_NS HASH PATH`; written
/// whole to a temporary file and renamed over the old one (concurrent writers lose entries, never
/// corrupt the file); at most 20000 entries are kept.
std::string contentHashCacheFile();

/// The files modelFileFingerprints() covers, in its order and with the same `path` and `size`,
/// each with its full content hash (contentHash) as `digest` instead of the sampled one. Same
/// errors as modelFileFingerprints.
std::vector<FileFingerprint> modelContentHashes(const std::vector<std::string>& paths);

/// One rank's files for a cross-host comparison (describeRankDifferences).
struct RankFiles {
  int rank = 0;
  std::string host;
  std::vector<FileFingerprint> files;
};

/// `files` as text for an exchange between ranks: one `SIZE DIGEST PATH` line per file.
std::string encodeFileList(const std::vector<FileFingerprint>& files);

/// The list encodeFileList() wrote (lines that do not parse are skipped; never throws).
std::vector<FileFingerprint> decodeFileList(const std::string& text);

/// XXH3-128 (32 hex digits) of encodeFileList(files): equal lists give equal digests.
std::string fileListDigest(const std::vector<FileFingerprint>& files);

/// What differs between the first entry of `ranks` (the reference, rank 0) and each other one,
/// by file: "PATH: content hash H0 on rank 0 (host A), H1 on rank 1 (host B)", "PATH: missing
/// on rank 1 (host B)" or "PATH: only on rank 1 (host B)"; at most `max` of them joined by "; ",
/// then "and N more". Empty when every list equals the reference.
std::string describeRankDifferences(const std::vector<RankFiles>& ranks, int max = 4);

}  // namespace dit::protocol
