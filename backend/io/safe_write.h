// Writing output files safely (issue 16): a temporary file in the destination folder, written,
// flushed to the disk (fsync), then renamed onto the destination — only when the destination is
// a regular file or absent (a FIFO, device, socket, directory or symlink there is refused and
// left alone). On any failure the temporary file is removed and the error carries the system's
// cause (strerror: "No space left on device", "File too large", "Permission denied").
// Torch-free.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <vector>

namespace dit {

/// One output file being written. Usage: AtomicFile f(path); f.write(...); ...; f.commit();
/// Destroying it without commit() removes the temporary file (nothing appears at `path`).
class AtomicFile {
 public:
  /// Checks the destination (lstat: absent or a regular file) and creates the temporary file
  /// "<dir>/.<name>.XXXXXX" (mode 0644 subject to the umask). Throws std::runtime_error "cannot
  /// write <path>: ..." naming the cause: "it is a FIFO (named pipe), not a regular file;
  /// refusing to replace it", "cannot create a temporary file in <dir>: <strerror>".
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends `n` bytes. Throws std::runtime_error "cannot write <path>: <strerror>" (the
  /// temporary file is removed).
  void write(const void* data, std::size_t n);
  /// fsync, close, re-check the destination, rename onto it, fsync the folder. Throws
  /// std::runtime_error with the cause (the temporary file is removed).
  void commit();
  const std::string& tempPath() const { return tmp_; }

 private:
  [[noreturn]] void fail(const std::string& cause);
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

/// Which existing files the AtomicFile commits of this thread may replace while this object
/// lives (innermost wins): `replaceable` are the output paths that existed when the request was
/// accepted and that the request allowed to overwrite. Any other destination is committed with
/// renameat2(RENAME_NOREPLACE) (link + unlink where the file system lacks it), so a file that
/// appeared there during the computation is never replaced: the commit fails with "cannot write
/// <path>: a file appeared there while the image was computed ...". Without a policy in force,
/// commit() renames onto a regular file as before (tools that always replace).
class OutputReplacePolicy {
 public:
  explicit OutputReplacePolicy(const std::vector<std::string>& replaceable);
  ~OutputReplacePolicy();
  OutputReplacePolicy(const OutputReplacePolicy&) = delete;
  OutputReplacePolicy& operator=(const OutputReplacePolicy&) = delete;
  /// The policy in force on this thread, or null.
  static const OutputReplacePolicy* current();
  /// True when `path` (compared as an absolute, lexically normal path) may be replaced.
  bool mayReplace(const std::string& path) const;

 private:
  std::set<std::string> replaceable_;
  const OutputReplacePolicy* previous_ = nullptr;
};

/// AtomicFile for a whole buffer.
void writeFileAtomically(const std::string& path, const void* data, std::size_t n);

/// Throws std::runtime_error "cannot write <path>: it is a FIFO (named pipe), not a regular
/// file; refusing to replace it" when something other than a regular file is at `path`
/// (lstat; absent is fine).
void requireRegularOrAbsent(const std::string& path);

}  // namespace dit
