// What an image file's bytes must hold before stb_image sees them (issue 48), shared by the
// server's uploads (app/server/image_codec) and every image file the CLI, the window and the
// workers read (backend/io/image_io: init images, masks, references). stb_image pads a cut-short
// PNM, BMP or JPEG with zeros (black) and decodes it, and Debian 12's version writes past its
// Huffman tables for a JPEG whose table declares more than 256 codes; such bytes are refused here.
// Torch-free, part of dit_backend_core.
#pragma once

#include <string>
#include <string_view>

namespace dit {

enum class ImageFormat { Png, Jpeg, Gif, Bmp, Pnm, WebP, Unknown };

/// The format of `bytes` from its signature (PNM: binary P5/P6 only); Unknown otherwise.
ImageFormat sniffImageFormat(std::string_view bytes);
/// "PNG", "JPEG", "GIF", "BMP", "PNM", "WebP"; "image" for Unknown.
const char* imageFormatName(ImageFormat f);
/// "" when `bytes` (non-empty, of format `f`) hold every byte their header promises, else what is
/// missing, in words ("its 'IDAT' chunk is cut short", "it ends before its end-of-image marker",
/// "its pixels need N bytes, it has M"). `damaged` is set (and "" returned) for a JPEG with a
/// malformed Huffman table (more than 256 codes, a bad class or id, or a table past its segment).
/// Unknown formats return "".
std::string missingImageBytes(std::string_view bytes, ImageFormat f, bool& damaged);

}  // namespace dit
