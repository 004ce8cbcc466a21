// A fresh scratch folder per test process and prefix (mkdtemp under the system temp folder), so
// that files left by an earlier run whose process id is reused (a ctest killed mid-run) are never
// read back or refused as existing outputs.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace dit::test {

/// The folder for `prefix` in this process: created on first use as
/// <temp>/<prefix>XXXXXX (unique), the same path afterwards. Throws std::runtime_error when it
/// cannot be created.
inline std::filesystem::path processTempDir(const std::string& prefix) {
  static std::mutex m;
  static std::map<std::string, std::filesystem::path> dirs;
  std::lock_guard<std::mutex> lock(m);
  auto it = dirs.find(prefix);
  if (it != dirs.end()) return it->second;
  std::string templ = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data()))
    throw std::runtime_error("mkdtemp " + templ + ": " + std::strerror(errno));
  return dirs.emplace(prefix, std::filesystem::path(buf.data())).first->second;
}

}  // namespace dit::test
