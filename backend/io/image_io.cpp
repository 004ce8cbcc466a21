#include "backend/io/image_io.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#include <stb_image.h>

namespace dit {

std::pair<int, int> imageSize(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open image file " + path + ": " + std::strerror(errno));
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
  std::ifstream probe(path, std::ios::binary);
  if (!probe)
    throw std::runtime_error("cannot open image file " + path + ": " + std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(probe)),
                             std::istreambuf_iterator<char>());
  if (bytes.empty()) throw std::runtime_error("image file " + path + " is empty");
  if (bytes.size() > (size_t{1} << 31))
    throw std::runtime_error("image file " + path + " is larger than 2 GiB");
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

namespace {
constexpr std::array<uint32_t, 64> kSha256K = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

struct Sha256 {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t buf[64];
  size_t bufLen = 0;
  uint64_t total = 0;

  void block(const uint8_t* p) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (uint32_t(p[i * 4]) << 24) | (uint32_t(p[i * 4 + 1]) << 16) |
             (uint32_t(p[i * 4 + 2]) << 8) | uint32_t(p[i * 4 + 3]);
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      const uint32_t ch = (e & f) ^ (~e & g);
      const uint32_t t1 = hh + S1 + ch + kSha256K[i] + w[i];
      const uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      const uint32_t mj = (a & b) ^ (a & c) ^ (b & c);
      const uint32_t t2 = S0 + mj;
      hh = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
  }
  void update(const uint8_t* p, size_t n) {
    total += n;
    while (n > 0) {
      const size_t take = std::min(n, sizeof(buf) - bufLen);
      std::memcpy(buf + bufLen, p, take);
      bufLen += take;
      p += take;
      n -= take;
      if (bufLen == 64) {
        block(buf);
        bufLen = 0;
      }
    }
  }
  std::string hex() {
    const uint64_t bits = total * 8;
    const uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (bufLen != 56) update(&zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    update(len, 8);
    std::string out;
    char tmp[9];
    for (uint32_t v : h) {
      std::snprintf(tmp, sizeof(tmp), "%08x", v);
      out += tmp;
    }
    return out;
  }
};
}  // namespace

std::string sha256Hex(const uint8_t* data, size_t size) {
  Sha256 s;
  s.update(data, size);
  return s.hex();
}

std::string sha256File(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  Sha256 s;
  std::vector<char> buf(1 << 16);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0)
      s.update(reinterpret_cast<const uint8_t*>(buf.data()), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) throw std::runtime_error("error reading " + path);
  return s.hex();
}

}  // namespace dit
