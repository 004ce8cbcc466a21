#include "backend/io/png_io.h"

#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "backend/io/safe_write.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#include <stb_image_write.h>

namespace dit {

static void appendBE32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(x >> s));
}

std::vector<uint8_t> encodePng(const uint8_t* rgb, int width, int height,
                               const std::map<std::string, std::string>& text) {
  int len = 0;
  unsigned char* png = stbi_write_png_to_mem(rgb, width * 3, width, height, 3, &len);
  if (!png || len < 33) throw std::runtime_error("PNG encoding failed");
  std::vector<uint8_t> out(png, png + 33);  // signature (8) + IHDR chunk (25)
  for (auto& [k, v] : text) {
    if (k.empty() || k.size() > 79) throw std::runtime_error("PNG text key must have 1-79 chars");
    std::vector<uint8_t> chunk{'t', 'E', 'X', 't'};
    chunk.insert(chunk.end(), k.begin(), k.end());
    chunk.push_back(0);
    chunk.insert(chunk.end(), v.begin(), v.end());
    appendBE32(out, static_cast<uint32_t>(chunk.size() - 4));
    out.insert(out.end(), chunk.begin(), chunk.end());
    appendBE32(out,
               static_cast<uint32_t>(crc32(0L, chunk.data(), static_cast<uInt>(chunk.size()))));
  }
  out.insert(out.end(), png + 33, png + len);
  STBIW_FREE(png);
  return out;
}

void writePng(const std::string& path, const uint8_t* rgb, int width, int height,
              const std::map<std::string, std::string>& text) {
  auto bytes = encodePng(rgb, width, height, text);
  // Temporary file in the same folder, fsync, rename onto a regular file or nothing; removed on
  // failure, the cause (strerror) in the message.
  writeFileAtomically(path, bytes.data(), bytes.size());
}

std::map<std::string, std::string> readPngText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (b.size() < 8 || std::memcmp(b.data(), sig, 8) != 0)
    throw std::runtime_error(path + ": not a PNG file");
  std::map<std::string, std::string> text;
  size_t p = 8;
  while (p + 12 <= b.size()) {
    uint32_t n =
        (uint32_t(b[p]) << 24) | (uint32_t(b[p + 1]) << 16) | (uint32_t(b[p + 2]) << 8) | b[p + 3];
    if (p + 12 + n > b.size()) break;
    if (std::memcmp(&b[p + 4], "tEXt", 4) == 0) {
      std::string s(reinterpret_cast<const char*>(&b[p + 8]), n);
      auto z = s.find('\0');
      if (z != std::string::npos) text[s.substr(0, z)] = s.substr(z + 1);
    }
    p += 12 + n;
  }
  return text;
}

std::string base64Encode(const std::vector<uint8_t>& bytes) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t v = (bytes[i] << 16) | (bytes[i + 1] << 8) | bytes[i + 2];
    out += {t[v >> 18], t[(v >> 12) & 63], t[(v >> 6) & 63], t[v & 63]};
  }
  if (i + 1 == bytes.size()) {
    uint32_t v = bytes[i] << 16;
    out += {t[v >> 18], t[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == bytes.size()) {
    uint32_t v = (bytes[i] << 16) | (bytes[i + 1] << 8);
    out += {t[v >> 18], t[(v >> 12) & 63], t[(v >> 6) & 63], '='};
  }
  return out;
}

}  // namespace dit
