// Helpers shared by tests that compare against the diffusers goldens, and the temporary-folder /
// raw-file helpers of the model-file tests (test_security, test_model_errors, test_fuzz).
#pragma once

#include <ATen/ATen.h>
#include <errno.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"

namespace dit::test {

inline const std::string& fixtureDir() {
  static const std::string d = DITSTUDIO_FIXTURE;
  return d;
}

inline const SafetensorsCollection& goldens() {
  static SafetensorsCollection g(fixtureDir() + "/golden/golden.safetensors");
  return g;
}

inline at::Tensor golden(const std::string& name) {
  const auto& info = goldens().info(name);
  return loadTensor(goldens(), name, info.dtype == DType::I64 ? at::kLong : at::kFloat);
}

inline const nlohmann::json& goldenJson() {
  static nlohmann::json j = [] {
    std::ifstream in(fixtureDir() + "/golden/golden.json");
    return nlohmann::json::parse(in);
  }();
  return j;
}

inline double maxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat).cpu() - b.to(at::kFloat).cpu()).abs().max().item<double>();
}

// A fresh, empty folder TMPDIR/ditstudio-<test program>-<pid>/<name> (removed and re-created).
inline std::filesystem::path tempDir(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path p = fs::temp_directory_path() /
               ("ditstudio-" + std::string(program_invocation_short_name) + "-" +
                std::to_string(::getpid())) /
               name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// The fixture model folder copied into tempDir(name), without its goldens, every entry writable
// (the source tree may be read-only), for tests that damage a copy.
inline std::filesystem::path copyFixture(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path d = tempDir(name);
  fs::copy(fixtureDir(), d, fs::copy_options::recursive);
  fs::remove_all(d / "golden");
  for (auto& e : fs::recursive_directory_iterator(d))
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  return d;
}

// Writes a safetensors file by hand: the 8-byte little-endian header length (`headerLen` when
// >= 0, to forge it, else the header's size), the header text, then `dataBytes` zero bytes.
// Returns the file's path.
inline std::string writeRaw(const std::filesystem::path& file, const std::string& header,
                            size_t dataBytes, int64_t headerLen = -1) {
  std::ofstream o(file, std::ios::binary);
  const uint64_t n = headerLen >= 0 ? static_cast<uint64_t>(headerLen) : header.size();
  for (int i = 0; i < 8; ++i) o.put(static_cast<char>((n >> (8 * i)) & 0xff));
  o << header << std::string(dataBytes, '\0');
  return file.string();
}

}  // namespace dit::test
