// PNG writing with stb_image_write, plus text chunks carrying the generation parameters
// (key "parameters": a JSON object; read back by the GUI with QImage::text("parameters")).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dit {

/// Encodes 8-bit RGB pixels (row-major, `width * height * 3` bytes) as PNG and inserts one tEXt
/// chunk per entry of `text` (keys 1-79 Latin-1 chars; values are written as given — pass ASCII,
/// e.g. JSON dumped with ensure_ascii). Throws std::runtime_error if encoding fails.
std::vector<uint8_t> encodePng(const uint8_t* rgb, int width, int height,
                               const std::map<std::string, std::string>& text = {});

/// encodePng, then writes the file atomically (tmp + rename). Throws std::runtime_error naming
/// the path on I/O failure.
void writePng(const std::string& path, const uint8_t* rgb, int width, int height,
              const std::map<std::string, std::string>& text = {});

/// Reads the tEXt chunks of a PNG file (for tests and the CLI's --show-params). Throws
/// std::runtime_error if the file is not a PNG.
std::map<std::string, std::string> readPngText(const std::string& path);

/// Base64 (RFC 4648) of bytes, for previews in worker events.
std::string base64Encode(const std::vector<uint8_t>& bytes);

}  // namespace dit
