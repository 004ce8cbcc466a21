// Image bytes for the server's responses and uploads (stb_image / stb_image_write from libstb-dev,
// WebP from libwebp, both ways): decoding an upload with limits, PNG/JPEG/WebP encoding, and the
// conversion of an OpenAI edit mask (transparent = edit) into DiT Studio's inpainting mask (white =
// repaint). No Torch, no Qt. Part of dit_server.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dit::server {

/// 8-bit pixels, row-major, `channels` interleaved (1 grey, 2 grey+alpha, 3 RGB, 4 RGBA).
struct Pixels {
  int width = 0, height = 0, channels = 0;
  std::vector<std::uint8_t> data;  ///< width * height * channels bytes
};

/// An upload or image that cannot be used; what() names the field and the cause.
class ImageError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Decodes PNG, JPEG, BMP, GIF (first frame), PNM (P5/P6) bytes (stb_image) or WebP (libwebp),
/// keeping the file's channels (WebP: RGB or RGBA). Throws ImageError naming `field` when the bytes
/// are not such an image; when the file is cut short (it must hold every byte its header promises:
/// PNG chunks up to IEND, JPEG segments up to the end-of-image marker, BMP/PNM pixel rows, the
/// WebP RIFF size, the GIF trailer; stb_image would pad a short file with black); or when a side
/// exceeds `maxSide` or the pixel count `maxPixels` (checked from the header, before the pixels
/// are decoded).
Pixels decodeImage(std::string_view bytes, const std::string& field, int maxSide,
                   std::int64_t maxPixels);

/// "png", "jpeg" or "webp" (the OpenAI `output_format` values) are encodable here.
bool canEncode(const std::string& format);
/// Encodes `p` (1..4 channels) as `format`; `quality` 0..100 for jpeg/webp (OpenAI's
/// output_compression; 100 = WebP lossless). Throws ImageError for another format.
std::string encodeImage(const Pixels& p, const std::string& format, int quality);
/// The MIME type of an output format ("image/png", ...).
std::string mimeType(const std::string& format);

/// OpenAI's edit mask -> DiT Studio's inpainting mask (one grey channel, white = repaint): with an
/// alpha channel, repaint where alpha < 128 (OpenAI: "fully transparent areas indicate where the
/// image should be edited"); without one, the mask's brightness as is (white = repaint).
Pixels inpaintMask(const Pixels& mask);

/// Standard base64 (RFC 4648, with padding) and its decoder (whitespace ignored; an optional
/// "data:...;base64," prefix is skipped). decodeBase64 throws ImageError naming `field` on
/// anything else.
std::string encodeBase64(std::string_view bytes);
std::string decodeBase64(std::string_view text, const std::string& field);

}  // namespace dit::server
