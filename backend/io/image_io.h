// Reading input images (init images and masks for image-to-image and inpainting) and the 8-bit
// operations diffusers' VaeImageProcessor performs on PIL images before they become tensors:
// mode conversion (PIL Image.convert("RGB") / convert("L")) and resizing with PIL's
// Image.resize(..., Image.LANCZOS), reproduced in PIL's fixed-point arithmetic so the resized
// pixels are bit-identical. Decoding uses stb_image (PNG, JPEG, BMP, TGA, ...). Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/io/sha256.h"  // sha256File: an init image's identity in PNG metadata

namespace dit {

/// An 8-bit image, row-major, interleaved channels: channels 1 = L (grey), 2 = LA, 3 = RGB,
/// 4 = RGBA (PIL's modes). pixels.size() == width * height * channels.
struct Image8 {
  int width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;
  uint8_t at(int x, int y, int c) const {
    return pixels[(static_cast<size_t>(y) * width + x) * channels + c];
  }
};

/// Decodes an image file with its stored channels (16-bit PNGs are reduced to 8 bits). Throws
/// std::runtime_error naming the file and the cause (missing, unreadable, not an image, empty,
/// larger than 16384 pixels on a side).
Image8 readImage(const std::string& path);

/// Width and height of an image file without decoding its pixels. Throws std::runtime_error as
/// readImage does.
std::pair<int, int> imageSize(const std::string& path);

/// PIL Image.convert("RGB"): L / LA replicate the grey value, RGBA drops alpha.
Image8 toRGB(const Image8& img);

/// PIL Image.convert("L"): ITU-R 601-2 luma in PIL's fixed point,
/// L = (R*19595 + G*38470 + B*7471 + 0x8000) >> 16; LA drops alpha, RGBA ignores alpha.
Image8 toL(const Image8& img);

/// PIL Image.resize((width, height), Image.LANCZOS) on 8-bit data (any channel count): separable
/// Lanczos-3 filter with support scaled by the reduction factor, coefficients normalised and
/// rounded to 22-bit fixed point, horizontal pass then vertical pass, each rounded and clamped
/// to 8 bits (Pillow's libImaging/Resample.c). Returns a copy when the size is unchanged.
/// Throws std::invalid_argument for a non-positive size.
Image8 resizeLanczos(const Image8& img, int width, int height);

/// PIL Image.crop((left, top, left + width, top + height)) inside the image (no padding). Throws
/// std::invalid_argument when the box is empty or leaves the image.
Image8 cropImage(const Image8& img, int left, int top, int width, int height);

}  // namespace dit
