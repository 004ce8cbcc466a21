// FLUX.1's kohya LoRA names: sd-scripts (networks/lora_flux.py) names modules after the original
// Black Forest Labs checkpoint (fused qkv, single-block linear1/linear2); this maps each to the
// diffusers modules of FluxTransformer2DModel, as diffusers'
// _convert_kohya_flux_lora_to_diffusers does, except that the fused split sizes come from the
// tensors (any hidden size, not FLUX.1-dev's 3072) and alpha / rank stays with each part instead of
// being folded into the factors (the same delta).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/io/lora_file.h"

namespace dit {

/// kohya module (without "lora_unet_") -> FluxTransformer2DModel module(s), for a module whose
/// lora_up has `out` rows and lora_down `in` columns:
///  - double_blocks_N_{img,txt}_attn_qkv -> transformer_blocks.N.attn.{to_q,to_k,to_v |
///    add_q_proj,add_k_proj,add_v_proj}, lora_up cut into three equal row blocks;
///  - double_blocks_N_{img,txt}_attn_proj -> attn.to_out.0 | attn.to_add_out; _mlp_0 / _mlp_2 ->
///    ff(_context).net.0.proj / net.2; _mod_lin -> norm1(_context).linear;
///  - single_blocks_M_linear1 -> single_transformer_blocks.M.attn.{to_q,to_k,to_v}, proj_mlp, rows
///    [in, in, in, out - 3 in]; _linear2 -> proj_out; _modulation_lin -> norm.linear;
///  - img_in, txt_in, time_in_*, vector_in_*, guidance_in_* -> x_embedder, context_embedder,
///    time_text_embed.{timestep,text,guidance}_embedder.linear_{1,2}; final_layer_linear ->
///    proj_out;
///  - final_layer_adaLN_modulation_1 -> norm_out.linear with the two row halves swapped (BFL
///    orders shift, scale; diffusers scale, shift) and scale 1: diffusers drops this module's alpha
///    (the "final-layer trap"; kohya's own semantics would apply alpha / rank, we follow
///    diffusers).
/// Returns an empty list for any other name or when the sizes cannot be split that way.
std::vector<KohyaTarget> fluxKohyaTargets(const std::string& module, int64_t out, int64_t in);

}  // namespace dit
