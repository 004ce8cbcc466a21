"""Tiled-decode goldens for AutoencoderKL (FLUX.1 VAE) and AutoencoderKLFlux2 (FLUX.2 VAE).

Ours: this script (the latents, the sizes, which tile sizes are set). diffusers': everything
it calls -- AutoencoderKL / AutoencoderKLFlux2 .from_pretrained, enable_tiling(), decode()
(which goes through _decode -> tiled_decode with blend_v / blend_h when the latent exceeds
tile_latent_min_size) and disable_tiling() for the untiled reference.
Run inside the golden lab (see README.md).
"""
import json
import sys

import torch
from safetensors.torch import save_file
from diffusers import AutoencoderKL, AutoencoderKLFlux2

torch.set_grad_enabled(False)
out_dir = sys.argv[1] if len(sys.argv) > 1 else "."

CASES = [
    # (name, class, folder, seed, [(batch, h, w), ...])
    ("flux", AutoencoderKL, "flux-vae", 4701, [(1, 48, 48), (2, 34, 50)]),
    ("flux2", AutoencoderKLFlux2, "flux2-vae", 4702, [(1, 24, 24), (2, 22, 26)]),
]
summary = {}
for name, cls, folder, seed, sizes in CASES:
    vae = cls.from_pretrained(folder, torch_dtype=torch.float32).eval()
    vsf = 2 ** (len(vae.config.block_out_channels) - 1)
    # Small tiles, so a 64-128 px image crosses several of them (overlap factor stays 0.25).
    vae.tile_sample_min_size = 32
    vae.tile_latent_min_size = 32 // vsf
    vae.tile_overlap_factor = 0.25
    g = torch.Generator("cpu").manual_seed(seed)
    tensors = {}
    info = {"tile_sample_min_size": vae.tile_sample_min_size,
            "tile_latent_min_size": vae.tile_latent_min_size,
            "tile_overlap_factor": vae.tile_overlap_factor, "vae_scale_factor": vsf,
            "use_post_quant_conv": bool(vae.config.use_post_quant_conv), "cases": []}
    for k, (b, h, w) in enumerate(sizes):
        z = torch.randn(b, vae.config.latent_channels, h, w, generator=g, dtype=torch.float32)
        vae.enable_tiling()
        tiled = vae.decode(z).sample
        vae.disable_tiling()
        untiled = vae.decode(z).sample
        tensors[f"latents_{k}"] = z.contiguous()
        tensors[f"tiled_{k}"] = tiled.contiguous()
        tensors[f"untiled_{k}"] = untiled.contiguous()
        d = (tiled - untiled).abs().max().item()
        info["cases"].append({"latents": list(z.shape), "image": list(tiled.shape),
                              "max_abs_tiled_minus_untiled": d})
        print(name, k, tuple(z.shape), "->", tuple(tiled.shape), "max|tiled-untiled| =", d)
    # Tiled encode (_encode -> _tiled_encode when the image exceeds tile_sample_min_size): the
    # posterior's mean and logvar (DiagonalGaussianDistribution, logvar clamped to [-30, 20]).
    gi = torch.Generator("cpu").manual_seed(seed + 100)
    info["encode_cases"] = []
    for k, (b, h, w) in enumerate(sizes):
        x = torch.rand(b, 3, h * vsf, w * vsf, generator=gi, dtype=torch.float32) * 2 - 1
        vae.enable_tiling()
        pt = vae.encode(x).latent_dist
        vae.disable_tiling()
        pu = vae.encode(x).latent_dist
        tensors[f"enc_image_{k}"] = x.contiguous()
        tensors[f"enc_tiled_mean_{k}"] = pt.mean.contiguous()
        tensors[f"enc_tiled_logvar_{k}"] = pt.logvar.contiguous()
        tensors[f"enc_untiled_mean_{k}"] = pu.mean.contiguous()
        tensors[f"enc_untiled_logvar_{k}"] = pu.logvar.contiguous()
        d = (pt.mean - pu.mean).abs().max().item()
        info["encode_cases"].append({"image": list(x.shape), "latents": list(pt.mean.shape),
                                     "max_abs_tiled_minus_untiled_mean": d})
        print(name, "encode", k, tuple(x.shape), "->", tuple(pt.mean.shape),
              "max|tiled-untiled| mean =", d)
    save_file(tensors, f"{out_dir}/{name}.safetensors")
    summary[name] = info
with open(f"{out_dir}/summary.json", "w") as f:
    json.dump(summary, f, indent=1)
