// diffusers VaeImageProcessor (image_processor.py) for PIL inputs, as FluxImg2ImgPipeline and
// FluxInpaintPipeline use it: the init image (convert to RGB, resize with PIL LANCZOS to the
// requested size when it differs, x / 255, 2x - 1) and the inpaint mask (mask_processor:
// do_convert_grayscale, LANCZOS resize, x / 255, binarise at 0.5, no normalisation). The 8-bit
// steps are in backend/io/image_io.h (bit-identical to Pillow).
#pragma once

#include <ATen/core/Tensor.h>

#include "backend/io/image_io.h"

namespace dit {

/// VaeImageProcessor.preprocess(image, height, width) for the init image: [1, 3, height, width]
/// float32 in [-1, 1] (contiguous NCHW). `img` may be L, LA, RGB or RGBA (converted to RGB
/// first, alpha dropped). Throws std::invalid_argument for a non-positive size.
at::Tensor preprocessImage(const Image8& img, int height, int width);

/// mask_processor.preprocess(mask, height, width): [1, 1, height, width] float32, 1 where the
/// (grayscale, resized) mask is >= 0.5 (white = repaint), else 0.
at::Tensor preprocessMask(const Image8& mask, int height, int width);

/// 2x2 patch packing of latents [B, C, h, w] -> [B, (h/2)(w/2), 4C]
/// (FluxPipeline._pack_latents): packed[b, i*(w/2)+j, c*4+dy*2+dx] = lat[b, c, 2i+dy, 2j+dx].
at::Tensor packLatents(const at::Tensor& latents);
/// The inverse of packLatents for an h x w latent (FluxPipeline._unpack_latents).
at::Tensor unpackLatents(const at::Tensor& packed, int64_t h, int64_t w);

}  // namespace dit
