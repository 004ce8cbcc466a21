// Reads the sizes of a diffusers FLUX.1 model folder for the generation panel, the strategy
// validation (dit::ModelDims) and the advisor, through the worker's own readers
// (dit::ModelFolder, dit::SafetensorsCollection): configs and safetensors headers only.
#pragma once

#include <QJsonObject>
#include <QString>
#include <QStringList>

#include "app/protocol/protocol.h"
#include "backend/io/model_folder.h"
#include "backend/models/family.h"
#include "backend/models/request_spec.h"
#include "parallel/strategy.h"

namespace dit::ui {

/// Parameter count and bytes of one component (e.g. "transformer"), from its safetensors headers.
struct ComponentSize {
  QString name;
  qint64 parameters = 0;  ///< sum of tensor element counts (0 when unreadable)
  qint64 bytes = 0;       ///< sum of the .safetensors file sizes on disk
  QString dtype;          ///< dtype of most parameters ("F32", "BF16", ...), empty when unknown
  QString storage;        ///< every stored dtype with its tensor count, e.g. "F8_E4M3 x36, F32 x48"
  QString source;  ///< where it comes from: "folder <path>" or "<file> (bfl layout, prefix ...)"
};

/// What the GUI shows and validates against. `ok` is false with `error` set for a missing or
/// broken folder (no model_index.json / transformer/config.json, unreadable JSON, git-lfs pointer
/// files instead of weights).
struct ModelInfo {
  bool ok = false;
  QString error;
  QString path;
  /// The family's display name (FamilySpec::display_name), e.g. "FLUX.1".
  QString family;
  /// One fact about the model as its family states it (FamilySpec::facts): "blocks" ->
  /// "19 double + 38 single".
  struct Fact {
    QString key, label, value;
  };
  QList<Fact> facts;
  /// The value of the fact `key`; empty when the family states none.
  QString fact(const QString& key) const {
    for (const auto& f : facts)
      if (f.key == key) return f.value;
    return {};
  }
  /// What the family can do (image-to-image, inpainting, step caching, single files, LoRA);
  /// everything on until a model is read, so the panels start enabled.
  dit::FamilyCapabilities capabilities{true, true, true, true, {}};
  // The transformer's attention sizes (ModelDims).
  int num_attention_heads = 0;
  int attention_head_dim = 0;
  // vae/config.json
  int vae_scale_factor = 8;       ///< 2^(len(block_out_channels)-1)
  int max_sequence_length = 512;  ///< the pipeline's default text length (FLUX: T5 tokens)
  /// The family's declared request for this model (dit::requestSpecOf): every field with what it
  /// means here (read or not and why), the size rule, the guider, the family's knobs. The panel
  /// builds its rows from it and the validation resolves requests against it (resolve()).
  /// Until a model is read: the generic fields, all read, no knobs.
  dit::RequestSpec request = anyModelRequest();
  QList<ComponentSize> components;
  /// The transformer family's declared ModelDims (sizes, tensor- and context-parallel plans,
  /// parameter table), as dit::ModelFolder::dims() gives them; empty when !ok.
  dit::ModelDims model_dims;
  /// Single-file models: what was detected from the keys, e.g. "flux / flux-dev (scaled fp8)";
  /// empty for a diffusers folder.
  QString detected;
  /// Notes on what was inferred (embedded tokenizers, published default configs).
  QStringList notes;
  /// The model's recommended generation settings (dit::ModelFolder::default_settings: any of
  /// steps, width, height, guidance, negative_prompt and the family's knobs, with the protocol's
  /// keys and types); empty when the model declares none. The panel applies them when the model is
  /// chosen (paramsFromQJson over the current parameters).
  QJsonObject default_settings;

  int innerDim() const { return num_attention_heads * attention_head_dim; }
  /// Width/height step: 2 * vae_scale_factor (latents are packed 2x2).
  int sizeMultiple() const { return 2 * vae_scale_factor; }
  qint64 totalParameters() const;
  qint64 totalBytes() const;
  const ComponentSize* component(const QString& name) const;
  /// The sizes dit::validateForModel needs: model_dims (the registered family's declaration,
  /// never rebuilt from the fields above).
  const dit::ModelDims& dims() const { return model_dims; }
  /// `p` resolved against this model's request (dit::resolveRequest: defaults, ranges, the size
  /// rule, whether the guider runs the CFG branch cfg_degree 2 splits off).
  dit::ResolvedRequest resolve(const dit::protocol::GenerationParams& p) const;
  /// The request before a model is read: guidance and the negative prompt read, no knobs, no
  /// CFG (which field turns CFG on is the family's).
  static dit::RequestSpec anyModelRequest();
  /// Multi-line human summary (layers, heads, head dim, parameters).
  QString summary() const;
};

/// Reads `path`: a diffusers folder, a single FLUX.1 transformer file or a ComfyUI all-in-one
/// checkpoint (dit::ModelFolder::open(ModelSources)); `configDir` completes a single file's
/// configs as the CLI's --config (empty = FLUX.1's published ones). Never throws; see
/// ModelInfo::ok / error.
ModelInfo readModelInfo(const QString& path, const QString& configDir = QString());
/// Reads a model with its components as the worker will (dit::ModelFolder::open(ModelSources):
/// --model with --config, --vae, --text-encoder, ...): a component the model lacks and no source
/// gives is the error, naming the flag that supplies it. Never throws.
ModelInfo readModelInfo(const dit::ModelSources& sources);

/// "12.3 M", "11.9 B" style parameter count.
QString formatCount(qint64 n);
/// "512 MiB", "22.7 GiB" style byte count.
QString formatBytes(qint64 bytes);

}  // namespace dit::ui
