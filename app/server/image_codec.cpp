#include "app/server/image_codec.h"

#include <webp/decode.h>
#include <webp/encode.h>

#include <cctype>
#include <cstdlib>
#include <cstring>

#include "app/common/image_bytes.h"

// stb: static implementations private to this file (the backend has its own copies).
#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_HDR
#define STBI_NO_PIC
#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#include <stb_image.h>
#include <stb_image_write.h>
#pragma GCC diagnostic pop

namespace dit::server {

namespace {

// The byte checks before a decoder runs (app/common/image_bytes.h: shared with the CLI's images).
using Format = ImageFormat;
Format sniff(std::string_view b) { return sniffImageFormat(b); }
const char* formatName(Format f) { return imageFormatName(f); }
std::string missingBytes(std::string_view b, Format f, bool& damaged) {
  return missingImageBytes(b, f, damaged);
}

void checkSize(int w, int h, const std::string& field, int maxSide, std::int64_t maxPixels) {
  if (w < 1 || h < 1 || w > maxSide || h > maxSide || static_cast<std::int64_t>(w) * h > maxPixels)
    throw ImageError("'" + field + "' is " + std::to_string(w) + "x" + std::to_string(h) +
                     " pixels; at most " + std::to_string(maxSide) + " per side and " +
                     std::to_string(maxPixels) + " pixels are accepted");
}

Pixels decodeWebP(std::string_view bytes, const std::string& field, int maxSide,
                  std::int64_t maxPixels) {
  const auto* buf = reinterpret_cast<const std::uint8_t*>(bytes.data());
  WebPBitstreamFeatures f;
  if (WebPGetFeatures(buf, bytes.size(), &f) != VP8_STATUS_OK)
    throw ImageError("'" + field + "' is not a valid WebP image");
  if (f.has_animation) throw ImageError("'" + field + "' is an animated WebP; send one image");
  checkSize(f.width, f.height, field, maxSide, maxPixels);
  Pixels p;
  p.channels = f.has_alpha ? 4 : 3;
  int w = 0, h = 0;
  std::uint8_t* px = f.has_alpha ? WebPDecodeRGBA(buf, bytes.size(), &w, &h)
                                 : WebPDecodeRGB(buf, bytes.size(), &w, &h);
  if (!px) throw ImageError("'" + field + "' cannot be decoded (a damaged or cut-short WebP)");
  p.width = w;
  p.height = h;
  p.data.assign(px, px + static_cast<size_t>(w) * h * p.channels);
  WebPFree(px);
  return p;
}

}  // namespace

Pixels decodeImage(std::string_view bytes, const std::string& field, int maxSide,
                   std::int64_t maxPixels) {
  if (bytes.empty()) throw ImageError("'" + field + "' is empty");
  if (bytes.size() > static_cast<size_t>(INT32_MAX))
    throw ImageError("'" + field + "' is larger than 2 GiB");
  const Format fmt = sniff(bytes);
  if (fmt == Format::Unknown)
    throw ImageError("'" + field + "' is not a PNG, JPEG, WebP, BMP, GIF or PNM (P5/P6) image");
  bool damaged = false;
  if (const std::string why = missingBytes(bytes, fmt, damaged); !why.empty())
    throw ImageError("'" + field + "' is cut short: a " + formatName(fmt) +
                     " file whose header promises more bytes than it holds (" + why + ")");
  if (damaged)
    throw ImageError("'" + field + "' is not a valid JPEG image (a Huffman table is malformed)");
  if (fmt == Format::WebP) return decodeWebP(bytes, field, maxSide, maxPixels);
  const auto* buf = reinterpret_cast<const stbi_uc*>(bytes.data());
  const int len = static_cast<int>(bytes.size());
  int w = 0, h = 0, c = 0;
  if (!stbi_info_from_memory(buf, len, &w, &h, &c))
    throw ImageError("'" + field + "' is not a valid " + formatName(fmt) + " image (" +
                     std::string(stbi_failure_reason() ? stbi_failure_reason() : "unknown") + ")");
  checkSize(w, h, field, maxSide, maxPixels);
  stbi_uc* px = stbi_load_from_memory(buf, len, &w, &h, &c, 0);
  if (!px)
    throw ImageError("'" + field + "' cannot be decoded (" +
                     std::string(stbi_failure_reason() ? stbi_failure_reason() : "unknown") + ")");
  Pixels p;
  p.width = w;
  p.height = h;
  p.channels = c;
  p.data.assign(px, px + static_cast<size_t>(w) * h * c);
  stbi_image_free(px);
  return p;
}

bool canEncode(const std::string& f) { return f == "png" || f == "jpeg" || f == "webp"; }

std::string mimeType(const std::string& f) {
  if (f == "jpeg") return "image/jpeg";
  if (f == "webp") return "image/webp";
  return "image/png";
}

namespace {
void appendBytes(void* ctx, void* data, int size) {
  static_cast<std::string*>(ctx)->append(static_cast<const char*>(data), static_cast<size_t>(size));
}

// RGB or RGBA copy of `p` (WebP takes 3 or 4 channels).
Pixels toRgbOrRgba(const Pixels& p) {
  if (p.channels == 3 || p.channels == 4) return p;
  Pixels o;
  o.width = p.width;
  o.height = p.height;
  o.channels = p.channels == 2 ? 4 : 3;
  const size_t n = static_cast<size_t>(p.width) * p.height;
  o.data.resize(n * o.channels);
  for (size_t i = 0; i < n; ++i) {
    const std::uint8_t g = p.data[i * p.channels];
    o.data[i * o.channels] = o.data[i * o.channels + 1] = o.data[i * o.channels + 2] = g;
    if (o.channels == 4) o.data[i * 4 + 3] = p.data[i * 2 + 1];
  }
  return o;
}
}  // namespace

std::string encodeImage(const Pixels& p, const std::string& format, int quality) {
  if (p.channels < 1 || p.channels > 4 || p.width < 1 || p.height < 1)
    throw ImageError("cannot encode an image of " + std::to_string(p.width) + "x" +
                     std::to_string(p.height) + "x" + std::to_string(p.channels));
  quality = std::max(0, std::min(100, quality));
  std::string out;
  if (format == "png") {
    if (!stbi_write_png_to_func(appendBytes, &out, p.width, p.height, p.channels, p.data.data(),
                                p.width * p.channels))
      throw ImageError("PNG encoding failed");
  } else if (format == "jpeg") {
    // JPEG has no alpha: stb drops it.
    if (!stbi_write_jpg_to_func(appendBytes, &out, p.width, p.height, p.channels, p.data.data(),
                                std::max(1, quality)))
      throw ImageError("JPEG encoding failed");
  } else if (format == "webp") {
    const Pixels q = toRgbOrRgba(p);
    uint8_t* buf = nullptr;
    size_t size = 0;
    const int stride = q.width * q.channels;
    if (quality >= 100)
      size = q.channels == 4
                 ? WebPEncodeLosslessRGBA(q.data.data(), q.width, q.height, stride, &buf)
                 : WebPEncodeLosslessRGB(q.data.data(), q.width, q.height, stride, &buf);
    else
      size = q.channels == 4
                 ? WebPEncodeRGBA(q.data.data(), q.width, q.height, stride, float(quality), &buf)
                 : WebPEncodeRGB(q.data.data(), q.width, q.height, stride, float(quality), &buf);
    if (size == 0 || !buf) throw ImageError("WebP encoding failed");
    out.assign(reinterpret_cast<const char*>(buf), size);
    WebPFree(buf);
  } else {
    throw ImageError("output_format '" + format + "' is not supported (png, jpeg or webp)");
  }
  return out;
}

Pixels inpaintMask(const Pixels& m) {
  Pixels o;
  o.width = m.width;
  o.height = m.height;
  o.channels = 1;
  const size_t n = static_cast<size_t>(m.width) * m.height;
  o.data.resize(n);
  const bool alpha = m.channels == 2 || m.channels == 4;
  for (size_t i = 0; i < n; ++i) {
    const std::uint8_t* px = m.data.data() + i * m.channels;
    if (alpha) {
      o.data[i] = px[m.channels - 1] < 128 ? 255 : 0;
    } else if (m.channels == 1) {
      o.data[i] = px[0];
    } else {  // ITU-R 601 luma, as PIL's convert("L")
      o.data[i] = static_cast<std::uint8_t>((px[0] * 299 + px[1] * 587 + px[2] * 114 + 500) / 1000);
    }
  }
  return o;
}

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string encodeBase64(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const unsigned v =
        (std::uint8_t(in[i]) << 16) | (std::uint8_t(in[i + 1]) << 8) | std::uint8_t(in[i + 2]);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == in.size()) {
    const unsigned v = std::uint8_t(in[i]) << 16;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const unsigned v = (std::uint8_t(in[i]) << 16) | (std::uint8_t(in[i + 1]) << 8);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::string decodeBase64(std::string_view text, const std::string& field) {
  if (text.rfind("data:", 0) == 0) {
    const size_t comma = text.find(',');
    if (comma == std::string_view::npos ||
        text.substr(0, comma).find(";base64") == std::string_view::npos)
      throw ImageError("'" + field + "' is a data URL without ';base64,'");
    text.remove_prefix(comma + 1);
  }
  std::string out;
  out.reserve(text.size() / 4 * 3);
  unsigned acc = 0;
  int bits = 0, pad = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t') continue;
    if (ch == '=') {
      ++pad;
      continue;
    }
    const char* pos = std::strchr(kB64, ch);
    if (!pos || ch == '\0' || pad)
      throw ImageError("'" + field + "' is not base64: unexpected character at offset " +
                       std::to_string(i));
    acc = (acc << 6) | static_cast<unsigned>(pos - kB64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  if (pad > 2) throw ImageError("'" + field + "' is not base64: too much padding");
  return out;
}

}  // namespace dit::server
