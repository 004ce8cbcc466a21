# Goldens of diffusers' Flux2KleinKVPipeline (pipelines/flux2/pipeline_flux2_klein_kv.py) on the
# tiny-flux2-A weights, for tests/test_flux2_kv.cpp. Run in the golden lab (setup-lab.sh: Debian 13
# chroot, CPU torch 2.6, diffusers from source), with this folder's parent bind-mounted:
#
#   mount --bind /path/to/tests/data ROOT/work/data
#   chroot ROOT bash -c 'cd /work/data/tiny-flux2-kv-A && PYTHONPATH=/opt/pysrc HF_HUB_OFFLINE=1 \
#       OMP_NUM_THREADS=1 python3 make_kv_golden.py'
#
# transformers is not installed in the lab: the pipeline module imports two of its classes for
# type annotations only, so a stub module stands in, the pipeline is built from its components
# with no text encoder, and the prompts are the STORED embeddings of tiny-flux2-A
# (golden/golden.safetensors enc.prompt_embeds.<i>), as the edit goldens (EDIT.md) are made.
# Writes golden/kv.safetensors and golden/kv_info.json.
import hashlib
import json
import os
import platform
import sys
import types

import numpy as np  # noqa: E402
import PIL  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import diffusers  # noqa: E402
from diffusers.models import AutoencoderKLFlux2, Flux2Transformer2DModel  # noqa: E402
# After diffusers has looked for transformers (a stub without __spec__ would upset that look).
stub = types.ModuleType("transformers")
stub.Qwen2TokenizerFast = type("Qwen2TokenizerFast", (), {})
stub.Qwen3ForCausalLM = type("Qwen3ForCausalLM", (), {})
sys.modules.setdefault("transformers", stub)
import diffusers.loaders  # noqa: E402

if not hasattr(diffusers.loaders, "Flux2LoraLoaderMixin"):  # exported only with transformers
    from diffusers.loaders.lora_pipeline import Flux2LoraLoaderMixin  # noqa: E402

    diffusers.loaders.Flux2LoraLoaderMixin = Flux2LoraLoaderMixin
from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline  # noqa: E402
from diffusers.pipelines.flux2.pipeline_flux2_klein_kv import Flux2KleinKVPipeline  # noqa: E402
from diffusers.schedulers import FlowMatchEulerDiscreteScheduler  # noqa: E402

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden")
prompts = load_file(os.path.join(HERE, "..", "tiny-flux2-A", "golden", "golden.safetensors"))

transformer = Flux2Transformer2DModel.from_pretrained(os.path.join(HERE, "transformer")).eval()
vae = AutoencoderKLFlux2.from_pretrained(os.path.join(HERE, "vae")).eval()
scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(HERE, "scheduler"))


def make(cls):
    return cls(scheduler=scheduler, vae=vae, text_encoder=None, tokenizer=None,
               transformer=transformer)


kv_pipe = make(Flux2KleinKVPipeline)  # sets Flux2KVAttnProcessor / Flux2KVParallelSelfAttnProcessor

# Recording: every transformer call (its mode, the noise prediction), the references as the
# pipeline encodes them, the latents after each step and the decoder's input.
rec = {}
orig_forward = transformer.forward
UNCACHED = {"on": False}


def forward(*args, **kw):
    mode = kw.get("kv_cache_mode")
    if UNCACHED["on"] and mode == "cached":
        # The uncached form of the same causal attention: the references in the sequence again
        # ("extract" every step), as diffusers lays them out: [ref, img].
        kw = dict(kw)
        kw.pop("kv_cache")
        kw["hidden_states"] = torch.cat([rec["ref_latents"], kw["hidden_states"]], 1)
        kw["img_ids"] = torch.cat([rec["ref_ids"], kw["img_ids"]], 1)
        kw["kv_cache_mode"] = "extract"
        kw["num_ref_tokens"] = rec["ref_latents"].shape[1]
        out = orig_forward(*args, **kw)
        rec["calls"].append(("extract(uncached)", out[0].clone()))
        return (out[0],)
    out = orig_forward(*args, **kw)
    rec["calls"].append((mode or "plain", out[0].clone()))
    return out


transformer.forward = forward


def wrap_pipe(pipe):
    orig_prep = pipe.prepare_image_latents
    orig_prep_lat = pipe.prepare_latents

    def prep(images, *a, **kw):
        lat, ids = orig_prep(images, *a, **kw)
        rec["ref_images"] = [im.clone() for im in images]
        rec["ref_latents"], rec["ref_ids"] = lat.clone(), ids.clone()
        return lat, ids

    def prep_lat(*a, **kw):
        lat, ids = orig_prep_lat(*a, **kw)
        rec["initial_latents"], rec["latent_ids"] = lat.clone(), ids.clone()
        return lat, ids

    pipe.prepare_image_latents = prep
    pipe.prepare_latents = prep_lat


wrap_pipe(kv_pipe)
orig_decode = vae.decode


def decode(z, *a, **kw):
    rec["vae_in"] = z.clone()
    return orig_decode(z, *a, **kw)


vae.decode = decode


def run(pipe, refs, prompt_index, seed, steps, height=None, width=None, **extra):
    rec.clear()
    rec["calls"], rec["steps"] = [], []

    def on_step(p, i, t, kw):
        rec["steps"].append(kw["latents"].clone())
        return {}

    images = [Image.open(os.path.join(GOLDEN, f)).convert("RGB") for f in refs] if refs else None
    out = pipe(image=images, prompt_embeds=prompts[f"enc.prompt_embeds.{prompt_index}"][None],
               height=height, width=width, num_inference_steps=steps,
               generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
               callback_on_step_end=on_step, **extra).images
    image = torch.from_numpy(out[0]).permute(2, 0, 1).contiguous()
    return dict(rec), image


