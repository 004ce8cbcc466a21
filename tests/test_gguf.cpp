// GGUF checkpoints (issue 33) on ../shared/fixtures/tiny-flux-gguf-A (README there): the reader
// (header, metadata, tensor infos in torch order), the dequantization of every tensor of every one
// of the 12 files against ggml's own (SHA-256 of the float32 bytes in gguf_report.json, and the
// rows of dequant_rows.safetensors at 0 ulp), and refusals of broken files naming the file, the
// tensor and the cause.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/io/gguf.h"
#include "backend/io/gguf_types.h"
#include "backend/io/safetensors.h"
#include "backend/io/sha256.h"
#include "gguf_test_util.h"

using namespace dit;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const json& report() {
  static const json r = [] {
    std::ifstream in(test::ggufFixture("gguf/gguf_report.json"));
    return json::parse(in);
  }();
  return r;
}

// Whole tensor `i` of `r` dequantized to float32, row-major (torch order).
std::vector<float> dequantAll(const SafetensorsReader& r, const TensorInfo& i) {
  const GgmlType t = test::ggmlTypeOf(i.dtype);
  int64_t n = i.numel();
  const int64_t width = i.shape.empty() ? 1 : i.shape.back();
  std::vector<float> out(static_cast<size_t>(n));
  const int64_t rows = width ? n / width : 0;
  const uint8_t* p = r.data(i);
  for (int64_t row = 0; row < rows; ++row)
    dequantizeGgml(t, p + row * ggmlRowBytes(t, width), out.data() + row * width, width);
  return out;
}

}  // namespace

TEST(Gguf, HeaderMetadataAndTensorInfos) {
  for (const auto& [type, rep] : report()["types"].items()) {
    SafetensorsReader r(test::ggufFile(type));
    ASSERT_TRUE(r.isGguf());
    EXPECT_EQ(r.ggufHeader()->version, 3u);
    EXPECT_EQ(r.ggufHeader()->dataOffset, rep["data_start"].get<uint64_t>()) << type;
    EXPECT_EQ(r.fileSize(), rep["file_bytes"].get<uint64_t>());
    EXPECT_EQ(r.metadata().at("general.architecture"), "flux");
    EXPECT_EQ(r.metadata().at("general.file_type"),
              std::to_string(rep["kv"]["general.file_type"]["value"].get<int>()));
    EXPECT_EQ(r.names().size(), 52u);
    std::map<std::string, int> counts;
    for (const auto& [name, t] : rep["tensors"].items()) {
      const TensorInfo& i = r.info(name);
      EXPECT_EQ(dtypeName(i.dtype), t["ggml_type"].get<std::string>()) << type << " " << name;
      EXPECT_EQ(i.shape, t["torch_shape"].get<std::vector<int64_t>>()) << name;
      EXPECT_EQ(i.begin, r.ggufHeader()->dataOffset + t["offset"].get<uint64_t>()) << name;
      EXPECT_EQ(i.nbytes(), t["nbytes"].get<uint64_t>()) << name;
      counts[dtypeName(i.dtype)]++;
    }
    for (const auto& [ty, n] : rep["tensor_type_counts"].items())
      EXPECT_EQ(counts[ty], n.get<int>()) << type << " " << ty;
  }
}

TEST(Gguf, EveryTensorOfEveryFileDequantizesBitExactlyAsGgml) {
  SafetensorsReader rows(test::ggufFixture("gguf/dequant_rows.safetensors"));
  for (const auto& [type, rep] : report()["types"].items()) {
    SafetensorsReader r(test::ggufFile(type));
    int matched = 0, rowsMatched = 0;
    for (const auto& [name, t] : rep["tensors"].items()) {
      const TensorInfo& i = r.info(name);
      const std::string raw(reinterpret_cast<const char*>(r.data(i)), i.nbytes());
      EXPECT_EQ(sha256Hex(raw), t["raw_sha256"].get<std::string>()) << type << " " << name;
      const std::vector<float> v = dequantAll(r, i);
      const std::string bytes(reinterpret_cast<const char*>(v.data()), v.size() * 4);
      const bool ok = sha256Hex(bytes) == t["dequant_f32_sha256"].get<std::string>();
      EXPECT_TRUE(ok) << type << " " << name << " (" << dtypeName(i.dtype)
                      << "): float32 dequantization differs from ggml's";
      matched += ok;
      // The stored rows (0, 1, last; the whole of a 1-D tensor), compared bit for bit.
      const TensorInfo& g = rows.info(type + "/" + name);
      const float* ref = reinterpret_cast<const float*>(rows.data(g));
      const int64_t width = i.shape.back();
      std::vector<int64_t> pick;
      if (i.shape.size() == 1)
        pick = {0};
      else
        pick = {0, 1, i.shape[0] - 1};
      bool rowsOk = true;
      for (size_t k = 0; k < pick.size(); ++k)
        rowsOk = rowsOk && std::memcmp(ref + k * width, v.data() + pick[k] * width,
                                       static_cast<size_t>(width) * 4) == 0;
      EXPECT_TRUE(rowsOk) << type << " " << name;
      rowsMatched += rowsOk;
    }
    std::printf("  %-7s %2d / 52 tensors bit-exact (SHA-256), %2d / 52 row sets at 0 ulp\n",
                type.c_str(), matched, rowsMatched);
  }
}

TEST(Gguf, BytesPerParameterByStorage) {
  EXPECT_DOUBLE_EQ(storageBytesPerParameter("Q8_0"), 34.0 / 32);
  EXPECT_DOUBLE_EQ(storageBytesPerParameter("Q4_K"), 144.0 / 256);
  EXPECT_DOUBLE_EQ(storageBytesPerParameter("Q2_K"), 84.0 / 256);
  EXPECT_DOUBLE_EQ(storageBytesPerParameter("BF16"), 2);
  EXPECT_DOUBLE_EQ(storageBytesPerParameter("F8_E4M3"), 1);
  EXPECT_DOUBLE_EQ(storageBytesPerParameter("IQ2_XXS"), 0);
}
