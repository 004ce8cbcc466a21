// Image files the CLI, the window and the workers read (init images, masks, references) go
// through the same byte checks as the server's uploads (backend/io/image_check.h, issue 48): a
// JPEG whose Huffman table declares more codes than stb_image's tables hold (Debian 12's
// stb_image wrote past them) and files cut short (stb_image padded them with black) are refused
// with an error naming the file; the whole files still decode. Run in the sanitize preset too.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backend/io/image_check.h"
#include "backend/io/image_io.h"
#include "backend/io/png_io.h"

#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb_image_write.h>
#pragma GCC diagnostic pop

using namespace dit;
namespace fs = std::filesystem;

namespace {

// A 24x16 RGB test pattern.
std::vector<std::uint8_t> pattern(int w, int h) {
  std::vector<std::uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        px[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<std::uint8_t>((x * 10 + y * 7 + c * 80) & 0xff);
  return px;
}

void appendBytes(void* ctx, void* data, int size) {
  auto* out = static_cast<std::string*>(ctx);
  out->append(static_cast<const char*>(data), static_cast<size_t>(size));
}

std::string jpegBytes() {
  const auto px = pattern(24, 16);
  std::string out;
  EXPECT_TRUE(stbi_write_jpg_to_func(appendBytes, &out, 24, 16, 3, px.data(), 90));
  return out;
}

std::string bmpBytes() {
  const auto px = pattern(24, 16);
  std::string out;
  EXPECT_TRUE(stbi_write_bmp_to_func(appendBytes, &out, 24, 16, 3, px.data()));
  return out;
}

std::string pngBytes() {
  const auto px = pattern(24, 16);
  const std::vector<std::uint8_t> v = encodePng(px.data(), 24, 16);
  return std::string(v.begin(), v.end());
}

std::string ppmBytes() {
  const auto px = pattern(24, 16);
  return "P6\n24 16\n255\n" + std::string(px.begin(), px.end());
}

class ImageFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ditstudio-image-files-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
  // readImage refuses `path` with a std::runtime_error naming it and matching `words`.
  static void expectRefused(const std::string& path, const std::string& words) {
    try {
      const Image8 img = readImage(path);
      ADD_FAILURE() << path << " decoded as " << img.width << "x" << img.height;
    } catch (const std::runtime_error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << m;
      EXPECT_NE(m.find(words), std::string::npos) << m;
    }
  }
  fs::path dir_;
};

// A DHT segment with one table of `codes` codes (all of length 8), its values 0, 1, ...
std::string dhtSegment(int codes, int valuesGiven) {
  std::string t;
  t += '\x00';  // class 0 (DC), id 0
  for (int len = 1; len <= 16; ++len) {
    const int n = len == 8 ? std::min(codes, 255) : len == 9 ? std::max(0, codes - 255) : 0;
    t += static_cast<char>(n);
  }
  for (int i = 0; i < valuesGiven; ++i) t += static_cast<char>(i & 0xff);
  const size_t len = t.size() + 2;
  return std::string("\xff\xc4", 2) + static_cast<char>(len >> 8) + static_cast<char>(len & 0xff) +
         t;
}

}  // namespace

TEST_F(ImageFiles, AJpegWithAMalformedHuffmanTableIsRefusedNamingTheFile) {
  const std::string jpg = jpegBytes();
  ASSERT_GT(jpg.size(), 100u);
  const Image8 whole = readImage(write("whole.jpg", jpg));
  EXPECT_EQ(whole.width, 24);
  EXPECT_EQ(whole.height, 16);
  // A table of 257 codes (stb_image's tables hold 256: Debian 12's version wrote past them),
  // placed right after the start-of-image marker, where a decoder reads it before the frame.
  const std::string overflow = jpg.substr(0, 2) + dhtSegment(257, 257) + jpg.substr(2);
  expectRefused(write("overflow.jpg", overflow), "is not a valid JPEG image");
  expectRefused(write("overflow.jpg", overflow), "Huffman table is malformed");
  // A table whose codes run past the end of its segment.
  const std::string past = jpg.substr(0, 2) + dhtSegment(40, 10) + jpg.substr(2);
  expectRefused(write("past.jpg", past), "Huffman table is malformed");
  // A table of 256 codes is allowed by the check (stb_image then decides on the codes).
  bool damaged = false;
  const std::string full = jpg.substr(0, 2) + dhtSegment(256, 256) + jpg.substr(2);
  EXPECT_EQ(missingImageBytes(full, ImageFormat::Jpeg, damaged), "");
  EXPECT_FALSE(damaged);
}

TEST_F(ImageFiles, CutShortFilesAreRefusedNamingTheFileAndWholeOnesDecode) {
  const struct {
    const char* name;
    std::string bytes;
    ImageFormat format;
  } cases[] = {{"a.jpg", jpegBytes(), ImageFormat::Jpeg},
               {"a.png", pngBytes(), ImageFormat::Png},
               {"a.ppm", ppmBytes(), ImageFormat::Pnm},
               {"a.bmp", bmpBytes(), ImageFormat::Bmp}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(sniffImageFormat(c.bytes), c.format);
    const Image8 img = readImage(write(c.name, c.bytes));
    EXPECT_EQ(img.width, 24);
    EXPECT_EQ(img.height, 16);
    const std::string cut = c.bytes.substr(0, c.bytes.size() * 6 / 10);
    expectRefused(write(std::string("cut-") + c.name, cut),
                  std::string("is cut short: a ") + imageFormatName(c.format) + " file");
    // One byte missing is enough.
    expectRefused(write(std::string("short-") + c.name, c.bytes.substr(0, c.bytes.size() - 1)),
                  "is cut short");
  }
}
