# diffusers' side of packaging/peer-bench.sh: one family's transformer (the config's _class_name:
# FluxTransformer2DModel, Flux2Transformer2DModel, ZImageTransformer2DModel or
# QwenImageTransformer2DModel), random weights, eager forward on CPU, with the inputs its pipeline
# builds for WIDTH x HEIGHT (VAE scale 8, 2x2 patches: (H/16) x (W/16) image tokens) and TEXT_LEN
# text tokens. Prints one JSON line: min / median step ms over STEPS timed forwards after WARMUP,
# the parameter count, torch's version and the BLAS core it ran.
#
# Usage: python3 peer_step.py CONFIG W H TEXT_LEN STEPS WARMUP THREADS [float32|bfloat16]
#        python3 peer_step.py --params CONFIG      (parameter count only, meta device, no timing)
# Needs torch and diffusers (../shared/lab/setup-lab.sh builds a chroot with both; set
# HF_HUB_OFFLINE=1 and PYTHONPATH=/opt/pysrc there). Inputs as the pipelines pass them:
#   FluxPipeline: hidden_states [1, S, in_channels], encoder_hidden_states [1, L, joint_attention_dim],
#     pooled_projections [1, pooled_projection_dim], img_ids [S, 3] = (0, row, col), txt_ids zeros
#     [L, 3], timestep [1], guidance [1] when the config embeds it.
#   Flux2KleinPipeline: img_ids [1, S, 4] = (0, row, col, 0), txt_ids [1, L, 4] = (0, 0, 0, l).
#   ZImagePipeline: x = [latents [in_channels, 1, H/8, W/8]], cap_feats = [[L, cap_feat_dim]], t [1].
#   QwenImagePipeline: img_shapes [[(1, H/16, W/16)]], encoder_hidden_states_mask None (an all-ones
#     mask is dropped by encode_prompt).
import ctypes
import json
import sys
import time

import torch


def blas_core():
    """openblas_get_corename() of the OpenBLAS this process loaded (via /proc/self/maps), else the
    BLAS torch reports in torch.__config__.show()."""
    try:
        for line in open("/proc/self/maps"):
            path = line.split()[-1]
            if "openblas" in path and ".so" in path:
                lib = ctypes.CDLL(path)
                lib.openblas_get_corename.restype = ctypes.c_char_p
                lib.openblas_get_config.restype = ctypes.c_char_p
                return "%s (%s)" % (lib.openblas_get_corename().decode(), lib.openblas_get_config().decode().strip())
    except (OSError, AttributeError):
        pass
    for part in torch.__config__.show().split(","):
        if "BLAS_INFO" in part:
            return part.strip()
    return "unknown"


def build(cfg_path, dtype, device=None):
    import diffusers

    c = json.load(open(cfg_path))
    cls_name = c.pop("_class_name")
    for k in [k for k in c if k.startswith("_")]:
        c.pop(k)
    cls = getattr(diffusers, cls_name)
    if device == "meta":
        with torch.device("meta"):
            return cls_name, c, cls(**c)
    return cls_name, c, cls(**c).to(dtype).eval()


def inputs(cls_name, c, W, H, L, dt):
    h, w = H // 16, W // 16
    S = h * w
    if cls_name == "FluxTransformer2DModel":
        ids = torch.zeros(S, 3)
        ids[:, 1] = torch.arange(h).repeat_interleave(w)
        ids[:, 2] = torch.arange(w).repeat(h)
        return dict(hidden_states=torch.randn(1, S, c["in_channels"], dtype=dt),
                    encoder_hidden_states=torch.randn(1, L, c["joint_attention_dim"], dtype=dt),
                    pooled_projections=torch.randn(1, c["pooled_projection_dim"], dtype=dt),
                    timestep=torch.tensor([0.75], dtype=dt), img_ids=ids, txt_ids=torch.zeros(L, 3),
                    guidance=torch.tensor([3.5], dtype=dt) if c.get("guidance_embeds") else None,
                    return_dict=False)
    if cls_name == "Flux2Transformer2DModel":
        ids = torch.zeros(1, S, 4, dtype=torch.long)
        ids[0, :, 1] = torch.arange(h).repeat_interleave(w)
        ids[0, :, 2] = torch.arange(w).repeat(h)
        tids = torch.zeros(1, L, 4, dtype=torch.long)
        tids[0, :, 3] = torch.arange(L)
        return dict(hidden_states=torch.randn(1, S, c["in_channels"], dtype=dt),
                    encoder_hidden_states=torch.randn(1, L, c["joint_attention_dim"], dtype=dt),
                    timestep=torch.tensor([0.75], dtype=dt), img_ids=ids, txt_ids=tids,
                    guidance=torch.tensor([4.0], dtype=dt) if c.get("guidance_embeds", True) else None,
                    return_dict=False)
    if cls_name == "ZImageTransformer2DModel":
        return dict(x=[torch.randn(c.get("in_channels", 16), 1, H // 8, W // 8, dtype=dt)],
                    t=torch.tensor([0.75], dtype=dt),
                    cap_feats=[torch.randn(L, c["cap_feat_dim"], dtype=dt)], return_dict=False)
    if cls_name == "QwenImageTransformer2DModel":
        return dict(hidden_states=torch.randn(1, S, c["in_channels"], dtype=dt),
                    encoder_hidden_states=torch.randn(1, L, c["joint_attention_dim"], dtype=dt),
                    encoder_hidden_states_mask=None, timestep=torch.tensor([0.75], dtype=dt),
                    img_shapes=[[(1, h, w)]], return_dict=False)
    raise SystemExit("peer_step.py: no inputs for transformer class " + cls_name)


def main():
    if sys.argv[1] == "--params":
        cls_name, _, m = build(sys.argv[2], torch.float32, "meta")
        print(json.dumps({"class": cls_name, "params": sum(p.numel() for p in m.parameters())}))
        return
    cfg, W, H, L, steps, warm, th = sys.argv[1], *map(int, sys.argv[2:8])
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[sys.argv[8] if len(sys.argv) > 8 else "float32"]
    torch.set_num_threads(th)
    torch.manual_seed(0)
    cls_name, c, m = build(cfg, dt)
    kw = inputs(cls_name, c, W, H, L, dt)
    ts = []
    with torch.inference_mode():
        for i in range(warm + steps):
            t0 = time.perf_counter()
            m(**kw)
            if i >= warm:
                ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    print(json.dumps({"peer": "diffusers eager " + cls_name, "torch": torch.__version__,
                      "blas_core": blas_core(), "threads": th, "image_tokens": (H // 16) * (W // 16),
                      "text_tokens": L, "params": sum(q.numel() for q in m.parameters()),
                      "step_ms_min": ts[0], "step_ms_median": ts[len(ts) // 2]}))


if __name__ == "__main__":
    main()
