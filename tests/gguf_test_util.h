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

/// A small valid GGUF v3 file: 3 KV pairs (a string, a UINT32, an INT32 array), tensors
/// "norm.scale" F32 [8], "a.weight" Q8_0 [3, 64] and "b.weight" Q4_K [2, 256] with seeded block
/// bytes (f16 scales kept finite), alignment 32.
inline std::string smallGguf() {
  GgufWriter w;
  w.header(3, 3, 3);
  w.kvString("general.architecture", "flux");
  w.kvU32("general.quantization_version", 2);
  w.str("test.shape");
  w.u32(9);  // ARRAY
  w.u32(5);  // INT32
  w.u64(2);
  w.u32(3);
  w.u32(64);
  const uint64_t n0 = 8 * 4, n1 = 3 * 2 * 34, n2 = 2 * 144;
  const uint64_t o1 = (n0 + 31) / 32 * 32, o2 = o1 + (n1 + 31) / 32 * 32;
  w.info("norm.scale", {8}, 0, 0);
  w.info("a.weight", {64, 3}, 8, o1);
  w.info("b.weight", {256, 2}, 12, o2);
  w.align();
  std::string data(static_cast<size_t>(o2 + n2), '\0');
  uint32_t state = 7;
  for (auto& c : data) c = static_cast<char>((state = state * 1664525u + 1013904223u) >> 24);
  auto half = [&](uint64_t at, uint16_t h) { std::memcpy(&data[at], &h, 2); };
  for (uint64_t i = 0; i < 8; ++i) {
    const float f = 0.5f + static_cast<float>(i);
    std::memcpy(&data[i * 4], &f, 4);
  }
  for (uint64_t b = 0; b < 6; ++b) half(o1 + b * 34, 0x2E66);  // d = 0.1
  for (uint64_t b = 0; b < 2; ++b) {
    half(o2 + b * 144, 0x2E66);
    half(o2 + b * 144 + 2, 0x2A66);
  }
  w.b += data;
  return w.b;
}

}  // namespace dit::test
