# Z-Image run 2 of tiny-zimage-A with the scheduler's static shift changed (diffusers'
# FlowMatchEulerDiscreteScheduler.from_config(config, shift=S)), through ZImagePipeline's
# prompt_embeds path with the fixture's stored embeddings (text_encoder=None, tokenizer=None).
# First replays run 2 at the folder's shift (3.0) and checks it equals the stored golden exactly.
import json, sys, torch
from safetensors.torch import load_file, save_file
import types
import diffusers  # before the stand-in below (its availability probe needs a real spec)
_t = types.ModuleType("transformers")
class AutoTokenizer: pass
class PreTrainedModel: pass
_t.AutoTokenizer = AutoTokenizer; _t.PreTrainedModel = PreTrainedModel
sys.modules["transformers"] = _t  # transformers is not installable here; the pipeline's typing only
import diffusers.loaders as _ld
from diffusers.loaders.single_file import FromSingleFileMixin as _sf
from diffusers.loaders.lora_pipeline import ZImageLoraLoaderMixin as _zl
_ld.FromSingleFileMixin, _ld.ZImageLoraLoaderMixin = _sf, _zl
from diffusers.pipelines.z_image.pipeline_z_image import ZImagePipeline
from diffusers import AutoencoderKL, ZImageTransformer2DModel, FlowMatchEulerDiscreteScheduler
torch.set_num_threads(1)
F = "/work/zshift/tiny-zimage-A"
g = load_file(F + "/golden/golden.safetensors")
meta = json.load(open(F + "/golden/golden.json"))
r = meta["runs"][2]
tr = ZImageTransformer2DModel.from_pretrained(F, subfolder="transformer", torch_dtype=torch.float32)
vae = AutoencoderKL.from_pretrained(F, subfolder="vae", torch_dtype=torch.float32)
base = FlowMatchEulerDiscreteScheduler.from_pretrained(F, subfolder="scheduler")
out = {}
for shift in [None, 6.0, 1.5]:
    sched = base if shift is None else FlowMatchEulerDiscreteScheduler.from_config(base.config, shift=shift)
    pipe = ZImagePipeline(scheduler=sched, vae=vae, text_encoder=None, tokenizer=None, transformer=tr)
    cap = {}
    def cb(p, i, t, kw):
        cap.setdefault("steps", []).append(kw["latents"].clone()); return kw
    img = pipe(prompt_embeds=[g["enc.prompt_embeds.%d" % r["prompt_index"]]],
               negative_prompt_embeds=[g["enc.prompt_embeds.%d" % r["negative_prompt_index"]]],
               height=r["height"], width=r["width"], num_inference_steps=r["steps"],
               guidance_scale=r["guidance_scale"], cfg_truncation=r["cfg_truncation"],
               cfg_normalization=r["cfg_normalization"],
               generator=torch.Generator("cpu").manual_seed(r["seed"]), output_type="pt",
               callback_on_step_end=cb, callback_on_step_end_tensor_inputs=["latents"]).images[0]
    fin = cap["steps"][-1]
    if shift is None:
        d = (fin - g["run.2.final_latents"]).abs().max().item()
        di = (img - g["run.2.image"]).abs().max().item()
        print("replay at the folder's shift: final_latents diff", d, "image diff", di)
        assert d < 1e-5 and di < 1e-5  # this lab: 2e-6 (the BLAS here differs from the fixture builder's)
        continue
    k = "shift%g." % shift
    out[k + "final_latents"] = fin.contiguous()
    out[k + "image"] = img.contiguous()
    out[k + "sigmas"] = pipe.scheduler.sigmas.float().contiguous()
    print(shift, "sigmas", pipe.scheduler.sigmas.tolist(), "diff from shift 3:", (fin - g["run.2.final_latents"]).abs().max().item())
save_file(out, "/work/zshift/zimage-shift.safetensors")
print("saved", list(out))
