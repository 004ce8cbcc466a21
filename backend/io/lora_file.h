// LoRA files read from their safetensors header alone (no Torch, no Qt: the GUI uses this to show
// a LoRA's format, rank and modules, and the Torch loader in backend/nn/lora_loader.h builds on
// it). Two layouts are recognised:
//
//  - diffusers / PEFT (diffusers FluxLoraLoaderMixin.save_lora_weights, PEFT
//    get_peft_model_state_dict): `<prefix><module>.lora_A.weight` [r, in] and
//    `<prefix><module>.lora_B.weight` [out, r], prefix "transformer." (or none, or PEFT's
//    "base_model.model."), module paths in the model's own (diffusers) naming. Alpha comes from,
//    in this order (diffusers lora_state_dict + get_peft_kwargs / load_lora_adapter): the header's
//    `lora_adapter_metadata` JSON (the PEFT LoraConfig, keys prefixed "transformer.": r,
//    lora_alpha, use_rslora, rank_pattern, alpha_pattern), else `<module>.alpha` scalar tensors
//    (per module), else alpha = r. A file with both metadata and alpha tensors is refused, as
//    diffusers refuses it.
//  - kohya sd-scripts (networks/lora_flux.py): `lora_unet_<module with "." ->
//  "_">.lora_down.weight`
//    [r, in], `.lora_up.weight` [out, r], optional `.alpha` scalar (missing = r). Module names are
//    the original (BFL) checkpoint's; a model family maps them to its own modules
//    (KohyaLoraMapping, e.g. backend/models/flux/flux_lora.h), splitting fused ones by rows.
//
// Scaling of a module (PEFT LoraLayer.scaling): strength * alpha / r (alpha / sqrt(r) with
// use_rslora). Errors are ModelFileError naming the file and the cause (first offending key).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace dit {

enum class LoraFormat { Diffusers, Kohya };

/// "diffusers" or "kohya".
const char* loraFormatName(LoraFormat f);

/// One module of a LoRA file as stored (names as in the file).
struct LoraFileModule {
  std::string
      name;  ///< diffusers: module path without prefix; kohya: "double_blocks_0_img_attn_qkv"
  std::string keyA;      ///< tensor key of lora_A / lora_down [rank, in]
  std::string keyB;      ///< tensor key of lora_B / lora_up [out, rank]
  std::string keyAlpha;  ///< tensor key of the alpha scalar, "" when absent
  int64_t rank = 0, in = 0, out = 0;
  double alpha = 0;  ///< effective alpha (after the precedence above)
  double scale = 0;  ///< alpha / rank (alpha / sqrt(rank) with use_rslora): scaling at strength 1
};

/// What a LoRA file's header says (values of alpha tensors are read from the mapped file).
struct LoraFileInfo {
  std::string path;
  LoraFormat format = LoraFormat::Diffusers;
  std::string
      alphaSource;  ///< "lora_adapter_metadata", "alpha tensors", "rank (no alpha)", "kohya .alpha"
  int64_t rank = 0;                     ///< the largest module rank
  uint64_t bytes = 0;                   ///< bytes of all LoRA tensors as stored
  std::vector<LoraFileModule> modules;  ///< in key order
  /// Informational header metadata (the safetensors "__metadata__" strings).
  std::map<std::string, std::string> metadata;
  /// One line: "kohya, rank 4, 26 modules, alpha from kohya .alpha".
  std::string summary() const;
};

/// Reads and checks a LoRA file's header. Throws ModelFileError naming the file and the cause:
/// not a safetensors file (see SafetensorsReader), no LoRA keys / an unknown key layout ("unknown
/// LoRA format: key 'x' is neither diffusers/PEFT (.lora_A/.lora_B) nor kohya (lora_unet_*)"),
/// a lora_A without its lora_B (and the reverse), a factor that is not 2-D or not floating point,
/// A and B ranks that disagree, text-encoder modules (only the denoiser is supported), metadata
/// that is not the JSON PEFT config or whose r disagrees with the tensors, metadata together with
/// alpha tensors, a non-scalar or non-positive alpha.
LoraFileInfo inspectLoraFile(const std::string& path);

/// Where one module of a kohya file goes in the model: rows [rowStart, rowStart + rows) of its
/// lora_up become the lora_B of `module` (lora_down is copied whole), the kohya way of splitting a
/// fused projection (diffusers _convert_kohya_flux_lora_to_diffusers). `swapHalves`: the two row
/// halves of those rows are swapped (a shift/scale chunk order that differs between the layouts);
/// `scaleOne`: the module's scale is 1 whatever alpha/rank is (diffusers drops that module's
/// alpha).
struct KohyaTarget {
  std::string module;
  int64_t rowStart = 0, rows = 0;
  bool swapHalves = false;
  bool scaleOne = false;
};

/// A model family's kohya name mapping: (kohya module name without "lora_unet_", lora_up rows,
/// lora_down columns) -> its targets; empty = the module is unknown to the family (the loader then
/// refuses the file naming it).
using KohyaLoraMapping =
    std::function<std::vector<KohyaTarget>(const std::string& module, int64_t out, int64_t in)>;

}  // namespace dit
