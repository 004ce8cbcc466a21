#include "backend/pipelines/image_processor.h"

#include <ATen/ATen.h>

#include <cstring>
#include <stdexcept>

namespace dit {

namespace {
// uint8 HWC -> float32 [1, C, H, W] with x / 255 (pil_to_numpy then numpy_to_pt).
at::Tensor toFloatNCHW(const Image8& img) {
  at::Tensor u8 = at::empty({img.height, img.width, img.channels}, at::kByte);
  std::memcpy(u8.data_ptr(), img.pixels.data(), img.pixels.size());
  return (u8.to(at::kFloat) / 255.0f).permute({2, 0, 1}).unsqueeze(0).contiguous();
}
}  // namespace

at::Tensor preprocessImage(const Image8& img, int height, int width) {
  const Image8 rgb = resizeLanczos(toRGB(img), width, height);
  at::Tensor x = toFloatNCHW(rgb);
  return 2.0f * x - 1.0f;
}

at::Tensor preprocessMask(const Image8& mask, int height, int width) {
  const Image8 l = resizeLanczos(toL(mask), width, height);
  at::Tensor x = toFloatNCHW(l);
  return (x >= 0.5f).to(at::kFloat);
}

at::Tensor packLatents(const at::Tensor& lat) {
  const int64_t B = lat.size(0), C = lat.size(1), h = lat.size(2), w = lat.size(3);
  if (h % 2 || w % 2) throw std::invalid_argument("packLatents: h and w must be even");
  return lat.reshape({B, C, h / 2, 2, w / 2, 2})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({B, (h / 2) * (w / 2), C * 4});
}

at::Tensor unpackLatents(const at::Tensor& packed, int64_t h, int64_t w) {
  const int64_t B = packed.size(0), C = packed.size(2) / 4;
  return packed.reshape({B, h / 2, w / 2, C, 2, 2})
      .permute({0, 3, 1, 4, 2, 5})
      .reshape({B, C, h, w});
}

}  // namespace dit
