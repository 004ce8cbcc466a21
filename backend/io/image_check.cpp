#include "backend/io/image_check.h"

#include <cctype>
#include <cstdint>

namespace dit {

namespace {

std::uint32_t be32(std::string_view b, std::size_t at) {
  return (std::uint32_t(std::uint8_t(b[at])) << 24) |
         (std::uint32_t(std::uint8_t(b[at + 1])) << 16) |
         (std::uint32_t(std::uint8_t(b[at + 2])) << 8) | std::uint32_t(std::uint8_t(b[at + 3]));
}
std::uint32_t le32(std::string_view b, std::size_t at) {
  return std::uint32_t(std::uint8_t(b[at])) | (std::uint32_t(std::uint8_t(b[at + 1])) << 8) |
         (std::uint32_t(std::uint8_t(b[at + 2])) << 16) |
         (std::uint32_t(std::uint8_t(b[at + 3])) << 24);
}
std::uint32_t le16(std::string_view b, std::size_t at) {
  return std::uint32_t(std::uint8_t(b[at])) | (std::uint32_t(std::uint8_t(b[at + 1])) << 8);
}

// A JPEG's Huffman tables (DHT segment [at, at + len)): at most 256 codes each. stb_image's
// version in Debian 12 does not check the count and writes past its tables (UBSan: index 257 out
// of bounds in stbi__build_huffman); such a file never reaches it.
bool jpegTablesOk(std::string_view b, std::size_t at, std::size_t len) {
  std::size_t p = at + 2;
  const std::size_t end = at + len;
  while (p < end) {
    if (p + 17 > end) return false;
    const std::uint8_t q = std::uint8_t(b[p]);
    if ((q >> 4) > 1 || (q & 15) > 3) return false;
    std::size_t n = 0;
    for (int i = 1; i <= 16; ++i) n += std::uint8_t(b[p + static_cast<std::size_t>(i)]);
    if (n > 256 || p + 17 + n > end) return false;
    p += 17 + n;
  }
  return true;
}

}  // namespace

ImageFormat sniffImageFormat(std::string_view b) {
  auto starts = [&](std::string_view m) { return b.substr(0, m.size()) == m; };
  if (starts("\x89PNG\r\n\x1a\n")) return ImageFormat::Png;
  if (starts("\xff\xd8\xff")) return ImageFormat::Jpeg;
  if (starts("GIF87a") || starts("GIF89a")) return ImageFormat::Gif;
  if (starts("BM")) return ImageFormat::Bmp;
  if (starts("P5") || starts("P6")) return ImageFormat::Pnm;
  if (starts("RIFF") && b.size() >= 12 && b.substr(8, 4) == "WEBP") return ImageFormat::WebP;
  return ImageFormat::Unknown;
}

const char* imageFormatName(ImageFormat f) {
  switch (f) {
    case ImageFormat::Png:
      return "PNG";
    case ImageFormat::Jpeg:
      return "JPEG";
    case ImageFormat::Gif:
      return "GIF";
    case ImageFormat::Bmp:
      return "BMP";
    case ImageFormat::Pnm:
      return "PNM";
    case ImageFormat::WebP:
      return "WebP";
    case ImageFormat::Unknown:
      break;
  }
  return "image";
}

// "" when the file holds every byte its header promises, else what is missing. stb_image pads a
// cut-short PNM, BMP or JPEG with zeros (black) and decodes it; nothing short reaches it.
// `damaged` is set for a JPEG whose tables stb_image would overflow.
std::string missingImageBytes(std::string_view b, ImageFormat f, bool& damaged) {
  switch (f) {
    case ImageFormat::Png: {  // every chunk whole, up to IEND
      std::size_t at = 8;
      while (true) {
        if (at + 12 > b.size()) return "it ends before its IEND chunk";
        const std::uint64_t len = be32(b, at);
        if (at + 12 + len > b.size())
          return "its '" + std::string(b.substr(at + 4, 4)) + "' chunk is cut short";
        if (b.substr(at + 4, 4) == "IEND") return "";
        at += 12 + len;
      }
    }
    case ImageFormat::Jpeg: {  // segments whole, entropy-coded data up to an EOI marker
      std::size_t at = 2;
      while (true) {
        while (at < b.size() && std::uint8_t(b[at]) != 0xff) ++at;  // entropy data / padding
        while (at < b.size() && std::uint8_t(b[at]) == 0xff) ++at;
        if (at >= b.size()) return "it ends before its end-of-image marker";
        const std::uint8_t m = std::uint8_t(b[at++]);
        if (m == 0xd9) return "";
        if (m == 0x00 || m == 0x01 || (m >= 0xd0 && m <= 0xd8)) continue;  // no length
        if (at + 2 > b.size()) return "a segment is cut short";
        const std::size_t len = (std::size_t(std::uint8_t(b[at])) << 8) | std::uint8_t(b[at + 1]);
        if (len < 2 || at + len > b.size()) return "a segment is cut short";
        if (m == 0xc4 && !jpegTablesOk(b, at, len)) {
          damaged = true;
          return "";
        }
        at += len;
      }
    }
    case ImageFormat::Gif:
      return std::uint8_t(b.back()) == 0x3b ? "" : "it ends before its trailer";
    case ImageFormat::Bmp: {
      if (b.size() < 26) return "its header is cut short";
      const std::uint64_t off = le32(b, 10), dib = le32(b, 14);
      std::int64_t w, h;
      std::uint32_t bpp, compression = 0;
      if (dib == 12) {
        w = le16(b, 18);
        h = le16(b, 20);
        bpp = le16(b, 24);
      } else {
        if (b.size() < 34) return "its header is cut short";
        w = static_cast<std::int32_t>(le32(b, 18));
        h = static_cast<std::int32_t>(le32(b, 22));
        bpp = le16(b, 28);
        compression = le32(b, 30);
      }
      if (compression != 0 && compression != 3 && compression != 6) return "";  // stb refuses
      if (w <= 0 || h == 0 || bpp == 0 || bpp > 32) return "";  // stb refuses these itself
      const std::uint64_t stride = ((static_cast<std::uint64_t>(w) * bpp + 31) / 32) * 4;
      const std::uint64_t need = off + stride * static_cast<std::uint64_t>(h < 0 ? -h : h);
      if (need > b.size())
        return "its pixels need " + std::to_string(need) + " bytes, it has " +
               std::to_string(b.size());
      return "";
    }
    case ImageFormat::Pnm: {  // P5/P6: width height maxval, one blank, then the samples
      std::size_t at = 2;
      std::uint64_t v[3] = {0, 0, 0};
      for (auto& x : v) {
        while (at < b.size()) {  // blanks and comments
          if (b[at] == '#') {
            while (at < b.size() && b[at] != '\n') ++at;
          } else if (std::isspace(static_cast<unsigned char>(b[at]))) {
            ++at;
          } else {
            break;
          }
        }
        if (at >= b.size() || !std::isdigit(static_cast<unsigned char>(b[at])))
          return "its header is cut short";
        while (at < b.size() && std::isdigit(static_cast<unsigned char>(b[at])) && x < (1u << 30))
          x = x * 10 + static_cast<std::uint64_t>(b[at++] - '0');
      }
      ++at;  // the single blank after maxval
      const std::uint64_t comps = b[1] == '6' ? 3 : 1, bytes = v[2] > 255 ? 2 : 1;
      const std::uint64_t need = at + v[0] * v[1] * comps * bytes;
      if (need > b.size())
        return "its pixels need " + std::to_string(need) + " bytes, it has " +
               std::to_string(b.size());
      return "";
    }
    case ImageFormat::WebP: {
      const std::uint64_t need = std::uint64_t(le32(b, 4)) + 8;
      if (need > b.size())
        return "its RIFF header promises " + std::to_string(need) + " bytes, it has " +
               std::to_string(b.size());
      return "";
    }
    case ImageFormat::Unknown:
      break;
  }
  return "";
}

}  // namespace dit
