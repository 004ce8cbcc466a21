// The VAE decode stage of the memory model (memory_estimate.h): the decoder followed op by op as
// backend/models/autoencoders/ runs it (AutoencoderKL::decodeUntiled, AutoencoderKLQwenImage::
// decode), counting the feature maps alive at each point, so that the figure is the decoder's
// real peak rather than a rule of thumb. Torch-free.
#pragma once

#include <cstdint>

namespace dit {

struct AutoencoderKLConfig;
struct AutoencoderKLQwenImageConfig;
struct VaeDecoderShape;

/// The decoder shape of a diffusers AutoencoderKL / AutoencoderKLFlux2 config: levels =
/// reversed block_out_channels, layers_per_block + 1 resnets per up block, mid-block attention
/// as configured.
VaeDecoderShape vaeDecoderShape(const AutoencoderKLConfig& c);
/// The decoder shape of an AutoencoderKLQwenImage config: levels = base_dim x [dim_mult[-1]] +
/// reversed dim_mult (the first is the mid block's), num_res_blocks + 1 resnets per up block,
/// the upsample convs halving the channels, the mid block's attention.
VaeDecoderShape vaeDecoderShape(const AutoencoderKLQwenImageConfig& c);
/// FLUX's / Stable Diffusion's AutoencoderKL widths (block_out_channels = c0 x (1, 2, 4, 4),
/// layers_per_block 2, 16 latent channels): the shape assumed when only the full-resolution
/// channels c0 are known.
VaeDecoderShape standardVaeDecoderShape(int c0);

/// Peak bytes of the tensors alive while the decoder turns a latent into a height x width image
/// (pixels) in a compute dtype of `elementBytes` bytes, on top of the weights, counting the
/// pipeline's latents alive meanwhile (the noise, its packed form, the denoised latents).
/// Follows the decoder op by op: the resnets (the norm and activation outputs held while their
/// convolution runs: C++ temporaries live to the end of the expression), the nearest upsampling
/// and its convolution, the mid block's attention (q, k, v, the output and its projection, one
/// block of scores: localAttention works through query blocks), the output convolution. With
/// `cpu`, a convolution also holds what LibTorch 1.13's CPU kernel allocates for it
/// (at::native::ConvParams::use_mkldnn): for an input of more than 20480 elements, oneDNN's
/// copies in its blocked layout (channels padded to 16: the input when it has 16 channels or
/// more, the output always) and its reordered weights; else slow_conv2d's im2col columns. These
/// are the bytes the allocator hands out (checked against a malloc tracer, docs/planner.md);
/// glibc's heap can hold more than this peak (fragmentation). 0 for an empty shape or size.
uint64_t vaeDecodePeakBytes(const VaeDecoderShape& shape, int64_t height, int64_t width,
                            int64_t elementBytes, bool cpu);

}  // namespace dit
