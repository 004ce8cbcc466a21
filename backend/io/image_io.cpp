#include "backend/io/image_io.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "backend/io/file_guard.h"
#include "backend/io/image_check.h"

#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#include <stb_image.h>

namespace dit {

std::pair<int, int> imageSize(const std::string& path) {
  // A regular file only: a FIFO or device given as an image never blocks (file_guard.h).
  int fd = -1;
  try {
    fd = openRegularFile(path);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("cannot open image file " + path + ": " + e.what());
  }
  FILE* f = ::fdopen(fd, "rb");
  if (!f) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error("cannot open image file " + path + ": " + std::strerror(err));
  }
  int w = 0, h = 0, n = 0;
  const int ok = stbi_info_from_file(f, &w, &h, &n);
  std::fclose(f);
  if (!ok)
    throw std::runtime_error(
        "image file " + path +
        " is not a readable image (PNG, JPEG, BMP, TGA, GIF, PSD, PNM): " + stbi_failure_reason());
  return {w, h};
}

Image8 readImage(const std::string& path) {
  // A regular file only (never blocks on a FIFO or device), at most 1 GiB (file_guard.h).
  std::string raw;
  try {
    raw = readRegularFile(path, std::uint64_t(1) << 30);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("cannot open image file " + path + ": " + e.what());
  }
  const std::vector<uint8_t> bytes(raw.begin(), raw.end());
  if (bytes.empty()) throw std::runtime_error("image file " + path + " is empty");
  // Every byte the header promises, and JPEG Huffman tables stb_image can hold (image_check.h):
  // stb_image would pad a cut-short file with black, or write past its tables.
  const ImageFormat format = sniffImageFormat(raw);
  bool damaged = false;
  if (const std::string why = missingImageBytes(raw, format, damaged); !why.empty())
    throw std::runtime_error("image file " + path + " is cut short: a " + imageFormatName(format) +
                             " file whose header promises more bytes than it holds (" + why + ")");
  if (damaged)
    throw std::runtime_error("image file " + path +
                             " is not a valid JPEG image (a Huffman table is malformed)");
  int w = 0, h = 0, n = 0;
  if (!stbi_info_from_memory(bytes.data(), static_cast<int>(bytes.size()), &w, &h, &n))
    throw std::runtime_error(
        "image file " + path +
        " is not a readable image (PNG, JPEG, BMP, TGA, GIF, PSD, PNM): " + stbi_failure_reason());
  constexpr int kMaxSide = 16384;
  if (w <= 0 || h <= 0 || w > kMaxSide || h > kMaxSide)
    throw std::runtime_error("image file " + path + " is " + std::to_string(w) + "x" +
                             std::to_string(h) + " pixels; sides must be 1 to " +
                             std::to_string(kMaxSide));
  unsigned char* data =
      stbi_load_from_memory(bytes.data(), static_cast<int>(bytes.size()), &w, &h, &n, 0);
  if (!data)
    throw std::runtime_error("image file " + path +
                             " could not be decoded: " + stbi_failure_reason());
  Image8 img;
  img.width = w;
  img.height = h;
  img.channels = n;
  img.pixels.assign(data, data + static_cast<size_t>(w) * h * n);
  stbi_image_free(data);
  return img;
}

Image8 toRGB(const Image8& in) {
  if (in.channels == 3) return in;
  Image8 out{in.width, in.height, 3, {}};
  const size_t n = static_cast<size_t>(in.width) * in.height;
  out.pixels.resize(n * 3);
  for (size_t i = 0; i < n; ++i)
    for (int c = 0; c < 3; ++c)
      out.pixels[i * 3 + c] =
          in.channels >= 3 ? in.pixels[i * in.channels + c] : in.pixels[i * in.channels];
  return out;
}

Image8 cropImage(const Image8& in, int left, int top, int width, int height) {
  if (width <= 0 || height <= 0 || left < 0 || top < 0 || left + width > in.width ||
      top + height > in.height)
    throw std::invalid_argument("crop box " + std::to_string(width) + "x" + std::to_string(height) +
                                " at (" + std::to_string(left) + ", " + std::to_string(top) +
                                ") is outside the " + std::to_string(in.width) + "x" +
                                std::to_string(in.height) + " image");
  Image8 out{width, height, in.channels, {}};
  const size_t row = static_cast<size_t>(width) * in.channels;
  out.pixels.resize(row * height);
  for (int y = 0; y < height; ++y)
    std::copy_n(&in.pixels[(static_cast<size_t>(top + y) * in.width + left) * in.channels], row,
                &out.pixels[static_cast<size_t>(y) * row]);
  return out;
}

Image8 toL(const Image8& in) {
  if (in.channels == 1) return in;
  Image8 out{in.width, in.height, 1, {}};
  const size_t n = static_cast<size_t>(in.width) * in.height;
  out.pixels.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = &in.pixels[i * in.channels];
    if (in.channels < 3) {
      out.pixels[i] = p[0];
    } else {
      // Pillow Convert.c L24: fixed-point ITU-R 601-2 luma.
      const uint32_t v = p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u;
      out.pixels[i] = static_cast<uint8_t>(v >> 16);
    }
  }
  return out;
}

