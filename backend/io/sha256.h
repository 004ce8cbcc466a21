// SHA-256 (FIPS 180-4, computed by OpenSSL libcrypto) of files and byte strings, Torch-free and
// Qt-free: the LoRA and init-image identity
// recorded in PNG metadata (issue 13), usable by the GUI too.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dit {

/// Lowercase hex SHA-256 (64 digits) of `bytes`.
std::string sha256Hex(std::string_view bytes);

/// Lowercase hex SHA-256 of the file's contents, read in 1 MiB blocks. Throws std::runtime_error
/// naming the file when it cannot be opened or read.
std::string sha256File(const std::string& path);

}  // namespace dit
