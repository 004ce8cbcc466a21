// Helpers of the GGUF tests (test_gguf, test_gguf_mpi, test_fuzz): fixture paths
// (../shared/fixtures/tiny-flux-gguf-A, DITSTUDIO_GGUF_FIXTURE) and a GGUF writer for broken and
// synthetic files. Torch-free.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/io/gguf_types.h"
#include "backend/io/safetensors.h"

namespace dit::test {

#ifdef DITSTUDIO_GGUF_FIXTURE
inline std::string ggufFixture(const std::string& f) {
  return std::string(DITSTUDIO_GGUF_FIXTURE) + "/" + f;
}
/// gguf/transformer-<TYPE>.gguf
inline std::string ggufFile(const std::string& type) {
  return ggufFixture("gguf/transformer-" + type + ".gguf");
}
#endif

inline GgmlType ggmlTypeOf(DType d) {
  if (d == DType::F32) return GgmlType::F32;
  if (d == DType::F16) return GgmlType::F16;
  if (d == DType::BF16) return GgmlType::BF16;
  GgmlType t;
  if (!parseGgmlType(dtypeName(d), t)) throw std::invalid_argument("not a ggml type");
  return t;
}

/// Little-endian GGUF byte writer (tests build well-formed and broken files with it).
struct GgufWriter {
  std::string b;
  void u32(uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); }
  void u64(uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); }
  void str(const std::string& s) {
    u64(s.size());
    b += s;
  }
  void header(uint32_t version, uint64_t tensors, uint64_t kvs) {
    b += "GGUF";
    u32(version);
    u64(tensors);
    u64(kvs);
  }
  void kvString(const std::string& k, const std::string& v) {
    str(k);
    u32(8);
    str(v);
  }
  void kvU32(const std::string& k, uint32_t v) {
    str(k);
    u32(4);
    u32(v);
  }
  /// Tensor info: `ne` in ggml order.
  void info(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type,
            uint64_t offset) {
    str(name);
    u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t v : ne) u64(v);
    u32(type);
    u64(offset);
  }
  void align(size_t a = 32) {
    while (b.size() % a) b.push_back('\0');
  }
};

}  // namespace dit::test
