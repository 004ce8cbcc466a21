// Single-file checkpoints as FLUX.1 users have them: Black Forest Labs' own files
// (flux1-dev.safetensors, ae.safetensors), community FP8 files, ComfyUI "scaled fp8" files and
// ComfyUI all-in-one checkpoints (transformer + VAE + CLIP-L + T5 in one file).
//
// Torch-free (the GUI detects what a file holds through this): reading is done by WeightSource
// (weight_source.h, WeightSource::fromLayout) through a KeyLayout, a table from each diffusers
// parameter name to the stored row ranges it is made of. The mapping is the inverse of diffusers'
// loaders/single_file_utils.py (convert_flux_transformer_checkpoint_to_diffusers,
// convert_ldm_vae_checkpoint), with the model's width read from the tensor shapes instead of
// FLUX.1-dev's hard-coded 3072; fused rows (qkv, linear1) are addressed as row ranges so a
// tensor-parallel rank reads only its own rows, and BFL's final-layer shift/scale halves are
// swapped back. See ../shared/fixtures/tiny-flux-A/formats/README.md for the layout tables.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/io/key_layout.h"
#include "backend/io/safetensors.h"
#include "backend/models/autoencoders/autoencoder_kl_config.h"
#include "backend/models/text_encoders/text_encoder_configs.h"

namespace dit {

/// One component found in a single file.
struct CheckpointComponent {
  std::string name;    ///< "transformer", "vae", "text_encoder" (CLIP-L), "text_encoder_2" (T5)
  std::string prefix;  ///< key prefix inside the file ("" for a bare file)
  std::string layout;  ///< "bfl", "ldm", "diffusers", "transformers"
  std::map<std::string, int64_t> dtypes;  ///< stored dtype spelling -> tensor count
  uint64_t bytes = 0;                     ///< stored bytes of its tensors
};

/// What a single safetensors file holds, from its header alone.
struct CheckpointInfo {
  std::string file;
  std::string family;  ///< "flux" (FLUX.1)
  std::string
      variant;  ///< "flux-dev" (guidance_in present), "flux-schnell", or "" (no transformer)
  bool scaled_fp8 = false;  ///< ComfyUI scaled fp8 (`scaled_fp8` marker or `.scale_weight` tensors)
  std::vector<CheckpointComponent> components;
  const CheckpointComponent* find(const std::string& name) const;
  /// The component `name`, or ModelFileError naming the file, what it holds instead and `flag`,
  /// the option that supplies it (e.g. a VAE given with --model: "holds a VAE ... not a
  /// transformer; give it with --vae").
  const CheckpointComponent& require(const std::string& name, const std::string& flag) const;
  /// One line: "flux-dev: transformer (bfl, F8_E4M3 x36 + F32 x48), vae (ldm, F32 x120)".
  std::string describe() const;
};

/// Reads the header of `file` and detects its components (diffusers' infer_diffusers_model_type
/// rules: `double_blocks.0.img_attn.norm.key_norm.scale` marks FLUX.1, `guidance_in` dev-style).
/// Throws ModelFileError naming the file and the cause: unreadable or truncated file (the
/// safetensors reader's checks); FLUX.1 Fill / Depth (img_in width 384 / 128), not supported yet;
/// a file of another model family (Stable Diffusion 1.x/2.x/XL UNet, SD3, FLUX.2 ...); a file
/// whose own metadata declares another architecture (GGUF `general.architecture` other than
/// "flux"; a transformer whose safetensors `modelspec.architecture` does not name FLUX), naming
/// what it declares; no known key layout at all (lists the first keys).
CheckpointInfo inspectCheckpoint(const std::string& file);

/// The transformer of a BFL-layout file (keys under `prefix`). Every stored key must be consumed
/// (else ModelFileError naming the first unknown key); when the file is scaled fp8 (`scaled_fp8`
/// marker), every F8 2-D weight must have its `.scale_weight` (else ModelFileError naming it).
KeyLayout bflFluxTransformerLayout(const SafetensorsReader& r, const std::string& prefix);
/// The VAE of an LDM/BFL `ae` layout file (keys under `prefix`).
KeyLayout ldmVaeLayout(const SafetensorsReader& r, const std::string& prefix);
/// Keys under `prefix` with the prefix removed (diffusers / transformers names already).
KeyLayout prefixLayout(const SafetensorsReader& r, const std::string& prefix,
                       const std::string& description);
/// The KeyLayout of component `c` of `file` (dispatches on c.layout).
std::shared_ptr<const KeyLayout> componentLayout(const SafetensorsReader& r,
                                                 const CheckpointComponent& c);

/// The tensor `key` of `r`, which must exist with `dims` dimensions (else ModelFileError naming
/// the file and the key): what the configs-from-shapes readers (here and the families' own, e.g.
/// flux/flux_bfl_config.h) read their sizes from.
const TensorInfo& checkpointTensor(const SafetensorsReader& r, const std::string& key, size_t dims);
/// The number of `<prefix><group>.<N>.` blocks in `r` (indices contiguous from 0; a gap is
/// ModelFileError naming the file).
int checkpointBlockCount(const SafetensorsReader& r, const std::string& prefix,
                         const std::string& group);
/// AutoencoderKL config from LDM shapes under `prefix` (channels, levels, resnets per level,
/// latent channels). norm_num_groups, scaling_factor, shift_factor, act_fn come from `reference`
/// when given, else FLUX.1's VAE (32 groups, 0.3611, 0.1159, silu).
AutoencoderKLConfig vaeConfigFromLdm(const SafetensorsReader& r, const std::string& prefix,
                                     const AutoencoderKLConfig* reference);
/// CLIPTextConfig from the shapes (vocab, width, MLP width, layers, positions). Heads, activation
/// and eos id come from `reference`, else CLIP-L's (width / 64 heads, quick_gelu, eos 2).
CLIPTextConfig clipConfigFromShapes(const KeyLayout& l, const SafetensorsReader& r,
                                    const CLIPTextConfig* reference);
/// T5Config from the shapes (vocab, d_model, heads from the relative attention bias, d_kv, d_ff,
/// layers, gated MLP). Activation from `reference`, else T5 v1.1's gelu_new when gated.
T5Config t5ConfigFromShapes(const KeyLayout& l, const SafetensorsReader& r,
                            const T5Config* reference);

}  // namespace dit