RUNS = [
    dict(refs=["edit_ref_1.png"], prompt_index=0, seed=42, steps=4, height=48, width=64),
    dict(refs=["edit_ref_2.png", "edit_ref_0.png", "edit_ref_1.png"], prompt_index=5, seed=1234,
         steps=3, height=None, width=None),
]
tensors, info_runs = {}, []
with torch.no_grad():
    for k, cfg in enumerate(RUNS):
        r, image = run(kv_pipe, **cfg)
        modes = [c[0] for c in r["calls"]]
        assert modes[0] == "extract" and all(m == "cached" for m in modes[1:]), modes
        p = f"run.{k}."
        n_ref = r["ref_latents"].shape[1]
        for j, im in enumerate(r["ref_images"]):
            tensors[p + f"ref_image.{j}"] = im
        tensors[p + "ref_latents"] = r["ref_latents"]
        tensors[p + "ref_ids"] = r["ref_ids"]
        tensors[p + "latent_ids"] = r["latent_ids"]
        tensors[p + "initial_latents"] = r["initial_latents"]
        tensors[p + "timesteps"] = kv_pipe.scheduler.timesteps.clone()
        tensors[p + "sigmas"] = kv_pipe.scheduler.sigmas.clone()
        tensors[p + "step_pred"] = torch.cat([c[1] for c in r["calls"]], 0)
        tensors[p + "step_latents"] = torch.cat(r["steps"], 0)
        tensors[p + "final_latents"] = r["steps"][-1]
        tensors[p + "vae_in"] = r["vae_in"]
        tensors[p + "image"] = image
        h, w = image.shape[1], image.shape[2]

        # The same run with the references recomputed every step (diffusers' "extract" mode every
        # call): the cached run must equal it.
        UNCACHED["on"] = True
        ru, image_u = run(kv_pipe, **cfg)
        UNCACHED["on"] = False
        assert [c[0] for c in ru["calls"]][1:] == ["extract(uncached)"] * (cfg["steps"] - 1)
        tensors[p + "uncached_final_latents"] = ru["steps"][-1]
        cached_vs_uncached = (ru["steps"][-1] - r["steps"][-1]).abs().max().item()

        # Without references (reference effect) and with the plain Flux2KleinPipeline (the
        # references attending to everything, recomputed every step: how far KV's causal
        # attention moves the result).
        r0, image0 = run(kv_pipe, refs=None, prompt_index=cfg["prompt_index"], seed=cfg["seed"],
                         steps=cfg["steps"], height=h, width=w)
        tensors[p + "noref_final_latents"] = r0["steps"][-1]
        full = make(Flux2KleinPipeline)
        from diffusers.models.transformers.transformer_flux2 import (  # noqa: E402
            Flux2AttnProcessor, Flux2ParallelSelfAttnProcessor)
        for b in transformer.transformer_blocks:
            b.attn.set_processor(Flux2AttnProcessor())
        for b in transformer.single_transformer_blocks:
            b.attn.set_processor(Flux2ParallelSelfAttnProcessor())
        wrap_pipe(full)
        rf, image_f = run(full, **cfg, guidance_scale=1.0)
        tensors[p + "full_attention_final_latents"] = rf["steps"][-1]
        kv_pipe._set_kv_attn_processors()

        ref_sizes = [[int(x.shape[3]), int(x.shape[2])] for x in r["ref_images"]]
        info_runs.append({
            "references": cfg["refs"], "references_preprocessed_wh": ref_sizes,
            "prompt_index": cfg["prompt_index"], "prompt_embeds_key":
            f"enc.prompt_embeds.{cfg['prompt_index']}", "seed": cfg["seed"],
            "num_inference_steps": cfg["steps"], "height_arg": cfg["height"],
            "width_arg": cfg["width"], "output_hw": [h, w],
            "n_tokens": int(r["initial_latents"].shape[1]), "n_ref_tokens": int(n_ref),
            "transformer_modes": modes,
            "timesteps": tensors[p + "timesteps"].tolist(),
            "cached_vs_uncached_final_max_abs": cached_vs_uncached,
            "reference_effect_final_max_abs":
                (r0["steps"][-1] - r["steps"][-1]).abs().max().item(),
            "reference_effect_image_max_abs": (image0 - image).abs().max().item(),
            "kv_vs_full_attention_final_max_abs":
                (rf["steps"][-1] - r["steps"][-1]).abs().max().item(),
            "kv_vs_full_attention_image_max_abs": (image_f - image).abs().max().item(),
        })

tensors = {k: v.contiguous() for k, v in tensors.items()}
save_file(tensors, os.path.join(GOLDEN, "kv.safetensors"))
info = {
    "fixture": "tiny-flux2-kv-A (tiny-flux2-A's weights, model_index _class_name "
               "Flux2KleinKVPipeline)",
    "pipeline": "Flux2KleinKVPipeline",
    "script": "tests/data/tiny-flux2-kv-A/make_kv_golden.py",
    "versions": {"diffusers": diffusers.__version__, "torch": torch.__version__,
                 "numpy": np.__version__, "Pillow": PIL.__version__,
                 "python": platform.python_version(), "threads": torch.get_num_threads()},
    "runs": info_runs,
    "tensors": {k: list(v.shape) for k, v in sorted(tensors.items())},
    "sha256": hashlib.sha256(open(os.path.join(GOLDEN, "kv.safetensors"), "rb").read())
    .hexdigest(),
}
with open(os.path.join(GOLDEN, "kv_info.json"), "w") as f:
    json.dump(info, f, indent=1)
    f.write("\n")
print(json.dumps(info_runs, indent=1))
