#include "backend/models/flux/flux_bfl_config.h"

#include <string>

#include "backend/models/checkpoint_layouts.h"

namespace dit {

FluxTransformerConfig fluxConfigFromBfl(const SafetensorsReader& r, const std::string& prefix,
                                        const FluxTransformerConfig* reference) {
  FluxTransformerConfig c;
  const auto& img = checkpointTensor(r, prefix + "img_in.weight", 2).shape;
  const int64_t D = img[0];
  c.in_channels = static_cast<int>(img[1]);
  c.out_channels =
      static_cast<int>(checkpointTensor(r, prefix + "final_layer.linear.weight", 2).shape[0]);
  c.attention_head_dim = static_cast<int>(
      checkpointTensor(r, prefix + "double_blocks.0.img_attn.norm.query_norm.scale", 1).shape[0]);
  if (c.attention_head_dim <= 0 || D % c.attention_head_dim != 0)
    throw ModelFileError(r.path(), "width " + std::to_string(D) +
                                       " is not a multiple of the head dim " +
                                       std::to_string(c.attention_head_dim));
  c.num_attention_heads = static_cast<int>(D / c.attention_head_dim);
  c.joint_attention_dim =
      static_cast<int>(checkpointTensor(r, prefix + "txt_in.weight", 2).shape[1]);
  c.pooled_projection_dim =
      static_cast<int>(checkpointTensor(r, prefix + "vector_in.in_layer.weight", 2).shape[1]);
  c.num_layers = checkpointBlockCount(r, prefix, "double_blocks");
  c.num_single_layers = checkpointBlockCount(r, prefix, "single_blocks");
  c.guidance_embeds = r.contains(prefix + "guidance_in.in_layer.weight");
  const int64_t mlp = checkpointTensor(r, prefix + "double_blocks.0.img_mlp.0.weight", 2).shape[0];
  if (mlp != 4 * D)
    throw ModelFileError(r.path(), "MLP width " + std::to_string(mlp) + " is not 4 x the width " +
                                       std::to_string(D) + " (FLUX.1's mlp_ratio)");
  if (reference) {
    c.axes_dims_rope = reference->axes_dims_rope;
  } else if (c.attention_head_dim == 128) {
    c.axes_dims_rope = {16, 56, 56};
  } else {
    throw ModelFileError(r.path(), "head dim " + std::to_string(c.attention_head_dim) +
                                       " is not FLUX.1's 128: the RoPE axes are not in the file; "
                                       "give a diffusers config folder with --config");
  }
  int sum = 0;
  for (int a : c.axes_dims_rope) sum += a;
  if (sum != c.attention_head_dim)
    throw ModelFileError(r.path(), "the config's axes_dims_rope sum to " + std::to_string(sum) +
                                       " but the file's head dim is " +
                                       std::to_string(c.attention_head_dim));
  return c;
}

}  // namespace dit
