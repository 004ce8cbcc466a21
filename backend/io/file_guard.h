// Opening untrusted model files as what they claim to be (issue 16): regular files only (a FIFO,
// device or socket at a weights/config path is refused before it is opened, so nothing blocks),
// bounded reads, JSON parsed with a depth limit and errors that never echo the file's bytes, and
// names taken from index files resolved inside their folder. Torch-free (the GUI's model reading
// and the tokenizers use it too). Every error is a ModelFileError naming the file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "backend/io/safetensors.h"  // ModelFileError

namespace dit {

/// Config, index and tokenizer JSON files larger than this are refused (64 MiB; real
/// tokenizer.json files are a few MiB).
inline constexpr std::uint64_t kMaxJsonFileBytes = std::uint64_t(64) << 20;
/// JSON nesting depth allowed in model files (configs need 3, safetensors headers 3).
inline constexpr int kMaxModelJsonDepth = 64;

/// Opens `path` read-only after checking with stat() that it is a regular file (following
/// symlinks, as Hugging Face caches use them), with O_NONBLOCK so that a FIFO swapped in after
/// the check cannot block either, and checks the opened descriptor again with fstat(). Returns
/// the file descriptor (O_CLOEXEC, blocking mode restored). Throws ModelFileError: "file is
/// missing", "is a FIFO (named pipe), not a regular file" (directory, character device, block
/// device, socket likewise), "cannot open file: <strerror>".
int openRegularFile(const std::string& path);
/// The whole of a regular file (openRegularFile) of at most `maxBytes` bytes. Throws
/// ModelFileError for a larger file ("is 80000000 bytes; files of this kind are limited to
/// 67108864") or a read error (with strerror).
std::string readRegularFile(const std::string& path, std::uint64_t maxBytes = kMaxJsonFileBytes);

/// True when `text` nests JSON objects/arrays deeper than `maxDepth` (brackets inside strings
/// do not count). Iterative, so any depth is safe to scan.
bool jsonDepthExceeds(std::string_view text, int maxDepth);
/// Parses untrusted JSON text read from `file`. Throws ModelFileError "<what> nests JSON more
/// than 64 levels deep" or "<what> is not valid JSON: syntax error at byte N" — the parser's
/// own message, which quotes the bytes it read, is not passed on.
nlohmann::json parseModelJson(std::string_view text, const std::string& file,
                              const std::string& what = "file");
/// readRegularFile + parseModelJson.
nlohmann::json readModelJson(const std::string& file, const std::string& what = "file");

/// `dir/name` for a file name read from an index file (`indexFile`, for the message), refused
/// unless `name` is a relative path that stays inside `dir`: no absolute path, no ".." part, not
/// empty, no NUL. Lexical (symlinks inside the folder, as in Hugging Face caches, are followed
/// when the file is opened). Throws ModelFileError naming the index, the entry and the rule.
std::string resolveInside(const std::string& dir, const std::string& name,
                          const std::string& indexFile, const std::string& entry);

}  // namespace dit