namespace {

// Pillow Resample.c: lanczos filter (support 3) and its coefficient tables.
double sincFilter(double x) {
  if (x == 0.0) return 1.0;
  x = x * M_PI;
  return std::sin(x) / x;
}
double lanczosFilter(double x) {
  if (-3.0 <= x && x < 3.0) return sincFilter(x) * sincFilter(x / 3);
  return 0.0;
}

constexpr int kPrecisionBits = 32 - 8 - 2;

struct Coeffs {
  int ksize = 0;
  std::vector<int> bounds;  // (xmin, count) per output pixel
  std::vector<int> kk;      // fixed-point coefficients, ksize per output pixel
};

Coeffs precomputeCoeffs(int inSize, int outSize) {
  const float in0 = 0.0f, in1 = static_cast<float>(inSize);
  double filterscale, scale;
  filterscale = scale = static_cast<double>(in1 - in0) / outSize;
  if (filterscale < 1.0) filterscale = 1.0;
  const double support = 3.0 * filterscale;
  Coeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(static_cast<size_t>(outSize) * 2);
  std::vector<double> pre(static_cast<size_t>(outSize) * c.ksize, 0.0);
  for (int xx = 0; xx < outSize; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    double ww = 0.0;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > inSize) xmax = inSize;
    xmax -= xmin;
    double* k = &pre[static_cast<size_t>(xx) * c.ksize];
    for (int x = 0; x < xmax; ++x) {
      const double w = lanczosFilter((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x)
      if (ww != 0.0) k[x] /= ww;
    c.bounds[xx * 2] = xmin;
    c.bounds[xx * 2 + 1] = xmax;
  }
  // normalize_coeffs_8bpc
  c.kk.resize(pre.size());
  for (size_t i = 0; i < pre.size(); ++i)
    c.kk[i] = pre[i] < 0 ? static_cast<int>(-0.5 + pre[i] * (1 << kPrecisionBits))
                         : static_cast<int>(0.5 + pre[i] * (1 << kPrecisionBits));
  return c;
}

uint8_t clip8(int v) {
  const int s = v >> kPrecisionBits;  // arithmetic shift, as Pillow's lookup index
  return static_cast<uint8_t>(s < 0 ? 0 : s > 255 ? 255 : s);
}

}  // namespace

Image8 resizeLanczos(const Image8& in, int width, int height) {
  if (width <= 0 || height <= 0)
    throw std::invalid_argument("resize: the target size must be positive, got " +
                                std::to_string(width) + "x" + std::to_string(height));
  if (width == in.width && height == in.height) return in;
  const int C = in.channels;
  const bool needH = width != in.width, needV = height != in.height;
  const Coeffs ch = precomputeCoeffs(in.width, width);
  Coeffs cv = precomputeCoeffs(in.height, height);
  Image8 cur = in;
  if (needH) {
    // Only rows the vertical pass reads (Pillow's ybox_first / ybox_last).
    const int yFirst = cv.bounds[0];
    const int yLast = cv.bounds[height * 2 - 2] + cv.bounds[height * 2 - 1];
    for (int i = 0; i < height; ++i) cv.bounds[i * 2] -= yFirst;
    Image8 tmp{width, yLast - yFirst, C, {}};
    tmp.pixels.resize(static_cast<size_t>(tmp.width) * tmp.height * C);
    for (int y = 0; y < tmp.height; ++y)
      for (int xx = 0; xx < width; ++xx) {
        const int xmin = ch.bounds[xx * 2], xmax = ch.bounds[xx * 2 + 1];
        const int* k = &ch.kk[static_cast<size_t>(xx) * ch.ksize];
        for (int c = 0; c < C; ++c) {
          int ss = 1 << (kPrecisionBits - 1);
          for (int x = 0; x < xmax; ++x) ss += in.at(x + xmin, y + yFirst, c) * k[x];
          tmp.pixels[(static_cast<size_t>(y) * width + xx) * C + c] = clip8(ss);
        }
      }
    cur = std::move(tmp);
  }
  if (needV) {
    Image8 out{width, height, C, {}};
    out.pixels.resize(static_cast<size_t>(width) * height * C);
    for (int yy = 0; yy < height; ++yy) {
      const int ymin = cv.bounds[yy * 2], ymax = cv.bounds[yy * 2 + 1];
      const int* k = &cv.kk[static_cast<size_t>(yy) * cv.ksize];
      for (int xx = 0; xx < width; ++xx)
        for (int c = 0; c < C; ++c) {
          int ss = 1 << (kPrecisionBits - 1);
          for (int y = 0; y < ymax; ++y) ss += cur.at(xx, y + ymin, c) * k[y];
          out.pixels[(static_cast<size_t>(yy) * width + xx) * C + c] = clip8(ss);
        }
    }
    cur = std::move(out);
  }
  return cur;
}

}  // namespace dit
