// DiTSpec: what a diffusion-transformer family tells the one driver (DiTModel, dit_model.h): its
// inputs, how they embed into the per-forward state, its block stages in order, and how the
// state becomes the prediction. Everything else (declared-vs-loaded check, input validation,
// context-parallel split/gather, the hooked block loop, First Block Cache / TaylorSeer, FLOPs)
// is the driver's. The shape follows llama.cpp's arch files over shared builders (the layers are
// backend/nn/) and diffusers' per-block hooks (hooks/first_block_cache.py, taylorseer_cache.py).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backend/models/diffusion_transformer.h"  // TransformerInputs
#include "backend/nn/adaln.h"
#include "backend/nn/attention.h"
#include "parallel/context_parallel_plan_types.h"

namespace dit {

/// One forward input, by diffusers' argument name.
struct DiTInput {
  enum class Kind {
    Activation,   ///< moved to the weights' device and cast to the compute dtype
    PositionIds,  ///< [S, n_axes] or [1, S, n_axes] (the batch dim of 1 is dropped, as diffusers
                  ///< does); moved to the device, dtype kept
    Float32,      ///< moved to the device as float32 whatever the compute dtype: an input the
                  ///< diffusers pipeline passes in float32 to a reduced-precision model (Z-Image's
                  ///< timestep)
  };
  std::string name;
  bool required = true;  ///< false: optional (absent or undefined = not given)
  Kind kind = Kind::Activation;
};

/// The per-forward state the stages pass along. Shapes with this rank's local (context-parallel)
/// tokens: B batch, S_img / S_txt image / text tokens, C inner dim.
struct DiTState {
  /// Image stream [B, S_img, C]; in a joint stage (after joinStreams) cat(text, image)
  /// [B, S_txt + S_img, C].
  at::Tensor hidden_states;
  /// Text stream [B, S_txt, C]; undefined in a joint stage.
  at::Tensor encoder_hidden_states;
  /// Text tokens at the head of the joint sequence (set by joinStreams).
  int64_t text_tokens = 0;
  /// silu(temb) [B, C]: every AdaLN/modulation applies silu to temb first; computed once.
  at::Tensor silu_temb;
  /// Shared modulation by module name (e.g. FLUX.2's "double_stream_modulation_img").
  std::map<std::string, std::vector<nn::Modulation::Params>> modulation;
  /// Per-block AdaLN modulation linear(silu(temb)) computed before the blocks, in the family's
  /// order (FLUX.1 under tensor parallelism: every block's at once with one all-gather,
  /// ColumnParallelLinear::forwardCoalesced); empty = each block computes its own.
  std::vector<at::Tensor> adaln_emb;
  /// Rotary tables float32 [S_txt + S_img, head_dim] over cat(text, image).
  at::Tensor rope_cos, rope_sin;
  /// Local or context-parallel attention (set by the driver before embed) over the joint
  /// sequence (the cp plan's joint_sequence).
  nn::AttentionBackend attention;
  /// Under context parallelism: every cp rank's length of each split input along its split dim
  /// (ContextParallelRunner::sizes); empty without cp.
  std::map<std::string, std::vector<int64_t>> cp_sizes;
  /// TaylorSeer's seam around the running block's "<stage>.<i>.attn" module (set by the driver
  /// before each block; null = no caching this block). Blocks pass it to nn::cachePredicts /
  /// cachePrediction / cacheRecord around their attention module.
  const nn::AttentionCacheSeam* attention_cache = nullptr;

  /// Enters a joint stage: hidden_states = cat(text, image) along the sequence, text_tokens =
  /// S_txt, encoder_hidden_states undefined. Throws std::logic_error when already joint.
  void joinStreams();
  bool joint() const { return !encoder_hidden_states.defined(); }
  /// The image stream [B, S_img, C] in either layout (a view in the joint one).
  at::Tensor imageStream() const;
  /// The text stream [B, S_txt, C] in either layout (a view in the joint one).
  at::Tensor textStream() const;
  /// `attention` restricted to the sequence made of the split inputs `inputs` (in that order),
  /// for a stage that attends over one stream only (e.g. ZImageTransformer2DModel's noise and
  /// context refiners): localLens = their summed cp_sizes. Without cp: `attention` itself. Throws
  /// std::invalid_argument naming an input the cp plan did not split.
  nn::AttentionBackend attentionOver(const std::vector<std::string>& inputs) const;
};

/// One list of blocks ("transformer_blocks", "single_transformer_blocks"): its module name, its
/// length, an optional step on entry (e.g. DiTState::joinStreams) and the block call.
struct DiTStage {
  std::string name;
  int count = 0;
  std::function<void(DiTState&)> begin;     ///< may be empty
  std::function<void(int, DiTState&)> run;  ///< block i updates the state in place
};

struct DiTSpec {
  /// diffusers class name, used in messages ("FluxTransformer2DModel").
  std::string class_name;
  /// Accepted inputs; forward() rejects unknown names and missing required ones.
  std::vector<DiTInput> inputs;
  /// diffusers' _cp_plan: which inputs are split over the cp group and how the output gathers.
  ContextParallelPlan cp_plan;
  /// Optional: rewrites the inputs (validated, on the device; the same on every rank) before the
  /// context-parallel split, e.g. patchify and pad sequences to a multiple with the rows a learned
  /// pad token fills, adding the inputs the cp plan splits with them (pad masks, position ids).
  std::function<void(TransformerInputs& inputs)> prepare;
  /// Optional: the gathered prediction -> forward()'s result, given the inputs as they were before
  /// prepare (e.g. the padding rows cut and the tokens unpatchified). Empty = the gathered one.
  std::function<at::Tensor(const at::Tensor& gathered, const TransformerInputs& inputs)> output;
  /// local = the inputs after the device/dtype moves and the cp split (optional inputs present
  /// only when given). Fills state's streams, conditioning and rotary tables (attention is set).
  std::function<void(const TransformerInputs& local, DiTState& state)> embed;
  std::vector<DiTStage> stages;
  /// The state after the last stage (or after a First Block Cache skip) -> the local prediction
  /// [B, S_img, out_channels] (norm_out + proj_out: the "proj_out" module TaylorSeer lite caches).
  std::function<at::Tensor(const DiTState& state)> finalize;
  /// FLOPs of one forward, batch 1 (matmuls + attention).
  std::function<double(int64_t imageTokens, int64_t textTokens)> flops;
};

}  // namespace dit
